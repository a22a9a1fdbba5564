"""The one form of ``snapshot()`` every implementation returns.

A snapshot is the full observable state as plain data (dicts, lists, tuples,
ints, floats, bools, strings), so two implementations agree exactly when
their snapshots are equal (``==``). Content keys are not part of it: how an
implementation names content is its own business; what keys decide (which
block is cached, shared, evicted) is all visible here.

``{
  "tables":   {seq_id: {"blocks": [absolute ids], "num_tokens": int,
                         "device": "GPU" | "CPU", "last_access": float | None}},
  "cross_tables": {request_id: [absolute ids]},
  "blocks":   [(refcount, cached, computed, last_access) for each absolute id],
  "free":     {"GPU": [ids, front first], "CPU": [...]},   # uncached free list
  "evictable": {"GPU": [ids, next victim first], "CPU": [...]},
  "touched":  [GPU ids registered since the last mark_blocks_as_computed, sorted],
  "hit_stats": {"GPU": (buckets, bucket_mean, queries, hits), "CPU": (...)},
  "tracker":  {seq_id: (num_keyed_blocks, num_cached_tokens)},
  "null_block": id | None,
}``

``last_access`` of a block is its recorded access time while in use, its
eviction time while idle, ``-1.0`` otherwise (and always without caching).
"""

from __future__ import annotations

from typing import Any

Snapshot = dict[str, Any]

SNAPSHOT_KEYS = (
    "tables",
    "cross_tables",
    "blocks",
    "free",
    "evictable",
    "touched",
    "hit_stats",
    "tracker",
    "null_block",
)


def diff(a: Snapshot, b: Snapshot) -> list[str]:
    """Human-readable differences between two snapshots (empty when equal)."""
    problems = []
    for name in SNAPSHOT_KEYS:
        if a.get(name) != b.get(name):
            left, right = a.get(name), b.get(name)
            if isinstance(left, dict) and isinstance(right, dict):
                for k in sorted(set(left) | set(right), key=repr):
                    if left.get(k) != right.get(k):
                        problems.append(f"{name}[{k!r}]: {left.get(k)!r} != {right.get(k)!r}")
            elif isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
                for i, (x, y) in enumerate(zip(left, right)):
                    if x != y:
                        problems.append(f"{name}[{i}]: {x!r} != {y!r}")
            else:
                problems.append(f"{name}: {left!r} != {right!r}")
    return problems
