"""Plausible wrong implementations: for each situation of the spec, a
manager that gets its rule wrong and every easy case right.

A situation reached (``situations.py``) says a scope exercised a rule; it
does not say the scope would notice that rule done otherwise. Here each
situation gets at least one *wrong implementation*: the reference with
one rule replaced by another a re-implementer could well write (a linear
scan for vLLM's binary search, a window cut rounded up, the hit rate's
running bucket blended in place, a reset that keeps the statistics), each a
small subclass of the reference that overrides one part or one method.
Each agrees with the reference until its rule is put to the test, so the
check that catches it is evidence that the rule was tested.

``WRONGS`` registers them, with the situation each targets, what it gets
wrong and the check of the kit that catches it: ``explore[<scope>]``, a
scope of the standard set that reaches the situation, or, where no scope
of it can show the difference (float drift over thousands of lookups), a
check of the quick profile, with the reason. ``NO_WRONG`` names the
situations without one, and why. ``tests/test_situation_wrongs.py``
holds the registry to the situations (every one has a wrong
implementation or a reason) and runs each check on its wrong
implementation through the kit's command, which must fail.

Each class is importable as ``blockspace.conformance.wrong:<Name>``, so
``blockspace conformance --impl blockspace.conformance.wrong:LinearScanTracker
--profile exhaustive`` shows the kit catching it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from blockspace.block_ids import EMPTY, BlockIds
from blockspace.conformance import broken
from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.errors import NoFreeBlocksError
from blockspace.protocols import SequenceGroupLike, SequenceLike
from blockspace.reference import ReferenceBlockSpaceManager, rules
from blockspace.reference.allocator import BlockAllocator, CachingAllocator
from blockspace.reference.evictor import Evictor, Idle
from blockspace.reference.hit_rate import BUCKET, HitRate
from blockspace.reference.table import Entry
from blockspace.reference.tracker import ComputedBlocksTracker
from blockspace.validation import check_encoder_decoder, check_lookahead, not_tracked, waiting_seqs


@dataclass(frozen=True)
class Wrong:
    """One wrong implementation: the situation whose rule it gets wrong."""

    situation: str
    gets_wrong: str  # one line: what it does instead
    cls: type
    caught_by: str  # the kit's check that catches it: "explore[<scope of the standard set>]", or another check
    why_not_explored: str = ""  # when ``caught_by`` is no scope: why no scope of the standard set can show it

    @property
    def impl(self) -> str:
        """The class as ``--impl`` names it."""
        return f"{self.cls.__module__}:{self.cls.__name__}"

    @property
    def scope(self) -> str | None:
        """The scope of ``caught_by``, when it is the explorer's."""
        return self.caught_by.removeprefix("explore[").removesuffix("]") if self.caught_by[:8] == "explore[" else None


WRONGS: list[Wrong] = []

NO_WRONG: dict[str, str] = {}  # situation -> why no plausible wrong implementation of it exists


def wrong(situation: str, gets_wrong: str, caught_by: str, why_not_explored: str = "") -> Callable[[type], type]:
    """Class decorator: register the class as a wrong implementation of ``situation``."""

    def register(cls: type) -> type:
        WRONGS.append(Wrong(situation, gets_wrong, cls, caught_by, why_not_explored))
        return cls

    return register


def killers(situation: str) -> list[str]:
    """The names of the wrong implementations of ``situation``: the
    situation table's column of what each situation kills."""
    return [w.cls.__name__ for w in WRONGS if w.situation == situation]


def missing(situations: Sequence[str]) -> list[str]:
    """The situations of ``situations`` with neither a wrong implementation
    nor a reason why none exists."""
    covered = {w.situation for w in WRONGS} | set(NO_WRONG)
    return [name for name in situations if name not in covered]


def table_cell(situation: str) -> str:
    """The situation table's cell of what ``situation`` kills (docs/conformance.md,
    ``scripts/situation_table.py``): each wrong implementation, with the check
    that catches it where that is no scope; or why there is none."""
    if situation in NO_WRONG:
        return f"none: {NO_WRONG[situation]}"
    return ", ".join(f"`{w.cls.__name__}`" + ("" if w.scope else f" (`{w.caught_by}`)")
                     for w in WRONGS if w.situation == situation)  # fmt: skip


# -- the parts a wrong implementation puts in the reference -----------------------------------
class _OwnParts(CachingAllocator):
    """A caching allocator whose evictor and hit statistics are of the
    classes it names, from the start and after every reset."""

    evictor_class: type[Evictor] = Evictor
    stats_class: type[HitRate] = HitRate

    def adopt_parts(self) -> None:
        self.evictor, self.stats = self.evictor_class(), self.stats_class()

    def reset(self) -> bool:
        done = super().reset()
        if done:
            self.adopt_parts()
        return done


