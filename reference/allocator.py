"""Block allocators of one device: plain (LIFO free list) and caching.

Ids are absolute (GPU ``0..G-1``, CPU ``G..G+C-1``); each device has its own
allocator over its own range. The allocator knows refcounts, the free list
and (caching) the content cache; it does not know tables. Every method that
takes a block assumes the manager has already checked that one is there, so
a failure can never leave an operation half done (``NoFreeBlocksError`` here
is a last line of defence, never expected).
"""

from __future__ import annotations

from collections import deque

from blockspace.enums import Device
from blockspace.errors import NoFreeBlocksError
from blockspace.reference.evictor import Evictor
from blockspace.reference.hit_rate import HitRate

NEVER_ACCESSED = -1.0


class BlockAllocator:
    """Plain allocation: a block is free exactly when its refcount is 0.

    The free list is a deque used LIFO: a released block goes to the front
    and is the next one handed out (spec §5). Content is ignored.
    """

    def __init__(self, device: Device, first_id: int, num_blocks: int) -> None:
        self.device = device
        self.first_id = first_id
        self.num_blocks = num_blocks
        self.refcount = [0] * num_blocks  # indexed by physical id
        self.free_ids: deque[int] = deque(range(first_id, first_id + num_blocks))

    # -- ids -----------------------------------------------------------------
    def owns(self, block_id: int) -> bool:
        return self.first_id <= block_id < self.first_id + self.num_blocks

    def physical(self, block_id: int) -> int:
        """The per-device id swap mappings use."""
        return block_id - self.first_id

    def refs(self, block_id: int) -> int:
        return self.refcount[block_id - self.first_id]

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    # -- taking and releasing -----------------------------------------------
    def take(self) -> int:
        """A block for new, unkeyed content."""
        if not self.free_ids:
            raise NoFreeBlocksError(f"no free {self.device.name} blocks")
        block_id = self.free_ids.popleft()
        self.refcount[block_id - self.first_id] = 1
        return block_id

    def fill_full(self, key: int | None) -> int:
        """A block for a full block of content (prompt allocation, swap)."""
        return self.take()

    def share(self, block_id: int) -> None:
        """One more table entry points at an in-use block (fork)."""
        self.refcount[block_id - self.first_id] += 1

    def release(self, block_id: int, key: int | None, depth: int) -> None:
        """One table entry stops pointing at ``block_id``."""
        self.refcount[block_id - self.first_id] -= 1
        if self.refcount[block_id - self.first_id] == 0:
            self.free_ids.appendleft(block_id)

    def copy_on_write(self, block_id: int) -> int:
        """The writer of a shared block gets a block of its own."""
        self.refcount[block_id - self.first_id] -= 1
        return self.take()

    def promote(self, block_id: int, key: int) -> int:
        """A block just became full; caching may merge it into a cached copy."""
        return block_id

    # -- what an operation will cost (for the checks before it) --------------
    def fill_cost(self, key: int | None) -> int:
        """Free blocks ``fill_full(key)`` consumes."""
        return 1

    def promote_gain(self, key: int) -> int:
        """Free blocks ``promote`` of a singly owned block gives back."""
        return 0

    def is_in_use_cached(self, key: int | None) -> bool:
        return False

    # -- prefix caching (nothing to do without it) ---------------------------
    def stamp(self, block_id: int, time: float) -> None:
        pass

    def mark_computed(self) -> None:
        pass

    def is_cached_and_computed(self, key: int) -> bool:
        return False

    def hit_rate(self) -> float:
        return -1

    def reset(self) -> bool:
        return True

    def snapshot_blocks(self) -> list[tuple[int, bool, bool, float]]:
        return [(ref, False, False, NEVER_ACCESSED) for ref in self.refcount]

    def snapshot_evictable(self) -> list[int]:
        return []

    def snapshot_stats(self) -> tuple[int, float, int, int]:
        return (0, 0.0, 0, 0)


