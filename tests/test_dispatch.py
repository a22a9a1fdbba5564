"""The kernels' two call paths (``fast/dispatch.py``) and the handle makers'
cache key (``fast/handles.py``).

The mode is read once, when ``blockspace.fast.dispatch`` is imported, so
whatever depends on ``BLOCKSPACE_KERNEL_DISPATCH`` runs in a fresh process.
Every test here also runs under ``NUMBA_DISABLE_JIT=1``, except those about
compiled code, which say why they skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import numba
import pytest

from blockspace.errors import InvalidArgumentError
from blockspace.fast import dispatch

ROOT = Path(__file__).resolve().parents[1]
NO_JIT = bool(numba.config.DISABLE_JIT)
TYPED_ONLY = pytest.mark.skipif(NO_JIT, reason="under NUMBA_DISABLE_JIT=1 no call is typed: a kernel is plain Python")
CACHED_ONLY = pytest.mark.skipif(
    NO_JIT, reason="under NUMBA_DISABLE_JIT=1 a handle is the NamedTuple itself: no maker is compiled or cached"
)


def python(script: str, **env: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter with ``env`` added (the mode is read at import)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=600,
    )


# -- the switch ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "mode"),
    [(None, "direct"), ("", "direct"), ("direct", "direct"), ("numba", "numba"), (" Numba\n", "numba")],
)
def test_the_switch_names_a_mode(value, mode):
    assert dispatch.requested_mode(value) == mode


@pytest.mark.parametrize("value", ["fast", "numba,direct", "1", "dispatcher"])
def test_an_unknown_mode_is_refused_by_name(value):
    with pytest.raises(
        InvalidArgumentError, match=f"BLOCKSPACE_KERNEL_DISPATCH must be one of direct, numba, got {value!r}"
    ):
        dispatch.requested_mode(value)


def test_an_unknown_mode_stops_the_import():
    done = python("import blockspace.fast.dispatch", BLOCKSPACE_KERNEL_DISPATCH="typed")
    assert done.returncode != 0
    assert "InvalidArgumentError: BLOCKSPACE_KERNEL_DISPATCH must be one of direct, numba, got 'typed'" in done.stderr


@pytest.mark.parametrize(
    ("version", "taken"),
    [("0.59.1", False), ("0.60.0", True), ("0.68.1", True), ("0.69.0rc1", False), ("0.70.0", False), ("1.0", False)]
    + [("0.68.0.dev0+12.g1234", True), ("unknown", False)],
)
def test_entry_points_only_on_the_numba_versions_tested(version, taken):
    assert dispatch.takes_entry_points("direct", version, disable_jit=False) is taken
    assert not dispatch.takes_entry_points("numba", version, disable_jit=False)
    assert not dispatch.takes_entry_points("direct", version, disable_jit=True)


def test_the_tested_versions_are_pyprojects_numba_range():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (numba_spec,) = [spec for spec in dependencies if spec.startswith("numba")]
    lowest, untested = (".".join(map(str, version)) for version in dispatch.NUMBA_VERSIONS)
    assert numba_spec.replace(" ", "") == f"numba>={lowest},<{untested}"


# -- the fail-safe binding, on stand-ins for a dispatcher ---------------------------------------


class Overload:
    def __init__(self, entry_point=None):
        if entry_point is not None:
            self.entry_point = entry_point


class Kernel:
    """Enough of a Numba dispatcher for ``direct``: a call, and ``overloads``."""

    def __init__(self, *overloads):
        self.overloads = {f"sig{i}": overload for i, overload in enumerate(overloads)}
        self.__doc__ = "a stand-in kernel"
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return sum(args)


def bindable(kernel):
    """A ``direct`` that may bind, whatever this process's mode."""
    call = dispatch.direct(kernel)
    call.binding = True
    return call


def test_one_overload_with_an_entry_point_is_bound_and_rebound():
    kernel = Kernel(Overload(entry_point=lambda *args: ("entry", args)))
    call = bindable(kernel)
    namespace = {"kernel": call}
    call.rebind = lambda entry: namespace.__setitem__("kernel", entry)
    assert call(1, 2) == 3 and kernel.calls == 1
    assert call(1, 2) == ("entry", (1, 2)) and kernel.calls == 1
    assert namespace["kernel"] is call.entry


