"""The fast block manager: the reference's behaviour, call for call, with
its state in NumPy arrays and every change made by a compiled kernel.

The manager is a facade: it checks the arguments that need no state (a
lookahead, a device) and hands each call to the part that owns it. The
parts run the reference's checks in the reference's order
(``reference/manager.py``), so the same bad input raises the same error
before anything changes. The parts:

- ``store``: the arrays every kernel reads and writes (``fast/store.py``);
- ``rows``: which table row holds which sequence, and the read-only
  block-id answers (``fast/table_rows.py``);
- ``tracker``: the computed-blocks tracker's rows, with parking (``fast/tracker_rows.py``);
- ``key_space``: salt and adapter ids, and the key collector (``fast/key_space.py``);
- ``sync``: the device block table kept in step (``fast/device_sync.py``);
- ``allocations``: admission, allocate, fork and free (``fast/allocations.py``);
- ``appends``: the append path shared by the per-sequence and batched calls (``fast/appends.py``);
- ``swaps``: the swap checks and moves (``fast/swaps.py``);
- ``batch``, ``row_api``: the batched step on sequences and on table rows
  (``fast/batch.py``, ``fast/row_api.py``).

Each part is handed the parts it calls when it is made, and reads no part
through another.

Every kernel is called by name from ``fast/kernels.py``. A kernel that lacks
room says so before it changes anything; the part that called it grows the
arrays and calls again.

The calls a scheduler makes for every sequence at every step
(``get_block_table``, ``access_all_blocks_in_seq``, ``can_append_slots``,
``get_common_computed_block_ids``, ``mark_blocks_as_computed``) do the least
Python work that still gives the reference's answers and errors: one
dictionary look-up for a table, a plain store for an access time, Python
arithmetic for the append check.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from blockspace.block_ids import EMPTY, BlockIds
from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.errors import (
    NoCrossTableError,
    UnsupportedError,
)
from blockspace.fast import kernels, row_args
from blockspace.fast import pool as P
from blockspace.fast.allocations import Allocations
from blockspace.fast.appends import Appends
from blockspace.fast.batch import BatchSteps
from blockspace.fast.device_sync import DeviceSync
from blockspace.fast.invariants import check_invariants, snapshot
from blockspace.fast.key_space import KeySpace
from blockspace.fast.row_api import RowApi
from blockspace.fast.store import Store
from blockspace.fast.swaps import Swaps
from blockspace.fast.table_rows import TableRows
from blockspace.fast.tracker_rows import TrackerRows
from blockspace.guard import BUSY, guard_concurrency
from blockspace.interfaces import BlockSpaceManager
from blockspace.protocols import SequenceGroupLike, SequenceLike
from blockspace.saved_state import SavedState, config_of
from blockspace.validation import (
    check_config,
    check_lookahead,
    check_saved,
)

if TYPE_CHECKING:  # the device table's modules need the [gpu] extra: imported when first used (fast/device_sync.py)
    from typing import TypedDict

    import torch

    from blockspace.fast.device_table import DeviceBlockTable
    from blockspace.fast.table_deltas import TableDelta

    class _Layout(TypedDict):
        """The keywords every operation part is made with."""

        block_size: int
        caching: bool


RUNNING = SequenceStatus.RUNNING


def _part_method(part: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """A manager method that is ``function`` of the part ``self.<part>``
    (same name, signature and docstring)."""

    @functools.wraps(function)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return function(getattr(self, part), *args, **kwargs)

    return method


@guard_concurrency
class FastBlockSpaceManager(BlockSpaceManager):
    """Paged KV-cache blocks for every sequence, on the GPU or swapped to the CPU."""

    def __init__(
        self,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        watermark: float = 0.01,
        sliding_window: int | None = None,
        enable_caching: bool = False,
        *,
        track_device_table: bool = False,
    ) -> None:
        check_config(block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window, enable_caching)
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        self.sliding_window = sliding_window
        self.max_block_sliding_window = kernels.window_blocks(sliding_window, block_size)
        self.watermark = watermark
        self.watermark_blocks = kernels.watermark_blocks(watermark, num_gpu_blocks)
        self.enable_caching = bool(enable_caching)
        self._make_state_parts()
        self._make_operation_parts()
        # get_block_table runs for every sequence at every step: the answers, bound once (never replaced)
        self._answers = self.rows.answers
        if track_device_table:
            self.sync.start()
        self._own = frozenset(vars(self)) | {"_own", BUSY}  # the rest is a subclass's (``save_state`` pickles it)

    def _make_state_parts(self) -> None:
        """The parts that own state: the arrays, and the bookkeeping beside them."""
        self.store = Store(self.block_size, self.num_total_gpu_blocks, self.num_total_cpu_blocks, self.enable_caching)
        self.rows = TableRows(self.store)
        self.key_space = KeySpace(self.store)
        self.tracker = TrackerRows(self.store, self.key_space, self.block_size)
        self.sync = DeviceSync(self.store, self.rows)

    def _make_operation_parts(self) -> None:
        """The parts that run the calls, each handed the state parts it uses."""
        store, rows, key_space = self.store, self.rows, self.key_space
        layout: _Layout = {"block_size": self.block_size, "caching": self.enable_caching}
        window_blocks = self.max_block_sliding_window
        self.allocations = Allocations(
            store, rows, key_space, self.tracker, self.sync, **layout, num_gpu_blocks=self.num_total_gpu_blocks,
            sliding_window=self.sliding_window, window_blocks=window_blocks, watermark_blocks=self.watermark_blocks,
        )  # fmt: skip
        self.appends = Appends(store, rows, key_space, **layout, window_blocks=window_blocks)
        self.swaps = Swaps(
            store, rows, block_size=self.block_size, num_gpu_blocks=self.num_total_gpu_blocks,
            num_cpu_blocks=self.num_total_cpu_blocks, watermark_blocks=self.watermark_blocks,
        )  # fmt: skip
        self.batch = BatchSteps(store, rows, self.appends, **layout, windowed=window_blocks is not None)
        self.row_api = RowApi(store, rows, self.appends, self.tracker, **layout, window_blocks=window_blocks)

    # -- admission (fast/allocations.py) -----------------------------------------------
    def can_allocate(self, seq_group: SequenceGroupLike, num_lookahead_slots: int = 0) -> AllocStatus:
        if type(num_lookahead_slots) is not int or num_lookahead_slots < 0:
            check_lookahead(num_lookahead_slots)
        return self.allocations.status(seq_group, num_lookahead_slots)

    def allocate(self, seq_group: SequenceGroupLike) -> None:
        """One table for the first WAITING sequence; the others share it."""
        self.allocations.allocate(seq_group)

    def fork(self, parent_seq: SequenceLike, child_seq: SequenceLike) -> None:
        """The child shares every block of the parent (copy-on-write later)."""
        self.allocations.fork(parent_seq, child_seq)

    # -- decode (fast/appends.py) ------------------------------------------------------
    def can_append_slots(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> bool:
        if type(num_lookahead_slots) is not int or num_lookahead_slots < 0:
            check_lookahead(num_lookahead_slots)
        return self.appends.can_append(seq_group, num_lookahead_slots)

    def append_slots(self, seq: SequenceLike, num_lookahead_slots: int) -> list[tuple[int, int]]:
        """Room for the sequence's new tokens plus lookahead slots; returns
        the copy-on-write pairs ``(src, dst)`` the worker must copy."""
        if type(num_lookahead_slots) is not int or num_lookahead_slots < 0:
            check_lookahead(num_lookahead_slots)
        return self.appends.one(seq, num_lookahead_slots)

    # -- swapping (fast/swaps.py) ------------------------------------------------------
    def can_swap_in(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> AllocStatus:
        check_lookahead(num_lookahead_slots)
        return self.swaps.status(seq_group, Device.GPU, SequenceStatus.SWAPPED, num_lookahead_slots)

    def can_swap_out(self, seq_group: SequenceGroupLike) -> bool:
        return self.swaps.status(seq_group, Device.CPU, RUNNING, 0) == AllocStatus.OK

    def swap_in(self, seq_group: SequenceGroupLike) -> list[tuple[int, int]]:
        return self.swaps.move(seq_group, SequenceStatus.SWAPPED, Device.CPU, Device.GPU)

    def swap_out(self, seq_group: SequenceGroupLike) -> list[tuple[int, int]]:
        return self.swaps.move(seq_group, RUNNING, Device.GPU, Device.CPU)

    # -- finishing (fast/allocations.py) ------------------------------------------------
    def free(self, seq: SequenceLike) -> None:
        """Release the sequence's blocks (stamped with its last access time);
        unknown sequences are ignored."""
        self.allocations.free(seq)

    def free_cross(self, seq_group: SequenceGroupLike) -> None:
        self.allocations.free_cross(seq_group)

    # -- tables and counts ---------------------------------------------------------
    def get_block_table(self, seq: SequenceLike) -> BlockIds:
        """The table's block ids, read-only: the same object until it changes."""
        ids = self._answers.get(seq.seq_id)
        return ids if ids is not None else self.rows.block_ids(seq)

    def get_cross_block_table(self, seq_group: SequenceGroupLike) -> BlockIds:
        if seq_group.request_id not in self.rows.of_cross:
            raise NoCrossTableError(f"group {seq_group.request_id!r} has no cross block table")
        return self.rows.cross_block_ids(seq_group.request_id)

    def get_num_free_gpu_blocks(self) -> int:
        return self.store.num_free_gpu()

    def get_num_free_cpu_blocks(self) -> int:
        return self.store.num_free_cpu()

    # -- prefix caching ------------------------------------------------------------------
    def access_all_blocks_in_seq(self, seq: SequenceLike, access_time: float) -> None:
        """Remember when the sequence last ran; its blocks get the time at ``free``."""
        if self.enable_caching:
            self.rows.touch(seq, access_time)

    def mark_blocks_as_computed(self, seq_group: SequenceGroupLike, token_chunk_size: int) -> None:
        """Every block registered since the last call is now computed (the
        arguments are ignored, as in vLLM)."""
        if self.enable_caching and self.store.gpu_view.meta[P.NUM_TOUCHED]:
            kernels.mark_computed(self.store.gpu_ref)

    def get_common_computed_block_ids(self, seqs: Sequence[SequenceLike]) -> BlockIds:
        """The longest block-id prefix the sequences' cached prefixes share
        (one sequence: its cached prefix); sequences without cached blocks
        are left out, as in vLLM (spec §9.15)."""
        for seq in seqs:
            self.rows.require(seq)
        if not self.enable_caching:
            return EMPTY
        if len(seqs) == 1:  # the usual call: one running sequence, its cached prefix kept between calls
            return self.rows.cached_prefix(seqs[0], self.tracker.num_cached_tokens(seqs[0]) // self.block_size)
        for seq in seqs:
            self.tracker.check_tokens(seq, seq.get_token_ids())
        counts = [self.tracker.num_cached_tokens(seq) // self.block_size for seq in seqs]
        return self.rows.common_prefix(seqs, counts)

    def get_prefix_cache_hit_rate(self, device: Device) -> float:
        pool = self.store.pool_ref(Device.parse(device))
        return float(kernels.hit_rate(pool)) if self.enable_caching else -1

    def reset_prefix_cache(self, device: Device | None = None) -> bool:
        """Forget every idle cached block of the device(s); False if a block is in use."""
        if device is not None:
            return bool(kernels.reset_pool(self.store.pool_ref(Device.parse(device))))
        cpu_done = bool(kernels.reset_pool(self.store.pool_ref(Device.CPU)))
        # the GPU is tried even if the CPU failed (vLLM stops there)
        gpu_done = bool(kernels.reset_pool(self.store.pool_ref(Device.GPU)))
        return cpu_done and gpu_done

    def get_num_cached_tokens(self, seq: SequenceLike) -> int:
        return self.tracker.num_cached_tokens(seq) if self.enable_caching else 0

    def remove_seq_from_computed_blocks_tracker(self, seq: SequenceLike) -> None:
        if self.enable_caching:
            self.tracker.remove(seq)

    # -- the batched step (fast/batch.py) and the array-level step (fast/row_api.py) -----
    can_append_slots_batch = _part_method("batch", BatchSteps.can_append_slots_batch)
    append_slots_batch = _part_method("batch", BatchSteps.append_slots_batch)
    rows_of = _part_method("row_api", RowApi.rows_of)
    can_append_slots_rows = _part_method("row_api", RowApi.can_append_slots_rows)
    append_slots_rows = _part_method("row_api", RowApi.append_slots_rows)
    block_tables = _part_method("row_api", RowApi.block_tables)
    block_table_array = _part_method("row_api", RowApi.block_table_array)
    access_all_blocks_rows = _part_method("row_api", RowApi.access_all_blocks_rows)
    num_computed_blocks_rows = _part_method("row_api", RowApi.num_computed_blocks_rows)
    slot_mapping = _part_method("row_api", RowApi.slot_mapping)
    slot_mapping_array = _part_method("row_api", RowApi.slot_mapping_array)

    def row_of(self, seq: SequenceLike) -> int:
        """The table row of ``seq``, which is also its row in the device block table."""
        return self.rows.require(seq)

    # -- the device block table (docs/gpu.md) -------------------------------------------
    def device_block_table(self, backend: str = "auto", max_seqs: int = 256, max_blocks: int = 64) -> DeviceBlockTable:
        """The ``DeviceBlockTable`` this manager keeps in sync through
        ``step_device`` (made, and tracking started, on the first call; the
        arguments only count then)."""
        return self.sync.device(self.block_size, backend, max_seqs, max_blocks)

    def step_device(
        self, seqs: Sequence[SequenceLike], starts: Any, ends: Any, pad_to: int | None = None
    ) -> torch.Tensor:
        """Bring the device block table up to date with every table change
        since the last call, then return the slots of the step's tokens:
        positions ``starts[i]`` up to ``ends[i]`` of ``seqs[i]`` (see
        ``DeviceBlockTable.step``). Swapped-out sequences must not be scheduled."""
        rows = self.row_api.rows_of(seqs)
        starts, ends = row_args.int_array("starts", starts, len(rows)), row_args.int_array("ends", ends, len(rows))
        row_args.optional_count("pad_to", pad_to)  # all checked before the drain: bad input loses no change
        return self.sync.device(self.block_size).step(self.sync.drain(), rows, starts, ends, pad_to)

    def table_delta(self) -> TableDelta:
        """The table changes since the last call as a ``TableDelta``, for a
        ``DeviceBlockTable`` kept by the caller (starts tracking on the first
        call: that delta holds every live table)."""
        return self.sync.drain()

    # -- introspection --------------------------------------------------------------------
    def check_invariants(self) -> None:
        check_invariants(self)

    def snapshot(self) -> dict[str, Any]:
        return snapshot(self)

    def _no_device_table(self, what: str) -> None:
        if self.sync.device_table is not None:
            raise UnsupportedError(
                f"a manager that keeps a device block table cannot {what} (the table is on the device)"
            )

    def save_state(self) -> SavedState:
        """The whole state, kept aside (``blockspace/saved_state.py``): the
        arrays as bytes, the parts' fields as copies, and a subclass's own
        fields (those ``__init__`` did not make) pickled."""
        self._no_device_table("save its state")
        parts = (self.rows.save(), self.key_space.save(), self.tracker.save(), self.sync.save())
        extra = {name: value for name, value in vars(self).items() if name not in self._own}
        return SavedState("fast", config_of(self), (self.store.save(), parts, pickle.dumps(extra) if extra else None))

    def restore_state(self, saved: SavedState) -> None:
        """The state ``save_state`` gave, back: the bytes copied into the
        arrays held now (where their shapes are the same), the fields into
        the parts' own containers."""
        check_saved(saved, "fast", self)
        self._no_device_table("restore a state")
        store, (rows, key_space, tracker, sync), extra = saved.data
        for name in [name for name in vars(self) if name not in self._own]:
            delattr(self, name)
        if extra is not None:
            vars(self).update(pickle.loads(extra))
        self.store.restore(store)
        self.rows.restore(rows)
        self.key_space.restore(key_space)
        self.tracker.restore(tracker)
        self.sync.restore(sync)
