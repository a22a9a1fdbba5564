"""Borrowing kernels keep their rules (``fast/borrowing.py``): no allocation
(the compiler's to refuse) and no array returned (checked here, on every
compiled signature of every borrowing kernel, each called on a small state);
and the compiled replay, a borrowing kernel that calls counting ones, gives
back every reference it takes."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import errors, njit, types

from blockspace.fast import pool as P
from blockspace.fast import table as T
from blockspace.fast.borrowing import KERNELS, borrowing
from blockspace.interfaces import load_manager_class
from blockspace.simulator import SimulationConfig, load_trace
from blockspace.simulator.compiled import blocks as B
from blockspace.simulator.compiled import loop as L
from blockspace.simulator.compiled import policy
from blockspace.simulator.compiled import state as S
from blockspace.simulator.compiled.engine import Run
from helpers import jit_or

pytestmark = pytest.mark.skipif(bool(jit_or(0, 1)), reason="NUMBA_DISABLE_JIT=1: nothing is compiled")


def holds_an_array(typ: types.Type) -> bool:
    """Is ``typ`` an array, or a tuple (named or not) or optional holding one?"""
    if isinstance(typ, types.Array):
        return True
    if isinstance(typ, types.BaseTuple):
        return any(holds_an_array(member) for member in typ.types)
    if isinstance(typ, types.Optional):
        return holds_an_array(typ.type)
    return False


def returning_arrays(kernels: list) -> list[str]:
    return [
        f"{kernel.py_func.__module__}.{kernel.__name__}{signature}"
        for kernel in kernels
        for signature in kernel.nopython_signatures
        if holds_an_array(signature.return_type)
    ]


def test_no_borrowing_kernel_returns_an_array():
    """Each kernel called on a small pool and store: a prompt of a full
    block and a partial one taken, stamped and released, the full one
    revived. Called here, since one loaded from Numba's cache inside its
    caller has no signature of its own."""
    pool, tables = P.new_pool(0, 8, True, 16), T.new_tables(2, 4)
    T._fill(pool, tables, 0, 20, np.array([3]), 0, -1, 16)
    T._stamp_all(pool, tables, 0, 1.0)
    T.release_all(pool, tables, 0, 16)
    assert (pool.refcount == 0).all() and P.num_free(pool) == 8  # the full block idle, the other free
    P._evictor_remove(pool, int(pool.key_block[3]))  # the idle block out of the evictor, as a hit takes it
    assert P.num_free(pool) == 7
    run = Run(load_trace(None, 5), load_manager_class("fast"), SimulationConfig(256, 64))
    run.advance(math.inf, None)
    fast = run.fast()
    state = (fast, B.views_of(fast), run.loop, run.requests)
    assert L.replay(*state) == L.DONE  # the replay and the step's parts, called once more at its end
    assert run.loop.meta[S.NUM_EVENTS] < run.loop.events.shape[1]  # room for the preemption's event
    assert run.loop.meta[S.NUM_TIMELINE] < run.loop.timeline.shape[1]  # and the model's side's row
    policy.begin(*state), policy.schedule_swapped(*state), policy.admit(*state, True), policy.preempt(*state, 0)
    policy.end(*state, 1.0), L.run_model(*state)
    assert [kernel.__name__ for kernel in KERNELS if not kernel.nopython_signatures] == []
    assert returning_arrays(KERNELS) == []


def test_the_check_sees_an_array_returned_alone_or_in_a_tuple():
    def same(values):  # what Numba lets a kernel without reference counts return: its argument
        return values

    def pair(values):
        return values[0], values

    kernels = [njit(_nrt=False)(same), njit(_nrt=False)(pair)]
    for kernel in kernels:
        kernel(np.arange(4))
    assert len(returning_arrays(kernels)) == 2


def test_an_allocation_in_a_borrowing_kernel_is_refused_when_it_compiles():
    def allocating(n):
        return np.zeros(n).sum()  # np.zeros returns a new array: refused

    kernel = borrowing(allocating)
    KERNELS.remove(kernel)  # not one of the package's
    with pytest.raises(errors.TypingError, match="Only accept returning of array passed into the function"):
        kernel(3)


LEAK_CHECK = textwrap.dedent("""
    import dataclasses, gc
    from numba.core.runtime import rtsys
    from blockspace.interfaces import load_manager_class
    from blockspace.simulator import SimulationConfig, load_trace
    from blockspace.simulator.engines import replay
    trace, fast = load_trace(None, 200), load_manager_class("fast")
    def runs():
        for replicas in (1, 3):  # a replay, and a fleet's replicas, each called again and again
            config = dataclasses.replace(SimulationConfig(4_096, 512), engine="compiled", replicas=replicas)
            replay(trace, fast, config)
        gc.collect()
    runs()  # compiled or loaded, and whatever is made once made
    before = rtsys.get_allocation_stats()
    runs()
    after = rtsys.get_allocation_stats()
    print(after.mi_alloc - before.mi_alloc, after.mi_free - before.mi_free)
""")


def test_the_compiled_replay_gives_back_every_reference_it_takes():
    """Each array Numba's runtime records (every array handed to compiled code)
    is let go of by the end of the runs. A borrowing kernel that kept an array
    a counting kernel returned to it would keep a record alive (seen: a view of
    fast's state taken inside the replay left 154 of 21,804)."""
    done = subprocess.run(
        [sys.executable, "-c", LEAK_CHECK], env={**os.environ, "NUMBA_NRT_STATS": "1"},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    made, freed = map(int, done.stdout.split())
    assert made > 1_000 and freed == made
