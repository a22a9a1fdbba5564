"""The fast block manager: the reference's behaviour, call for call, with
its state in NumPy arrays and every change made by a compiled kernel.

This class only checks arguments (the same checks, in the same order, as
``reference/manager.py``, so the same bad input raises the same error before
anything changes), maps sequences and groups to table rows, and converts the
kernels' results. The state:

- ``gpu``, ``cpu``: the blocks of each device (``fast/pool.py``);
- ``keys``: content keys (``fast/content.py``), shared by both devices;
- ``tables``: one row per sequence table and per cross table (``fast/table.py``);
- ``tracker``: one row per sequence the computed-blocks tracker knows (``fast/tracker.py``).

Arrays grow on demand: a kernel that lacks room says so before it changes
anything, the class grows the arrays and calls it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.errors import (
    ChildExistsError,
    DuplicateTableError,
    EmptyTableError,
    InvalidArgumentError,
    NoCrossTableError,
    NoFreeBlocksError,
    TrackerError,
    UnknownSequenceError,
    UnsupportedError,
    WrongDeviceError,
)
from blockspace.fast import pool as P
from blockspace.fast import rules
from blockspace.fast import table as T
from blockspace.fast import tracker as K
from blockspace.fast.batch import BatchedSteps
from blockspace.fast.checks import check_new_tokens, checked_lookahead, checked_token_array, int64_or_none
from blockspace.fast.content import collect_keys, grow_keys, new_keys, remap_keys
from blockspace.fast.dispatch import direct
from blockspace.fast.handles import State
from blockspace.fast.invariants import check_invariants, snapshot
from blockspace.fast.rows import RowSteps
from blockspace.guard import guard_concurrency
from blockspace.interfaces import BlockSpaceManager
from blockspace.validation import cache_salt, check_config, check_encoder_decoder, check_lookahead, waiting_seqs

# The kernels the manager calls, each through its entry point (fast/dispatch.py).
_allocate, _append, _fork, _free_table = direct(T.allocate), direct(T.append), direct(T.fork), direct(T.free)
_swap, _swap_need, _swap_cost = direct(T.swap), direct(T.swap_need), direct(T.swap_cost)
_num_cached_tokens, _open_tracker_row = direct(K.num_cached_tokens), direct(K.open_row)
_mark_computed, _hit_rate, _reset_pool = direct(P.mark_computed), direct(P.hit_rate), direct(P.reset)
_alloc_status, _swap_status = direct(rules.alloc_status), direct(rules.swap_status)  # ints only
_blocks_touched = direct(rules.blocks_touched)
_ALLOC_STATUS = {status.value: status for status in AllocStatus}


class _Memo:
    """The token list a tracker row was keyed from (a copy), its salt and
    adapter ids, and ``int64_or_none`` of the tokens."""

    __slots__ = ("tokens", "root", "extra", "array")

    def __init__(self, tokens: list[int], root: int, extra: int, array: np.ndarray | None) -> None:
        self.tokens, self.root, self.extra, self.array = tokens, root, extra, array

    def matches(self, tokens: Any, root: int, extra: int) -> bool:
        """Are ``tokens`` (and salt and adapters) those keyed, or do they begin with them?"""
        if root != self.root or extra != self.extra:
            return False
        if len(tokens) == len(self.tokens):
            return tokens == self.tokens  # no slice: the usual case, a waiting request
        return tokens[: len(self.tokens)] == self.tokens


@guard_concurrency
class FastBlockSpaceManager(RowSteps, BatchedSteps, BlockSpaceManager):
    """Paged KV-cache blocks for every sequence, on the GPU or swapped to the CPU."""

    # The state, as NamedTuples of arrays; ``_gpu`` etc. are the kernels' handles on them.
    gpu, cpu, keys, tables, tracker = State(), State(), State(), State(), State()

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
        self.max_block_sliding_window = rules.window_blocks(sliding_window, block_size)
        self.watermark = watermark
        self.watermark_blocks = rules.watermark_blocks(watermark, num_gpu_blocks)
        self.enable_caching = bool(enable_caching)

        self.keys = new_keys(block_size)
        self._num_keys_after_collect = -1  # key count right after the last collection
        self.gpu = P.new_pool(0, num_gpu_blocks, self.enable_caching, len(self.keys.parent))
        self.cpu = P.new_pool(num_gpu_blocks, num_cpu_blocks, self.enable_caching, len(self.keys.parent))
        self.tables = T.new_tables()
        self.tracker = K.new_tracker()
        self.null_block = np.full(1, -1, np.int64)  # sliding window: taken at the first append
        self._window = self.max_block_sliding_window is not None
        self._rows: dict[int, int] = {}  # seq_id -> table row
        self._live = np.zeros(self.tables.blocks.shape[0], np.bool_)  # row -> a sequence's table (fast/rows.py)
        self._seen = np.zeros(self.tables.blocks.shape[0], np.int64)  # row -> last batch stamp (duplicate check)
        self._stamp = 0
        self._lists: dict[int, tuple[int, list[int]]] = {}  # row -> (version, block ids), see _table_list
        self._cross_rows: dict[str, int] = {}  # request_id -> table row
        self._free_rows: list[int] = []
        self._num_rows = 0  # rows ever used
        self._tracked: dict[int, int] = {}  # seq_id -> tracker row
        self._free_tracker_rows: list[int] = []
        self._memos: dict[int, _Memo | None] = {}  # tracker row -> the tokens it was keyed from (from 0)
        self._parked: dict[int, tuple[int, _Memo]] = {}  # seq_id -> (row, memo), oldest first
        self._num_tracker_rows = 0
        self._extra_ids: dict[Any, int] = {None: 0}  # extra_hash() -> small int
        self._root_ids: dict[Any, int] = {None: -1}  # cache salt -> negative id (first block's parent)
        self._cow = np.zeros(64, np.int64)  # copy-on-write pairs / swap mappings come back here
        self._info = np.zeros(2, np.int64)
        self._needs = np.zeros(2, np.int64)  # batch_needs: table columns, content keys
        self._status = np.zeros(2, np.int64)  # append_batch: failure code, index
        self._deltas: Any = None  # cuda_tables.DeltaBuffers while a device table is kept in sync
        self._device_table: Any = None
        if track_device_table:
            self._start_tracking()

    # -- rows, arrays, ids ---------------------------------------------------------
    def _row(self, seq: Any) -> int:
        row = self._rows.get(seq.seq_id)
        if row is None:
            raise UnknownSequenceError(f"sequence {seq.seq_id} has no block table")
        return row

    def _bind(self, seq_id: int, row: int) -> None:
        self._rows[seq_id] = row
        self._live[row] = True

    def _take_row(self) -> int:
        if self._free_rows:
            return self._free_rows.pop()
        if self._num_rows == self.tables.blocks.shape[0]:
            self.tables = T.grow_tables(self.tables, num_rows=self._num_rows + 1)
            num_more = self.tables.blocks.shape[0] - len(self._live)
            self._live = np.concatenate([self._live, np.zeros(num_more, np.bool_)])
            self._seen = np.concatenate([self._seen, np.zeros(num_more, np.int64)])
        self._num_rows += 1
        return self._num_rows - 1

    def _take_tracker_row(self) -> int:
        if self._free_tracker_rows:
            row = self._free_tracker_rows.pop()
        else:
            row = self._num_tracker_rows
            self._num_tracker_rows += 1
            if row == self.tracker.keys.shape[0]:
                self.tracker = K.grow_tracker(self.tracker, num_rows=row + 1)
        _open_tracker_row(self._tracker, row)
        return row

    def _extra_id(self, extra: Any) -> int:
        extra_id = self._extra_ids.get(extra)
        if extra_id is None:
            extra_id = self._extra_ids[extra] = len(self._extra_ids)
        return extra_id

    def _root_id(self, seq: Any) -> int:
        """The parent of the sequence's first block key: -1, or its cache salt's id."""
        salt = cache_salt(seq)
        root = self._root_ids.get(salt)
        if root is None:
            root = self._root_ids[salt] = -1 - len(self._root_ids)
        return root

    def _grow_keys(self, num_more: int = 0) -> None:
        """Make room for more content keys: first forget the keys nothing
        names any more (evicted blocks of finished requests), and grow only
        if the live keys still fill half of the table."""
        live = self._live_keys()
        stalled = self.keys.count[0] == self._num_keys_after_collect  # nothing interned since: grow
        if stalled or live.sum() + num_more > len(self.keys.parent) // 2:
            self.keys = grow_keys(self.keys, num_more)
            self.gpu = P.grow_key_index(self.gpu, len(self.keys.parent))
            self.cpu = P.grow_key_index(self.cpu, len(self.keys.parent))
            return
        self.keys, remap = collect_keys(self.keys, live, num_more)
        self._num_keys_after_collect = int(self.keys.count[0])
        remap_keys(self.tables.keys, remap)
        remap_keys(self.tracker.keys, remap)
        self.gpu = self._remapped_pool(self.gpu, remap)
        self.cpu = self._remapped_pool(self.cpu, remap)

    def _live_keys(self) -> np.ndarray:
        """Keys named by a cached block, a table entry or a tracker row."""
        live = np.zeros(int(self.keys.count[0]), np.bool_)
        for pool in (self.gpu, self.cpu):
            live[pool.block_key[pool.block_key >= 0]] = True
        for stored, lengths, num_rows in (
            (self.tables.keys, self.tables.num_blocks, self._num_rows),
            (self.tracker.keys, self.tracker.num_keys, self._num_tracker_rows),
        ):
            in_row = np.arange(stored.shape[1])[None, :] < lengths[:num_rows, None]
            named = stored[:num_rows][in_row]
            live[named[named >= 0]] = True
        return live

    def _remapped_pool(self, pool: P.Pool, remap: np.ndarray) -> P.Pool:
        remap_keys(pool.block_key, remap)
        key_block = np.full(len(self.keys.parent), -1, np.int64)
        cached = np.flatnonzero(pool.block_key >= 0)
        key_block[pool.block_key[cached]] = cached + pool.meta[P.FIRST_ID]
        return pool._replace(key_block=key_block)

    def _grow_columns(self) -> None:
        self.tables = T.grow_tables(self.tables, num_cols=2 * self.tables.blocks.shape[1])

    def _grow_tracker_columns(self) -> None:
        self.tracker = K.grow_tracker(self.tracker, num_cols=2 * self.tracker.keys.shape[1])

    def _scratch(self, num_values: int) -> np.ndarray:
        if len(self._cow) < num_values:
            self._cow = np.zeros(2 * num_values, np.int64)
        return self._cow

    def _grew(self, result: int, grow_columns: Callable[[], None] | None = None) -> bool:
        """Grow the arrays a kernel asked for (False: it did not ask)."""
        if result == T.NO_ROOM:
            (grow_columns or self._grow_columns)()
        elif result == T.NO_KEY_ROOM:
            self._grow_keys()
        else:
            return False
        return True

    def _retry(self, call: Callable[[], int], grow_columns: Callable[[], None] | None = None) -> int:
        """Run a kernel, growing the arrays it asks for, until it has room."""
        while True:
            result = call()
            if not self._grew(result, grow_columns):
                return int(result)

    def _pool(self, device: Device) -> P.Pool:
        return self.gpu if device == Device.GPU else self.cpu

    def _handle(self, device: Device) -> Any:
        return self._gpu if device == Device.GPU else self._cpu

    @staticmethod
    def _num_free(pool: P.Pool) -> int:
        """``pool.num_free`` for Python callers (one read instead of a kernel call)."""
        return pool.meta.item(P.NUM_FREE_IDS) + pool.meta.item(P.NUM_IDLE)

    @staticmethod
    def _pairs(values: np.ndarray, count: int) -> list[tuple[int, int]]:
        flat = values[: 2 * count].tolist()
        return list(zip(flat[0::2], flat[1::2]))

    # -- admission ---------------------------------------------------------------
    def can_allocate(self, seq_group: Any, num_lookahead_slots: int = 0) -> AllocStatus:
        check_lookahead(num_lookahead_slots)
        check_encoder_decoder(seq_group, self.sliding_window, self.enable_caching)
        seq = waiting_seqs(seq_group)[0]
        encoder = seq_group.get_encoder_seq() if seq_group.is_encoder_decoder() else None
        need = rules.blocks_for_prompt(  # the window may be None: through the dispatcher
            len(seq.get_token_ids()),
            num_lookahead_slots,
            len(encoder.get_token_ids()) if encoder is not None else 0,
            self.block_size,
            self.max_block_sliding_window,
        )
        status = _alloc_status(self.num_total_gpu_blocks, self._num_free(self.gpu), need, self.watermark_blocks)
        return _ALLOC_STATUS[status]

    def allocate(self, seq_group: Any) -> None:
        """One table for the first WAITING sequence; the others share it."""
        waiting = waiting_seqs(seq_group)
        seq_ids = [seq.seq_id for seq in waiting]
        if len(set(seq_ids)) != len(seq_ids) or any(i in self._rows for i in seq_ids):
            raise DuplicateTableError(f"block table already exists for a sequence of group {seq_group.request_id!r}")
        first = waiting[0]
        token_list = first.get_token_ids()
        memo = self._memo(first, token_list)
        tokens = checked_token_array(first, token_list, known=memo.array if memo is not None else None)
        if not len(tokens) and len(waiting) > 1:
            raise EmptyTableError("an empty prompt cannot be shared by several WAITING sequences")
        encoder = None
        encoder_tokens = T.NO_TOKENS
        if seq_group.is_encoder_decoder():
            if seq_group.request_id in self._cross_rows:
                raise DuplicateTableError(f"cross block table already exists for group {seq_group.request_id!r}")
            check_encoder_decoder(seq_group, self.sliding_window, self.enable_caching)
            encoder = seq_group.get_encoder_seq()
        extra = self._extra_id(first.extra_hash())
        root = self._root_id(first)
        keyed = T.NO_TOKENS  # the prompt's block keys, if the tracker made them from the same content
        if memo is not None and memo.root == root and memo.extra == extra:
            keyed = self.tracker.keys[self._tracked[first.seq_id], : len(tokens) // self.block_size]
        if encoder is not None:
            encoder_tokens = checked_token_array(encoder, encoder.get_token_ids())
        rows = [self._take_row() for _ in range(len(waiting) + (encoder is not None))]
        cross_row = rows.pop() if encoder is not None else -1
        encoder_extra = self._extra_id(encoder.extra_hash()) if encoder is not None else 0
        fork_rows = np.array(rows[1:], np.int64)
        result = self._retry(
            lambda: _allocate(
                self._gpu, self._keys, self._tables, rows[0], tokens, extra, root, keyed,
                fork_rows, cross_row, encoder_tokens, encoder_extra, self._info,
            )
        )  # fmt: skip
        if result == T.NO_BLOCKS:
            self._free_rows += rows[::-1] + ([cross_row] if cross_row >= 0 else [])
            raise NoFreeBlocksError(
                f"allocate needs {int(self._info[0])} GPU blocks, {self._num_free(self.gpu)} are free"
            )
        for seq, row in zip(waiting, rows):
            self._bind(seq.seq_id, row)
        if encoder is not None:
            self._cross_rows[seq_group.request_id] = cross_row

    # -- decode ----------------------------------------------------------------------
    def can_append_slots(self, seq_group: Any, num_lookahead_slots: int) -> bool:
        checked_lookahead(num_lookahead_slots)
        seqs = seq_group.get_seqs(status=SequenceStatus.RUNNING)
        rows = [self._row(seq) for seq in seqs]
        num_filled = self.tables.num_filled
        touched = 0
        for seq, row in zip(seqs, rows):
            filled = num_filled.item(row)
            unseen = max(0, len(seq.get_token_ids()) - filled)
            touched += _blocks_touched(filled, unseen, num_lookahead_slots, self.block_size)
        return touched <= self._num_free(self.gpu)

    def _check_appendable(self, seq: Any) -> tuple[int, int, list[int]]:
        """The reference's checks before an append; returns (row, num_filled, tokens)."""
        row = self._row(seq)
        tables = self.tables
        if tables.num_blocks.item(row) == 0:
            raise EmptyTableError(f"sequence {seq.seq_id} has no blocks to append to")
        if tables.device.item(row) != T.GPU:
            raise WrongDeviceError(f"sequence {seq.seq_id} is swapped out; swap it in before appending")
        tokens = seq.get_token_ids()
        num_filled = tables.num_filled.item(row)
        if len(tokens) < num_filled:
            raise InvalidArgumentError(f"sequence {seq.seq_id} has fewer tokens than its block table holds")
        check_new_tokens(seq, tokens, num_filled)
        return row, num_filled, tokens

    def _append_args(self, seq: Any, num_filled: int, tokens: list[int]) -> tuple[np.ndarray, int, int]:
        """What the append kernel needs besides the row: the token ids from the
        start of the last block (caching only), the drops, the extra id."""
        extra = self._extra_id(seq.extra_hash()) if self.enable_caching else 0  # extras only key content
        num_drops = 0
        if self._window:
            computed = seq.data.get_num_computed_tokens()
            num_drops = rules.num_blocks_to_drop(computed, self.block_size, self.max_block_sliding_window)
        start = num_filled - num_filled % self.block_size
        if self.enable_caching and len(tokens) - start >= self.block_size:  # a block fills up: key it
            array = np.array(tokens[start:], np.int64)
        else:
            array = T.NO_TOKENS
        return array, num_drops, extra

    def append_slots(self, seq: Any, num_lookahead_slots: int) -> list[tuple[int, int]]:
        """Room for the sequence's new tokens plus lookahead slots; returns
        the copy-on-write pairs ``(src, dst)`` the worker must copy."""
        checked_lookahead(num_lookahead_slots)
        row, num_filled, tokens = self._check_appendable(seq)
        array, num_drops, extra = self._append_args(seq, num_filled, tokens)
        num_new = len(tokens) - num_filled
        cow = self._scratch(2 * (num_new // self.block_size + 2))
        while True:
            result = _append(
                self._gpu, self._keys, self._tables, row, array, num_new, num_lookahead_slots,
                num_drops, extra, self._window, self.null_block, cow, 0,
            )  # fmt: skip
            if not self._grew(result):
                break
        if result in T.SHORTAGE:
            raise NoFreeBlocksError(f"append_slots needs a free GPU block for {T.SHORTAGE[result]}; none is left")
        return self._pairs(cow, result) if result else []

    def fork(self, parent_seq: Any, child_seq: Any) -> None:
        """The child shares every block of the parent (copy-on-write later)."""
        parent = self._rows.get(parent_seq.seq_id)
        if parent is None:
            return
        if self.tables.num_blocks[parent] == 0:
            raise EmptyTableError(f"sequence {parent_seq.seq_id} has no blocks to fork")
        if child_seq.seq_id in self._rows:
            raise ChildExistsError(f"fork onto sequence {child_seq.seq_id}, which already has a block table")
        if self.tables.num_null[parent] > 0:
            raise UnsupportedError("fork of a sliding-window table after blocks were dropped")
        child = self._take_row()
        pool = self._gpu if self.tables.device[parent] == T.GPU else self._cpu
        _fork(pool, self._tables, parent, child)
        self._bind(child_seq.seq_id, child)

    # -- swapping ------------------------------------------------------------------
    def _swap_status(
        self, seq_group: Any, device: Device, status: SequenceStatus, num_lookahead_slots: int
    ) -> AllocStatus:
        seqs = seq_group.get_seqs(status=status)
        rows = np.array([self._row(seq) for seq in seqs], np.int64)
        num_tokens = np.array([len(seq.get_token_ids()) for seq in seqs], np.int64)
        pool = self._pool(device)
        need = _swap_need(self._handle(device), self._tables, rows, num_tokens, num_lookahead_slots, self.block_size)
        watermark = self.watermark_blocks if device == Device.GPU else 0
        total = self.num_total_gpu_blocks if device == Device.GPU else self.num_total_cpu_blocks
        return _ALLOC_STATUS[_swap_status(total, self._num_free(pool), need, watermark)]

    def can_swap_in(self, seq_group: Any, num_lookahead_slots: int) -> AllocStatus:
        check_lookahead(num_lookahead_slots)
        return self._swap_status(seq_group, Device.GPU, SequenceStatus.SWAPPED, num_lookahead_slots)

    def can_swap_out(self, seq_group: Any) -> bool:
        return self._swap_status(seq_group, Device.CPU, SequenceStatus.RUNNING, 0) == AllocStatus.OK

    def swap_in(self, seq_group: Any) -> list[tuple[int, int]]:
        return self._swap(seq_group, SequenceStatus.SWAPPED, Device.CPU, Device.GPU)

    def swap_out(self, seq_group: Any) -> list[tuple[int, int]]:
        return self._swap(seq_group, SequenceStatus.RUNNING, Device.GPU, Device.CPU)

    def _swap(
        self, seq_group: Any, status: SequenceStatus, source: Device, destination: Device
    ) -> list[tuple[int, int]]:
        """Move the tables of the group's ``status`` sequences; returns the
        ``(source, destination)`` physical-id pairs, sequence by sequence."""
        rows = [self._row(seq) for seq in seq_group.get_seqs(status=status)]
        rows = [row for row in rows if self.tables.num_blocks[row] > 0]
        source_code = T.GPU if source == Device.GPU else T.CPU
        for row in rows:
            if self.tables.device[row] != source_code:
                raise WrongDeviceError(
                    f"a {status.name} sequence of group {seq_group.request_id!r} is not on the {source.name}"
                )
            if self.tables.num_null[row] > 0:
                raise UnsupportedError("swap of a sliding-window table after blocks were dropped")
        rows_array = np.array(rows, np.int64)
        mapping = self._scratch(2 * int(self.tables.num_blocks[rows_array].sum()))
        destination_pool = self._pool(destination)
        count = _swap(
            self._handle(source), self._handle(destination), self._tables, rows_array, 1 - source_code,
            self.block_size, mapping,
        )  # fmt: skip
        if count == T.NO_BLOCKS:
            need = _swap_cost(
                self._handle(destination), self._tables, rows_array, self.block_size
            )  # as before the call
            raise NoFreeBlocksError(
                f"swap needs {need} {destination.name} blocks, {self._num_free(destination_pool)} are free"
            )
        return self._pairs(mapping, count)

    # -- finishing ---------------------------------------------------------------------
    def free(self, seq: Any) -> None:
        """Release the sequence's blocks; unknown sequences are ignored."""
        row = self._rows.pop(seq.seq_id, None)
        if row is None:
            return
        self._live[row] = False
        tracked = self._tracked.pop(seq.seq_id, None)
        if tracked is not None:
            self._memos.pop(tracked, None)
            self._free_tracker_rows.append(tracked)
        self._drop_parked(seq.seq_id)
        self._forget_row(row)
        _free_table(self._gpu, self._cpu, self._tables, row, self.block_size)
        self._lists.pop(row, None)
        self._free_rows.append(row)

    def free_cross(self, seq_group: Any) -> None:
        row = self._cross_rows.pop(seq_group.request_id, None)
        if row is not None:
            self._forget_row(row)
            _free_table(self._gpu, self._cpu, self._tables, row, self.block_size)
            self._lists.pop(row, None)
            self._free_rows.append(row)

    # -- the device block table (docs/gpu.md) -------------------------------------------
    def row_of(self, seq: Any) -> int:
        """The table row of ``seq``, which is also its row in the device block table."""
        return self._row(seq)

    def device_block_table(self, backend: str = "auto", max_seqs: int = 256, max_blocks: int = 64) -> Any:
        """The ``DeviceBlockTable`` this manager keeps in sync through
        ``step_device`` (made, and tracking started, on the first call; the
        arguments only count then)."""
        return self._device(backend, max_seqs, max_blocks)

    def step_device(self, seqs: list[Any], starts: Any, ends: Any, pad_to: int | None = None) -> Any:
        """Bring the device block table up to date with every table change
        since the last call, then return the slots of the step's tokens:
        positions ``starts[i]`` up to ``ends[i]`` of ``seqs[i]`` (see
        ``DeviceBlockTable.step``). Swapped-out sequences must not be scheduled."""
        rows = np.array([self._row(seq) for seq in seqs], np.int64)
        return self._device().step(self._drain_deltas(), rows, starts, ends, pad_to)

    def table_delta(self) -> Any:
        """The table changes since the last call as a ``TableDelta``, for a
        ``DeviceBlockTable`` kept by the caller (starts tracking on the first
        call: that delta holds every live table)."""
        return self._drain_deltas()

    def _device(self, backend: str = "auto", max_seqs: int = 256, max_blocks: int = 64) -> Any:
        if self._device_table is None:
            from blockspace.fast.cuda_tables import DeviceBlockTable

            self._device_table = DeviceBlockTable(self.block_size, max_seqs, max_blocks, backend)
        return self._device_table

    def _start_tracking(self) -> None:
        """Start logging block writes, with every live table as the first delta."""
        if self._deltas is not None:
            return
        from blockspace.fast.cuda_tables import new_delta_buffers

        self._deltas = new_delta_buffers(max(self._num_rows, 1), self.tables.blocks.shape[1])
        self._resync(log_capacity=1024)

    def _resync(self, log_capacity: int) -> None:
        """Record every row in use in full and clear the others (tracking starts,
        or the write log overflowed), with an empty log of ``log_capacity``."""
        from blockspace.fast.cuda_tables import deltas_clear_row, deltas_copy_row

        live = set(self._rows.values()) | set(self._cross_rows.values())
        buffers = self._deltas
        for row in range(self._num_rows):
            if row in live:
                buffers = deltas_copy_row(buffers, row, self.tables.blocks[row, : self.tables.num_blocks[row]])
            elif row < len(buffers.lengths):
                buffers = deltas_clear_row(buffers, row)
        self._deltas = buffers
        self.tables = self.tables._replace(log=np.zeros((log_capacity, 2), np.int32), num_logged=np.zeros(1, np.int64))

    def _flush_log(self) -> None:
        from blockspace.fast.cuda_tables import flush_table_log

        self._deltas, flushed = flush_table_log(self._tables, self._deltas)
        if not flushed:
            self._resync(log_capacity=2 * len(self.tables.log))

    def _forget_row(self, row: int) -> None:
        """A table is freed: its row empties on the device too."""
        if self._deltas is not None:
            from blockspace.fast.cuda_tables import deltas_clear_row

            self._flush_log()
            self._deltas = deltas_clear_row(self._deltas, row)

    def _drain_deltas(self) -> Any:
        from blockspace.fast.cuda_tables import TableDelta, deltas_drain

        self._start_tracking()
        self._flush_log()
        num_rows, num_cols = self._deltas.table.shape
        return TableDelta(*deltas_drain(self._deltas), num_rows, num_cols)

    # -- tables and counts ---------------------------------------------------------
    def _table_list(self, row: int) -> list[int]:
        """The row's block ids as a list, converted once per version of the
        row (decode changes a table once a block: most calls reuse it). Not
        for callers to keep: they get copies."""
        version = self.tables.version.item(row)
        known = self._lists.get(row)
        if known is not None and known[0] == version:
            return known[1]
        ids = self.tables.blocks[row, : self.tables.num_blocks.item(row)].tolist()
        self._lists[row] = (version, ids)
        return ids

    def _block_ids(self, row: int) -> list[int]:
        return self._table_list(row)[:]

    def get_block_table(self, seq: Any) -> list[int]:
        return self._block_ids(self._row(seq))

    def get_cross_block_table(self, seq_group: Any) -> list[int]:
        row = self._cross_rows.get(seq_group.request_id)
        if row is None:
            raise NoCrossTableError(f"group {seq_group.request_id!r} has no cross block table")
        return self._block_ids(row)

    def get_num_free_gpu_blocks(self) -> int:
        return self._num_free(self.gpu)

    def get_num_free_cpu_blocks(self) -> int:
        return self._num_free(self.cpu)

    # -- prefix caching ------------------------------------------------------------------
    def access_all_blocks_in_seq(self, seq: Any, access_time: float) -> None:
        """Remember when the sequence last ran; its blocks get the time at ``free``."""
        if self.enable_caching:
            row = self._row(seq)
            self.tables.accessed[row] = access_time is not None
            if access_time is not None:
                self.tables.last_access[row] = access_time

    def mark_blocks_as_computed(self, seq_group: Any, token_chunk_size: int) -> None:
        """Every block registered since the last call is now computed (the
        arguments are ignored, as in vLLM)."""
        if self.enable_caching and self.gpu.meta.item(P.NUM_TOUCHED):
            _mark_computed(self._gpu)

    def _keyed(self, seq: Any, tokens: Any) -> tuple[int | None, int]:
        """The sequence's tracker row (None: not tracked) and number of keyed
        blocks, after the reference's check that its tokens did not shrink."""
        row = self._tracked.get(seq.seq_id)
        known = 0 if row is None else self.tracker.num_keys.item(row)
        if len(tokens) < known * self.block_size:
            raise TrackerError(
                f"sequence {seq.seq_id} has {len(tokens)} tokens, fewer than the "
                f"{known * self.block_size} the tracker already keyed"
            )
        return row, known

    def _num_cached_tokens(self, seq: Any) -> int:
        tokens = seq.get_token_ids()
        row, known = self._keyed(seq, tokens)
        frozen = row is not None and seq.is_prefill()
        root, extra = self._root_id(seq), self._extra_id(seq.extra_hash())
        if row is None:
            row, known = self._unpark(seq.seq_id, tokens, root, extra)
        num_full = len(tokens) // self.block_size
        memo = None
        if num_full > known == 0:  # keyed from the start: remember the tokens (parking, allocate)
            memo = _Memo(tokens[:], root, extra, int64_or_none(tokens))
            if memo.array is None:  # not all ints: convert as before (allocate will check them)
                array = np.array(tokens[: num_full * self.block_size], np.int64).reshape(-1)
            else:
                array = memo.array[: num_full * self.block_size]
        elif num_full > known:
            array = np.array(tokens[known * self.block_size : num_full * self.block_size], np.int64).reshape(-1)
        else:  # no new block to key
            array = T.NO_TOKENS
        if row is None:
            row = self._take_tracker_row()
        while True:
            count = _num_cached_tokens(self._gpu, self._keys, self._tracker, row, array, num_full, extra, root, frozen)
            if not self._grew(count, self._grow_tracker_columns):
                break
        self._tracked[seq.seq_id] = row
        if num_full > known:
            self._memos[row] = memo
        return int(count)

    # A waiting request that cannot be admitted yet is keyed, dropped from the
    # tracker and keyed again at every scheduler step (vLLM v0's admission
    # loop). Its tokens do not change meanwhile, so a dropped row is parked
    # with a copy of the token list it was keyed from: if the next query
    # brings the same tokens (compared in full, a C loop far cheaper than
    # converting them again), the row's keys are exactly those a fresh keying
    # would make, and the row comes back instead. Only the last few are kept.
    # ``allocate`` of a sequence whose row still has its memo takes the
    # converted tokens from it after the same comparison.
    MAX_PARKED_ROWS = 64

    def _park(self, seq_id: int, row: int) -> None:
        memo = self._memos.pop(row, None)
        if memo is None:
            self._free_tracker_rows.append(row)
            return
        self._parked[seq_id] = (row, memo)
        if len(self._parked) > self.MAX_PARKED_ROWS:
            self._drop_parked(next(iter(self._parked)))

    def _drop_parked(self, seq_id: int) -> None:
        entry = self._parked.pop(seq_id, None)
        if entry is not None:
            self._free_tracker_rows.append(entry[0])

    def _unpark(self, seq_id: int, tokens: Any, root: int, extra: int) -> tuple[int | None, int]:
        """The parked row of ``seq_id`` and its number of keys, if it was keyed
        from these very tokens (and salt and adapters); else (None, 0)."""
        entry = self._parked.pop(seq_id, None)
        if entry is None:
            return None, 0
        row, memo = entry
        if memo.matches(tokens, root, extra):
            self._memos[row] = memo
            return row, self.tracker.num_keys.item(row)
        self._free_tracker_rows.append(row)
        return None, 0

    def _memo(self, seq: Any, tokens: list[int]) -> _Memo | None:
        """The memo of the sequence's tracker row, if that row was keyed from
        these very tokens (so ``allocate`` takes their conversion and keys)."""
        row = self._tracked.get(seq.seq_id)
        memo = self._memos.get(row) if row is not None else None
        if memo is None or len(tokens) != len(memo.tokens) or tokens != memo.tokens:
            return None
        return memo

    def get_common_computed_block_ids(self, seqs: list[Any]) -> list[int]:
        rows = [self._row(seq) for seq in seqs]
        if not self.enable_caching:
            return []
        for seq in seqs:
            self._keyed(seq, seq.get_token_ids())
        prefixes = [
            self._table_list(row)[: self._num_cached_tokens(seq) // self.block_size] for seq, row in zip(seqs, rows)
        ]
        if len(prefixes) == 1:
            return prefixes[0]
        prefixes = [ids for ids in prefixes if ids]  # vLLM drops sequences without cached blocks
        if not prefixes:
            return []
        common = prefixes[0]
        for ids in prefixes[1:]:
            length = 0
            while length < min(len(common), len(ids)) and common[length] == ids[length]:
                length += 1
            common = common[:length]
        return common

    def get_prefix_cache_hit_rate(self, device: Device) -> float:
        handle = self._handle(Device.parse(device))
        return float(_hit_rate(handle)) if self.enable_caching else -1

    def reset_prefix_cache(self, device: Device | None = None) -> bool:
        """Forget every idle cached block of the device(s); False if a block is in use."""
        if device is not None:
            return bool(_reset_pool(self._handle(Device.parse(device))))
        cpu_done = bool(_reset_pool(self._cpu))
        gpu_done = bool(_reset_pool(self._gpu))  # tried even if the CPU failed (vLLM stops there)
        return cpu_done and gpu_done

    def get_num_cached_tokens(self, seq: Any) -> int:
        return self._num_cached_tokens(seq) if self.enable_caching else 0

    def remove_seq_from_computed_blocks_tracker(self, seq: Any) -> None:
        if not self.enable_caching:
            return
        row = self._tracked.pop(seq.seq_id, None)
        if row is None:
            raise TrackerError(f"sequence {seq.seq_id} is not in the computed-blocks tracker (query it first)")
        self._park(seq.seq_id, row)

    # -- introspection --------------------------------------------------------------------
    def check_invariants(self) -> None:
        check_invariants(self)

    def snapshot(self) -> dict[str, Any]:
        return snapshot(self)
