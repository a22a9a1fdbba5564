"""The fast manager against the reference, call for call, on seeded random
walks of the scheduler protocol (spec §16).

``Twins`` makes every call on both managers and demands the same outcome
(equal values of the same types, or the same error type, with both managers
unchanged by an error) and equal snapshots afterwards; on any mismatch the
assertion message carries the whole call log. The walk itself
(``blockspace.conformance.walk``) drives a small continuous-batching
scheduler through admissions, decode steps with and without lookahead, forks,
recompute and swap preemption, finishing, access times, computed marks,
common computed ids, cached tokens, hit rates, resets and deliberately
illegal calls, on pools small enough that LATER, NEVER, eviction and
swapping all happen.
"""

from __future__ import annotations

from typing import Any

import pytest

from blockspace import Sequence, SequenceGroup
from blockspace.conformance.walk import Attempting, Config
from blockspace.conformance.walk import walk as run_walk
from blockspace.errors import BlockSpaceError
from blockspace.fast import FastBlockSpaceManager
from blockspace.reference import ReferenceBlockSpaceManager
from blockspace.snapshot import diff


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (an int is not a numpy int)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


class Twins(Attempting):
    """A reference and a fast manager driven by the same calls."""

    def __init__(self, *args: Any, check_every: int = 1, snapshot_every: int = 1, **kwargs: Any) -> None:
        self.reference = ReferenceBlockSpaceManager(*args, **kwargs)
        self.fast = FastBlockSpaceManager(*args, **kwargs)
        self.log = [f"manager({', '.join([*map(repr, args), *(f'{k}={v!r}' for k, v in kwargs.items())])})"]
        self.check_every = check_every  # check_invariants() of the fast manager every so many calls
        self.snapshot_every = snapshot_every  # compare snapshots every so many calls (and after any error)

    def compare_snapshots(self, name: str = "") -> None:
        problems = diff(self.reference.snapshot(), self.fast.snapshot())
        if problems:
            self.fail(f"{name}: snapshots differ:\n    " + "\n    ".join(problems[:20]))

    def fail(self, why: str) -> None:
        raise AssertionError(f"{why}\ncall log ({len(self.log)} calls):\n  " + "\n  ".join(self.log[-400:]))

    def __call__(self, name: str, *args: Any) -> Any:
        self.log.append(f"{name}({', '.join(map(_describe, args))})")
        outcomes = []
        careful = self.snapshot_every == 1
        for manager in (self.reference, self.fast):
            before = manager.snapshot() if careful else None
            try:
                outcomes.append((True, getattr(manager, name)(*args)))
            except BlockSpaceError as error:
                outcomes.append((False, error))
                if careful and manager.snapshot() != before:
                    self.fail(f"{type(manager).__name__}.{name} raised {error!r} and changed the state")
        (ref_ok, ref_value), (fast_ok, fast_value) = outcomes
        if ref_ok != fast_ok or (not ref_ok and type(ref_value) is not type(fast_value)):
            self.fail(f"{name}: reference {ref_value!r}, fast {fast_value!r}")
        if ref_ok and not same(ref_value, fast_value):
            self.fail(f"{name}: reference returned {ref_value!r}, fast {fast_value!r}")
        if careful or not ref_ok or len(self.log) % self.snapshot_every == 0:
            self.compare_snapshots(name)
        if len(self.log) % self.check_every == 0:
            self.fast.check_invariants()
        if not ref_ok:
            raise ref_value
        return ref_value


def _describe(value: Any) -> str:
    if isinstance(value, SequenceGroup):
        return f"group {value.request_id!r} {[(s.seq_id, s.status.name, s.get_len()) for s in value.seqs]}"
    if isinstance(value, Sequence):
        return f"seq {value.seq_id} (len {value.get_len()}, computed {value.data.get_num_computed_tokens()})"
    if isinstance(value, list) and value and isinstance(value[0], Sequence):
        return "[" + ", ".join(_describe(v) for v in value) + "]"
    return repr(value)


def walk(config: Config, seed: int, num_steps: int, check_every: int = 1) -> Twins:
    args, kwargs = config.args()
    m = Twins(*args, check_every=check_every, **kwargs)
    run_walk(m, config, seed, num_steps)
    m.fast.check_invariants()
    assert m("get_num_free_gpu_blocks") == config.num_gpu_blocks - (m.fast.snapshot()["null_block"] is not None)
    return m


CONFIGS = {
    "plain-bs4": Config(4, 24, 16, lookahead=(0, 0, 3)),
    "plain-bs1": Config(1, 60, 30, max_prompt=12),
    "plain-bs2-watermark": Config(2, 40, 20, watermark=0.1, lookahead=(0, 2)),
    "plain-bs16-nocpu": Config(16, 10, 0, max_prompt=60, lookahead=(0, 5)),
    "caching-bs4": Config(4, 24, 16, enable_caching=True, lookahead=(0, 0, 3)),
    "caching-bs1": Config(1, 60, 30, enable_caching=True, max_prompt=12),
    "caching-bs2": Config(2, 40, 16, enable_caching=True, watermark=0.05, lookahead=(0, 1)),
    "caching-bs16": Config(16, 12, 8, enable_caching=True, max_prompt=60),
    "window-bs4": Config(4, 24, 16, sliding_window=8, lookahead=(0, 2)),
    "window-bs2": Config(2, 30, 10, sliding_window=5),
    "encoder-decoder-bs4": Config(4, 30, 16, encoder_decoder=True, lookahead=(0, 2)),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [0, 1])
def test_random_walk_lockstep(name, seed):
    m = walk(CONFIGS[name], seed, num_steps=60)
    assert len(m.log) > 200  # the walk really exercised the managers


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", range(2, 22))
def test_random_walk_lockstep_long(name, seed):
    walk(CONFIGS[name], seed, num_steps=300, check_every=7)
