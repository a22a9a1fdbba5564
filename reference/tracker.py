"""The computed-blocks tracker behind ``get_num_cached_tokens`` (spec §10).

Per sequence it keeps the content keys of the full blocks of its token list
(extended as the sequence grows, never recomputed) and the last count of
cached tokens. The count is the longest prefix of keys that are cached and
computed on the GPU, found by vLLM's binary search; if that predicate has a
hole the search may count past it, as vLLM does (spec §14.8). While the
sequence is in prefill the first count is frozen.
"""

from __future__ import annotations

from collections.abc import Callable

from blockspace.protocols import SequenceLike
from blockspace.reference.content import ContentKeys
from blockspace.validation import cache_salt, not_tracked, shrunk_tokens


class ComputedBlocksTracker:
    def __init__(self, block_size: int, keys: ContentKeys, is_cached_and_computed: Callable[[int], bool]) -> None:
        self.block_size = block_size
        self._keys = keys
        self._is_hit = is_cached_and_computed
        self.keys_of: dict[int, list[int]] = {}
        self.num_cached: dict[int, int] = {}

    def check_tokens(self, seq: SequenceLike) -> None:
        known = self.keys_of.get(seq.seq_id, [])
        if len(seq.get_token_ids()) < len(known) * self.block_size:
            raise shrunk_tokens(seq.seq_id, len(seq.get_token_ids()), len(known) * self.block_size)

    def num_cached_tokens(self, seq: SequenceLike) -> int:
        self.check_tokens(seq)
        root = self._keys.root(cache_salt(seq))
        keys = self._keys.chain(
            seq.get_token_ids(), self.block_size, seq.extra_hash(), root, self.keys_of.get(seq.seq_id)
        )
        self.keys_of[seq.seq_id] = keys
        if seq.seq_id in self.num_cached and seq.is_prefill():
            return self.num_cached[seq.seq_id]
        low, high = 0, len(keys)
        while low < high:
            middle = (low + high) // 2
            if self._is_hit(keys[middle]):
                low = middle + 1
            else:
                high = middle
        self.num_cached[seq.seq_id] = low * self.block_size
        return low * self.block_size

    def is_tracked(self, seq_id: int) -> bool:
        return seq_id in self.num_cached

    def remove(self, seq_id: int) -> None:
        if seq_id not in self.num_cached:
            raise not_tracked(seq_id)
        del self.keys_of[seq_id], self.num_cached[seq_id]

    def discard(self, seq_id: int) -> None:
        self.keys_of.pop(seq_id, None)
        self.num_cached.pop(seq_id, None)
