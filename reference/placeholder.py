"""The placeholder manager: for models without a KV cache (pooling,
attention-free). It keeps no state and answers every call with the same
value (spec §12), so the scheduler's bookkeeping runs unchanged.

Like every manager here it offers ``snapshot()`` and ``check_invariants()``:
its snapshot is the state of a manager that holds nothing, and its one
invariant is that it holds nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from blockspace.enums import AllocStatus, Device
from blockspace.errors import InvariantError
from blockspace.interfaces import BlockSpaceManager
from blockspace.protocols import SequenceGroupLike, SequenceLike


class PlaceholderBlockSpaceManager(BlockSpaceManager):
    def __init__(self, **kwargs: Any) -> None:
        pass

    def can_allocate(self, seq_group: SequenceGroupLike, num_lookahead_slots: int = 0) -> AllocStatus:
        return AllocStatus.OK

    def allocate(self, seq_group: SequenceGroupLike) -> None:
        pass

    def can_append_slots(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> bool:
        return True

    def append_slots(self, seq: SequenceLike, num_lookahead_slots: int) -> list[tuple[int, int]]:
        return []

    def fork(self, parent_seq: SequenceLike, child_seq: SequenceLike) -> None:
        pass

    def can_swap_in(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> AllocStatus:
        return AllocStatus.OK

    def swap_in(self, seq_group: SequenceGroupLike) -> None:  # type: ignore[override]  # vLLM returns None
        return None

    def can_swap_out(self, seq_group: SequenceGroupLike) -> bool:
        return True

    def swap_out(self, seq_group: SequenceGroupLike) -> None:  # type: ignore[override]
        return None

    def free(self, seq: SequenceLike) -> None:
        pass

    def get_block_table(self, seq: SequenceLike) -> None:  # type: ignore[override]
        return None

    def get_num_free_gpu_blocks(self) -> int:
        return 1

    def get_num_free_cpu_blocks(self) -> int:
        return 1

    def access_all_blocks_in_seq(self, seq: SequenceLike, access_time: float) -> None:
        pass

    def get_common_computed_block_ids(self, seqs: Sequence[SequenceLike]) -> list[int]:
        return []

    def mark_blocks_as_computed(self, seq_group: SequenceGroupLike, token_chunk_size: int) -> None:
        pass

    def get_prefix_cache_hit_rate(self, device: Device) -> float:
        return -1

    def reset_prefix_cache(self, device: Device | None = None) -> bool:
        return True

    def get_num_cached_tokens(self, seq: SequenceLike) -> int:
        return 0

    def remove_seq_from_computed_blocks_tracker(self, seq: SequenceLike) -> None:
        pass

    # -- what every blockspace manager offers besides the interface ------------------
    def snapshot(self) -> dict[str, Any]:
        """No tables, no blocks, no statistics (``blockspace/snapshot.py``'s form)."""
        return {
            "tables": {},
            "cross_tables": {},
            "blocks": [],
            "free": {"GPU": [], "CPU": []},
            "evictable": {"GPU": [], "CPU": []},
            "touched": [],
            "hit_stats": {"GPU": (0, 0.0, 0, 0), "CPU": (0, 0.0, 0, 0)},
            "tracker": {},
            "null_block": None,
        }

    def check_invariants(self) -> None:
        """The placeholder holds no state: anything stored on it is a bug
        (``InvariantError``), since no answer of it may depend on a call."""
        if vars(self):
            raise InvariantError(f"the placeholder manager holds state: {sorted(vars(self))}")