@pytest.mark.parametrize(
    "overloads",
    [(), (Overload(),), (Overload(entry_point="not callable"),), (Overload(len), Overload(len))],
    ids=["none", "no-entry-point", "not-callable", "two-overloads"],
)
def test_anything_else_stays_on_the_dispatcher(overloads):
    kernel = Kernel(*overloads)
    call = bindable(kernel)
    for _ in range(3):
        assert call(1, 2) == 3
    assert kernel.calls == 3 and call.entry is None and not call.binding


def test_without_entry_points_nothing_is_bound_nor_rebound(monkeypatch):
    monkeypatch.setattr(dispatch, "ENTRY_POINTS", False)
    kernel = Kernel(Overload(entry_point=len))
    call = dispatch.direct(kernel)
    namespace = {"kernel": call}
    dispatch.rebind_module(namespace)
    assert call(1, 2) == call(1, 2) == 3 and kernel.calls == 2
    assert call.entry is None and call.rebind is None and namespace["kernel"] is call


# -- the switch on a real manager ---------------------------------------------------------------

WORKLOAD = """
import json
from blockspace import Device, Sequence, SequenceGroup, SequenceStatus
from blockspace.fast import FastBlockSpaceManager, dispatch, kernels

answers = []
for caching in (False, True):
    m = FastBlockSpaceManager(4, 48, 32, watermark=0.0, enable_caching=caching)
    groups = []
    for i in range(6):
        s = Sequence(i, [t % 7 for t in range(9 + 3 * i)])
        g = SequenceGroup(str(i), [s])
        answers.append(str(m.can_allocate(g)))
        m.allocate(g)
        s.status = SequenceStatus.RUNNING
        groups.append(g)
    child = groups[0].seqs[0].fork(100)
    m.fork(groups[0].seqs[0], child)
    groups[0].add(child)
    for step in range(7):
        for g in groups:
            answers.append(m.can_append_slots(g, 1))
            for s in g.get_seqs():
                s.append_token_id(step)
                answers.append(m.append_slots(s, 1))
            m.mark_blocks_as_computed(g, 1)
    answers.append(m.can_swap_out(groups[1]))
    answers.append(m.swap_out(groups[1]))
    answers.append(str(m.can_swap_in(groups[1], 0)))
    answers.append(m.swap_in(groups[1]))
    answers.append(list(m.get_common_computed_block_ids(groups[0].get_seqs())))
    answers.append([m.get_num_cached_tokens(s) for g in groups for s in g.get_seqs()])
    for g in groups[:3]:
        for s in g.get_seqs():
            m.free(s)
    answers.append([list(m.get_block_table(s)) for g in groups[3:] for s in g.get_seqs()])
    answers.append([m.get_num_free_gpu_blocks(), m.get_num_free_cpu_blocks()])
    answers.append(m.get_prefix_cache_hit_rate(Device.GPU))
    answers.append(m.reset_prefix_cache())
    m.check_invariants()
kinds = {name: type(value).__name__ for name, value in vars(kernels).items() if not name.startswith("_")}
bound = sorted(name for name, value in vars(kernels).items() if isinstance(value, dispatch.direct) and value.entry)
print(json.dumps({"mode": dispatch.MODE, "answers": answers, "kinds": kinds, "bound": bound}))
"""