class CachingAllocator(BlockAllocator):
    """Prefix caching: full blocks are registered under their content key and
    stay cached after their last user is gone, until evicted (spec §6).

    Free count = uncached free list + idle cached blocks (the evictor):
    uncached blocks are always used before any cached one is evicted.
    """

    def __init__(self, device: Device, first_id: int, num_blocks: int) -> None:
        super().__init__(device, first_id, num_blocks)
        self.cached: dict[int, int] = {}  # content key -> block id
        self.key_of: dict[int, int] = {}  # block id -> content key (cached blocks)
        self.evictor = Evictor()
        self.computed = [False] * num_blocks
        self.last_access = [NEVER_ACCESSED] * num_blocks
        self.touched: set[int] = set()  # registered since the last mark_computed
        self.stats = HitRate()

    @property
    def num_free(self) -> int:
        return len(self.free_ids) + len(self.evictor)

    def _activate(self, block_id: int, computed: bool) -> None:
        self.computed[block_id - self.first_id] = computed
        self.last_access[block_id - self.first_id] = NEVER_ACCESSED

    def _deactivate(self, block_id: int) -> None:
        self._activate(block_id, False)

    def _register(self, key: int, block_id: int) -> None:
        self.cached[key] = block_id
        self.key_of[block_id] = key
        self.touched.add(block_id)

    def _forget(self, key: int) -> None:
        del self.key_of[self.cached.pop(key)]

    def take(self) -> int:
        """Uncached free blocks first, then the LRU idle cached block."""
        if self.free_ids:
            block_id = self.free_ids.popleft()
        elif len(self.evictor):
            block_id, key = self.evictor.pop_victim()
            self._forget(key)
        else:
            raise NoFreeBlocksError(f"no free {self.device.name} blocks")
        self.refcount[block_id - self.first_id] = 1
        self._activate(block_id, computed=False)
        return block_id

    def _adopt(self, block_id: int) -> None:
        """Share a cached block found by content; revive it if it was idle."""
        self.refcount[block_id - self.first_id] += 1
        if self.refcount[block_id - self.first_id] == 1:
            self.evictor.remove(block_id)
            self._activate(block_id, computed=True)

    def fill_full(self, key: int | None) -> int:
        assert key is not None
        hit = key in self.cached
        self.stats.query(hit)
        if hit:
            block_id = self.cached[key]
            self._adopt(block_id)
            return block_id
        block_id = self.take()
        self._register(key, block_id)
        return block_id

    def release(self, block_id: int, key: int | None, depth: int) -> None:
        """A keyed block goes idle but stays cached; an unkeyed one is free."""
        physical = block_id - self.first_id
        self.refcount[physical] -= 1
        if self.refcount[physical] == 0:
            if key is None:
                self.free_ids.appendleft(block_id)
            else:
                self.evictor.add(block_id, key, depth, self.last_access[physical])
            self._deactivate(block_id)

    def promote(self, block_id: int, key: int) -> int:
        """Register a block that just became full, or, if its content is
        already cached, give the block back and share the cached one."""
        if key not in self.cached:
            self._register(key, block_id)
            return block_id
        self.release(block_id, None, 0)
        cached_id = self.cached[key]
        self._adopt(cached_id)
        return cached_id

    def is_in_use_cached(self, key: int | None) -> bool:
        return key in self.cached and self.refs(self.cached[key]) > 0

    def fill_cost(self, key: int | None) -> int:
        return 0 if self.is_in_use_cached(key) else 1

    def promote_gain(self, key: int) -> int:
        return 1 if self.is_in_use_cached(key) else 0

    def stamp(self, block_id: int, time: float) -> None:
        self.last_access[block_id - self.first_id] = time

    def mark_computed(self) -> None:
        for block_id in self.touched:
            self.computed[block_id - self.first_id] = True
        self.touched.clear()

    def is_computed(self, block_id: int) -> bool:
        """In use: its flag. Idle: always (it held content once)."""
        if self.refs(block_id) > 0:
            return self.computed[block_id - self.first_id]
        return block_id in self.evictor

    def is_cached_and_computed(self, key: int) -> bool:
        return key in self.cached and self.is_computed(self.cached[key])

    def hit_rate(self) -> float:
        return self.stats.rate

    def reset(self) -> bool:
        """Drop every idle cached block, if no block is in use (spec §6.8)."""
        if self.num_blocks - self.num_free > 0:
            return False
        while len(self.evictor):
            block_id, key = self.evictor.pop_victim()
            self._forget(key)
            self.free_ids.appendleft(block_id)
        self.evictor = Evictor()
        self.computed = [False] * self.num_blocks
        self.last_access = [NEVER_ACCESSED] * self.num_blocks
        self.stats = HitRate()
        return True

    def snapshot_blocks(self) -> list[tuple[int, bool, bool, float]]:
        blocks = []
        for physical, ref in enumerate(self.refcount):
            block_id = physical + self.first_id
            time = self.evictor.time_of(block_id) if block_id in self.evictor else self.last_access[physical]
            blocks.append((ref, block_id in self.key_of, self.computed[physical], time))
        return blocks

    def snapshot_evictable(self) -> list[int]:
        return self.evictor.order()

    def snapshot_stats(self) -> tuple[int, float, int, int]:
        return self.stats.state()
