"""Which idle cached block to recycle next: least recently used first.

An idle cached block (refcount 0, content still valid) stays reusable until
a fresh block is needed and no uncached block is free. The victim is the
block with the oldest access time; among equal times the deepest one (the
later blocks of a prefix go before its head, so a shared head survives
longest); then the smallest id. These are vLLM's tie-breaks.

A heap with lazy deletion keeps both ``remove`` (a cache hit revives the
block) and ``pop_victim`` logarithmic: a heap item is current only while the
block's record still carries the same serial number. Unlike vLLM's evictor,
a stale item can never be taken for a current one (spec §14.10).
"""

from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple


class Idle(NamedTuple):
    """Why an idle block is where it is in the eviction order."""

    key: int
    depth: int  # tokens from the start of the sequence to the end of this block
    time: float  # last access time (-1 when never stamped)
    serial: int


def _rank(block_id: int, idle: Idle) -> tuple[float, int, int, int]:
    """Where an idle block stands in the eviction order: oldest first, then
    deepest, then smallest id. The serial, last, only tells a heap item
    current or stale; one rule for the heap, its compaction and ``order``."""
    return (idle.time, -idle.depth, block_id, idle.serial)


class Evictor:
    """The idle cached blocks of one device, in LRU order."""

    def __init__(self) -> None:
        self._idle: dict[int, Idle] = {}
        self._heap: list[tuple[float, int, int, int]] = []
        self._serials = itertools.count()

    def __len__(self) -> int:
        return len(self._idle)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._idle

    def add(self, block_id: int, key: int, depth: int, time: float) -> None:
        """Park an idle block with its content key."""
        idle = Idle(key, depth, time, next(self._serials))
        self._idle[block_id] = idle
        heapq.heappush(self._heap, _rank(block_id, idle))
        if len(self._heap) > 2 * len(self._idle) + 64:  # mostly stale: keep only the current items
            self._heap = [_rank(b, i) for b, i in self._idle.items()]
            heapq.heapify(self._heap)

    def remove(self, block_id: int) -> None:
        """Take a block out because it is in use again (a cache hit)."""
        del self._idle[block_id]

    def pop_victim(self) -> tuple[int, int]:
        """Remove and return ``(block_id, key)`` of the next block to recycle."""
        while True:
            _, _, block_id, serial = heapq.heappop(self._heap)
            idle = self._idle.get(block_id)
            if idle is not None and idle.serial == serial:
                del self._idle[block_id]
                return block_id, idle.key

    def time_of(self, block_id: int) -> float:
        return self._idle[block_id].time

    def order(self) -> list[int]:
        """Block ids in the order they would be evicted."""
        return sorted(self._idle, key=lambda b: _rank(b, self._idle[b]))
