"""The host's record of what changed in its block tables since the last drain.

A device-resident block table (``fast/device_table.py``) stays in step with
the host by receiving only the cells that changed, so the host has to know
which changed. This module owns that record and nothing else:

* :class:`DeltaBuffers`, plain arrays that ``@njit`` code appends each change
  to (the fast manager's ``fast/device_sync.py``, or a caller's own kernels),
  and the ``deltas_*`` functions that write and drain them;
* ``flush_table_log``, which moves the block writes the fast manager's kernels
  logged (``fast/table.py``) into those arrays;
* :class:`TableDeltas`, a Python face over them that also hands out rows;
* :class:`TableDelta`, one step's changes as compact int32 arrays, each
  changed cell once with its final value: what the device table applies.

Why a module of its own: recording is host work, NumPy and Numba's CPU
target, and needs neither torch nor ``numba.cuda``. Kept apart from the
device table, a manager that tracks deltas (``table_delta()``, for a table
the caller keeps) never loads the CUDA target, and the device table depends
on this module, never the reverse. The ``[gpu]`` extra is still checked on
import: the deltas exist only to feed a device table, and ``table_delta()``
is documented as needing that extra; the check looks the modules up and
imports none of them.

``PAD_BLOCK_ID = 0`` is defined here because the host's copy of the table
pads with it first; the device table pads with the same value (vLLM v0's
block table padding).
"""

from __future__ import annotations

import heapq
from collections import namedtuple
from typing import NamedTuple

import numpy as np

from blockspace.errors import InvalidArgumentError
from blockspace.extras import require
from blockspace.fast.borrowing import counting
from blockspace.fast.row_args import count

require("gpu", "blockspace.fast's device block tables (CUDA kernels on torch tensors)")

PAD_BLOCK_ID = 0

DeltaBuffers = namedtuple(
    "DeltaBuffers",
    [
        "table",  # int32 [rows, cols]: the host's copy of the table, padding past each length
        "dirty",  # uint8 [rows, cols]: 1 where the cell changed since the last drain
        "lengths",  # int32 [rows]: blocks per row
        "length_dirty",  # uint8 [rows]: 1 where the length changed since the last drain
        "cells",  # int32 [capacity, 2]: (row, col) of each dirty cell, in first-change order
        "length_rows",  # int32 [rows]: each row whose length changed, in first-change order
        "counts",  # int64 [2]: number of dirty cells, number of changed lengths
    ],
)
DeltaBuffers.__doc__ = """Plain arrays that ``@njit`` code appends the step's
changes to. Each change writes the host copy and marks the cell dirty once, so
``drain`` sends each changed cell once, with its final value: the order of the
changes within a step never matters to the device."""


class TableDelta(NamedTuple):
    """One step's changes, as the device applies them."""

    rows: np.ndarray  # int32: the changed cells...
    cols: np.ndarray  # int32
    values: np.ndarray  # int32: ...and their new block ids
    length_rows: np.ndarray  # int32: the rows whose length changed...
    length_values: np.ndarray  # int32: ...and their new lengths
    num_rows: int  # the table must have at least this many rows...
    num_cols: int  # ...and columns to hold them

    @property
    def num_entries(self) -> int:
        return len(self.rows)


def new_delta_buffers(num_rows: int = 64, num_cols: int = 16) -> DeltaBuffers:
    """Empty buffers for a table of ``num_rows x num_cols`` (they grow)."""
    if num_rows < 1 or num_cols < 1:
        raise InvalidArgumentError(f"table shape must be positive, got {num_rows} x {num_cols}")
    return DeltaBuffers(
        np.full((num_rows, num_cols), PAD_BLOCK_ID, np.int32),
        np.zeros((num_rows, num_cols), np.uint8),
        np.zeros(num_rows, np.int32),
        np.zeros(num_rows, np.uint8),
        np.zeros((64, 2), np.int32),
        np.zeros(num_rows, np.int32),
        np.zeros(2, np.int64),
    )


@counting
def _grown(size, needed):
    while size < needed:
        size *= 2
    return size


