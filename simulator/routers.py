"""How a fleet's router picks a replica for each request (``fleet.py``).

A router sees each replica as it stands when the request arrives: every
step that started before the arrival has run (a step is whole, so a
replica may be a little past it). It reads a replica only through what a
real router could know (``Replica`` below), and ties go to the lowest index.

- ``round_robin``: replica ``position % N``, the request's place in the
  trace. It reads nothing, so a fleet under it is its replicas replayed
  apart, each on its share of the trace: any engine can replay it.
- ``least_loaded``: the fewest outstanding requests (routed there and not
  yet finished, ignored or aborted): Vidur's "least outstanding requests".
- ``kv_aware``: the least cost, in blocks,
  ``weight x (prompt blocks the replica's prefix cache lacks) + (prompt
  blocks of the requests outstanding there)``. The first term is the
  prefill the replica would have to compute, the second its load. This is
  how Dynamo's KV router scores workers: an overlap weight on the blocks
  to prefill, plus the blocks active there; its default weight is 1.
  ``weight`` 0 routes by load alone; a large one by the cache alone. The
  cache is read through the manager's public calls (``Replica.cached_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from blockspace.workloads import TraceRequest


class Replica(Protocol):
    """What a router reads of a replica (``Simulation`` and ``CompiledReplica`` offer it)."""

    def outstanding(self) -> int:
        """Requests routed here and not yet done."""
        ...

    def outstanding_blocks(self) -> int:
        """Prompt blocks of those requests."""
        ...

    def cached_tokens(self, entry: TraceRequest) -> int:
        """Tokens of the request's prompt that the replica's prefix cache holds."""
        ...


def blocks_of(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` (the last one partly filled)."""
    return -(-num_tokens // block_size)


def round_robin(position: int, entry: TraceRequest, replicas: Sequence[Replica], block_size: int, weight: float) -> int:
    return position % len(replicas)


def least_loaded(
    position: int, entry: TraceRequest, replicas: Sequence[Replica], block_size: int, weight: float
) -> int:
    loads = [replica.outstanding() for replica in replicas]
    return loads.index(min(loads))


def kv_aware(position: int, entry: TraceRequest, replicas: Sequence[Replica], block_size: int, weight: float) -> int:
    prompt_blocks = blocks_of(entry.input_length, block_size)
    costs = [
        weight * (prompt_blocks - replica.cached_tokens(entry) // block_size) + replica.outstanding_blocks()
        for replica in replicas
    ]
    return costs.index(min(costs))


Router = Callable[[int, TraceRequest, Sequence[Replica], int, float], int]
ROUTERS: dict[str, Router] = {"round_robin": round_robin, "least_loaded": least_loaded, "kv_aware": kv_aware}
STATIC = frozenset({"round_robin"})  # routers that read no replica: the assignment is known before the replay

__all__ = ["ROUTERS", "STATIC", "Replica", "Router", "blocks_of", "kv_aware", "least_loaded", "round_robin"]
