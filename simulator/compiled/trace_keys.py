"""The trace's own content keys: one per distinct full prompt block, made
before the replay, so that keying a prompt block is arithmetic and a read,
not a hash and a probe of fast's key table.

Why it can: a prompt token is a function of its chunk id and offset
(``workloads.prompt_token_ids``), so a full block's content (its tokens and
every token before it) is fixed by the chunk ids up to the chunk that holds
its last token. Two full prompt blocks have the same content exactly when
they have the same index and the same chunk ids up to there: the same node
of the trace's tree of chunk ids (``chunk_nodes``). So a node owns
``keys_per_node`` consecutive keys, one per block whose last token lies in
its chunk, and the blocks of a chunk are keyed in order, side by side in
memory. The ids are only tokens' stand-ins: generated tokens (and any block
holding one) lie in the other half of the token ids (``workloads``), so no
full block past the prompt's can share a content with one of these; those
are keyed by fast's key table as always.

Where the key spaces part, and how they meet: fast's key table leaves the
ids below its ``first`` to its caller (``fast/content.py``), and a replica
numbers the nodes of the requests routed to it in the order they come
(``number_nodes``), so a replica's keys cover the prompts it was sent, not
the fleet's trace. ``block_key`` is the one map from a trace block to
fast's key; ``tests/test_trace_keys.py`` holds it equal to fast's own
keying, block for block: two blocks get one key here exactly when fast's
table, keying their tokens, gives them one.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from blockspace.workloads import CHUNK_TOKENS, NUM_CHUNK_IDS


def keys_per_node(block_size: int) -> int:
    """The most full blocks whose last token lies in one chunk."""
    return -(-CHUNK_TOKENS // block_size)


@njit(cache=True, inline="always")
def block_key(node_key, nodes, chunk_lo, index, block_size):
    """Full prompt block ``index`` of the request whose chunk ids start at
    ``chunk_lo``: the first key of the node of the chunk holding its last
    token, plus its place among that chunk's blocks; -1 if this replica has
    not numbered that node (no block of it was ever keyed here)."""
    chunk = (index * block_size + block_size - 1) // CHUNK_TOKENS
    first = node_key[nodes[chunk_lo + chunk]]
    return first + index - chunk * CHUNK_TOKENS // block_size if first >= 0 else -1


def chunk_nodes(chunks: np.ndarray, chunk_lo: np.ndarray, prompt_len: np.ndarray) -> tuple[np.ndarray, int]:
    """Each chunk id's node in the tree of the trace's prompts (a node is a
    sequence of chunk ids from a prompt's start), and the number of nodes.
    ``chunks[chunk_lo[r]:]`` are request ``r``'s chunk ids, for its
    ``prompt_len[r]`` tokens (a request's samples share them). Made a depth
    at a time: a node is its parent node and its chunk id, so the nodes of a
    depth are the distinct pairs there (their numbers are arbitrary: a
    replica numbers its keys apart, ``number_nodes``)."""
    nodes = np.full(len(chunks), -1, np.int64)
    positions = prompt_positions(chunk_lo, prompt_len)
    depth = positions - np.repeat(chunk_lo, -(-prompt_len // CHUNK_TOKENS))
    positions, first = np.unique(positions, return_index=True)
    depth = depth[first]
    by_depth = np.argsort(depth, kind="stable")
    ends = np.searchsorted(depth[by_depth], np.arange(int(depth.max(initial=-1)) + 2))
    num_nodes = 0
    for level in range(len(ends) - 1):
        here = positions[by_depth[ends[level] : ends[level + 1]]]
        parent = nodes[here - 1] if level else np.full(len(here), -1, np.int64)
        pairs, numbers = np.unique((parent + 1) * NUM_CHUNK_IDS + chunks[here], return_inverse=True)
        nodes[here] = num_nodes + numbers
        num_nodes += len(pairs)
    return nodes, num_nodes


def number_nodes(node_key: np.ndarray, nodes: np.ndarray, positions: np.ndarray, num_numbered: int,
                 per_node: int) -> int:  # fmt: skip
    """Give the nodes at ``positions`` (of ``nodes``) not yet numbered on
    this replica their first keys, ``per_node`` apart, in the order they
    first appear; returns how many nodes are numbered now."""
    fresh = nodes[positions]
    fresh = fresh[node_key[fresh] < 0]
    _, first_seen = np.unique(fresh, return_index=True)
    fresh = fresh[np.sort(first_seen)]
    node_key[fresh] = (num_numbered + np.arange(len(fresh))) * per_node
    return num_numbered + len(fresh)


def prompt_positions(chunk_lo: np.ndarray, prompt_len: np.ndarray) -> np.ndarray:
    """The positions in the trace's chunk ids of these requests' prompts, one after another."""
    counts = -(-prompt_len // CHUNK_TOKENS)
    starts = np.repeat(chunk_lo - np.cumsum(counts) + counts, counts)
    return starts + np.arange(int(counts.sum()))


@njit(cache=True, inline="always")
def num_table_keys(prompt_len, known, num_full, block_size):
    """Of full blocks ``known .. num_full - 1``, those fast's key table keys:
    the ones past the prompt's full blocks."""
    return max(0, num_full - max(known, prompt_len // block_size))
