"""The content-key space: small ids for what keys a block, and the collector
that keeps the key table from filling with keys nothing names any more.

A block's content key chains from its parent key (the first block's parent
is the tenant's cache salt) and mixes in the sequence's ``extra_hash()``
(LoRA and prompt-adapter ids). Kernels take both as small ints: ``root_id``
gives each salt a negative id (-1: no salt) and ``extra_id`` each extra value
a non-negative one, once, for the manager's life.

Why a collector: keys are interned in an open-addressing table
(``fast/content.py``) and a finished request's keys stay there while an
evicted block, a table or a tracker row could still name them. When the
table runs out of room, the keys nobody names are dropped and the survivors
renumbered (every array holding keys is remapped); the table grows only if
the live keys still fill half of it, or if nothing was interned since the
last collection.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blockspace.fast import pool as P
from blockspace.fast.content import collect_keys, grow_keys, mark_named, remap_keys, remap_named
from blockspace.fast.saving import SavedFields
from blockspace.fast.store import Store


class KeySpace(SavedFields):
    """Salt and extra ids, and room in the key table (see the module docstring)."""

    SAVED = ("extra_ids", "root_ids", "num_keys_after_collect")

    def __init__(self, store: Store) -> None:
        self.store = store
        self.extra_ids: dict[Any, int] = {None: 0}  # extra_hash() -> small int
        self.root_ids: dict[Any, int] = {None: -1}  # cache salt -> negative id (the first block's parent)
        self.num_keys_after_collect = -1

    def extra_id(self, extra: Any) -> int:
        extra_id = self.extra_ids.get(extra)
        if extra_id is None:
            extra_id = self.extra_ids[extra] = len(self.extra_ids)
        return extra_id

    def root_id(self, salt: Any) -> int:
        """The parent of a first block key: -1 (no salt), or the cache salt's id."""
        root = self.root_ids.get(salt)
        if root is None:
            root = self.root_ids[salt] = -1 - len(self.root_ids)
        return root

    def make_room(self, num_more: int = 0, first: int | None = None) -> None:
        """Room for ``num_more`` new keys (at least one more): collect, or
        grow. Given ``first``, the ids below it are left to the caller
        (``fast/content.py``): the table's keys move up to it, by a collection."""
        store = self.store
        live = self._live()
        stalled = store.keys.count[0] == self.num_keys_after_collect  # nothing interned since: grow
        if first is None and (stalled or live.sum() + num_more > len(store.keys.parent) // 2):
            store.keys = grow_keys(store.keys, num_more)
            size = self._index_size()
            store.gpu, store.cpu = P.grow_key_index(store.gpu, size), P.grow_key_index(store.cpu, size)
            return
        old_first = int(store.keys.first[0])
        store.keys, remap = collect_keys(store.keys, live, num_more, first)
        self.num_keys_after_collect = int(store.keys.count[0])
        remap_named(store.tables.keys, store.tables.num_blocks, remap, old_first)
        remap_named(store.tracker.keys, store.tracker.num_keys, remap, old_first)
        store.gpu = self._remapped(store.gpu, remap, old_first)
        store.cpu = self._remapped(store.cpu, remap, old_first)

    def _index_size(self) -> int:
        """A pool's key index covers the caller's ids and the table's."""
        keys = self.store.keys
        return int(keys.first[0]) + len(keys.parent)

    def _live(self) -> np.ndarray:
        """Keys of the table named by a cached block, a table entry or a
        tracker row (a row names keys up to its length only: ``mark_named``)."""
        store = self.store
        first = int(store.keys.first[0])
        live = np.zeros(int(store.keys.count[0]), np.bool_)
        for pool in (store.gpu, store.cpu):
            live[pool.block_key[pool.block_key >= first] - first] = True
        mark_named(store.tables.keys, store.tables.num_blocks, live, first)
        mark_named(store.tracker.keys, store.tracker.num_keys, live, first)
        return live

    def _remapped(self, pool: P.Pool, remap: np.ndarray, old_first: int) -> P.Pool:
        """The pool's keys remapped, and its key index made again over the
        table's part (the caller's part kept, where its ids did not move)."""
        remap_keys(pool.block_key, remap, old_first)
        first, size = int(self.store.keys.first[0]), self._index_size()
        key_block = pool.key_block
        if len(key_block) != size or first != old_first:
            key_block = np.full(size, -1, key_block.dtype)
            key_block[:old_first] = pool.key_block[:old_first]
        else:
            key_block[first:] = -1
        cached = np.flatnonzero(pool.block_key >= first)
        key_block[pool.block_key[cached]] = cached + pool.meta[P.FIRST_ID]
        return pool._replace(key_block=key_block)
