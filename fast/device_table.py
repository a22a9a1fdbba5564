"""The device-resident block table, kept in sync by deltas, and slot mapping.

vLLM v0 rebuilds the block table of every scheduled sequence from Python
lists each step and copies the whole padded tensor to the GPU. Between two
steps only a few entries change (a new block every ``block_size`` tokens, a
copy-on-write replacement, a freed row), so here the table lives on the device
for good and only the changes travel. The host records them
(``fast/table_deltas.py``, which hands one step's changes over as a
:class:`~blockspace.fast.table_deltas.TableDelta`); this module owns the
device half: :meth:`DeviceBlockTable.step` uploads a delta together with the
step's token ranges in ONE host-to-device copy and ONE kernel launch, which
applies the changes and then computes every token's slot.

Why a module of its own: this is the only part of the table sync that needs
torch and ``numba.cuda``, so it is the only one that imports them; the host
deltas import neither, and this module imports them, never the reverse.
It also owns the choice of backend (``gpu_available``, ``simulator_enabled``,
``resolve_backend``), which ``fast/kv_copy.py`` shares.

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

from typing import Any, cast

import numpy as np
from numba import int64

from blockspace.errors import InvalidArgumentError
from blockspace.extras import require
from blockspace.fast.borrowing import counting
from blockspace.fast.row_args import int_array, optional_count
from blockspace.fast.table_deltas import PAD_BLOCK_ID, TableDelta, empty_delta

require("gpu", "blockspace.fast's device block tables (CUDA kernels on torch tensors)")
import torch  # noqa: E402  (after the check: without the extra, one error naming it)
from numba import cuda  # noqa: E402

# numba-cuda 0.30.4 registers ``overload(np.row_stack)`` when its CUDA target
# first loads (at the first kernel compile) for any NumPy >= 2.0, but NumPy 2.5
# removed ``row_stack`` (an alias of ``vstack``), so every compile raised
# AttributeError on the H200 image (numpy 2.5.2). Restore the alias first.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

PAD_SLOT_ID = -1


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


@counting
def _pack_step(stage, lengths, new_lengths, delta_rows, delta_cols, delta_values, length_rows, length_values,  # type: ignore[no-untyped-def]
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
def _step_kernel(table, lengths, stage, block_size, out):  # type: ignore[no-untyped-def]  # a kernel: unannotated
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

    return bool(config.ENABLE_CUDASIM)  # type: ignore[attr-defined]  # made from NUMBA_ENABLE_CUDASIM when numba loads


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
        # used only on the GPU (None elsewhere): typed as what it is where it is used
        self._upload_done = cast("torch.cuda.Event", torch.cuda.Event() if self._on_gpu else None)
        self._stage_capacity = 0
        self._out_capacity = 0
        self._ensure_stage(4096)
        self._ensure_out(4096)
        self._views: tuple | None = None
        self._launch: Any = None  # the kernel configured for a stream (``_configured_kernel``)
        self._launch_stream: int | None = None

    # -- the per-step protocol ---------------------------------------------

    def sync(self, delta: TableDelta) -> None:
        """Apply one step's changes, with no tokens to map."""
        self.step(delta)

    def slot_mapping(self, rows: Any, starts: Any, ends: Any, pad_to: int | None = None) -> torch.Tensor:
        """The slots of the given tokens, with no table changes."""
        return self.step(None, rows, starts, ends, pad_to)

    def step(
        self, delta: TableDelta | None, rows: Any = (), starts: Any = (), ends: Any = (), pad_to: int | None = None
    ) -> torch.Tensor:
        delta = _EMPTY_DELTA if delta is None else delta
        rows = int_array("rows", rows)
        starts, ends = int_array("starts", starts, len(rows)), int_array("ends", ends, len(rows))
        optional_count("pad_to", pad_to)
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

    def _step_cpu(
        self, delta: TableDelta, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray, num_out: int
    ) -> torch.Tensor:
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

    def _configured_kernel(self) -> Any:
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
    "DeviceBlockTable",
    "gpu_available",
    "resolve_backend",
    "simulator_enabled",
]
