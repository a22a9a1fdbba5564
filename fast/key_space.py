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

    def make_room(self, num_more: int = 0) -> None:
        """Room for ``num_more`` new keys (at least one more): collect, or grow."""
        store = self.store
        live = self._live()
        stalled = store.keys.count[0] == self.num_keys_after_collect  # nothing interned since: grow
        if stalled or live.sum() + num_more > len(store.keys.parent) // 2:
            store.keys = grow_keys(store.keys, num_more)
            capacity = len(store.keys.parent)
            store.gpu, store.cpu = P.grow_key_index(store.gpu, capacity), P.grow_key_index(store.cpu, capacity)
            return
        store.keys, remap = collect_keys(store.keys, live, num_more)
        self.num_keys_after_collect = int(store.keys.count[0])
        remap_named(store.tables.keys, store.tables.num_blocks, remap)
        remap_named(store.tracker.keys, store.tracker.num_keys, remap)
        store.gpu, store.cpu = self._remapped(store.gpu, remap), self._remapped(store.cpu, remap)

    def _live(self) -> np.ndarray:
        """Keys named by a cached block, a table entry or a tracker row (a
        row names keys up to its length only: ``mark_named``)."""
        store = self.store
        live = np.zeros(int(store.keys.count[0]), np.bool_)
        for pool in (store.gpu, store.cpu):
            live[pool.block_key[pool.block_key >= 0]] = True
        mark_named(store.tables.keys, store.tables.num_blocks, live)
        mark_named(store.tracker.keys, store.tracker.num_keys, live)
        return live

    def _remapped(self, pool: P.Pool, remap: np.ndarray) -> P.Pool:
        remap_keys(pool.block_key, remap)
        capacity = len(self.store.keys.parent)
        key_block = pool.key_block if len(pool.key_block) == capacity else np.empty(capacity, np.int64)
        key_block.fill(-1)
        cached = np.flatnonzero(pool.block_key >= 0)
        key_block[pool.block_key[cached]] = cached + pool.meta[P.FIRST_ID]
        return pool._replace(key_block=key_block)
