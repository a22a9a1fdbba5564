"""Wrong arrays at the row API's one boundary (fast/row_args.py): every
public method of the fast manager that takes arrays refuses a wrong dtype,
shape or count by the argument's name, and changes nothing.

Why it matters: the kernels behind these methods are called without
Numba's typing (fast/dispatch.py), so anything that got past the boundary
would be read as memory of another type. The row API is the fast
manager's own (the reference has none), so this file is about fast alone;
``test_every_array_method_is_covered`` fails by name when a new method
that takes arrays has no cases here."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from blockspace.errors import InvalidArgumentError
from blockspace.fast import FastBlockSpaceManager
from helpers import group, run, seq

# Parameters that carry arrays (or lists standing for them) in the row API.
ARRAY_PARAMETERS = {
    "rows", "seq_lens", "group_ends", "token_ids", "num_computed_tokens", "prefill", "num_step_tokens", "starts",
    "ends", "seqs", "seqs_or_rows", "pad", "pad_to",
}  # fmt: skip
# Methods whose array parameters are Sequence objects only, checked by the per-sequence rules.
SEQUENCE_METHODS = {"get_common_computed_block_ids", "append_slots_batch", "can_append_slots_batch"}

NOT_INTEGERS = {
    "floats": np.array([0.5]),
    "bools": np.array([True]),
    "2-D": np.zeros((1, 1), np.int64),
    "strings": ["a"],
    "ragged": [[1], [1, 2]],
    "objects": np.array([object()]),
    "None": None,
    "beyond int64": np.array([2**64 - 1], np.uint64),
}


def _manager(**config: object) -> tuple[FastBlockSpaceManager, list]:
    """A manager with two running sequences of 5 tokens (block size 4)."""
    m = FastBlockSpaceManager(4, 32, 8, **config)
    seqs = [seq(i, range(i, i + 5)) for i in (1, 2)]
    for i, s in enumerate(seqs):
        m.allocate(group(f"r{i}", s))
        run(s)
    return m, seqs


def _tokens(seqs: list) -> list[list[int]]:
    return [list(s.get_token_ids()) for s in seqs]


def _cases() -> list[tuple[str, dict, str, object]]:
    """(method, manager config, argument name, call) for every wrong input:
    the call takes the manager and its two sequences."""
    ok_rows = np.array([0, 1])
    calls = {
        "rows": lambda bad: {
            "can_append_slots_rows": lambda m, s: m.can_append_slots_rows(bad, [5, 5], 0),
            "append_slots_rows": lambda m, s: m.append_slots_rows(bad, [5, 5], 0, token_ids=_tokens(s)),
            "access_all_blocks_rows": lambda m, s: m.access_all_blocks_rows(bad, 1.0),
            "num_computed_blocks_rows": lambda m, s: m.num_computed_blocks_rows(bad, _tokens(s)),
        },
        "seq_lens": lambda bad: {
            "can_append_slots_rows": lambda m, s: m.can_append_slots_rows(ok_rows, bad, 0),
            "append_slots_rows": lambda m, s: m.append_slots_rows(ok_rows, bad, 0, token_ids=_tokens(s)),
        },
        "group_ends": lambda bad: {
            "can_append_slots_rows": lambda m, s: m.can_append_slots_rows(ok_rows, [5, 5], 0, group_ends=bad),
        },
        "num_step_tokens": lambda bad: {
            "slot_mapping_array": lambda m, s: m.slot_mapping_array(ok_rows, bad),
            "slot_mapping": lambda m, s: m.slot_mapping(ok_rows, bad),
        },
        "starts": lambda bad: {"step_device": lambda m, s: m.step_device(s, bad, [5, 5])},
        "ends": lambda bad: {"step_device": lambda m, s: m.step_device(s, [4, 4], bad)},
    }  # fmt: skip
    cases = []
    for name, of in calls.items():
        for why, bad in NOT_INTEGERS.items():
            if why == "None" and name == "group_ends":
                continue  # None is its default: every row a group
            for method, call in of(bad).items():
                cases.append((method, {"enable_caching": True}, name, call, why))
        for method, call in of([1, 2, 3]).items():  # one entry too many for two rows
            if name != "rows" and name != "group_ends":
                cases.append((method, {"enable_caching": True}, name, call, "count"))
    for why, bad in {**NOT_INTEGERS, "count": [1, 2, 3]}.items():
        call = lambda m, s, bad=bad: m.append_slots_rows([0, 1], [6, 6], 0, num_computed_tokens=bad)  # noqa: E731
        cases.append(("append_slots_rows", {"sliding_window": 8}, "num_computed_tokens", call, why))
    for why, bad in {"ints": [1, 0], "2-D": [[True], [False]], "count": [True], "strings": ["a", "b"]}.items():
        call = lambda m, s, bad=bad: m.num_computed_blocks_rows([0, 1], _tokens(s), bad)  # noqa: E731
        cases.append(("num_computed_blocks_rows", {"enable_caching": True}, "prefill", call, why))
    tokens = {"float tokens": [0.5] * 8, "negative tokens": [-3] * 8, "float array": np.full(8, 0.5)}
    for why, bad_tokens in tokens.items():  # the values: read by a kernel that keys them
        for method, call in {
            "append_slots_rows": lambda m, s, b=bad_tokens: m.append_slots_rows(
                [0, 1], [8, 5], 0, token_ids=[b, s[1].get_token_ids()]
            ),
            "num_computed_blocks_rows": lambda m, s, b=bad_tokens: m.num_computed_blocks_rows(
                [0, 1], [b, s[1].get_token_ids()]
            ),
        }.items():
            cases.append((method, {"enable_caching": True}, "token_ids", call, why))
    for why, bad in {"None": None, "count": [[1, 2, 3, 4, 5]], "not lists": [5, 6], "a string": "ab"}.items():
        for method, call in {
            "append_slots_rows": lambda m, s, bad=bad: m.append_slots_rows([0, 1], [6, 6], 0, token_ids=bad),
            "num_computed_blocks_rows": lambda m, s, bad=bad: m.num_computed_blocks_rows([0, 1], bad),
        }.items():
            cases.append((method, {"enable_caching": True}, "token_ids", call, why))
    for why, bad in {"float": 0.5, "bool": True, "beyond int32": 2**31, "numpy": np.int64(0)}.items():
        for method in ("block_table_array", "block_tables"):
            call = lambda m, s, bad=bad, method=method: getattr(m, method)(np.array([0, 1]), bad)  # noqa: E731
            cases.append((method, {}, "pad", call, why))
    for why, bad in {"negative": -1, "float": 1.5, "bool": True}.items():
        call = lambda m, s, bad=bad: m.step_device(s, [4, 4], [5, 5], pad_to=bad)  # noqa: E731
        cases.append(("step_device", {}, "pad_to", call, why))
    for method in ("rows_of", "block_table_array", "block_tables", "slot_mapping_array", "slot_mapping"):
        call = lambda m, s, method=method: getattr(m, method)([0, 1])  # noqa: E731
        cases.append((method, {}, "seqs", call, "ints for sequences"))
    return cases


CASES = _cases()


@pytest.mark.parametrize(
    ("method", "config", "name", "call", "why"),
    CASES,
    ids=[f"{method}-{name}-{why}" for method, _, name, _, why in CASES],
)
def test_wrong_array_is_refused_by_name_and_changes_nothing(method, config, name, call, why):
    m, seqs = _manager(**config)
    if method == "step_device":
        pytest.importorskip("torch")
        m.device_block_table(backend="cpu")
    before = m.snapshot()
    with pytest.raises(InvalidArgumentError) as raised:
        call(m, seqs)
    assert name in str(raised.value), f"{method}: the error does not name {name!r}: {raised.value}"
    assert m.snapshot() == before
    m.check_invariants()
    if method == "step_device":  # the delta the refused call did not drain is still there
        table = m.step_device(seqs, [4, 4], [5, 5])
        assert table is not None


def test_every_array_method_is_covered():
    """A public method of the fast manager that takes an array parameter
    (by the parameter names of the row API) has wrong-input cases above."""
    covered = {method for method, *_ in CASES}
    for name, member in inspect.getmembers(FastBlockSpaceManager, callable):
        if name.startswith("_") or name in SEQUENCE_METHODS:
            continue
        parameters = set(inspect.signature(member).parameters)
        if parameters & ARRAY_PARAMETERS:
            assert name in covered, (
                f"{name} takes arrays ({sorted(parameters & ARRAY_PARAMETERS)}) but has no case here"
            )
