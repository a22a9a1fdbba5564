"""vLLM 0.9.2's own manager as a party of the kit.

``VllmManager`` puts vLLM's v0 ``SelfAttnBlockSpaceManager`` behind
blockspace's interface, so the kit compares it like any implementation:

    blockspace conformance --impl blockspace.conformance.vllm_manager:VllmManager \\
        --against reference --profile exhaustive --scope plain

vLLM is imported only when one is built (it is never a dependency): in an
environment that has it (docs/performance.md says how to make one), and an
``ImportError`` naming it elsewhere.

What is normalised, as the spec maps it:

* return types: ``AllocStatus`` by name; a table as a ``BlockIds`` (vLLM
  hands out its live list, §14.16); ``get_common_computed_block_ids``'s
  ``''`` as the empty answer (§14.7); swap pairs as tuples;
* errors: vLLM raises built-in exceptions where blockspace raises named ones
  that subclass them (``blockspace/errors.py``). A vLLM error comes out as a
  ``ForeignError`` carrying its built-in kind, and the lockstep counts it the
  same as the yardstick's error when that is an instance of the kind;
* the state: ``snapshot()`` reads vLLM's internals into blockspace's form
  (``vllm_snapshot``), so whole states are compared, not only answers.

Not vLLM's at all, so excluded too: a request with a cache salt
(blockspace's tenant isolation, docs/reliability.md; vLLM 0.9.2's v0
manager keys none).

What is excluded (§14: vLLM's crashes, half-done operations and
nondeterminism, which blockspace does not reproduce): a call that would
meet one raises ``Excluded`` naming the item *before* vLLM runs, or after a
vLLM error that leaves its state half-changed. The explorer drops such a
transition and counts it by name; it is never compared, so never hidden in a
comparison.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from blockspace.block_ids import EMPTY, BlockIds
from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.validation import cache_salt


class Excluded(Exception):
    """A call on which vLLM crashes, half-changes its state or is
    nondeterministic (spec §14 / §15): not compared."""


class ForeignError(Exception):
    """An error vLLM raised, carrying its built-in kind (``builtin``)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"{type(original).__name__}: {original}")
        self.builtin = next(t for t in type(original).__mro__ if t.__module__ == "builtins")


def vllm_snapshot(manager: Any, vllm_device: Any) -> dict[str, Any]:
    """vLLM's state in the form of ``blockspace.snapshot`` (reads internals).
    The evictor's order is (time, deeper first, block id): vLLM's for every
    distinct time; equal times are its §14.10 nondeterminism."""
    num_gpu = manager.num_total_gpu_blocks
    allocators = manager.block_allocator._allocators
    caching = manager.enable_caching
    blocks: list = []
    free: dict[str, list[int]] = {}
    evictable: dict[str, list[int]] = {}
    hit_stats: dict[str, tuple] = {}
    for name in ("GPU", "CPU"):
        allocator = allocators[vllm_device[name]]
        refcounts = allocator._refcounter._refcounts
        ids = sorted(refcounts)
        if not caching:
            free[name] = list(allocator._free_block_indices)
            evictable[name] = []
            hit_stats[name] = (0, 0.0, 0, 0)
            blocks += [(refcounts[i], False, False, -1.0) for i in ids]
            continue
        free[name] = list(allocator._hashless_allocator._free_block_indices)
        idle = allocator.evictor.free_table
        evictable[name] = sorted(idle, key=lambda i: (idle[i].last_accessed, -idle[i].num_hashed_tokens, i))
        cached_ids = set(allocator._cached_blocks.values())
        for i in ids:
            tracker = allocator._block_tracker[i]
            when = idle[i].last_accessed if i in idle else tracker.last_accessed
            blocks.append((refcounts[i], i in cached_ids, bool(tracker.computed), float(when)))
        metric = allocator.metric_data
        hit_stats[name] = (metric.num_completed_blocks, metric.completed_block_cache_hit_rate,
                           metric.num_incompleted_block_queries, metric.num_incompleted_block_hit)  # fmt: skip
    last_access = manager._last_access_blocks_tracker._seq_last_access
    tracker = manager._computed_blocks_tracker
    null_block = manager.block_allocator._null_block
    return {
        "tables": {
            seq_id: {
                "blocks": list(table.physical_block_ids),
                "num_tokens": table._num_full_slots,
                "device": "CPU" if table.physical_block_ids and table.physical_block_ids[-1] >= num_gpu else "GPU",
                "last_access": last_access.get(seq_id),
            }
            for seq_id, table in manager.block_tables.items()
        },
        "cross_tables": {r: list(t.physical_block_ids) for r, t in manager.cross_block_tables.items()},
        "blocks": blocks,
        "free": free,
        "evictable": evictable,
        "touched": sorted(allocators[vllm_device.GPU]._touched_blocks) if caching else [],
        "hit_stats": hit_stats,
        "tracker": {
            i: (len(tracker._seq_id_to_blocks_hashes.get(i, [])), n)
            for i, n in tracker._seq_id_to_num_tokens_computed.items()
        }
        if caching
        else {},  # fmt: skip
        "null_block": None if null_block is None else null_block.block_id,
    }