class _Rewired(ReferenceBlockSpaceManager):
    """The reference with parts of other classes: its allocators' and its
    tracker's classes replaced once built (as ``broken.FifoFreeList`` does),
    so that the manager still pickles and saves its state."""

    caching_allocator: type[CachingAllocator] | None = None
    plain_allocator: type[BlockAllocator] | None = None
    tracker_class: type[ComputedBlocksTracker] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for allocator in (self.gpu, self.cpu):
            wanted = self.caching_allocator if isinstance(allocator, CachingAllocator) else self.plain_allocator
            if wanted is not None:
                allocator.__class__ = wanted
            if isinstance(allocator, _OwnParts):
                allocator.adopt_parts()
        if self.tracker is not None and self.tracker_class is not None:
            self.tracker.__class__ = self.tracker_class


class _RankedEvictor(Evictor):
    """An evictor whose order is ``rank`` (the smallest first)."""

    def rank(self, block_id: int, idle: Idle) -> Any:
        raise NotImplementedError

    def pop_victim(self) -> tuple[int, int]:
        block_id = min(self._idle, key=lambda b: self.rank(b, self._idle[b]))
        return block_id, self._idle.pop(block_id).key

    def order(self) -> list[int]:
        return sorted(self._idle, key=lambda b: self.rank(b, self._idle[b]))


# -- eviction (§6.3, §14.10) ---------------------------------------------------------------------
class _ReleaseOrderEvictor(_RankedEvictor):
    def rank(self, block_id: int, idle: Idle) -> Any:
        return idle.serial


class _ReleaseOrderAllocator(_OwnParts):
    evictor_class = _ReleaseOrderEvictor


@wrong("evict_by_time", "evicts the block that went idle first, not the one accessed longest ago", "explore[evictions]")
class EvictInReleaseOrder(_Rewired):
    caching_allocator = _ReleaseOrderAllocator


class _ShallowFirstEvictor(_RankedEvictor):
    def rank(self, block_id: int, idle: Idle) -> Any:
        return (idle.time, idle.depth, block_id)


class _ShallowFirstAllocator(_OwnParts):
    evictor_class = _ShallowFirstEvictor


@wrong("evict_by_depth", "among blocks of one time, evicts the shallowest first (a prefix's head before its tail)",
       "explore[long_tables]")  # fmt: skip
class EvictShallowFirst(_Rewired):
    caching_allocator = _ShallowFirstAllocator


class _LargerIdEvictor(_RankedEvictor):
    def rank(self, block_id: int, idle: Idle) -> Any:
        return (idle.time, -idle.depth, -block_id)


class _LargerIdAllocator(_OwnParts):
    evictor_class = _LargerIdEvictor


@wrong("evict_equal_times", "among blocks of one time and depth, evicts the larger id first", "explore[evictions]")
class EvictLargerIdFirst(_Rewired):
    caching_allocator = _LargerIdAllocator


# -- the prefix cache (§6.4-§6.7) ----------------------------------------------------------------
class _IdleHitsOnly(CachingAllocator):
    def fill_full(self, key: int | None) -> int:
        if key in self.cached and self.refs(self.cached[key]) > 0:  # shared with a table that holds it
            self.stats.query(False)  # counted as a miss
            self._adopt(self.cached[key])
            return self.cached[key]
        return super().fill_full(key)


@wrong("hit_in_use", "counts a prompt block found in use by another table as a miss (only revivals are hits)",
       "explore[adapter_rows]")  # fmt: skip
class InUseHitsMissed(_Rewired):
    caching_allocator = _IdleHitsOnly


class _RevivedUncomputed(CachingAllocator):
    def _adopt(self, block_id: int) -> None:
        super()._adopt(block_id)
        if self.refs(block_id) == 1:  # revived: taken as content still to compute
            self.computed[block_id - self.first_id] = False
            self.touched.add(block_id)


@wrong("revive_idle", "marks an idle cached block it takes back as not computed, to be computed again",
       "explore[default]")  # fmt: skip
class RevivedNotComputed(_Rewired):
    caching_allocator = _RevivedUncomputed


class _KeepsDuplicates(CachingAllocator):
    def promote(self, block_id: int, key: int) -> int:
        return block_id if key in self.cached else super().promote(block_id, key)

    def promote_gain(self, key: int) -> int:
        return 0


@wrong("promote_duplicate", "keeps a block filled with cached content as a duplicate, not folded into the cached one",
       "explore[default]")  # fmt: skip
class DuplicatesKept(_Rewired):
    caching_allocator = _KeepsDuplicates


class _LeakyCopyPlain(BlockAllocator):
    def copy_on_write(self, block_id: int) -> int:
        return self.take()  # the writer's reference to the shared block is never dropped


class _LeakyCopy(_LeakyCopyPlain, CachingAllocator):
    pass


@wrong("cow_shared", "a copy on write keeps the writer's reference to the shared block (held until the sharers go)",
       "explore[default]")  # fmt: skip
class CopyKeepsSource(_Rewired):
    caching_allocator, plain_allocator = _LeakyCopy, _LeakyCopyPlain


@wrong("cow_twice_in_one_call", "returns an append's copy-on-write pairs last block first", "explore[shared_writes]")
@wrong("cow_two_pairs", "returns an append's copy-on-write pairs last block first", "explore[shared_writes]")
class CopiesBackToFront(ReferenceBlockSpaceManager):
    def append_slots(self, seq: SequenceLike, num_lookahead_slots: int) -> list[tuple[int, int]]:
        return super().append_slots(seq, num_lookahead_slots)[::-1]


