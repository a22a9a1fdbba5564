"""Device-resident block tables, kept in sync by deltas, and slot mapping.

vLLM v0 rebuilds the block table of every scheduled sequence from Python
lists each step and copies the whole padded tensor to the GPU. Between two
steps only a few entries change (a new block every ``block_size`` tokens, a
copy-on-write replacement, a freed row), so here the table lives on the device
for good and only the changes travel:

* the host records each change as it mutates its own tables
  (:class:`TableDeltas`, usable from Python and from ``@njit`` code), and
  ``drain()`` hands the step's changes over as compact int32 arrays;
* :meth:`DeviceBlockTable.step` uploads them together with the step's token
  ranges in ONE host-to-device copy and ONE kernel launch, which applies the
  changes and then computes every token's slot.

Layout and padding
------------------
The table is a torch int32 tensor ``[max_seqs, max_blocks]``: row ``r`` is one
sequence's block table, ``lengths[r]`` its number of blocks. Cells at or past a
row's length always hold ``PAD_BLOCK_ID = 0``, the value vLLM v0 pads block
tables with (``_make_tensor_with_pad``); the attention kernels never read
them. A freed row is cleared (length 0, all cells padding) and handed to the
next sequence. Both dimensions grow on demand, keeping the contents.

Slots follow vLLM: ``slot = table[row, pos // block_size] * block_size +
pos % block_size`` as int64, and ``PAD_SLOT_ID = -1`` for padding tokens.

Backends
--------
``"cuda"`` runs the Numba-CUDA kernel on a real GPU, or under Numba's CUDA
simulator (``NUMBA_ENABLE_CUDASIM=1``) on CPU tensors, which is how the tests
prove it equal to ``"cpu"``, the NumPy path. ``"auto"`` picks ``"cuda"`` when
a real GPU is present and ``"cpu"`` otherwise.
"""

from __future__ import annotations

import heapq
from collections import namedtuple
from typing import NamedTuple

import numpy as np
from numba import int64, njit

from blockspace.errors import InvalidArgumentError
from blockspace.extras import require

require("gpu", "blockspace.fast's device block tables (CUDA kernels on torch tensors)")
import torch  # noqa: E402  (after the check: without the extra, one error naming it)
from numba import cuda  # noqa: E402

# numba-cuda 0.30.4 registers ``overload(np.row_stack)`` when its CUDA target
# first loads (at the first kernel compile) for any NumPy >= 2.0, but NumPy 2.5
# removed ``row_stack`` (an alias of ``vstack``), so every compile raised
# AttributeError on the H200 image (numpy 2.5.2). Restore the alias first.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

PAD_BLOCK_ID = 0
PAD_SLOT_ID = -1

# ---------------------------------------------------------------------------
# Host side: the recorder
# ---------------------------------------------------------------------------

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


@njit(cache=True)
def _grown(size, needed):
    while size < needed:
        size *= 2
    return size


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def _write_length(buf, row, num_blocks):
    buf.lengths[row] = num_blocks
    if not buf.length_dirty[row]:
        buf.length_dirty[row] = 1
        buf.length_rows[buf.counts[1]] = row
        buf.counts[1] += 1


@njit(cache=True)
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


@njit(cache=True)
def deltas_append(buf, row, value):
    """Append block ``value`` to ``row``. Returns the buffers."""
    if row < 0:
        raise InvalidArgumentError("table row must be non-negative")
    col = np.int64(buf.lengths[row]) if row < buf.lengths.shape[0] else np.int64(0)
    return deltas_record(buf, np.int64(row), col, np.int64(value))


@njit(cache=True)
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


@njit(cache=True)
def deltas_clear_row(buf, row):
    """Empty ``row`` (a freed sequence). Returns the buffers."""
    return deltas_set_length(buf, row, np.int64(0))


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise InvalidArgumentError(f"{name} must be a non-negative int, got {value!r}")


def empty_delta() -> TableDelta:
    empty = np.zeros(0, np.int32)
    return TableDelta(empty, empty, empty, empty, empty, 0, 0)


# ---------------------------------------------------------------------------
# Device side: packing, the kernel, the table
# ---------------------------------------------------------------------------

# The int32 stage one step uploads: a header of counts, then the changed
# cells' rows, cols and values, the changed lengths' rows and values, and the
# scheduled sequences' token offsets (a running sum, one more than the
# sequences), rows and first positions.
NUM_ENTRIES, NUM_LENGTHS, NUM_SEQS, NUM_TOKENS, NUM_OUT, HEADER = range(6)

PACK_ERRORS = {
    -1: "delta arrays differ in length",
    -2: "a delta cell, length or block id lies outside the table or is negative",
    -3: "rows, starts and ends differ in length",
    -4: "a scheduled row is outside the table",
    -5: "token ranges need 0 <= start <= end",
    -6: "a token position lies past its row's blocks",
    -7: "too many tokens for one step",
}


