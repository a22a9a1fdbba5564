"""``StepRecord.digest`` computed in compiled code: CPython's own hash of
the tuple the Python engine hashes, so that records of the two engines
compare equal exactly when their tables, copy-on-write pairs and swap
mappings are.

The Python engine writes ``hash((tables, copies, swap_in, swap_out))`` with
``tables`` a tuple of ``(seq_id, block_ids)`` and the others tuples of
``(src, dst)`` pairs, all small non-negative ints, whose hash is the int
itself. CPython hashes a tuple with its xxHash-derived loop
(``Objects/tupleobject.c``, ``tuplehash``); it is written out below in
wrapping unsigned 64-bit arithmetic. ``tests/test_compiled_engine.py``
checks it against ``hash()`` on random nested tuples.
"""

from __future__ import annotations

import numpy as np

from blockspace.fast.borrowing import counting

PRIME_1 = np.uint64(11400714785074694791)
PRIME_2 = np.uint64(14029467366897019727)
PRIME_5 = np.uint64(2870177450012600261)
LENGTH_MIX = np.uint64(2870177450012600261 ^ 3527539)
ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
MINUS_ONE_HASH = np.uint64(1546275796)  # what CPython gives instead of -1


@counting
def start():
    return PRIME_5


@counting
def add(acc, lane):
    """One item of hash ``lane`` (as unsigned) into the accumulator."""
    acc = np.uint64(acc) + np.uint64(lane) * PRIME_2
    acc = (acc << np.uint64(31)) | (acc >> np.uint64(33))
    return acc * PRIME_1


@counting
def finish(acc, length):
    acc = np.uint64(acc) + (np.uint64(length) ^ LENGTH_MIX)
    return MINUS_ONE_HASH if acc == ALL_ONES else acc


@counting
def pairs(values, count):
    """hash(tuple of the first ``count`` pairs of a flat array)."""
    acc = start()
    for i in range(count):
        pair = add(add(start(), np.uint64(values[2 * i])), np.uint64(values[2 * i + 1]))
        acc = add(acc, finish(pair, 2))
    return finish(acc, count)


@counting
def ints(values, count):
    """hash(tuple of the first ``count`` ints of an array)."""
    acc = start()
    for i in range(count):
        acc = add(acc, np.uint64(values[i]))
    return finish(acc, count)


def signed(value: int) -> int:
    """A digest as Python's hash gives it (signed 64-bit)."""
    value = int(value)
    return value - (1 << 64) if value >= 1 << 63 else value
