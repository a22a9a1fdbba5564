"""The fast block manager: the reference's behaviour, call for call, with
its state in NumPy arrays and every change made by a compiled kernel.

The manager checks arguments (the same checks, in the same order, as
``reference/manager.py``, so the same bad input raises the same error before
anything changes) and composes the parts that own the state:

- ``store``: the arrays every kernel reads and writes (``fast/store.py``);
- ``rows``: which table row holds which sequence, and the read-only
  block-id answers (``fast/table_rows.py``);
- ``tracker``: the computed-blocks tracker's rows, with parking (``fast/tracker_rows.py``);
- ``key_space``: salt and adapter ids, and the key collector (``fast/key_space.py``);
- ``appends``: the append path shared by the per-sequence and batched calls (``fast/appends.py``);
- ``swaps``: the swap checks and moves (``fast/swaps.py``);
- ``batch``, ``arrays``: the batched step on sequences and on rows (``fast/batch.py``, ``fast/rows.py``);
- ``sync``: the device block table kept in step (``fast/device_sync.py``).

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
from collections.abc import Callable
from typing import Any

import numpy as np

from blockspace.block_ids import EMPTY, BlockIds
from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.errors import (
    ChildExistsError,
    DuplicateTableError,
    EmptyTableError,
    NoCrossTableError,
    NoFreeBlocksError,
    UnsupportedError,
)
from blockspace.fast import kernels
from blockspace.fast import pool as P
from blockspace.fast import table as T
from blockspace.fast.appends import Appends, with_room
from blockspace.fast.batch import BatchSteps
from blockspace.fast.checks import checked_token_array
from blockspace.fast.device_sync import DeviceSync
from blockspace.fast.invariants import check_invariants, snapshot
from blockspace.fast.key_space import KeySpace
from blockspace.fast.rows import RowSteps
from blockspace.fast.store import Store
from blockspace.fast.swaps import Swaps
from blockspace.fast.table_rows import TableRows
from blockspace.fast.tracker_rows import TrackerRows
from blockspace.guard import BUSY, guard_concurrency
from blockspace.interfaces import BlockSpaceManager
from blockspace.saved_state import SavedState, config_of
from blockspace.validation import (
    check_config,
    check_encoder_decoder,
    check_lookahead,
    check_saved,
    group_salt,
    waiting_seqs,
)

_ALLOC_STATUS = {status.value: status for status in AllocStatus}
RUNNING = SequenceStatus.RUNNING
NO_WINDOW_CAP = 2**62  # blocks_for_prompt's cap without a sliding window: larger than any prompt


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
        # no window caps no prompt: an int either way, so the rule is one compiled overload
        self._window_cap = NO_WINDOW_CAP if self.max_block_sliding_window is None else self.max_block_sliding_window
        self.watermark = watermark
        self.watermark_blocks = kernels.watermark_blocks(watermark, num_gpu_blocks)
        self.enable_caching = bool(enable_caching)

        self.store = Store(block_size, num_gpu_blocks, num_cpu_blocks, self.enable_caching)
        self.rows = TableRows(self.store)
        self.key_space = KeySpace(self.store)
        self.tracker = TrackerRows(self.store, self.key_space, block_size)
        self.appends = Appends(
            self.store, self.rows, self.key_space, block_size, self.enable_caching, self.max_block_sliding_window
        )
        self.swaps = Swaps(self.appends, num_gpu_blocks, num_cpu_blocks, self.watermark_blocks)
        self.batch = BatchSteps(self.appends)
        self.arrays = RowSteps(self.appends, self.tracker)
        self.sync = DeviceSync(self.store, self.rows)
        # the per-step calls read these every time: bound once (the parts never replace them)
        self._of_seq, self._answers, self._access_times = self.rows.of_seq, self.rows.answers, self.rows.access_times
        if track_device_table:
            self.sync.start()
        self._own = frozenset(vars(self)) | {"_own", BUSY}  # the rest is a subclass's (``save_state`` pickles it)

    def _handle(self, device: Device) -> Any:
        return self.store.gpu_ref if device == Device.GPU else self.store.cpu_ref

    # -- admission ---------------------------------------------------------------
    def can_allocate(self, seq_group: Any, num_lookahead_slots: int = 0) -> AllocStatus:
        if type(num_lookahead_slots) is not int or num_lookahead_slots < 0:
            check_lookahead(num_lookahead_slots)
        check_encoder_decoder(seq_group, self.sliding_window, self.enable_caching)
        seq = waiting_seqs(seq_group)[0]
        encoder = seq_group.get_encoder_seq() if seq_group.is_encoder_decoder() else None
        need = kernels.blocks_for_prompt(
            len(seq.get_token_ids()),
            num_lookahead_slots,
            len(encoder.get_token_ids()) if encoder is not None else 0,
            self.block_size,
            self._window_cap,
        )
        status = kernels.alloc_status(self.num_total_gpu_blocks, self.store.num_free_gpu(), need, self.watermark_blocks)
        return _ALLOC_STATUS[status]

    def allocate(self, seq_group: Any) -> None:
        """One table for the first WAITING sequence; the others share it."""
        waiting = waiting_seqs(seq_group)
        seq_ids = [seq.seq_id for seq in waiting]
        if len(set(seq_ids)) != len(seq_ids) or any(i in self._of_seq for i in seq_ids):
            raise DuplicateTableError(f"block table already exists for a sequence of group {seq_group.request_id!r}")
        first = waiting[0]
        token_list = first.get_token_ids()
        memo = self.tracker.prompt_memo(first, token_list)
        tokens = checked_token_array(first, token_list, known=memo.array if memo is not None else None)
        if not len(tokens) and len(waiting) > 1:
            raise EmptyTableError("an empty prompt cannot be shared by several WAITING sequences")
        encoder = None
        encoder_tokens = T.NO_TOKENS
        if seq_group.is_encoder_decoder():
            if seq_group.request_id in self.rows.of_cross:
                raise DuplicateTableError(f"cross block table already exists for group {seq_group.request_id!r}")
            check_encoder_decoder(seq_group, self.sliding_window, self.enable_caching)
            encoder = seq_group.get_encoder_seq()
        extra = self.key_space.extra_id(first.extra_hash())
        root = self.key_space.root_id(group_salt(seq_group, self.tracker.tracked.__contains__))
        keyed = T.NO_TOKENS  # the prompt's block keys, if the tracker made them from the same content
        if memo is not None and memo.root == root and memo.extra == extra:
            keyed = self.tracker.prompt_keys(first, len(tokens) // self.block_size)
        if encoder is not None:
            encoder_tokens = checked_token_array(encoder, encoder.get_token_ids())
        encoder_extra = self.key_space.extra_id(encoder.extra_hash()) if encoder is not None else 0
        rows = [self.rows.take() for _ in range(len(waiting) + (encoder is not None))]
        cross_row = rows.pop() if encoder is not None else -1
        fork_rows = np.array(rows[1:], np.int64)
        store, info = self.store, np.zeros(1, np.int64)
        result = with_room(
            lambda: kernels.allocate(
                store.gpu_ref, store.keys_ref, store.tables_ref, rows[0], tokens, extra, root, keyed,
                fork_rows, cross_row, encoder_tokens, encoder_extra, info,
            ),
            store,
            self.key_space,
        )  # fmt: skip
        if result == T.NO_BLOCKS:
            self.rows.give_back(rows + ([cross_row] if cross_row >= 0 else []))
            raise NoFreeBlocksError(f"allocate needs {int(info[0])} GPU blocks, {store.num_free_gpu()} are free")
        for seq, row in zip(waiting, rows):
            self.rows.bind(seq.seq_id, row)
            self.rows.block_ids(seq)  # the table's first answer, built now: the scheduler asks at once
        if encoder is not None:
            self.rows.of_cross[seq_group.request_id] = cross_row

    # -- decode ----------------------------------------------------------------------
    def can_append_slots(self, seq_group: Any, num_lookahead_slots: int) -> bool:
        if type(num_lookahead_slots) is not int or num_lookahead_slots < 0:
            check_lookahead(num_lookahead_slots)
        num_filled, of_seq, block_size = self.store.tables_view.num_filled, self._of_seq, self.block_size
        touched = 0
        for seq in seq_group.get_seqs(status=RUNNING):
            row = of_seq.get(seq.seq_id)
            if row is None:
                self.rows.row(seq)  # raises
            filled = num_filled[row]
            unseen = max(0, len(seq.get_token_ids()) - filled)
            touched += kernels.blocks_touched(filled, unseen, num_lookahead_slots, block_size)
        return touched <= self.store.num_free_gpu()

    def append_slots(self, seq: Any, num_lookahead_slots: int) -> list[tuple[int, int]]:
        """Room for the sequence's new tokens plus lookahead slots; returns
        the copy-on-write pairs ``(src, dst)`` the worker must copy."""
        if type(num_lookahead_slots) is not int or num_lookahead_slots < 0:
            check_lookahead(num_lookahead_slots)
        return self.appends.one(seq, num_lookahead_slots)

    def fork(self, parent_seq: Any, child_seq: Any) -> None:
        """The child shares every block of the parent (copy-on-write later)."""
        parent = self._of_seq.get(parent_seq.seq_id)
        if parent is None:
            return
        tables = self.store.tables
        if tables.num_blocks[parent] == 0:
            raise EmptyTableError(f"sequence {parent_seq.seq_id} has no blocks to fork")
        if child_seq.seq_id in self._of_seq:
            raise ChildExistsError(f"fork onto sequence {child_seq.seq_id}, which already has a block table")
        if tables.num_null[parent] > 0:
            raise UnsupportedError("fork of a sliding-window table after blocks were dropped")
        child = self.rows.take()
        pool = self.store.gpu_ref if self.store.tables.device[parent] == T.GPU else self.store.cpu_ref
        kernels.fork(pool, self.store.tables_ref, parent, child)
        self.rows.bind(child_seq.seq_id, child)
        self.rows.block_ids(child_seq)

    # -- swapping (fast/swaps.py) ------------------------------------------------------
    def can_swap_in(self, seq_group: Any, num_lookahead_slots: int) -> AllocStatus:
        check_lookahead(num_lookahead_slots)
        return _ALLOC_STATUS[self.swaps.status(seq_group, Device.GPU, SequenceStatus.SWAPPED, num_lookahead_slots)]

    def can_swap_out(self, seq_group: Any) -> bool:
        return _ALLOC_STATUS[self.swaps.status(seq_group, Device.CPU, RUNNING, 0)] == AllocStatus.OK

    def swap_in(self, seq_group: Any) -> list[tuple[int, int]]:
        return self.swaps.move(seq_group, SequenceStatus.SWAPPED, Device.CPU, Device.GPU)

    def swap_out(self, seq_group: Any) -> list[tuple[int, int]]:
        return self.swaps.move(seq_group, RUNNING, Device.GPU, Device.CPU)

    # -- finishing ---------------------------------------------------------------------
    def free(self, seq: Any) -> None:
        """Release the sequence's blocks (stamped with its last access time);
        unknown sequences are ignored."""
        access_time = self._access_times.pop(seq.seq_id, None)
        row = self.rows.unbind(seq.seq_id)
        if row is None:
            return
        self.tracker.forget(seq.seq_id)
        tables = self.store.tables
        tables.accessed[row] = access_time is not None
        tables.last_access[row] = access_time if access_time is not None else P.NEVER_ACCESSED
        self._free_row(row)

    def free_cross(self, seq_group: Any) -> None:
        row = self.rows.unbind_cross(seq_group.request_id)
        if row is not None:
            self._free_row(row)

    def _free_row(self, row: int) -> None:
        self.sync.forget_row(row)
        store = self.store
        kernels.free_table(store.gpu_ref, store.cpu_ref, store.tables_ref, row, self.block_size)
        self.rows.recycle(row)

    # -- tables and counts ---------------------------------------------------------
    def get_block_table(self, seq: Any) -> BlockIds:
        """The table's block ids, read-only: the same object until it changes."""
        ids = self._answers.get(seq.seq_id)
        return ids if ids is not None else self.rows.block_ids(seq)

    def get_cross_block_table(self, seq_group: Any) -> BlockIds:
        if seq_group.request_id not in self.rows.of_cross:
            raise NoCrossTableError(f"group {seq_group.request_id!r} has no cross block table")
        return self.rows.cross_block_ids(seq_group.request_id)

    def get_num_free_gpu_blocks(self) -> int:
        return self.store.num_free_gpu()

    def get_num_free_cpu_blocks(self) -> int:
        return self.store.num_free_cpu()

    # -- prefix caching ------------------------------------------------------------------
    def access_all_blocks_in_seq(self, seq: Any, access_time: float) -> None:
        """Remember when the sequence last ran; its blocks get the time at ``free``."""
        if self.enable_caching:
            seq_id = seq.seq_id
            if seq_id not in self._of_seq:
                self.rows.row(seq)  # raises
            self._access_times[seq_id] = access_time

    def mark_blocks_as_computed(self, seq_group: Any, token_chunk_size: int) -> None:
        """Every block registered since the last call is now computed (the
        arguments are ignored, as in vLLM)."""
        if self.enable_caching and self.store.gpu_view.meta[P.NUM_TOUCHED]:
            kernels.mark_computed(self.store.gpu_ref)

    def get_common_computed_block_ids(self, seqs: list[Any]) -> BlockIds:
        """The longest block-id prefix the sequences' cached prefixes share
        (one sequence: its cached prefix); sequences without cached blocks
        are left out, as in vLLM (spec §9.15)."""
        row = self.rows.row
        if len(seqs) == 1:  # the usual call: one running sequence
            row(seqs[0])
            if not self.enable_caching:
                return EMPTY
            num_cached = self.tracker.num_cached_tokens(seqs[0])
            return self.rows.cached_prefix(seqs[0], num_cached // self.block_size)
        for seq in seqs:
            row(seq)
        if not self.enable_caching:
            return EMPTY
        for seq in seqs:
            self.tracker.check_tokens(seq, seq.get_token_ids())
        prefixes = [self.rows.block_ids(seq)[: self.tracker.num_cached_tokens(seq) // self.block_size] for seq in seqs]
        prefixes = [ids for ids in prefixes if ids]  # vLLM drops sequences without cached blocks
        if not prefixes:
            return EMPTY
        common = prefixes[0]
        for ids in prefixes[1:]:
            length = 0
            while length < min(len(common), len(ids)) and common[length] == ids[length]:
                length += 1
            common = common[:length]
        return BlockIds(common)

    def get_prefix_cache_hit_rate(self, device: Device) -> float:
        handle = self._handle(Device.parse(device))
        return float(kernels.hit_rate(handle)) if self.enable_caching else -1

    def reset_prefix_cache(self, device: Device | None = None) -> bool:
        """Forget every idle cached block of the device(s); False if a block is in use."""
        if device is not None:
            return bool(kernels.reset_pool(self._handle(Device.parse(device))))
        cpu_done = bool(kernels.reset_pool(self.store.cpu_ref))
        gpu_done = bool(kernels.reset_pool(self.store.gpu_ref))  # tried even if the CPU failed (vLLM stops there)
        return cpu_done and gpu_done

    def get_num_cached_tokens(self, seq: Any) -> int:
        return self.tracker.num_cached_tokens(seq) if self.enable_caching else 0

    def remove_seq_from_computed_blocks_tracker(self, seq: Any) -> None:
        if self.enable_caching:
            self.tracker.remove(seq)

    # -- the batched step (fast/batch.py) and the array-level step (fast/rows.py) ---------
    can_append_slots_batch = _part_method("batch", BatchSteps.can_append_slots_batch)
    append_slots_batch = _part_method("batch", BatchSteps.append_slots_batch)
    rows_of = _part_method("arrays", RowSteps.rows_of)
    can_append_slots_rows = _part_method("arrays", RowSteps.can_append_slots_rows)
    append_slots_rows = _part_method("arrays", RowSteps.append_slots_rows)
    block_tables = _part_method("arrays", RowSteps.block_tables)
    block_table_array = _part_method("arrays", RowSteps.block_table_array)
    access_all_blocks_rows = _part_method("arrays", RowSteps.access_all_blocks_rows)
    num_computed_blocks_rows = _part_method("arrays", RowSteps.num_computed_blocks_rows)
    slot_mapping = _part_method("arrays", RowSteps.slot_mapping)
    slot_mapping_array = _part_method("arrays", RowSteps.slot_mapping_array)

    def row_of(self, seq: Any) -> int:
        """The table row of ``seq``, which is also its row in the device block table."""
        return self.rows.row(seq)

    # -- the device block table (docs/gpu.md) -------------------------------------------
    def device_block_table(self, backend: str = "auto", max_seqs: int = 256, max_blocks: int = 64) -> Any:
        """The ``DeviceBlockTable`` this manager keeps in sync through
        ``step_device`` (made, and tracking started, on the first call; the
        arguments only count then)."""
        return self.sync.device(self.block_size, backend, max_seqs, max_blocks)

    def step_device(self, seqs: list[Any], starts: Any, ends: Any, pad_to: int | None = None) -> Any:
        """Bring the device block table up to date with every table change
        since the last call, then return the slots of the step's tokens:
        positions ``starts[i]`` up to ``ends[i]`` of ``seqs[i]`` (see
        ``DeviceBlockTable.step``). Swapped-out sequences must not be scheduled."""
        rows = np.array([self.rows.row(seq) for seq in seqs], np.int64)
        return self.sync.device(self.block_size).step(self.sync.drain(), rows, starts, ends, pad_to)

    def table_delta(self) -> Any:
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