def stage_size(delta: TableDelta, num_seqs: int) -> int:
    return HEADER + 3 * len(delta.rows) + 2 * len(delta.length_rows) + 3 * num_seqs + 1


@njit(cache=True)
def _pack_step(stage, lengths, new_lengths, delta_rows, delta_cols, delta_values, length_rows, length_values,
               seq_rows, seq_starts, seq_ends, block_size, num_cols, pad_to):  # fmt: skip
    """Check one step's input against a table of ``len(new_lengths) x
    num_cols`` and pack it into ``stage``; ``new_lengths`` receives the
    lengths after the step. Returns the number of tokens, or a negative
    ``PACK_ERRORS`` code having written nothing but ``new_lengths``."""
    num_entries = delta_rows.shape[0]
    num_lengths = length_rows.shape[0]
    num_seqs = seq_rows.shape[0]
    num_rows = new_lengths.shape[0]
    if delta_cols.shape[0] != num_entries or delta_values.shape[0] != num_entries:
        return -1
    if length_values.shape[0] != num_lengths:
        return -1
    for i in range(num_entries):
        if not (0 <= delta_rows[i] < num_rows and 0 <= delta_cols[i] < num_cols and delta_values[i] >= 0):
            return -2
    new_lengths[: lengths.shape[0]] = lengths
    new_lengths[lengths.shape[0] :] = 0
    for i in range(num_lengths):
        if not (0 <= length_rows[i] < num_rows and 0 <= length_values[i] <= num_cols):
            return -2
        new_lengths[length_rows[i]] = length_values[i]
    if seq_starts.shape[0] != num_seqs or seq_ends.shape[0] != num_seqs:
        return -3
    num_tokens = 0
    for i in range(num_seqs):
        if not 0 <= seq_rows[i] < num_rows:
            return -4
        if not 0 <= seq_starts[i] <= seq_ends[i]:
            return -5
        if (seq_ends[i] + block_size - 1) // block_size > new_lengths[seq_rows[i]]:
            return -6
        num_tokens += seq_ends[i] - seq_starts[i]
    if num_tokens >= 2**31 or pad_to >= 2**31:
        return -7
    stage[NUM_ENTRIES] = num_entries
    stage[NUM_LENGTHS] = num_lengths
    stage[NUM_SEQS] = num_seqs
    stage[NUM_TOKENS] = num_tokens
    stage[NUM_OUT] = max(pad_to, num_tokens)
    at = HEADER
    for piece in (delta_rows, delta_cols, delta_values, length_rows, length_values):
        stage[at : at + piece.shape[0]] = piece
        at += piece.shape[0]
    stage[at] = 0
    for i in range(num_seqs):
        stage[at + 1 + i] = stage[at + i] + seq_ends[i] - seq_starts[i]
        stage[at + 1 + num_seqs + i] = seq_rows[i]
        stage[at + 1 + 2 * num_seqs + i] = seq_starts[i]
    return num_tokens