@wrong("cow_stale_pair", "leaves out a copy whose target the same append gave back (vLLM reports it)",
       "explore[stale_pair]")  # fmt: skip
class StalePairDropped(ReferenceBlockSpaceManager):
    def append_slots(self, seq: SequenceLike, num_lookahead_slots: int) -> list[tuple[int, int]]:
        copies = super().append_slots(seq, num_lookahead_slots)
        return [(source, target) for source, target in copies if target in self.get_block_table(seq)]


@wrong("mark_computed", "marks computed only the blocks of the group it is given (vLLM ignores the arguments)",
       "explore[stale_pair]")  # fmt: skip
class MarksOwnGroupOnly(ReferenceBlockSpaceManager):
    def mark_blocks_as_computed(self, seq_group: SequenceGroupLike, token_chunk_size: int) -> None:
        tables = [self.block_tables.get(seq.seq_id) for seq in seq_group.get_seqs()]
        own = {entry.block_id for table in tables if table is not None for entry in table.entries}
        gpu = self.gpu
        if isinstance(gpu, CachingAllocator):
            for block_id in gpu.touched & own:
                gpu.computed[block_id - gpu.first_id] = True
                gpu.touched.discard(block_id)


class _IdleByFlag(CachingAllocator):
    def is_computed(self, block_id: int) -> bool:
        return self.computed[block_id - self.first_id]  # an idle block's flag was cleared when it went idle


@wrong("idle_counts_computed", "reads an idle cached block's cleared flag: not computed, so no cached token counts",
       "explore[adapter_rows]")  # fmt: skip
class IdleNotComputed(_Rewired):
    caching_allocator = _IdleByFlag


class _LateBucket(HitRate):
    def query(self, hit: bool) -> None:
        if self.num_queries == BUCKET:  # the full bucket is closed by the next lookup
            self.bucket_mean = (self.bucket_mean * self.num_buckets + self.num_hits / BUCKET) / (self.num_buckets + 1)
            self.num_queries = self.num_hits = 0
            self.num_buckets += 1
        self.num_queries += 1
        self.num_hits += hit


class _LateBucketAllocator(_OwnParts):
    stats_class = _LateBucket


@wrong("bucket_completes", "closes a bucket of 1,000 lookups at the next lookup, not at its 1,000th",
       "explore[two_buckets]")  # fmt: skip
class BucketClosedLate(_Rewired):
    caching_allocator = _LateBucketAllocator


class _BlendedInPlace(HitRate):
    @property
    def rate(self) -> float:
        fraction = self.num_queries / BUCKET
        total = self.num_buckets + fraction
        if total == 0:
            return 0.0
        running = self.num_hits / self.num_queries if self.num_queries > 0 else 0.0
        return self.bucket_mean + (running - self.bucket_mean) * fraction / total  # the running bucket blended in


class _BlendedInPlaceAllocator(_OwnParts):
    stats_class = _BlendedInPlace


@wrong("bucket_completes", "blends the running bucket into the mean in place, m + (r - m) * f / (n + f): exact "
       "until a bucket has completed, a few ulps off in IEEE double after", "long[hit_rate_buckets]",
       "it shows only once a bucket of 1,000 lookups has completed and the next holds hits and misses; the standard "
       "set's two_buckets completes a bucket of misses, then one of hits, where every blend is exact")  # fmt: skip
class HitRateBlendedInPlace(_Rewired):
    caching_allocator = _BlendedInPlaceAllocator


# -- reset (§6.8, §9.17, §14.13, §14.14) ---------------------------------------------------------
class _KeepsStats(CachingAllocator):
    def reset(self) -> bool:
        stats = self.stats
        done = super().reset()
        self.stats = stats
        return done


@wrong("reset_forgets", "forgets the idle cached blocks but keeps the hit statistics", "explore[key_room]")
class ResetKeepsHitRate(_Rewired):
    caching_allocator = _KeepsStats


class _ResetBlockedByCachedOnly(CachingAllocator):
    def reset(self) -> bool:
        if any(self.refs(block_id) for block_id in self.key_of):  # uncached blocks in use do not stop it
            return False
        while len(self.evictor):
            block_id, key = self.evictor.pop_victim()
            self._forget(key)
            self.free_ids.appendleft(block_id)
        self.evictor, self.stats = Evictor(), HitRate()
        self.computed = [False] * self.num_blocks
        self.last_access = [-1.0] * self.num_blocks
        return True


@wrong("reset_refused", "refuses a reset only while a cached block is in use, not any block", "explore[default]")
class ResetIgnoresUncached(_Rewired):
    caching_allocator = _ResetBlockedByCachedOnly


class _ResetInIdOrder(CachingAllocator):
    def reset(self) -> bool:
        forgotten = set(self.evictor.order())
        done = super().reset()
        if done:  # the forgotten blocks at the free list's front, smallest id first
            rest = [block_id for block_id in self.free_ids if block_id not in forgotten]
            self.free_ids.clear()
            self.free_ids.extend(sorted(forgotten) + rest)
        return done