@counting
def _fit(buf, row, col):
    """``buf``, or a copy with room for cell ``(row, col)``."""
    num_rows, num_cols = buf.table.shape
    if row < num_rows and col < num_cols:
        return buf
    new_rows = _grown(num_rows, row + 1)
    new_cols = _grown(num_cols, col + 1)
    table = np.full((new_rows, new_cols), PAD_BLOCK_ID, np.int32)
    table[:num_rows, :num_cols] = buf.table
    dirty = np.zeros((new_rows, new_cols), np.uint8)
    dirty[:num_rows, :num_cols] = buf.dirty
    lengths = np.zeros(new_rows, np.int32)
    lengths[:num_rows] = buf.lengths
    length_dirty = np.zeros(new_rows, np.uint8)
    length_dirty[:num_rows] = buf.length_dirty
    length_rows = np.zeros(new_rows, np.int32)
    length_rows[:num_rows] = buf.length_rows
    return DeltaBuffers(table, dirty, lengths, length_dirty, buf.cells, length_rows, buf.counts)


@counting
def _write(buf, row, col, value):
    buf.table[row, col] = value
    if buf.dirty[row, col]:
        return buf
    buf.dirty[row, col] = 1
    count = buf.counts[0]
    if count == buf.cells.shape[0]:
        cells = np.zeros((2 * count, 2), np.int32)
        cells[:count] = buf.cells
        buf = DeltaBuffers(buf.table, buf.dirty, buf.lengths, buf.length_dirty, cells, buf.length_rows, buf.counts)
    buf.cells[count, 0] = row
    buf.cells[count, 1] = col
    buf.counts[0] = count + 1
    return buf


@counting
def _write_length(buf, row, num_blocks):
    buf.lengths[row] = num_blocks
    if not buf.length_dirty[row]:
        buf.length_dirty[row] = 1
        buf.length_rows[buf.counts[1]] = row
        buf.counts[1] += 1


@counting
def deltas_record(buf, row, col, value):
    """Set cell ``(row, col)`` to block ``value``; a cell past the row's
    length extends it (cells skipped over hold padding). Returns the buffers,
    which may be new arrays after growth: always keep the result."""
    if row < 0 or col < 0 or value < 0:
        raise InvalidArgumentError("table row, column and block id must be non-negative")
    buf = _fit(buf, row, col)
    buf = _write(buf, row, col, value)
    if col >= buf.lengths[row]:
        _write_length(buf, row, col + 1)
    return buf


@counting
def deltas_append(buf, row, value):
    """Append block ``value`` to ``row``. Returns the buffers."""
    if row < 0:
        raise InvalidArgumentError("table row must be non-negative")
    col = np.int64(buf.lengths[row]) if row < buf.lengths.shape[0] else np.int64(0)
    return deltas_record(buf, np.int64(row), col, np.int64(value))


@counting
def deltas_set_length(buf, row, num_blocks):
    """Make ``row`` hold ``num_blocks`` blocks: cells dropped from its end
    become padding, cells added hold padding until recorded. Returns the buffers."""
    if row < 0 or num_blocks < 0:
        raise InvalidArgumentError("table row and length must be non-negative")
    buf = _fit(buf, row, max(num_blocks - 1, 0))
    for col in range(num_blocks, buf.lengths[row]):
        buf = _write(buf, row, col, np.int64(PAD_BLOCK_ID))
    _write_length(buf, row, num_blocks)
    return buf


@counting
def deltas_clear_row(buf, row):
    """Empty ``row`` (a freed sequence). Returns the buffers."""
    return deltas_set_length(buf, row, np.int64(0))


@counting
def deltas_drain(buf):
    """The dirty cells with their final values and the changed lengths, as
    ``(rows, cols, values, length_rows, length_values)``; clears the marks."""
    num_cells = buf.counts[0]
    rows = buf.cells[:num_cells, 0].copy()
    cols = buf.cells[:num_cells, 1].copy()
    values = np.empty(num_cells, np.int32)
    for i in range(num_cells):
        values[i] = buf.table[rows[i], cols[i]]
        buf.dirty[rows[i], cols[i]] = 0
    num_lengths = buf.counts[1]
    length_rows = buf.length_rows[:num_lengths].copy()
    length_values = np.empty(num_lengths, np.int32)
    for i in range(num_lengths):
        length_values[i] = buf.lengths[length_rows[i]]
        buf.length_dirty[length_rows[i]] = 0
    buf.counts[0] = 0
    buf.counts[1] = 0
    return rows, cols, values, length_rows, length_values