@cuda.jit
def _step_kernel(table, lengths, stage, block_size, out):
    """Apply the deltas, then map tokens to slots. Launch with ONE thread
    block: ``syncthreads`` orders the table writes before the reads, which a
    grid of blocks could not do within one launch (one block of 1,024
    threads maps a decode batch in one pass, a long prefill in a few)."""
    num_entries = stage[NUM_ENTRIES]
    num_lengths = stage[NUM_LENGTHS]
    num_seqs = stage[NUM_SEQS]
    num_tokens = stage[NUM_TOKENS]
    num_out = stage[NUM_OUT]
    thread = cuda.threadIdx.x
    stride = cuda.blockDim.x
    cells = HEADER
    for i in range(thread, num_entries, stride):
        table[stage[cells + i], stage[cells + num_entries + i]] = stage[cells + 2 * num_entries + i]
    changed = cells + 3 * num_entries
    for i in range(thread, num_lengths, stride):
        lengths[stage[changed + i]] = stage[changed + num_lengths + i]
    cuda.syncthreads()
    offsets = changed + 2 * num_lengths
    seq_rows = offsets + num_seqs + 1
    seq_starts = seq_rows + num_seqs
    for token in range(thread, num_out, stride):
        if token >= num_tokens:
            out[token] = PAD_SLOT_ID
            continue
        # the last sequence whose offset is <= token (empty ones are skipped)
        low = 0
        high = num_seqs - 1
        while low < high:
            mid = (low + high + 1) // 2
            if stage[offsets + mid] <= token:
                low = mid
            else:
                high = mid - 1
        pos = stage[seq_starts + low] + token - stage[offsets + low]
        block = int64(table[stage[seq_rows + low], pos // block_size])
        out[token] = block * block_size + pos % block_size


def simulator_enabled() -> bool:
    """True under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def gpu_available() -> bool:
    """A real CUDA GPU that both torch and Numba can use."""
    return not simulator_enabled() and torch.cuda.is_available() and cuda.is_available()


def resolve_backend(backend: str) -> str:
    """``"cpu"`` or ``"cuda"`` for a requested ``"auto"``, ``"cpu"`` or ``"cuda"``."""
    if backend == "auto":
        return "cuda" if gpu_available() else "cpu"
    if backend == "cpu":
        return "cpu"
    if backend == "cuda":
        if not (gpu_available() or simulator_enabled()):
            raise InvalidArgumentError("backend 'cuda' needs a CUDA GPU or NUMBA_ENABLE_CUDASIM=1")
        return "cuda"
    raise InvalidArgumentError(f"backend must be 'auto', 'cpu' or 'cuda', got {backend!r}")


def _int64_array(values) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype != np.int64:
        if array.size and array.dtype.kind not in "iu":
            raise InvalidArgumentError(f"rows, starts and ends must be integers, got {array.dtype}")
        array = array.astype(np.int64)
    return array.reshape(-1)


class DeviceBlockTable:
    """The block tables of all running sequences, resident on the device.

    ``step(delta, rows, starts, ends)`` is the whole per-step protocol: apply
    the recorded changes, then return the slot of every scheduled token
    (sequence ``i`` in table row ``rows[i]``, positions ``starts[i]`` up to
    ``ends[i]``), as an int64 tensor of ``pad_to`` slots (default: the number
    of tokens), padding tokens ``PAD_SLOT_ID``. The returned tensor is a view
    of a persistent buffer, valid until the next call (as vLLM's persistent
    input buffers are). Pass int64 NumPy arrays for speed; lists work too.
    """

    def __init__(
        self,
        block_size: int,
        max_seqs: int = 256,
        max_blocks: int = 64,
        backend: str = "auto",
        threads_per_block: int = 1024,
    ):
        for name, value in (("block_size", block_size), ("max_seqs", max_seqs), ("max_blocks", max_blocks)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}")
        if not 1 <= threads_per_block <= 1024:
            raise InvalidArgumentError(f"threads_per_block must be in 1..1024, got {threads_per_block}")
        self.block_size = block_size
        self.backend = resolve_backend(backend)
        self.threads_per_block = threads_per_block
        self._on_gpu = self.backend == "cuda" and not simulator_enabled()
        self.device = torch.device("cuda") if self._on_gpu else torch.device("cpu")
        self.table = torch.full((max_seqs, max_blocks), PAD_BLOCK_ID, dtype=torch.int32, device=self.device)
        self.lengths = torch.zeros(max_seqs, dtype=torch.int32, device=self.device)
        self._host_lengths = np.zeros(max_seqs, np.int32)  # to check token ranges without reading the device
        self._new_lengths = self._host_lengths.copy()
        self._upload_done = torch.cuda.Event() if self._on_gpu else None
        self._stage_capacity = 0
        self._out_capacity = 0
        self._ensure_stage(4096)
        self._ensure_out(4096)
        self._views: tuple | None = None
        self._launch = None
        self._launch_stream = None

    # -- the per-step protocol ---------------------------------------------

    def sync(self, delta: TableDelta) -> None:
        """Apply one step's changes, with no tokens to map."""
        self.step(delta)

    def slot_mapping(self, rows, starts, ends, pad_to: int | None = None) -> torch.Tensor:
        """The slots of the given tokens, with no table changes."""
        return self.step(None, rows, starts, ends, pad_to)

    def step(self, delta: TableDelta | None, rows=(), starts=(), ends=(), pad_to: int | None = None):
        delta = _EMPTY_DELTA if delta is None else delta
        rows, starts, ends = _int64_array(rows), _int64_array(starts), _int64_array(ends)
        if pad_to is not None and (isinstance(pad_to, bool) or not isinstance(pad_to, (int, np.integer)) or pad_to < 0):
            raise InvalidArgumentError(f"pad_to must be a non-negative int, got {pad_to!r}")
        num_rows = max(self.table.shape[0], delta.num_rows)
        num_cols = max(self.table.shape[1], delta.num_cols)
        if len(self._new_lengths) != num_rows:
            self._new_lengths = np.zeros(num_rows, np.int32)
        size = stage_size(delta, len(rows))
        self._ensure_stage(size)
        if self._on_gpu:
            self._upload_done.synchronize()  # the previous upload has left the pinned buffer
        stage = self._host_stage_np
        num_tokens = _pack_step(stage, self._host_lengths, self._new_lengths, delta.rows, delta.cols, delta.values,
                                delta.length_rows, delta.length_values, rows, starts, ends, self.block_size,
                                num_cols, -1 if pad_to is None else pad_to)  # fmt: skip
        if num_tokens < 0:
            raise InvalidArgumentError(PACK_ERRORS[num_tokens])
        if pad_to is not None and pad_to < num_tokens:
            raise InvalidArgumentError(f"pad_to ({pad_to}) is below the number of tokens ({num_tokens})")
        num_out = int(stage[NUM_OUT])
        self._grow(num_rows, num_cols)
        self._host_lengths, self._new_lengths = self._new_lengths, self._host_lengths
        self._ensure_out(num_out)
        if self.backend == "cpu":
            return self._step_cpu(delta, rows, starts, ends, num_out)
        return self._step_kernel(size, num_out)

    # -- capacity -------------------------------------------------------------

    def _grow(self, num_rows: int, num_cols: int) -> None:
        old_rows, old_cols = self.table.shape
        if num_rows <= old_rows and num_cols <= old_cols:
            return
        new_rows = max(num_rows, 2 * old_rows if num_rows > old_rows else old_rows)
        new_cols = max(num_cols, 2 * old_cols if num_cols > old_cols else old_cols)
        table = torch.full((new_rows, new_cols), PAD_BLOCK_ID, dtype=torch.int32, device=self.device)
        table[:old_rows, :old_cols] = self.table
        lengths = torch.zeros(new_rows, dtype=torch.int32, device=self.device)
        lengths[:old_rows] = self.lengths
        self.table, self.lengths = table, lengths
        self._views = None

    def _ensure_stage(self, size: int) -> None:
        if size <= self._stage_capacity:
            return
        size = max(size, 2 * self._stage_capacity)
        if self._on_gpu:
            self._upload_done.synchronize()
            self._host_stage = torch.empty(size, dtype=torch.int32, pin_memory=True)
            self._dev_stage = torch.empty(size, dtype=torch.int32, device=self.device)
        else:
            self._host_stage = torch.empty(size, dtype=torch.int32)
            self._dev_stage = self._host_stage
        self._host_stage_np = self._host_stage.numpy()
        self._stage_capacity = size
        self._views = None

    def _ensure_out(self, size: int) -> None:
        if size <= self._out_capacity:
            return
        size = max(size, 2 * self._out_capacity)
        self._out = torch.empty(size, dtype=torch.int64, device=self.device)
        self._out_capacity = size
        self._views = None

    # -- the two paths --------------------------------------------------------

    def _step_cpu(self, delta, rows, starts, ends, num_out) -> torch.Tensor:
        table = self.table.numpy()
        table[delta.rows, delta.cols] = delta.values  # each cell once: order does not matter
        self.lengths.numpy()[delta.length_rows] = delta.length_values
        counts = ends - starts
        seq_of_token = np.repeat(np.arange(len(rows)), counts)
        first_token = np.repeat(np.cumsum(counts) - counts, counts)
        positions = starts[seq_of_token] + np.arange(len(seq_of_token)) - first_token
        blocks = table[rows[seq_of_token], positions // self.block_size].astype(np.int64)
        out = self._out[:num_out]
        out_np = out.numpy()
        out_np[: len(positions)] = blocks * self.block_size + positions % self.block_size
        out_np[len(positions) :] = PAD_SLOT_ID
        return out

    def _step_kernel(self, size: int, num_out: int) -> torch.Tensor:
        if self._on_gpu:
            self._dev_stage[:size].copy_(self._host_stage[:size], non_blocking=True)
            self._upload_done.record()
        table, lengths, stage, out = self._kernel_views()
        self._configured_kernel()(table, lengths, stage, self.block_size, out)
        return self._out[:num_out]

    def _kernel_views(self) -> tuple:
        """The tensors as the kernel takes them, made once per allocation:
        Numba device arrays over ``__cuda_array_interface__`` on a GPU, NumPy
        views of the CPU tensors under the simulator."""
        if self._views is None:
            tensors = (self.table, self.lengths, self._dev_stage, self._out)
            if self._on_gpu:
                self._views = tuple(cuda.as_cuda_array(t, sync=False) for t in tensors)
            else:
                self._views = tuple(t.numpy() for t in tensors)
        return self._views

    def _configured_kernel(self):
        """The kernel bound to one thread block and torch's current stream
        (so it stays in order with torch's work), made once per stream."""
        handle = torch.cuda.current_stream().cuda_stream if self._on_gpu else 0
        if self._launch is None or handle != self._launch_stream:
            stream = cuda.external_stream(handle) if self._on_gpu else 0
            self._launch = _step_kernel[1, self.threads_per_block, stream]
            self._launch_stream = handle
        return self._launch


_EMPTY_DELTA = empty_delta()


__all__ = [
    "PAD_BLOCK_ID",
    "PAD_SLOT_ID",
    "DeltaBuffers",
    "DeviceBlockTable",
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
    "gpu_available",
    "new_delta_buffers",
    "resolve_backend",
    "simulator_enabled",
]
