"""Content keys in arrays: an open-addressing hash table over block contents.

A key is a small int handed out in order of first sight, exactly like the
reference's interner: key ``k`` stands for the content ``(parent[k],
tokens[k], extra[k])``. ``extra`` is an interned ``extra_hash()``; the parent
of a sequence's first block is its root: ``-1``, or a negative id interned
from the tenant's cache salt (never equal to a key, which is >= 0). The hash only picks where to look:
every probe compares the stored content itself, so two different contents
never share a key however their hashes collide (equal key <=> equal content).
A slot holds its key and, above it, a tag of the content's hash: a probe
passes an occupied slot whose tag differs without reading the key's stored
content, which sits elsewhere in memory (most probes of a new key pass such
slots, and each read of a key's content was a cache miss).

Kernels that may create keys first ask ``has_room`` and, when it says no,
return ``NO_KEY_ROOM`` before changing anything; the caller grows the table
with ``grow_keys`` and calls again.

The table may leave the ids below ``first`` to its caller: keys the caller
names itself, for contents it knows apart from their tokens (the
simulator's blocks of a trace's prompts, one id per distinct prompt block,
made before the replay). Those ids are never looked up, stored or collected
here; a key of the table may name one as its parent. The table's own keys
are ``first``, ``first + 1``, ... and its arrays are indexed by ``key - first``.
A manager's table has ``first`` 0 and every key is its own.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from blockspace.fast.borrowing import counting

MASK = (1 << 40) - 1  # keeps every intermediate hash below 2**61 (no overflow, jit or not)
KEY_BITS = 32  # a slot: (tag << KEY_BITS) | key, or -1 when empty
KEY_MASK = (1 << KEY_BITS) - 1
TAG_SHIFT = 9  # the tag is hash bits above the few that pick the slot of a small table
TAG_MASK = (1 << 30) - 1


class Keys(NamedTuple):
    parent: np.ndarray  # int64[cap]: key of the previous block, -1 for the first
    extra: np.ndarray  # int64[cap]: interned extra_hash() of the content
    tokens: np.ndarray  # int64[cap, block_size]
    slots: np.ndarray  # int64[2 * cap]: (hash tag << KEY_BITS) | key id, or -1; probed linearly
    count: np.ndarray  # int64[1]: keys handed out so far
    first: np.ndarray  # int64[1]: the first key the table hands out (the ids below are the caller's)


def new_keys(block_size: int, capacity: int = 256, first: int = 0) -> Keys:
    return Keys(
        np.full(capacity, -1, np.int64),
        np.zeros(capacity, np.int64),
        np.zeros((capacity, block_size), np.int64),
        np.full(2 * capacity, -1, np.int64),
        np.zeros(1, np.int64),
        np.full(1, first, np.int64),
    )


def grow_keys(keys: Keys, num_more: int) -> Keys:
    """A table at least twice as large, with room for ``num_more`` more keys; same key ids."""
    capacity = 2 * len(keys.parent)
    while capacity < keys.count[0] + num_more:
        capacity *= 2
    return _resized(keys, capacity)


def _resized(keys: Keys, capacity: int) -> Keys:
    """The same keys, ids and all, in a new table of ``capacity``."""
    grown = new_keys(keys.tokens.shape[1], capacity, int(keys.first[0]))
    count = keys.count[0]
    grown.parent[:count] = keys.parent[:count]
    grown.extra[:count] = keys.extra[:count]
    grown.tokens[:count] = keys.tokens[:count]
    grown.count[0] = count
    _rehash(grown)
    return grown


@njit(cache=True, inline="always")
def _hash(parent, tokens, start, block_size, extra):
    h = (parent & MASK) ^ ((extra & MASK) * 31)
    for j in range(block_size):
        h = ((h ^ (tokens[start + j] & MASK)) * 1000003) & MASK
    return h ^ (h >> 21)


@njit(cache=True, inline="always")
def _same(parents, extras, stored, index, parent, tokens, start, extra):
    if parents[index] != parent or extras[index] != extra:
        return False
    for j in range(stored.shape[1]):
        if stored[index, j] != tokens[start + j]:
            return False
    return True


@counting
def _rehash(keys):
    mask = keys.slots.shape[0] - 1
    block_size = keys.tokens.shape[1]
    for index in range(keys.count[0]):
        h = _hash(keys.parent[index], keys.tokens[index], 0, block_size, keys.extra[index])
        slot = h & mask
        while keys.slots[slot] >= 0:
            slot = (slot + 1) & mask
        keys.slots[slot] = _tag(h) << KEY_BITS | (keys.first[0] + index)


@counting
def has_room(keys, num_new):
    return keys.count[0] + num_new <= keys.parent.shape[0]


@njit(cache=True, inline="always")
def _tag(h):
    return (h >> TAG_SHIFT) & TAG_MASK


@njit(cache=True, inline="always")
def _slot_of(parents, extras, stored, slots, first, parent, tokens, start, extra, h):
    """The slot that holds this content's key (its hash ``h``), or the free slot where it would go."""
    mask = slots.shape[0] - 1
    slot = h & mask
    tag = _tag(h)
    while True:
        held = slots[slot]
        if held < 0:
            return slot
        if held >> KEY_BITS == tag and _same(
            parents, extras, stored, (held & KEY_MASK) - first, parent, tokens, start, extra
        ):
            return slot
        slot = (slot + 1) & mask


