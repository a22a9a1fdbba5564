"""Block tables: one per sequence, an ordered list of entries (spec §8).

An entry points at one physical block and carries its own tokens (0..bs of
them), the adapter identity ``extra`` it was created with and, once full
with prefix caching on, its content key. Two tables sharing a block have one
entry each. ``num_filled`` counts the token slots written so far; blocks
past it are empty lookahead slots.

Every change that can run out of blocks is planned first (``plan_append``,
``cost_*``), so the manager can check the plan against the free blocks and
raise before anything changes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from blockspace.block_ids import BlockIds
from blockspace.enums import Device
from blockspace.reference import rules
from blockspace.reference.allocator import BlockAllocator
from blockspace.reference.content import ContentKeys


@dataclass
class Entry:
    block_id: int
    tokens: list[int]
    extra: Hashable
    key: int | None = None  # content key, once full (prefix caching only)
    is_null: bool = False  # dropped by the sliding window: points at the null block


@dataclass
class AppendPlan:
    """What ``append`` will do, computed before anything changes."""

    drops: list[int]  # entry indexes the sliding window releases
    num_new_blocks: int  # empty blocks appended
    writes: list[tuple[int, list[int], int | None]]  # (entry index, tokens, key if it becomes full)


@dataclass
class BlockTable:
    block_size: int
    entries: list[Entry] = field(default_factory=list)
    num_filled: int = 0
    device: Device = Device.GPU
    last_access: float | None = None  # set by access_all_blocks_in_seq (caching)
    root: Hashable = None  # what the first block's key chains from (a tenant's cache salt)

    @property
    def block_ids(self) -> BlockIds:
        """The entries' block ids, read-only (``blockspace/block_ids.py``)."""
        return BlockIds([entry.block_id for entry in self.entries])

    @property
    def has_dropped_blocks(self) -> bool:
        return any(entry.is_null for entry in self.entries)

    def is_full(self, entry: Entry) -> bool:
        return len(entry.tokens) == self.block_size

    def depth(self, index: int) -> int:
        """Tokens from the start of the sequence through block ``index``."""
        return (index + 1) * self.block_size

    # -- prompt allocation (§8.1) ---------------------------------------------
    def prompt_keys(self, tokens: Sequence[int], extra: Hashable, keys: ContentKeys | None) -> list[int | None]:
        """Content keys of the full chunks of a prompt (all None without caching)."""
        num_full = len(tokens) // self.block_size
        if keys is None:
            return [None] * num_full
        return list(keys.chain(tokens, self.block_size, extra, self.root))

    def cost_allocate(self, tokens: Sequence[int], chunk_keys: list[int | None], allocator: BlockAllocator) -> int:
        """Free blocks ``allocate`` consumes: every chunk but those that hit an
        in-use cached block (a hit on an idle block revives it, which costs)."""
        tail = 1 if len(tokens) % self.block_size else 0
        return sum(allocator.fill_cost(key) for key in chunk_keys) + tail

    def allocate(
        self, tokens: Sequence[int], extra: Hashable, chunk_keys: list[int | None], allocator: BlockAllocator
    ) -> None:
        bs = self.block_size
        for index, key in enumerate(chunk_keys):
            chunk = list(tokens[index * bs : (index + 1) * bs])
            self.entries.append(Entry(allocator.fill_full(key), chunk, extra, key))
        if len(tokens) % bs:
            self.entries.append(Entry(allocator.take(), list(tokens[len(chunk_keys) * bs :]), extra))
        self.num_filled = len(tokens)

    # -- append (§8.3) -------------------------------------------------------
    def plan_append(
        self,
        new_tokens: Sequence[int],
        num_lookahead_slots: int,
        num_drops: int,
        extra: Hashable,
        keys: ContentKeys | None,
    ) -> AppendPlan:
        bs = self.block_size
        drops = [index for index in range(min(num_drops, len(self.entries))) if not self.entries[index].is_null]
        num_new = rules.blocks_to_add(len(self.entries), self.num_filled, len(new_tokens) + num_lookahead_slots, bs)
        writes: list[tuple[int, list[int], int | None]] = []
        position, offset = self.num_filled, 0
        while offset < len(new_tokens):
            index = position // bs
            chunk = list(new_tokens[offset : offset + bs - position % bs])
            entry = self.entries[index] if index < len(self.entries) else None
            written = (entry.tokens if entry else []) + chunk
            key = None
            if keys is not None and len(written) == bs:
                parent = writes[-1][2] if writes else (self.entries[index - 1].key if index else self.root)
                key = keys.key(parent, written, entry.extra if entry else extra)
            writes.append((index, chunk, key))
            position += len(chunk)
            offset += len(chunk)
        return AppendPlan(drops, num_new, writes)

    def append(
        self,
        plan: AppendPlan,
        new_tokens: Sequence[int],
        extra: Hashable,
        allocator: BlockAllocator,
        null_id: int | None,
    ) -> list[tuple[int, int]]:
        """Carry out a checked plan; returns the copy-on-write pairs."""
        for index in plan.drops:
            entry = self.entries[index]
            allocator.release(entry.block_id, entry.key, self.depth(index))
            assert null_id is not None
            entry.block_id, entry.is_null = null_id, True
        for _ in range(plan.num_new_blocks):
            self.entries.append(Entry(allocator.take(), [], extra))
        copies = []
        for index, chunk, key in plan.writes:
            entry = self.entries[index]
            entry.tokens += chunk
            if allocator.refs(entry.block_id) > 1:
                new_id = allocator.copy_on_write(entry.block_id)
                copies.append((entry.block_id, new_id))
                entry.block_id = new_id
            if key is not None:
                entry.key = key
                entry.block_id = allocator.promote(entry.block_id, key)
        self.num_filled += len(new_tokens)
        return copies

    # -- fork (§8.4), free (§8.5), swap (§9.7) -------------------------------
    def fork(self, allocator: BlockAllocator) -> BlockTable:
        child = BlockTable(self.block_size, num_filled=self.num_filled, device=self.device, root=self.root)
        for entry in self.entries:
            allocator.share(entry.block_id)
            child.entries.append(Entry(entry.block_id, list(entry.tokens), entry.extra, entry.key))
        return child

    def release_all(self, allocator: BlockAllocator) -> None:
        """Release every entry, first to last (null entries are not ours)."""
        for index, entry in enumerate(self.entries):
            if not entry.is_null:
                allocator.release(entry.block_id, entry.key, self.depth(index))

    def cost_move(self, allocator: BlockAllocator, seen: set[int]) -> int:
        """Free destination blocks ``move`` consumes. ``seen`` holds the keys
        earlier tables of the same swap re-registered (then in use)."""
        cost = 0
        for entry in self.entries:
            if not self.is_full(entry) or entry.key is None:
                cost += 1
            elif entry.key not in seen:
                seen.add(entry.key)
                cost += allocator.fill_cost(entry.key)
        return cost

    def move(self, source: BlockAllocator, destination: BlockAllocator) -> list[tuple[int, int]]:
        """Swap every entry to the other device; returns physical-id pairs.
        Shared blocks are not kept shared (spec §14.5): each table takes its
        own destination blocks, re-shared only through content keys."""
        old_ids = self.block_ids
        self.release_all(source)
        for entry in self.entries:
            entry.block_id = (
                destination.fill_full(entry.key)
                if self.is_full(entry) and entry.key is not None
                else destination.take()
            )
        self.device = destination.device
        return [(source.physical(a), destination.physical(e.block_id)) for a, e in zip(old_ids, self.entries)]
