"""The reference block manager: vLLM 0.9.2's ``SelfAttnBlockSpaceManager``
behaviour (spec ``semantics.md``), written to be read beside the spec.

Policy (spec §14): every deterministic quirk a scheduler can observe is
reproduced; crashes, half-done operations and nondeterminism are not. Each
method checks its input and what it will need before it changes anything,
so an error leaves the manager exactly as it was.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

from blockspace.block_ids import EMPTY, BlockIds, common_prefix
from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.errors import (
    ChildExistsError,
    DuplicateTableError,
    EmptyTableError,
    InvalidArgumentError,
    NoCrossTableError,
    NoFreeBlocksError,
    UnsupportedError,
    WrongDeviceError,
)
from blockspace.guard import BUSY, guard_concurrency
from blockspace.interfaces import BlockSpaceManager
from blockspace.protocols import SequenceGroupLike, SequenceLike
from blockspace.reference import rules
from blockspace.reference.allocator import BlockAllocator, CachingAllocator
from blockspace.reference.content import ContentKeys
from blockspace.reference.invariants import check_invariants, snapshot
from blockspace.reference.table import AppendPlan, BlockTable
from blockspace.reference.tracker import ComputedBlocksTracker
from blockspace.saved_state import SavedState, config_of
from blockspace.validation import (
    check_config,
    check_encoder_decoder,
    check_lookahead,
    check_saved,
    check_token_ids,
    group_salt,
    token_ids,
    unknown_sequence,
    waiting_seqs,
)


@guard_concurrency
class ReferenceBlockSpaceManager(BlockSpaceManager):
    """Paged KV-cache blocks for every sequence, on the GPU or swapped to the CPU."""

    def __init__(
        self,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        watermark: float = 0.01,
        sliding_window: int | None = None,
        enable_caching: bool = False,
    ) -> None:
        check_config(block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window, enable_caching)
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        self.sliding_window = sliding_window
        self.max_block_sliding_window = rules.window_blocks(sliding_window, block_size)
        self.watermark = watermark
        self.watermark_blocks = rules.watermark_blocks(watermark, num_gpu_blocks)
        self.enable_caching = enable_caching

        allocator = CachingAllocator if enable_caching else BlockAllocator
        self.gpu = allocator(Device.GPU, 0, num_gpu_blocks)
        self.cpu = allocator(Device.CPU, num_gpu_blocks, num_cpu_blocks)
        self.content_keys: ContentKeys | None = ContentKeys() if enable_caching else None
        self.tracker = (
            ComputedBlocksTracker(block_size, self.content_keys, self.gpu.is_cached_and_computed)
            if self.content_keys is not None
            else None
        )
        self.block_tables: dict[int, BlockTable] = {}
        self.cross_block_tables: dict[str, BlockTable] = {}
        self.null_block_id: int | None = None  # sliding window: taken at the first append

    # -- helpers ---------------------------------------------------------------
    def _allocator(self, device: Device) -> BlockAllocator:
        return self.gpu if device == Device.GPU else self.cpu

    def _table(self, seq: SequenceLike) -> BlockTable:
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            raise unknown_sequence(seq.seq_id)
        return table

    def _unseen(self, seq: SequenceLike, table: BlockTable) -> int:
        return max(0, len(seq.get_token_ids()) - table.num_filled)

    # -- admission ---------------------------------------------------------------
    def can_allocate(self, seq_group: SequenceGroupLike, num_lookahead_slots: int = 0) -> AllocStatus:
        check_lookahead(num_lookahead_slots)
        check_encoder_decoder(seq_group, self.sliding_window, self.enable_caching)
        seq = waiting_seqs(seq_group)[0]
        encoder = seq_group.get_encoder_seq() if seq_group.is_encoder_decoder() else None
        need = rules.blocks_for_prompt(
            len(seq.get_token_ids()),
            num_lookahead_slots,
            len(encoder.get_token_ids()) if encoder is not None else 0,
            self.block_size,
            self.max_block_sliding_window,
        )
        return rules.alloc_status(self.num_total_gpu_blocks, self.gpu.num_free, need, self.watermark_blocks)

    def allocate(self, seq_group: SequenceGroupLike) -> None:
        """One table for the first WAITING sequence; the others share it."""
        waiting = waiting_seqs(seq_group)
        seq_ids = [seq.seq_id for seq in waiting]
        if len(set(seq_ids)) != len(seq_ids) or any(i in self.block_tables for i in seq_ids):
            raise DuplicateTableError(f"block table already exists for a sequence of group {seq_group.request_id!r}")
        first = waiting[0]
        tokens = token_ids(first)
        if not tokens and len(waiting) > 1:
            raise EmptyTableError("an empty prompt cannot be shared by several WAITING sequences")
        encoder = None
        if seq_group.is_encoder_decoder():
            if seq_group.request_id in self.cross_block_tables:
                raise DuplicateTableError(f"cross block table already exists for group {seq_group.request_id!r}")
            check_encoder_decoder(seq_group, self.sliding_window, self.enable_caching)
            encoder = seq_group.get_encoder_seq()
        extra = first.extra_hash()
        table = BlockTable(
            self.block_size,
            root=ContentKeys.root(
                group_salt(seq_group, self.tracker.is_tracked if self.tracker else lambda seq_id: False)
            ),
        )
        chunk_keys = table.prompt_keys(tokens, extra, self.content_keys)
        need = table.cost_allocate(tokens, chunk_keys, self.gpu)
        if encoder is not None:
            need += rules.cdiv(len(token_ids(encoder)), self.block_size)
        if need > self.gpu.num_free:
            raise NoFreeBlocksError(f"allocate needs {need} GPU blocks, {self.gpu.num_free} are free")

        table.allocate(tokens, extra, chunk_keys, self.gpu)
        self.block_tables[first.seq_id] = table
        for seq in waiting[1:]:
            self.block_tables[seq.seq_id] = table.fork(self.gpu)
        if encoder is not None:
            cross = BlockTable(self.block_size)
            encoder_tokens = token_ids(encoder)
            cross.allocate(
                encoder_tokens, encoder.extra_hash(), cross.prompt_keys(encoder_tokens, None, None), self.gpu
            )
            self.cross_block_tables[seq_group.request_id] = cross

    # -- decode ----------------------------------------------------------------------
    def can_append_slots(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> bool:
        check_lookahead(num_lookahead_slots)
        seqs = seq_group.get_seqs(status=SequenceStatus.RUNNING)
        tables = [self._table(seq) for seq in seqs]
        touched = sum(
            rules.blocks_touched(t.num_filled, self._unseen(s, t), num_lookahead_slots, self.block_size)
            for s, t in zip(seqs, tables)
        )
        return touched <= self.gpu.num_free

    def append_slots(self, seq: SequenceLike, num_lookahead_slots: int) -> list[tuple[int, int]]:
        """Room for the sequence's new tokens plus lookahead slots; returns
        the copy-on-write pairs ``(src, dst)`` the worker must copy."""
        check_lookahead(num_lookahead_slots)
        table = self._table(seq)
        if not table.entries:
            raise EmptyTableError(f"sequence {seq.seq_id} has no blocks to append to")
        if table.device != Device.GPU:
            raise WrongDeviceError(f"sequence {seq.seq_id} is swapped out; swap it in before appending")
        tokens = seq.get_token_ids()
        if len(tokens) < table.num_filled:
            raise InvalidArgumentError(f"sequence {seq.seq_id} has fewer tokens than its block table holds")
        check_token_ids(seq, tokens, table.num_filled)
        extra = seq.extra_hash()
        num_drops = 0
        if self.max_block_sliding_window is not None:
            computed = seq.data.get_num_computed_tokens()
            num_drops = rules.num_blocks_to_drop(computed, self.block_size, self.max_block_sliding_window)
        new_tokens = tokens[table.num_filled :]
        plan = table.plan_append(new_tokens, num_lookahead_slots, num_drops, extra, self.content_keys)
        self._check_append_fits(table, plan)

        if self.max_block_sliding_window is not None and self.null_block_id is None:
            self.null_block_id = self.gpu.take()
        return table.append(plan, new_tokens, extra, self.gpu, self.null_block_id)

    def _check_append_fits(self, table: BlockTable, plan: AppendPlan) -> None:
        """Walk the plan's block traffic in order (null block, drops, new
        blocks, per write: copy-on-write then promotion) and fail if any
        step would take a block when none is free."""
        free = self.gpu.num_free

        def take(why: str) -> None:
            nonlocal free
            if free == 0:
                raise NoFreeBlocksError(f"append_slots needs a free GPU block for {why}; none is left")
            free -= 1

        if self.max_block_sliding_window is not None and self.null_block_id is None:
            take("the sliding-window null block")
        free += sum(1 for index in plan.drops if self.gpu.refs(table.entries[index].block_id) == 1)
        for _ in range(plan.num_new_blocks):
            take("a new block")
        for index, _, key in plan.writes:
            if index < len(table.entries) and self.gpu.refs(table.entries[index].block_id) > 1:
                take("a copy-on-write")
            if key is not None:
                free += self.gpu.promote_gain(key)

    def fork(self, parent_seq: SequenceLike, child_seq: SequenceLike) -> None:
        """The child shares every block of the parent (copy-on-write later)."""
        parent = self.block_tables.get(parent_seq.seq_id)
        if parent is None:
            return
        if not parent.entries:
            raise EmptyTableError(f"sequence {parent_seq.seq_id} has no blocks to fork")
        if child_seq.seq_id in self.block_tables:
            raise ChildExistsError(f"fork onto sequence {child_seq.seq_id}, which already has a block table")
        if parent.has_dropped_blocks:
            raise UnsupportedError("fork of a sliding-window table after blocks were dropped")
        self.block_tables[child_seq.seq_id] = parent.fork(self._allocator(parent.device))

    # -- swapping ------------------------------------------------------------------
    def _swap_need(
        self, seq_group: SequenceGroupLike, device: Device, status: SequenceStatus, num_lookahead_slots: int
    ) -> int:
        """Blocks a swap to ``device`` is estimated to need (spec §9.6)."""
        allocator = self._allocator(device)
        need = 0
        for seq in seq_group.get_seqs(status=status):
            table = self._table(seq)
            need += rules.blocks_touched(
                table.num_filled, self._unseen(seq, table), num_lookahead_slots, self.block_size
            )
            for entry in table.entries:
                if table.is_full(entry) and not entry.is_null and not allocator.is_in_use_cached(entry.key):
                    need += 1
        return need

    def _swap_status(
        self, seq_group: SequenceGroupLike, device: Device, status: SequenceStatus, num_lookahead_slots: int
    ) -> AllocStatus:
        allocator = self._allocator(device)
        need = self._swap_need(seq_group, device, status, num_lookahead_slots)
        watermark = self.watermark_blocks if device == Device.GPU else 0
        return rules.swap_status(allocator.num_blocks, allocator.num_free, need, watermark)

    def can_swap_in(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> AllocStatus:
        check_lookahead(num_lookahead_slots)
        return self._swap_status(seq_group, Device.GPU, SequenceStatus.SWAPPED, num_lookahead_slots)

    def can_swap_out(self, seq_group: SequenceGroupLike) -> bool:
        return self._swap_status(seq_group, Device.CPU, SequenceStatus.RUNNING, 0) == AllocStatus.OK

    def swap_in(self, seq_group: SequenceGroupLike) -> list[tuple[int, int]]:
        return self._swap(seq_group, SequenceStatus.SWAPPED, self.cpu, self.gpu)

    def swap_out(self, seq_group: SequenceGroupLike) -> list[tuple[int, int]]:
        return self._swap(seq_group, SequenceStatus.RUNNING, self.gpu, self.cpu)

    def _swap(
        self, seq_group: SequenceGroupLike, status: SequenceStatus, source: BlockAllocator, destination: BlockAllocator
    ) -> list[tuple[int, int]]:
        """Move the tables of the group's ``status`` sequences; returns the
        ``(source, destination)`` physical-id pairs, sequence by sequence."""
        tables = [self._table(seq) for seq in seq_group.get_seqs(status=status)]
        tables = [table for table in tables if table.entries]
        for table in tables:
            if table.device != source.device:
                raise WrongDeviceError(
                    f"a {status.name} sequence of group {seq_group.request_id!r} is not on the {source.device.name}"
                )
            if table.has_dropped_blocks:
                raise UnsupportedError("swap of a sliding-window table after blocks were dropped")
        seen: set[int] = set()
        need = sum(table.cost_move(destination, seen) for table in tables)
        if need > destination.num_free:
            raise NoFreeBlocksError(
                f"swap needs {need} {destination.device.name} blocks, {destination.num_free} are free"
            )
        mapping: list[tuple[int, int]] = []
        for table in tables:
            mapping += table.move(source, destination)
        return mapping

    # -- finishing ---------------------------------------------------------------------
    def free(self, seq: SequenceLike) -> None:
        """Release the sequence's blocks; unknown sequences are ignored."""
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            return
        if table.last_access is not None:
            for entry in table.entries:
                if self.gpu.owns(entry.block_id) and not entry.is_null:
                    self.gpu.stamp(entry.block_id, table.last_access)
        if self.tracker is not None:
            self.tracker.discard(seq.seq_id)
        table.release_all(self._allocator(table.device))
        del self.block_tables[seq.seq_id]

    def free_cross(self, seq_group: SequenceGroupLike) -> None:
        cross = self.cross_block_tables.pop(seq_group.request_id, None)
        if cross is not None:
            cross.release_all(self.gpu)

    # -- tables and counts ---------------------------------------------------------
    def get_block_table(self, seq: SequenceLike) -> BlockIds:
        return self._table(seq).block_ids

    def get_cross_block_table(self, seq_group: SequenceGroupLike) -> BlockIds:
        cross = self.cross_block_tables.get(seq_group.request_id)
        if cross is None:
            raise NoCrossTableError(f"group {seq_group.request_id!r} has no cross block table")
        return cross.block_ids

    def get_num_free_gpu_blocks(self) -> int:
        return self.gpu.num_free

    def get_num_free_cpu_blocks(self) -> int:
        return self.cpu.num_free

    # -- prefix caching ------------------------------------------------------------------
    def access_all_blocks_in_seq(self, seq: SequenceLike, access_time: float) -> None:
        """Remember when the sequence last ran; its blocks get the time at ``free``."""
        if self.enable_caching:
            self._table(seq).last_access = access_time

    def mark_blocks_as_computed(self, seq_group: SequenceGroupLike, token_chunk_size: int) -> None:
        """Every block registered since the last call is now computed (the
        arguments are ignored, as in vLLM)."""
        self.gpu.mark_computed()

    def get_common_computed_block_ids(self, seqs: Sequence[SequenceLike]) -> BlockIds:
        """The longest block-id prefix the sequences' cached prefixes share
        (one sequence: its cached prefix); sequences without cached blocks
        are left out, as in vLLM (spec §9.15)."""
        tables = [self._table(seq) for seq in seqs]
        if self.tracker is None:
            return EMPTY
        for seq in seqs:
            self.tracker.check_tokens(seq)
        prefixes = [
            table.block_ids[: self.tracker.num_cached_tokens(seq) // self.block_size]
            for seq, table in zip(seqs, tables)
        ]
        if len(prefixes) == 1:
            return BlockIds(prefixes[0])
        return common_prefix(prefixes)

    def get_prefix_cache_hit_rate(self, device: Device) -> float:
        return self._allocator(Device.parse(device)).hit_rate()

    def reset_prefix_cache(self, device: Device | None = None) -> bool:
        """Forget every idle cached block of the device(s); False if a block is in use."""
        if device is not None:
            return self._allocator(Device.parse(device)).reset()
        cpu_done = self.cpu.reset()
        gpu_done = self.gpu.reset()  # tried even if the CPU failed (vLLM stops there)
        return cpu_done and gpu_done

    def get_num_cached_tokens(self, seq: SequenceLike) -> int:
        return 0 if self.tracker is None else self.tracker.num_cached_tokens(seq)

    def remove_seq_from_computed_blocks_tracker(self, seq: SequenceLike) -> None:
        if self.tracker is not None:
            self.tracker.remove(seq.seq_id)

    # -- introspection --------------------------------------------------------------------
    def check_invariants(self) -> None:
        check_invariants(self)

    def snapshot(self) -> dict[str, Any]:
        return snapshot(self)

    def save_state(self) -> SavedState:
        """The whole state, kept aside (``blockspace/saved_state.py``): every
        field pickled together (the tracker shares the keys and the GPU
        allocator; a subclass's own fields come along)."""
        state = {name: value for name, value in vars(self).items() if name != BUSY}
        return SavedState("reference", config_of(self), pickle.dumps(state, pickle.HIGHEST_PROTOCOL))

    def restore_state(self, saved: SavedState) -> None:
        """The state ``save_state`` gave, back (a fresh copy each time)."""
        check_saved(saved, "reference", self)
        state, busy = pickle.loads(saved.data), vars(self).get(BUSY)
        vars(self).clear()
        vars(self).update(state)
        if busy is not None:
            setattr(self, BUSY, busy)