@njit(cache=True, inline="always")
def _intern(parents, extras, stored, slots, count, first, parent, tokens, start, extra):
    """``intern`` on the table's arrays. Why arrays: each read of a field
    of a handle counts the array's reference up and down (two atomic
    operations), and one probe reads five fields; a chain of blocks reads
    them once (``key_chain``)."""
    block_size = stored.shape[1]
    h = _hash(parent, tokens, start, block_size, extra)
    slot = _slot_of(parents, extras, stored, slots, first, parent, tokens, start, extra, h)
    if slots[slot] >= 0:
        return slots[slot] & KEY_MASK
    index = count[0]
    count[0] = index + 1
    parents[index] = parent
    extras[index] = extra
    for j in range(block_size):
        stored[index, j] = tokens[start + j]
    slots[slot] = _tag(h) << KEY_BITS | (first + index)
    return first + index


@counting
def intern(keys, parent, tokens, start, extra):
    """The key of the block ``tokens[start:start + block_size]`` after the
    block keyed ``parent``; a new key if this content was never seen (the
    caller has checked ``has_room``)."""
    return _intern(
        keys.parent, keys.extra, keys.tokens, keys.slots, keys.count, keys.first[0], parent, tokens, start, extra
    )


@counting
def key_chain(keys, root, tokens, extra, out, first, last):
    """Key blocks ``first .. last - 1`` of a sequence into ``out``: block
    ``index``'s tokens are ``tokens[(index - first) * block_size:]``, its
    parent ``out[index - 1]`` (``root`` for block 0). The caller has checked
    ``has_room`` for ``last - first`` keys."""
    parents, extras, stored, slots, count = keys.parent, keys.extra, keys.tokens, keys.slots, keys.count
    block_size, own = stored.shape[1], keys.first[0]
    for index in range(first, last):
        parent = out[index - 1] if index else root
        start = (index - first) * block_size
        out[index] = _intern(parents, extras, stored, slots, count, own, parent, tokens, start, extra)


@counting
def _close_over_parents(parent, live, first):
    """A live key keeps its parent alive (a parent of the table's own: the
    caller's ids and the roots are not the table's to keep). A parent is
    always interned before its children, so one pass from the newest key down
    is enough."""
    for index in range(live.shape[0] - 1, -1, -1):
        if live[index] and parent[index] >= first:
            live[parent[index] - first] = True


def collect_keys(keys: Keys, live: np.ndarray, num_more: int, first: int | None = None) -> tuple[Keys, np.ndarray]:
    """Forget every key not marked ``live`` (``live[key - first]``), nor a
    parent of one, and number the rest ``first``, ``first + 1``, ... again, in
    the same order: ``first`` as before, or the one given (a caller that
    names more ids of its own moves the table's keys up).

    Keys are interned for good while anything may still name them, but most
    keys stop mattering once their blocks are evicted and no table or
    tracker row holds them; without collecting them the table grows with
    every distinct block ever seen. Returns the table, with room for
    ``num_more`` keys, and ``remap``: old key - old first -> new key, -1 if
    forgotten. The caller rewrites every stored key with ``remap``
    (``remap_keys``, ``remap_named``, given the old ``first``).

    The survivors move down in the same table when it is large enough
    (twice the keys it must hold), and only its slots are made again: a
    table of a 50,000-block pool is some 20 MB, and a fresh one at each
    collection cost a fleet of four replicas a quarter of a second.
    """
    old_first = int(keys.first[0])
    new_first = old_first if first is None else first
    _close_over_parents(keys.parent, live, old_first)
    remap = np.full(len(live), -1, np.int64)
    num_live = int(live.sum())
    remap[live] = np.arange(new_first, new_first + num_live)
    _compact(keys, live, remap, old_first, new_first)
    keys.count[0] = num_live
    keys.first[0] = new_first
    capacity = len(keys.parent)
    while capacity < 2 * (num_live + num_more):
        capacity *= 2
    if capacity > len(keys.parent):
        return _resized(keys, capacity), remap
    keys.slots.fill(-1)
    _rehash(keys)
    return keys, remap


@counting
def _compact(keys, live, remap, old_first, new_first):
    """Each live key to its new place, ``remap[index] - new_first <= index``:
    taken in increasing order, a key is written over only once it was moved
    or forgotten."""
    for index in range(live.shape[0]):
        if live[index]:
            new = remap[index] - new_first
            parent = keys.parent[index]
            keys.parent[new] = remap[parent - old_first] if parent >= old_first else parent
            keys.extra[new] = keys.extra[index]
            keys.tokens[new, :] = keys.tokens[index, :]


def remap_keys(stored: np.ndarray, remap: np.ndarray, first: int) -> None:
    """Rewrite stored keys of the table (``first`` and up) in place; the
    rest (no key, the caller's own ids) stay."""
    named = stored >= first
    stored[named] = remap[stored[named] - first]


@counting
def mark_named(stored, lengths, live, first):
    """Mark live each key of the table the rows name: ``stored[row, :lengths[row]]``.
    Past its length a row's entries are stale (a freed table, a tracker row
    opened again) and never read, so they name nothing; walking only the
    named entries costs their number, not the arrays' size."""
    for row in range(stored.shape[0]):
        for index in range(min(lengths[row], stored.shape[1])):
            if stored[row, index] >= first:
                live[stored[row, index] - first] = True


@counting
def remap_named(stored, lengths, remap, first):
    """``remap_keys`` of the entries the rows name (``mark_named``); the
    stale ones past a row's length stay as they are, never read."""
    for row in range(stored.shape[0]):
        for index in range(min(lengths[row], stored.shape[1])):
            if stored[row, index] >= first:
                stored[row, index] = remap[stored[row, index] - first]