@counting
def flush_table_log(tables, buf):
    """Move the block writes the fast manager's kernels logged in ``tables``
    (``fast/table.py``: ``log``, ``num_logged``) into the recorder, each
    cell with its current value. Returns ``(buffers, ok)``; ``ok`` is False
    when the log overflowed (nothing is moved): the caller resynchronises
    whole rows instead and gives the log more room."""
    num_logged = tables.num_logged[0]
    if num_logged > tables.log.shape[0]:
        return buf, False
    for i in range(num_logged):
        row = np.int64(tables.log[i, 0])
        col = np.int64(tables.log[i, 1])
        buf = deltas_record(buf, row, col, np.int64(tables.blocks[row, col]))
    tables.num_logged[0] = 0
    return buf, True


@counting
def deltas_copy_row(buf, row, blocks):
    """Make ``row`` hold exactly ``blocks`` (a resynchronised table). Returns the buffers."""
    buf = deltas_set_length(buf, row, np.int64(blocks.shape[0]))
    for col in range(blocks.shape[0]):
        if buf.table[row, col] != blocks[col]:
            buf = deltas_record(buf, row, np.int64(col), np.int64(blocks[col]))
    return buf


class TableDeltas:
    """The host's record of block-table changes between two device syncs.

    A thin Python face over :class:`DeltaBuffers` and the ``deltas_*``
    functions; ``@njit`` code uses those directly on ``self.buffers`` and
    hands the result back (``deltas.buffers = kernel(deltas.buffers, ...)``).
    It also hands out table rows: the lowest free one, so rows stay dense.
    """

    def __init__(self, num_rows: int = 64, num_cols: int = 16):
        self.buffers = new_delta_buffers(num_rows, num_cols)
        self._free_rows: list[int] = []
        self._next_row = 0

    def record(self, row: int, col: int, value: int) -> None:
        _check_ints(row=row, col=col, value=value)
        self.buffers = deltas_record(self.buffers, int(row), int(col), int(value))

    def append(self, row: int, value: int) -> None:
        _check_ints(row=row, value=value)
        self.buffers = deltas_append(self.buffers, int(row), int(value))

    def set_length(self, row: int, num_blocks: int) -> None:
        _check_ints(row=row, num_blocks=num_blocks)
        self.buffers = deltas_set_length(self.buffers, int(row), int(num_blocks))

    def clear_row(self, row: int) -> None:
        _check_ints(row=row)
        self.buffers = deltas_clear_row(self.buffers, int(row))

    def length(self, row: int) -> int:
        _check_ints(row=row)
        return int(self.buffers.lengths[row]) if row < len(self.buffers.lengths) else 0

    def acquire_row(self) -> int:
        """A free row for a new sequence (it is empty)."""
        if self._free_rows:
            return heapq.heappop(self._free_rows)
        self._next_row += 1
        return self._next_row - 1

    def release_row(self, row: int) -> None:
        """Clear the row of a freed sequence and make it free again."""
        if not 0 <= row < self._next_row or row in self._free_rows:
            raise InvalidArgumentError(f"row {row} is not in use")
        self.clear_row(row)
        heapq.heappush(self._free_rows, row)

    def host_table(self) -> np.ndarray:
        """A copy of the host's table, the state the device reaches after the next sync."""
        return self.buffers.table.copy()

    def host_lengths(self) -> np.ndarray:
        return self.buffers.lengths.copy()

    def drain(self) -> TableDelta:
        """The changes since the last drain, each changed cell once."""
        rows, cols, values, length_rows, length_values = deltas_drain(self.buffers)
        num_rows, num_cols = self.buffers.table.shape
        return TableDelta(rows, cols, values, length_rows, length_values, num_rows, num_cols)


def _check_ints(**named: int) -> None:
    for name, value in named.items():
        count(name, value)


def empty_delta() -> TableDelta:
    empty = np.zeros(0, np.int32)
    return TableDelta(empty, empty, empty, empty, empty, 0, 0)


__all__ = [
    "PAD_BLOCK_ID",
    "DeltaBuffers",
    "TableDelta",
    "TableDeltas",
    "deltas_append",
    "deltas_clear_row",
    "deltas_copy_row",
    "deltas_drain",
    "deltas_record",
    "deltas_set_length",
    "empty_delta",
    "flush_table_log",
    "new_delta_buffers",
]