@wrong("reset_reorders", "puts the blocks a reset forgets at the free list's front in id order, not last evicted first",
       "explore[evictions]")  # fmt: skip
class ResetInIdOrder(_Rewired):
    caching_allocator = _ResetInIdOrder


@wrong("reset_both_with_cpu_in_use", "a reset of both devices stops when the CPU's is refused (the GPU's never tried)",
       "explore[swap_single]")  # fmt: skip
class ResetStopsAtCpu(ReferenceBlockSpaceManager):
    def reset_prefix_cache(self, device: Device | None = None) -> bool:
        if device is not None:
            return super().reset_prefix_cache(device)
        return self.cpu.reset() and self.gpu.reset()


# -- the tracker (§10, §9.18, §14.8, §14.12) ------------------------------------------------------
class _LinearScan(ComputedBlocksTracker):
    def num_cached_tokens(self, seq: SequenceLike) -> int:
        if seq.seq_id in self.num_cached and seq.is_prefill():
            return super().num_cached_tokens(seq)  # the frozen count, as the reference keeps it
        super().num_cached_tokens(seq)  # the keys extended and checked
        count = 0
        for key in self.keys_of[seq.seq_id]:  # the longest prefix cached and computed, in order
            if not self._is_hit(key):
                break
            count += 1
        self.num_cached[seq.seq_id] = count * self.block_size
        return count * self.block_size


@wrong("count_past_hole", "counts the cached prefix by a linear scan that stops at the first block not computed, "
       "where vLLM's binary search may count past it", "explore[tracker_hole]")  # fmt: skip
class LinearScanTracker(_Rewired):
    tracker_class = _LinearScan


class _ParkedCount(ComputedBlocksTracker):
    def parked(self) -> dict[int, int]:
        return self.__dict__.setdefault("parked_counts", {})  # made on first use: the class is swapped in

    def remove(self, seq_id: int) -> None:
        count = self.num_cached.get(seq_id)
        super().remove(seq_id)
        self.parked()[seq_id] = count if count is not None else 0

    def num_cached_tokens(self, seq: SequenceLike) -> int:
        count = super().num_cached_tokens(seq)
        if seq.is_prefill() and seq.seq_id in self.parked():  # back: the count it left with, frozen again
            count = self.num_cached[seq.seq_id] = self.parked().pop(seq.seq_id)
        return count

    def discard(self, seq_id: int) -> None:
        super().discard(seq_id)
        self.parked().pop(seq_id, None)


@wrong("free_untracked", "takes a sequence's count back from when it left the tracker, where vLLM counts afresh",
       "explore[untracked]")  # fmt: skip
class TrackerCountKept(_Rewired):
    tracker_class = _ParkedCount


@wrong("free_untracked", "refuses to free a sequence the tracker does not hold (vLLM's free needs a count first)",
       "explore[default]")  # fmt: skip
class FreeNeedsCount(ReferenceBlockSpaceManager):
    def free(self, seq: SequenceLike) -> None:
        if self.tracker is not None and seq.seq_id in self.block_tables and not self.tracker.is_tracked(seq.seq_id):
            raise not_tracked(seq.seq_id)
        super().free(seq)


# -- admission (§8.1, §9.1, §11, §14.2) -----------------------------------------------------------
class _AdmissionRules(ReferenceBlockSpaceManager):
    """``can_allocate`` with its two rules as methods, for a wrong one of
    either to override."""

    def prompt_blocks(self, num_tokens: int, num_lookahead_slots: int, num_encoder_tokens: int) -> int:
        return rules.blocks_for_prompt(
            num_tokens, num_lookahead_slots, num_encoder_tokens, self.block_size, self.max_block_sliding_window
        )

    def admission(self, num_needed: int) -> AllocStatus:
        return rules.alloc_status(self.num_total_gpu_blocks, self.gpu.num_free, num_needed, self.watermark_blocks)

    def can_allocate(self, seq_group: SequenceGroupLike, num_lookahead_slots: int = 0) -> AllocStatus:
        check_lookahead(num_lookahead_slots)
        check_encoder_decoder(seq_group, self.sliding_window, self.enable_caching)
        seq = waiting_seqs(seq_group)[0]
        encoder = seq_group.get_encoder_seq() if seq_group.is_encoder_decoder() else None
        num_encoder_tokens = len(encoder.get_token_ids()) if encoder is not None else 0
        return self.admission(self.prompt_blocks(len(seq.get_token_ids()), num_lookahead_slots, num_encoder_tokens))


@wrong("partial_last_block", "counts a prompt's blocks rounded down, leaving out a partial last block",
       "explore[default]")  # fmt: skip
class PartialBlockUncounted(_AdmissionRules):
    def prompt_blocks(self, num_tokens: int, num_lookahead_slots: int, num_encoder_tokens: int) -> int:
        need = (num_tokens + num_lookahead_slots) // self.block_size + rules.cdiv(num_encoder_tokens, self.block_size)
        return rules.window_cap(need, self.max_block_sliding_window)


@wrong("window_cap_only_asked", "asks for every prompt block, the window's cap left out",
       "explore[sliding_window_single]")  # fmt: skip
