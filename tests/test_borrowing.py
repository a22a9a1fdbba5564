"""Borrowing kernels keep their rules (``fast/borrowing.py``): no allocation
(the compiler's to refuse) and no array returned (checked here, on every
compiled signature of every borrowing kernel, each called on a small state)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import errors, njit, types

from blockspace.fast import pool as P
from blockspace.fast import table as T
from blockspace.fast.borrowing import KERNELS, borrowing
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
