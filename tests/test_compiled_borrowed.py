"""The compiled loop's state, borrowed for a call (``compiled/borrowed.py``):
the same arrays, read and written in place."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from blockspace.simulator.compiled.borrowed import borrowed


class Pair(NamedTuple):
    counts: np.ndarray
    times: np.ndarray


@njit
def add_through_borrowed(pair, value):
    pair = borrowed(pair)
    for i in range(pair.counts.shape[0]):
        pair.counts[i] += value
        pair.times[i] = pair.counts[i] * 0.5
    return pair.counts.sum()


def test_a_borrowed_tuple_reads_and_writes_the_callers_arrays():
    pair = Pair(np.arange(4, dtype=np.int64), np.zeros(4))
    assert add_through_borrowed(pair, 3) == 3 + 4 + 5 + 6
    assert pair.counts.tolist() == [3, 4, 5, 6]
    assert pair.times.tolist() == [1.5, 2.0, 2.5, 3.0]
    for _ in range(1_000):  # the caller's arrays stay whole however often they are borrowed
        add_through_borrowed(pair, 1)
    assert pair.counts.tolist() == [1_003, 1_004, 1_005, 1_006]