class WindowUncapped(_AdmissionRules):
    def prompt_blocks(self, num_tokens: int, num_lookahead_slots: int, num_encoder_tokens: int) -> int:
        return rules.cdiv(num_tokens + num_lookahead_slots, self.block_size) + rules.cdiv(
            num_encoder_tokens, self.block_size
        )


@wrong("can_allocate_ok", "answers OK only with a block to spare beyond the watermark (> where vLLM has >=)",
       "explore[default]")  # fmt: skip
class AdmitsWithSpare(_AdmissionRules):
    def admission(self, num_needed: int) -> AllocStatus:
        status = super().admission(num_needed)
        spare = self.gpu.num_free - num_needed > self.watermark_blocks
        return AllocStatus.LATER if status == AllocStatus.OK and not spare else status


@wrong("can_allocate_later", "answers NEVER where the free blocks cannot hold the prompt (free taken for total)",
       "explore[default]")  # fmt: skip
class LaterTakenForNever(_AdmissionRules):
    def admission(self, num_needed: int) -> AllocStatus:
        return rules.alloc_status(self.gpu.num_free, self.gpu.num_free, num_needed, self.watermark_blocks)


@wrong("can_allocate_never", "decides NEVER on the decoder prompt alone, the encoder's blocks left out of that test",
       "explore[encoder_decoder_single]")  # fmt: skip
class NeverWithoutEncoder(_AdmissionRules):
    def can_allocate(self, seq_group: SequenceGroupLike, num_lookahead_slots: int = 0) -> AllocStatus:
        status = super().can_allocate(seq_group, num_lookahead_slots)
        if status != AllocStatus.NEVER or not seq_group.is_encoder_decoder():
            return status
        decoder = self.prompt_blocks(len(waiting_seqs(seq_group)[0].get_token_ids()), num_lookahead_slots, 0)
        return AllocStatus.NEVER if self.num_total_gpu_blocks - decoder < self.watermark_blocks else AllocStatus.LATER


# -- prompts, appends, forks and frees (§8, §9.3-§9.5, §14.20, §14.21) ----------------------------
@wrong("empty_prompt", "gives an empty prompt a table of one empty block", "explore[plain_single]")
class EmptyPromptGetsBlock(ReferenceBlockSpaceManager):
    def allocate(self, seq_group: SequenceGroupLike) -> None:
        first = waiting_seqs(seq_group)[0]
        if first.get_token_ids() or self.gpu.num_free == 0 or first.seq_id in self.block_tables:
            super().allocate(seq_group)
            return
        super().allocate(seq_group)
        self.block_tables[first.seq_id].entries.append(Entry(self.gpu.take(), [], first.extra_hash()))


@wrong("lookahead_two_blocks", "asks can_append_slots for one block a sequence at most, the most a decode step of one "
       "token needs", "explore[wide]")  # fmt: skip