def workload(**env: str) -> dict:
    done = python(WORKLOAD, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_with_the_switch_every_kernel_is_called_through_the_dispatcher_with_the_same_answers():
    default, typed = workload(BLOCKSPACE_KERNEL_DISPATCH=""), workload(BLOCKSPACE_KERNEL_DISPATCH="numba")
    assert (default["mode"], typed["mode"]) == ("direct", "numba")
    assert typed["answers"] == default["answers"]
    kernel_names = [name for name, kind in typed["kinds"].items() if kind == "direct"]
    assert len(kernel_names) >= 20 and "mark_computed" in kernel_names and "append_batch" in kernel_names
    assert typed["bound"] == []  # no ``direct`` took an entry point, and none was replaced by one
    if NO_JIT:
        assert default["kinds"] == typed["kinds"]  # nothing to bind without JIT
    else:  # the default path did bind: what the switch turns off is really there
        rebound = [name for name in kernel_names if default["kinds"][name] != "direct"]
        assert {"allocate", "mark_computed", "fork", "swap"} <= set(rebound)


@TYPED_ONLY
def test_with_the_switch_a_wrong_dtype_is_a_typing_error():
    done = python(
        """
        import numpy as np
        from numba.core.errors import TypingError
        from blockspace import Sequence, SequenceGroup, SequenceStatus
        from blockspace.fast import FastBlockSpaceManager, kernels

        m = FastBlockSpaceManager(4, 16, 4, enable_caching=True)
        s = Sequence(0, list(range(10)))
        g = SequenceGroup("0", [s])
        m.allocate(g)
        m.mark_blocks_as_computed(g, 1)  # the kernel has run: in the default mode it would now be bound
        pool = m.store.gpu
        kernels.mark_computed(pool)  # the NamedTuple itself is fine: the dispatcher compiles for it
        try:
            kernels.mark_computed(pool._replace(meta=pool.meta.astype(np.float64)))
        except TypingError as error:
            print("TypingError", type(kernels.mark_computed).__name__)
        """,
        BLOCKSPACE_KERNEL_DISPATCH="numba",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["TypingError", "direct"]


# -- the handle makers' cache key ---------------------------------------------------------------

STATE_MODULE = """
from typing import NamedTuple

import numpy as np
from numba import njit
from numba.experimental import structref

from blockspace.fast import handles


class State(NamedTuple):
{fields}


@structref.register
class StateHandleType(handles._ArrayFields):
    pass


class StateHandle(structref.StructRefProxy):
    pass


structref.define_proxy(StateHandle, StateHandleType, list(State._fields))
make = handles.maker(State, StateHandle)


@njit
def read(handle):  # each field by name, in compiled code: Numba 0.60 gives a proxy no Python attributes
    return {reads}
"""

USE_STATE = """
import json
import numpy as np
import state

arrays = [np.full(2, i, dtype=np.int64) for i in range(len(state.State._fields))]
made = state.make(state.State(*arrays))
print(json.dumps({
    "hits": sum(state.make.stats.cache_hits.values()),
    "misses": sum(state.make.stats.cache_misses.values()),
    "read": dict(zip(state.State._fields, state.read(made))),
}))
"""


@CACHED_ONLY
def test_a_change_of_fields_is_a_new_handle_cache_key(tmp_path):
    """A state module (``fast/pool.py``'s stand-in) is rewritten with its two
    int64 fields swapped; ``fast/handles.py`` is not touched. Same types, so
    the old maker's cache entry would still match its argument types; the
    swapped names must miss it and compile anew, and the handle must read
    each field by its new name."""
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": path}

    def run(*fields: str) -> dict:
        body = "".join(f"    {name}: np.ndarray\n" for name in fields)
        reads = "".join(f"handle.{name}[0], " for name in fields)
        (tmp_path / "state.py").write_text(STATE_MODULE.format(fields=body, reads=f"({reads})"))
        done = python(USE_STATE, **env)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run("first", "second")
    assert (first["hits"], first["misses"]) == (0, 1)
    again = run("first", "second")
    assert (again["hits"], again["misses"]) == (1, 0)  # the cache is used: the key is the same in a new process
    swapped = run("second", "first")
    assert (swapped["hits"], swapped["misses"]) == (0, 1)
    assert swapped["read"] == {"second": 0, "first": 1}
    back = run("first", "second")
    assert (back["hits"], back["misses"]) == (1, 0) and back["read"] == {"first": 0, "second": 1}


def test_a_handle_is_the_state_itself_without_jit_else_a_handle_over_the_same_arrays():
    from blockspace.fast import FastBlockSpaceManager
    from blockspace.fast.handles import PoolHandle, handle

    pool = FastBlockSpaceManager(4, 8, 4).store.gpu
    made = handle(pool)
    if NO_JIT:
        assert made is pool
    else:
        assert isinstance(made, PoolHandle)
        # the same memory: a kernel's write through the handle is a write to the NamedTuple's array
        assert numba.njit(lambda state: state.meta.ctypes.data)(made) == pool.meta.ctypes.data