def _ids(value: Any) -> BlockIds:
    return BlockIds(value) if value else EMPTY


NO_FREE_BLOCKS = (ValueError,)  # vLLM's NoFreeBlocksError: raised after partial changes wherever it comes (§15)
# A swap into a pool with no free id fails on the pool's own assert, after the source ids were released (§14.6)
SWAP_RAN_DRY = (ValueError, AssertionError)
UNSALTED = "a cache salt (blockspace's tenant isolation: vLLM 0.9.2's v0 manager keys no salt)"


class VllmManager:
    """vLLM 0.9.2's ``SelfAttnBlockSpaceManager``, compared the spec's way
    (module docstring). Its calls take sequences and groups as ``Any``: they
    go on to vLLM's manager as they are, and what that reads of them is
    vLLM's (``blockspace.protocols`` names what blockspace's managers read)."""

    # vLLM's own values, copied from it by __init__
    block_size: int
    num_total_gpu_blocks: int
    num_total_cpu_blocks: int
    watermark: float
    sliding_window: int | None
    enable_caching: bool

    def __init__(
        self,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        watermark: float = 0.01,
        sliding_window: int | None = None,
        enable_caching: bool = False,
    ) -> None:
        try:
            from vllm.core.block_manager import SelfAttnBlockSpaceManager
            from vllm.utils import Device as VllmDevice
        except ImportError as error:
            raise ImportError(f"VllmManager needs vLLM 0.9.2 installed ({error})") from None
        logging.getLogger("vllm").setLevel(logging.ERROR)  # it logs every refused reset
        self.vllm = SelfAttnBlockSpaceManager(block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window,
                                              enable_caching)  # fmt: skip
        self.device = VllmDevice
        self.unshared: set[int] = set()  # sequences whose shared blocks a swap un-shared (§14.5)
        for attribute in ("block_size", "num_total_gpu_blocks", "num_total_cpu_blocks", "watermark",
                          "sliding_window", "enable_caching"):  # fmt: skip
            setattr(self, attribute, getattr(self.vllm, attribute))

    # -- what vLLM cannot be compared on -------------------------------------------------------
    def _tracked(self, seq_id: int) -> bool:
        return seq_id in self.vllm._computed_blocks_tracker._seq_id_to_num_tokens_computed

    def _dropped(self, seq_id: int) -> bool:
        # Any: vLLM declares the allocator as its interface, DeviceAwareBlockAllocator; the null block is
        # kept by the class it builds, CpuGpuBlockAllocator (read without allocate_or_get_null_block, which makes one).
        allocator: Any = self.vllm.block_allocator
        null = allocator._null_block
        table = self.vllm.block_tables.get(seq_id)
        return null is not None and table is not None and null.block_id in table.physical_block_ids

    def _exclude_if(self, wrong: bool, item: str) -> None:
        if wrong:
            raise Excluded(item)

    def _run(self, call: Any, *args: Any, half_done: tuple[type, ...] = ()) -> Any:
        """vLLM's answer, or its error as a ``ForeignError``; ``half_done``:
        the errors of this call that leave vLLM half-changed (§15)."""
        try:
            return call(*args)
        except Exception as error:  # noqa: BLE001 - every vLLM error is either compared or excluded
            names = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
            if "_maybe_allocate_evicted_block_id" in names:
                raise Excluded("§14.10 the evictor's stale entry") from None
            if "init_block" in names and isinstance(error, IndexError):
                raise Excluded("§14.11 a swapped-out table's blocks in the wrong pool") from None
            if isinstance(error, half_done):
                raise Excluded(f"§15 {type(error).__name__} after partial changes") from None
            raise ForeignError(error) from None

    def _unsalted(self, seqs: list[Any]) -> None:
        self._exclude_if(any(cache_salt(seq) is not None for seq in seqs), UNSALTED)

    def _tokens(self, tokens: list[Any]) -> None:
        self._exclude_if(any(type(t) is not int or t < 0 for t in tokens),
                         "a token id that is no int or negative (vLLM does not check it)")  # fmt: skip

    def _lookahead(self, num_lookahead_slots: int) -> None:
        self._exclude_if(type(num_lookahead_slots) is not int or num_lookahead_slots < 0,
                         "a lookahead that is no int or negative (vLLM does not check it)")  # fmt: skip

    # -- the interface ----------------------------------------------------------------------------
    def can_allocate(self, seq_group: Any, num_lookahead_slots: int = 0) -> AllocStatus:
        self._lookahead(num_lookahead_slots)
        self._unsalted(seq_group.get_seqs())
        status = self._run(self.vllm.can_allocate, seq_group, num_lookahead_slots)
        return AllocStatus[status.name]

    def allocate(self, seq_group: Any) -> None:
        waiting = seq_group.get_seqs(status=SequenceStatus.WAITING)
        self._unsalted(seq_group.get_seqs())
        self._tokens([t for s in waiting for t in s.get_token_ids()])
        self._exclude_if(
            len(waiting) > 1 and not waiting[0].get_token_ids(), "§15 an empty prompt for several sequences"
        )
        self._exclude_if(seq_group.is_encoder_decoder() and (self.enable_caching or self.sliding_window is not None),
                         "§14.18 encoder-decoder refused after its tables were made")  # fmt: skip
        self._run(self.vllm.allocate, seq_group, half_done=NO_FREE_BLOCKS)

    def can_append_slots(self, seq_group: Any, num_lookahead_slots: int) -> bool:
        self._lookahead(num_lookahead_slots)
        return self._run(self.vllm.can_append_slots, seq_group, num_lookahead_slots)

    def append_slots(self, seq: Any, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        self._lookahead(num_lookahead_slots)
        table = self.vllm.block_tables.get(seq.seq_id)
        on_cpu = table is not None and any(b >= self.num_total_gpu_blocks for b in table.physical_block_ids)
        self._exclude_if(on_cpu, "an append to a swapped-out sequence (vLLM does not check it)")
        if table is not None:  # the tokens past those its table holds are the new ones
            self._tokens(seq.get_token_ids()[table._num_full_slots :])
        self._after_unsharing(seq)
        return self._run(self.vllm.append_slots, seq, num_lookahead_slots, half_done=NO_FREE_BLOCKS)

    def fork(self, parent_seq: Any, child_seq: Any) -> None:
        self._after_unsharing(parent_seq)
        self._exclude_if(self._dropped(parent_seq.seq_id), "§14.4 fork after a sliding-window drop")
        self._exclude_if(child_seq.seq_id in self.vllm.block_tables, "§15 fork onto a child with a table")
        self._run(self.vllm.fork, parent_seq, child_seq)

    def _swap_checks(self, seq_group: Any) -> None:
        self._exclude_if(
            any(self._dropped(s.seq_id) for s in seq_group.get_seqs()), "§14.4 swap after a sliding-window drop"
        )

    def can_swap_in(self, seq_group: Any, num_lookahead_slots: int) -> AllocStatus:
        self._lookahead(num_lookahead_slots)
        self._swap_checks(seq_group)
        return AllocStatus[self._run(self.vllm.can_swap_in, seq_group, num_lookahead_slots).name]

    def can_swap_out(self, seq_group: Any) -> bool:
        self._swap_checks(seq_group)
        return self._run(self.vllm.can_swap_out, seq_group)

    def _swap(self, swap: Any, seq_group: Any) -> list[tuple[int, int]]:
        """The swap is compared (its pairs are §14.5's, which blockspace
        reproduces); but when the group's tables shared blocks, vLLM's
        forked tables share block *objects* whose ids the swap rewrote, and
        what it does with them afterwards is not its tables' story (it
        asserts in an append, miscounts references in a free): later calls
        on those sequences are left out."""
        self._swap_checks(seq_group)
        for seq in seq_group.get_seqs():
            self._after_unsharing(seq)
        ids = [
            b
            for s in seq_group.get_seqs()
            for b in getattr(self.vllm.block_tables.get(s.seq_id), "physical_block_ids", [])
        ]
        pairs = self._run(swap, seq_group, half_done=SWAP_RAN_DRY)
        if len(ids) != len(set(ids)):
            self.unshared.update(s.seq_id for s in seq_group.get_seqs())
        return pairs

    def _after_unsharing(self, seq: Any) -> None:
        self._exclude_if(seq.seq_id in self.unshared, "§14.5 a call on a table whose shared blocks a swap un-shared")

    def swap_in(self, seq_group: Any) -> list[tuple[int, int]]:
        return self._swap(self.vllm.swap_in, seq_group)

    def swap_out(self, seq_group: Any) -> list[tuple[int, int]]:
        return self._swap(self.vllm.swap_out, seq_group)

    def free(self, seq: Any) -> None:
        self._after_unsharing(seq)
        table = self.vllm.block_tables.get(seq.seq_id)
        if self.enable_caching and table is not None:
            self._exclude_if(not self._tracked(seq.seq_id), "§14.12 free of a sequence the tracker does not know")
            ids = table.physical_block_ids
            swapped = bool(ids) and ids[-1] >= self.num_total_gpu_blocks
            timed = self.vllm._last_access_blocks_tracker._seq_last_access.get(seq.seq_id) is not None
            self._exclude_if(swapped and timed, "§14.11 free of a swapped-out sequence with an access time")
        self._run(self.vllm.free, seq)

    def free_cross(self, seq_group: Any) -> None:
        self._run(self.vllm.free_cross, seq_group)

    def get_block_table(self, seq: Any) -> BlockIds:
        return _ids(self._run(self.vllm.get_block_table, seq))

    def get_cross_block_table(self, seq_group: Any) -> BlockIds:
        return _ids(self._run(self.vllm.get_cross_block_table, seq_group))

    def get_num_free_gpu_blocks(self) -> int:
        return self.vllm.get_num_free_gpu_blocks()

    def get_num_free_cpu_blocks(self) -> int:
        return self.vllm.get_num_free_cpu_blocks()

    def access_all_blocks_in_seq(self, seq: Any, now: float) -> None:
        self._run(self.vllm.access_all_blocks_in_seq, seq, now)

    def get_common_computed_block_ids(self, seqs: list[Any]) -> BlockIds:
        return _ids(self._run(self.vllm.get_common_computed_block_ids, seqs))

    def mark_blocks_as_computed(self, seq_group: Any, token_chunk_size: int) -> None:
        self._run(self.vllm.mark_blocks_as_computed, seq_group, token_chunk_size)

    def _device(self, device: Any) -> Any:
        self._exclude_if(not isinstance(device, Device), f"device {device!r} (vLLM takes its own Device only)")
        return self.device[device.name]

    def get_prefix_cache_hit_rate(self, device: Any) -> float:
        return self._run(self.vllm.get_prefix_cache_hit_rate, self._device(device))

    def reset_prefix_cache(self, device: Any = None) -> bool:
        if device is None:
            cpu_busy = self.vllm.get_num_free_cpu_blocks() != self.num_total_cpu_blocks
            self._exclude_if(self.enable_caching and cpu_busy, "§14.13 reset_prefix_cache() stops at the CPU's refusal")
            return self._run(self.vllm.reset_prefix_cache)
        return self._run(self.vllm.reset_prefix_cache, self._device(device))

    def get_num_cached_tokens(self, seq: Any) -> int:
        self._unsalted([seq])
        return self._run(self.vllm.get_num_cached_tokens, seq)

    def remove_seq_from_computed_blocks_tracker(self, seq: Any) -> None:
        self._run(self.vllm.remove_seq_from_computed_blocks_tracker, seq)

    def snapshot(self) -> dict[str, Any]:
        return vllm_snapshot(self.vllm, self.device)