class OneBlockPerStep(ReferenceBlockSpaceManager):
    def can_append_slots(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> bool:
        check_lookahead(num_lookahead_slots)
        seqs = seq_group.get_seqs(status=SequenceStatus.RUNNING)
        touched = sum(
            min(1, rules.blocks_touched(t.num_filled, self._unseen(s, t), num_lookahead_slots, self.block_size))
            for s, t in ((s, self._table(s)) for s in seqs)
        )
        return touched <= self.gpu.num_free


@wrong("can_append_false", "checks each running sequence's blocks against the free ones alone, not their sum",
       "explore[wide]")  # fmt: skip
class AppendCheckedAlone(ReferenceBlockSpaceManager):
    def can_append_slots(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> bool:
        check_lookahead(num_lookahead_slots)
        seqs = seq_group.get_seqs(status=SequenceStatus.RUNNING)
        touched = [
            rules.blocks_touched(t.num_filled, self._unseen(s, t), num_lookahead_slots, self.block_size)
            for s, t in ((s, self._table(s)) for s in seqs)
        ]
        return max(touched, default=0) <= self.gpu.num_free


@wrong("fork_shares", "gives a fork's child its own copy of a partial last block at once, not at its first write",
       "explore[plain_single]")  # fmt: skip
class ForkCopiesPartialBlock(ReferenceBlockSpaceManager):
    def fork(self, parent_seq: SequenceLike, child_seq: SequenceLike) -> None:
        parent = self.block_tables.get(parent_seq.seq_id)
        partial = parent is not None and parent.entries and not parent.is_full(parent.entries[-1])
        allocator = self._allocator(parent.device) if parent is not None else self.gpu
        if partial and child_seq.seq_id not in self.block_tables and allocator.num_free == 0:
            raise NoFreeBlocksError("fork needs a free block for the child's copy of the last block")
        super().fork(parent_seq, child_seq)
        if partial:
            last = self.block_tables[child_seq.seq_id].entries[-1]
            last.block_id = allocator.copy_on_write(last.block_id)


class _UncomputedFreed(CachingAllocator):
    def release(self, block_id: int, key: int | None, depth: int) -> None:
        physical = block_id - self.first_id
        if key is not None and self.refcount[physical] == 1 and not self.computed[physical]:
            if self.cached.get(key) == block_id:  # never computed: nothing worth keeping
                self._forget(key)
            self.touched.discard(block_id)
            key = None
        super().release(block_id, key, depth)


@wrong("free_to_idle", "sends a freed block to the free list, uncached, when it was never marked computed",
       "explore[key_room]")  # fmt: skip
class UncomputedNotCached(_Rewired):
    caching_allocator = _UncomputedFreed


_ = wrong("free_lifo", "hands out the block freed longest ago first (a FIFO free list; vLLM's is LIFO)",
          "explore[default]")(broken.FifoFreeList)  # fmt: skip


class _LatestStamp(CachingAllocator):
    def stamp(self, block_id: int, time: float) -> None:
        physical = block_id - self.first_id
        self.last_access[physical] = max(self.last_access[physical], time)


@wrong("shared_stamped_by_last", "stamps a shared block with its latest access, not the last freed sharer's",
       "explore[evictions]")  # fmt: skip
class SharedStampedByLatest(_Rewired):
    caching_allocator = _LatestStamp


# -- common computed blocks (§9.15, §14.7) --------------------------------------------------------
@wrong("common_nothing", "keeps a sequence without cached blocks in the common prefix, so nothing is in common",
       "explore[long_tables]")  # fmt: skip
class CommonKeepsEmpty(ReferenceBlockSpaceManager):
    def get_common_computed_block_ids(self, seqs: Sequence[SequenceLike]) -> BlockIds:
        answer = super().get_common_computed_block_ids(seqs)
        counts = [self.tracker.num_cached_tokens(seq) for seq in seqs] if self.tracker is not None else []
        return EMPTY if len(seqs) > 1 and 0 in counts and answer else answer


@wrong("common_blocks", "leaves the last computed block out of the common prefix (vLLM keeps it)", "explore[default]")
class CommonDropsLast(ReferenceBlockSpaceManager):
    def get_common_computed_block_ids(self, seqs: Sequence[SequenceLike]) -> BlockIds:
        return BlockIds(list(super().get_common_computed_block_ids(seqs))[:-1])


# -- swaps (§3, §9.6, §9.7, §14.5, §14.6, §14.11, §14.19, §14.22) ---------------------------------
@wrong("swap_out", "maps a swap-out to absolute CPU ids, not the CPU's own (ids from num_gpu_blocks on)",
       "explore[swap_single]")  # fmt: skip
class SwapOutAbsoluteIds(ReferenceBlockSpaceManager):
    def swap_out(self, seq_group: SequenceGroupLike) -> list[tuple[int, int]]:
        return [(gpu, self.cpu.first_id + cpu) for gpu, cpu in super().swap_out(seq_group)]


@wrong("swap_in", "swaps in onto the smallest free GPU ids, not the free list's front", "explore[swap_single]")
class SwapInLowestIds(ReferenceBlockSpaceManager):
    def swap_in(self, seq_group: SequenceGroupLike) -> list[tuple[int, int]]:
        ordered = sorted(self.gpu.free_ids)
        self.gpu.free_ids.clear()
        self.gpu.free_ids.extend(ordered)
        return super().swap_in(seq_group)


@wrong("swap_unshares", "keeps a fork's shared blocks shared through a swap: one copy of each, not one a sharer",
       "explore[plain_single]")  # fmt: skip
class SwapKeepsSharing(ReferenceBlockSpaceManager):
    def _swap(
        self, seq_group: SequenceGroupLike, status: SequenceStatus, source: BlockAllocator, destination: BlockAllocator
    ) -> list[tuple[int, int]]:
        mapping = super()._swap(seq_group, status, source, destination)
        tables = [self.block_tables[seq.seq_id] for seq in seq_group.get_seqs(status=status)]
        first: dict[int, int] = {}
        kept = []
        for pair in mapping:
            source_id, target = pair
            if source_id not in first:
                first[source_id] = target
                kept.append(pair)
            elif first[source_id] != target:  # a second copy of one block: the first one shared instead
                old, new = target + destination.first_id, first[source_id] + destination.first_id
                for entry in (e for table in tables for e in table.entries if e.block_id == old):
                    entry.block_id = new
                    destination.share(new)
                    destination.release(old, entry.key, 0)
        return kept


@wrong("swap_out_fails_after_ok", "counts every block of a table in can_swap_out, empty lookahead blocks too, so it "
       "never says True for a swap that runs out", "explore[plain_single]")  # fmt: skip
class SwapCountsEveryBlock(ReferenceBlockSpaceManager):
    def _swap_need(
        self, seq_group: SequenceGroupLike, device: Device, status: SequenceStatus, num_lookahead_slots: int
    ) -> int:
        allocator = self._allocator(device)
        need = 0
        for seq in seq_group.get_seqs(status=status):
            table = self._table(seq)
            need += sum(1 for entry in table.entries if not allocator.is_in_use_cached(entry.key))
            need += rules.blocks_to_add(len(table.entries), table.num_filled, num_lookahead_slots, self.block_size)
        return need


@wrong("can_swap_out_false", "keeps the watermark free on the CPU too when asked whether a swap-out fits",
       "explore[plain_single]")  # fmt: skip
class CpuWatermark(ReferenceBlockSpaceManager):
    def _swap_status(
        self, seq_group: SequenceGroupLike, device: Device, status: SequenceStatus, num_lookahead_slots: int
    ) -> AllocStatus:
        allocator = self._allocator(device)
        need = self._swap_need(seq_group, device, status, num_lookahead_slots)
        return rules.swap_status(allocator.num_blocks, allocator.num_free, need, self.watermark_blocks)


@wrong("can_swap_in_later", "answers NEVER where the free GPU blocks cannot take the swap-in (free taken for total)",
       "explore[encoder_decoder_single]")  # fmt: skip
class SwapInLaterTakenForNever(ReferenceBlockSpaceManager):
    def can_swap_in(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> AllocStatus:
        status = super().can_swap_in(seq_group, num_lookahead_slots)
        return AllocStatus.NEVER if status == AllocStatus.LATER else status


@wrong("swapped_time_minus_one", "stamps the blocks a swap-out leaves idle with the table's time, as a free does",
       "explore[swap_single]")  # fmt: skip
class SwapOutStamps(ReferenceBlockSpaceManager):
    def swap_out(self, seq_group: SequenceGroupLike) -> list[tuple[int, int]]:
        running = [self.block_tables.get(seq.seq_id) for seq in seq_group.get_seqs(status=SequenceStatus.RUNNING)]
        stamps = [(table.block_ids, table.last_access) for table in running if table and table.last_access is not None]
        mapping = super().swap_out(seq_group)
        gpu = self.gpu
        for block_ids, time in stamps:
            for block_id in block_ids:
                if isinstance(gpu, CachingAllocator) and block_id in gpu.evictor:  # parked again, at the time
                    idle = gpu.evictor._idle[block_id]
                    gpu.evictor.add(block_id, idle.key, idle.depth, time)
        return mapping


@wrong("cross_not_swapped", "counts the cross table's blocks in can_swap_out, as if it moved with the request",
       "explore[encoder_decoder_single]")  # fmt: skip
class SwapCountsCross(ReferenceBlockSpaceManager):
    def _swap_need(
        self, seq_group: SequenceGroupLike, device: Device, status: SequenceStatus, num_lookahead_slots: int
    ) -> int:
        need = super()._swap_need(seq_group, device, status, num_lookahead_slots)
        cross = self.cross_block_tables.get(seq_group.request_id)
        return need + (len(cross.entries) if cross is not None and device == Device.CPU else 0)


@wrong("free_swapped", "frees a swapped-out sequence's table but leaves its CPU blocks taken", "explore[swap_single]")
class SwappedFreeLeaks(ReferenceBlockSpaceManager):
    def free(self, seq: SequenceLike) -> None:
        table = self.block_tables.get(seq.seq_id)
        if table is None or table.device == Device.GPU:
            super().free(seq)
            return
        if self.tracker is not None:
            self.tracker.discard(seq.seq_id)
        del self.block_tables[seq.seq_id]


# -- encoder-decoder (§9.2, §14.18) ---------------------------------------------------------------
@wrong("cross_table_made", "makes the cross table before the decoder's, so it takes the first free blocks",
       "explore[encoder_decoder_single]")  # fmt: skip
class CrossTableFirst(ReferenceBlockSpaceManager):
    def allocate(self, seq_group: SequenceGroupLike) -> None:
        super().allocate(seq_group)
        cross = self.cross_block_tables.get(seq_group.request_id)
        if cross is None or not seq_group.is_encoder_decoder():
            return
        tables = [self.block_tables[seq.seq_id] for seq in waiting_seqs(seq_group)]
        taken = [entry.block_id for entry in tables[0].entries] + [entry.block_id for entry in cross.entries]
        # the same blocks, the cross table's first (fresh blocks: no cache with encoder-decoder)
        moved = dict(zip(taken, taken[len(cross.entries) :] + taken[: len(cross.entries)]))
        refs = {block_id: self.gpu.refs(block_id) for block_id in taken}
        for entry in [e for table in tables for e in table.entries] + cross.entries:
            entry.block_id = moved[entry.block_id]
        for block_id, count in refs.items():
            self.gpu.refcount[moved[block_id]] = count


class _DecoderOnly:
    """A request seen without its encoder: vLLM makes the decoder's tables
    before it looks at the encoder (spec §14.18)."""

    def __init__(self, group: SequenceGroupLike) -> None:
        self._group = group

    def __getattr__(self, name: str) -> Any:
        return getattr(self._group, name)

    def is_encoder_decoder(self) -> bool:
        return False


@wrong("encoder_refused_first", "makes the decoder's tables before it refuses an encoder-decoder request, as vLLM "
       "does (the reference refuses first and changes nothing)", "explore[default]")  # fmt: skip
class EncoderRefusedLate(ReferenceBlockSpaceManager):
    def allocate(self, seq_group: SequenceGroupLike) -> None:
        if seq_group.is_encoder_decoder():
            try:
                check_encoder_decoder(seq_group, self.sliding_window, self.enable_caching)
            except Exception:
                super().allocate(_DecoderOnly(seq_group))
                raise
        super().allocate(seq_group)


# -- the sliding window (§11, §14.3, §14.4) -------------------------------------------------------
@wrong("window_drops", "cuts the window at the block holding the computed count rounded up, not down: one block early "
       "while the count is mid-block", "explore[window_mid_block]")  # fmt: skip
class WindowCutRoundedUp(ReferenceBlockSpaceManager):
    def append_slots(self, seq: SequenceLike, num_lookahead_slots: int) -> list[tuple[int, int]]:
        return super().append_slots(_ComputedRoundedUp(seq, self.block_size), num_lookahead_slots)


class _ComputedRoundedUp:
    """A sequence whose computed count reads rounded up to a block edge."""

    def __init__(self, seq: SequenceLike, block_size: int) -> None:
        self._seq, self.data = seq, self
        self._computed = rules.cdiv(seq.data.get_num_computed_tokens(), block_size) * block_size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._seq, name)

    def get_num_computed_tokens(self) -> int:
        return self._computed


LAZY_NULL = -1  # a null block id no table ever holds: "none taken yet", without the reference taking one


@wrong("window_null_block", "takes the null block at the first drop, not at the first append",
       "explore[sliding_window_single]")  # fmt: skip
class NullBlockAtFirstDrop(ReferenceBlockSpaceManager):
    def append_slots(self, seq: SequenceLike, num_lookahead_slots: int) -> list[tuple[int, int]]:
        table = self.block_tables.get(seq.seq_id)
        if self.max_block_sliding_window is None or self.null_block_id is not None or table is None:
            return super().append_slots(seq, num_lookahead_slots)
        computed = seq.data.get_num_computed_tokens()
        if rules.num_blocks_to_drop(computed, self.block_size, self.max_block_sliding_window) and table.entries:
            return super().append_slots(seq, num_lookahead_slots)
        self.null_block_id = LAZY_NULL  # nothing to drop: no null block needed yet
        try:
            return super().append_slots(seq, num_lookahead_slots)
        finally:
            self.null_block_id = None


@wrong("window_fork_after_drop", "forks a table that dropped blocks, the child sharing the null block",
       "explore[sliding_window_single]")  # fmt: skip
class ForkAfterDrop(ReferenceBlockSpaceManager):
    def fork(self, parent_seq: SequenceLike, child_seq: SequenceLike) -> None:
        parent = self.block_tables.get(parent_seq.seq_id)
        if parent is None or not parent.has_dropped_blocks or child_seq.seq_id in self.block_tables:
            super().fork(parent_seq, child_seq)
            return
        self.block_tables[child_seq.seq_id] = parent.fork(self.gpu)


# -- errors (§15) ----------------------------------------------------------------------------------
@wrong("refused_unchanged", "a fork onto a sequence that has a table shares the parent's blocks before it refuses",
       "explore[default]")  # fmt: skip
class ForkRefusedLate(ReferenceBlockSpaceManager):
    def fork(self, parent_seq: SequenceLike, child_seq: SequenceLike) -> None:
        parent = self.block_tables.get(parent_seq.seq_id)
        if parent is not None and parent.entries and child_seq.seq_id in self.block_tables:
            for entry in parent.entries:
                self._allocator(parent.device).share(entry.block_id)
        super().fork(parent_seq, child_seq)


# -- answers that carry an order (the shape situations) -------------------------------------------
@wrong("table_two_blocks", "answers a block table in id order (a table kept as a set)", "explore[plain_single]")
class TableInIdOrder(ReferenceBlockSpaceManager):
    def get_block_table(self, seq: SequenceLike) -> BlockIds:
        return BlockIds(sorted(super().get_block_table(seq)))


@wrong("cross_table_two_blocks", "answers a cross table in id order (a table kept as a set)",
       "explore[encoder_decoder_single]")  # fmt: skip
class CrossTableInIdOrder(ReferenceBlockSpaceManager):
    def get_cross_block_table(self, seq_group: SequenceGroupLike) -> BlockIds:
        return BlockIds(sorted(super().get_cross_block_table(seq_group)))


@wrong("common_two_blocks", "answers the common computed blocks in id order", "explore[long_tables]")
class CommonInIdOrder(ReferenceBlockSpaceManager):
    def get_common_computed_block_ids(self, seqs: Sequence[SequenceLike]) -> BlockIds:
        return BlockIds(sorted(super().get_common_computed_block_ids(seqs)))


@wrong("swap_out_two_blocks", "returns a swap-out's pairs last block first, each pair right",
       "explore[encoder_decoder_single]")  # fmt: skip
class SwapOutReversed(ReferenceBlockSpaceManager):
    def swap_out(self, seq_group: SequenceGroupLike) -> list[tuple[int, int]]:
        return super().swap_out(seq_group)[::-1]


@wrong("swap_in_two_blocks", "returns a swap-in's pairs last block first, each pair right",
       "explore[encoder_decoder_single]")  # fmt: skip
class SwapInReversed(ReferenceBlockSpaceManager):
    def swap_in(self, seq_group: SequenceGroupLike) -> list[tuple[int, int]]:
        return super().swap_in(seq_group)[::-1]
