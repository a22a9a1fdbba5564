"""Deliberately broken managers: the kit must catch each with a short repro.

Each is the reference with one small, realistic bug, the kind a fast
re-implementation makes. They are test fixtures (and a demo:
``blockspace conformance --impl blockspace.conformance.broken:FifoFreeList``).
"""

from __future__ import annotations

import itertools
from typing import Any

from blockspace.block_ids import BlockIds
from blockspace.enums import SequenceStatus
from blockspace.protocols import SequenceGroupLike, SequenceLike
from blockspace.reference import ReferenceBlockSpaceManager
from blockspace.reference.allocator import BlockAllocator, CachingAllocator


class _FifoRelease(BlockAllocator):
    """Allocator mixin: a released block goes to the *back* of the free list.
    (Based on ``BlockAllocator``, which both classes below derive from: their
    method order is the same as with a bare mixin.)"""

    def release(self, block_id: int, key: int | None, depth: int) -> None:
        was_free = len(self.free_ids)
        super().release(block_id, key, depth)
        if len(self.free_ids) > was_free:  # it went to the front: move it back
            self.free_ids.append(self.free_ids.popleft())


class _FifoAllocator(_FifoRelease, BlockAllocator):
    pass


class _FifoCachingAllocator(_FifoRelease, CachingAllocator):
    pass


class FifoFreeList(ReferenceBlockSpaceManager):
    """Reuses the least recently freed block first (vLLM reuses the most
    recently freed one: its free list is LIFO, spec §5 / §14.21)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for allocator in (self.gpu, self.cpu):  # classes of this module: the manager still pickles
            allocator.__class__ = _FifoCachingAllocator if isinstance(allocator, CachingAllocator) else _FifoAllocator


class WatermarkOffByOne(ReferenceBlockSpaceManager):
    """Keeps one block more than the watermark free at admission (an
    off-by-one in ``int(watermark * num_gpu_blocks)``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watermark_blocks += 1


class StaleBlockTable(ReferenceBlockSpaceManager):
    """Keeps each sequence's first ``get_block_table`` answer and hands it
    out again after the table changed (a cached answer never refreshed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept: dict[int, BlockIds] = {}

    def get_block_table(self, seq: SequenceLike) -> BlockIds:
        answer = super().get_block_table(seq)
        return self.kept.setdefault(seq.seq_id, answer) if len(answer) > 1 else answer

    def free(self, seq: SequenceLike) -> None:
        super().free(seq)
        self.kept.pop(seq.seq_id, None)


class ReversedSwapIn(ReferenceBlockSpaceManager):
    """Returns swap-in pairs as (destination, source) instead of (source,
    destination): the copy would run backwards."""

    def swap_in(self, seq_group: SequenceGroupLike) -> list[tuple[int, int]]:
        return [(gpu, cpu) for cpu, gpu in super().swap_in(seq_group)]


class ReversedSwapOrder(ReferenceBlockSpaceManager):
    """Returns each sequence's swap pairs in reverse block order (its table
    walked from the end): the same copies, each right, in another order
    than vLLM's. Only a swap of a table of two blocks or more shows it; the
    exhaustive profile once passed it, its swap scopes having at most one
    CPU block (issue #51)."""

    def _swap(
        self, seq_group: SequenceGroupLike, status: SequenceStatus, source: BlockAllocator, destination: BlockAllocator
    ) -> list[tuple[int, int]]:
        lengths = [len(self._table(seq).entries) for seq in seq_group.get_seqs(status=status)]
        mapping = super()._swap(seq_group, status, source, destination)
        ends = list(itertools.accumulate(lengths))
        return [pair for start, end in zip([0, *ends], ends) for pair in reversed(mapping[start:end])]


BROKEN_MANAGERS = (FifoFreeList, WatermarkOffByOne, StaleBlockTable, ReversedSwapIn, ReversedSwapOrder)
