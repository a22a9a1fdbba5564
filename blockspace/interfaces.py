"""The v0 block-manager interface of vLLM 0.9.2 (``vllm/core/interfaces.py``).

``BlockSpaceManager`` declares the 19 abstract methods a v0 scheduler calls,
with vLLM's names, keywords and defaults, so that a scheduler written for
vLLM can hold any of our managers. ``get_block_space_manager_class`` maps a
version name to an implementation, case-insensitively. Sequences and groups
are typed by what a manager reads of them (``blockspace/protocols.py``), so
vLLM's own objects pass, as do ours.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from blockspace.enums import AllocStatus, Device
from blockspace.protocols import SequenceGroupLike, SequenceLike

# Version name -> "module:Class". "selfattn" is vLLM's name for its default
# manager; it points at the fast implementation once that agrees with the
# reference on every call (the conformance suite is the judge).
MANAGER_CLASSES = {
    "reference": "blockspace.reference:ReferenceBlockSpaceManager",
    "fast": "blockspace.fast:FastBlockSpaceManager",
    "placeholder": "blockspace.reference:PlaceholderBlockSpaceManager",
    "selfattn": "blockspace.fast:FastBlockSpaceManager",
}


def load_manager_class(spec: str) -> type:
    """A class from a version name (``"fast"``) or a ``package.module:Class``."""
    target = MANAGER_CLASSES.get(spec.lower(), spec)
    if ":" not in target:
        known = ", ".join(sorted(MANAGER_CLASSES))
        raise ValueError(f"Unknown version {spec.lower()!r}: known versions are {known} (or package.module:Class)")
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


class BlockSpaceManager(ABC):
    """Where each sequence's KV cache lives: a table of fixed-size blocks per
    sequence, on the GPU or swapped to the CPU."""

    @staticmethod
    def get_block_space_manager_class(version: str) -> type:
        """The manager class for a version name: "reference", "fast",
        "placeholder" or "selfattn" (vLLM's name for the default one)."""
        name = version.lower()
        if name not in MANAGER_CLASSES:
            known = ", ".join(sorted(MANAGER_CLASSES))
            raise ValueError(f"Unknown version {name!r}: known versions are {known}")
        return load_manager_class(name)

    @abstractmethod
    def can_allocate(self, seq_group: SequenceGroupLike, num_lookahead_slots: int = 0) -> AllocStatus: ...

    @abstractmethod
    def allocate(self, seq_group: SequenceGroupLike) -> None: ...

    @abstractmethod
    def can_append_slots(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> bool: ...

    @abstractmethod
    def append_slots(self, seq: SequenceLike, num_lookahead_slots: int) -> list[tuple[int, int]]: ...

    @abstractmethod
    def fork(self, parent_seq: SequenceLike, child_seq: SequenceLike) -> None: ...

    @abstractmethod
    def can_swap_in(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> AllocStatus: ...

    @abstractmethod
    def swap_in(self, seq_group: SequenceGroupLike) -> list[tuple[int, int]]: ...

    @abstractmethod
    def can_swap_out(self, seq_group: SequenceGroupLike) -> bool: ...

    @abstractmethod
    def swap_out(self, seq_group: SequenceGroupLike) -> list[tuple[int, int]]: ...

    @abstractmethod
    def free(self, seq: SequenceLike) -> None: ...

    @abstractmethod
    def get_block_table(self, seq: SequenceLike) -> list[int]: ...

    @abstractmethod
    def get_num_free_gpu_blocks(self) -> int: ...

    @abstractmethod
    def get_num_free_cpu_blocks(self) -> int: ...

    @abstractmethod
    def access_all_blocks_in_seq(self, seq: SequenceLike, access_time: float) -> None: ...

    @abstractmethod
    def get_common_computed_block_ids(self, seqs: Sequence[SequenceLike]) -> list[int]: ...

    @abstractmethod
    def mark_blocks_as_computed(self, seq_group: SequenceGroupLike, token_chunk_size: int) -> None: ...

    @abstractmethod
    def get_prefix_cache_hit_rate(self, device: Device) -> float: ...

    @abstractmethod
    def reset_prefix_cache(self, device: Device | None = None) -> bool: ...

    @abstractmethod
    def get_num_cached_tokens(self, seq: SequenceLike) -> int: ...


# The array-level step a manager may offer beside the interface (the fast
# manager's ``fast/row_api.py``): table rows and lengths in, arrays out.
# Schedulers and the conformance kit find it by these methods, not by class.
ROW_API = (
    "rows_of",
    "can_append_slots_rows",
    "append_slots_rows",
    "block_table_array",
    "access_all_blocks_rows",
    "num_computed_blocks_rows",
)


def offers_rows(manager: Any) -> bool:
    """Does ``manager`` offer every method of ``ROW_API``?"""
    return all(callable(getattr(manager, name, None)) for name in ROW_API)


# The batched step on Sequence objects a manager may offer (the fast
# manager's ``fast/batch.py``): one call for all running sequences.
BATCH_API = ("can_append_slots_batch", "append_slots_batch")


def offers_batch(manager: Any) -> bool:
    """Does ``manager`` offer every method of ``BATCH_API``?"""
    return all(callable(getattr(manager, name, None)) for name in BATCH_API)


__all__ = [
    "AllocStatus", "BATCH_API", "BlockSpaceManager", "MANAGER_CLASSES", "ROW_API", "load_manager_class", "offers_batch",
    "offers_rows",
]  # fmt: skip
