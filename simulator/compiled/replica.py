"""A replica of a fleet on the compiled engine: the twin of ``Simulation``
as ``fleet.py`` drives it (``add``, ``advance``, and what a router or a
closed loop reads: ``routers.Replica``).

Why the trace's arrays are the fleet's, made once (``FleetTrace``): a
request's prompt is its chunk ids (``state.py``), which every replica
reads, and a router asks each replica about a request before any holds
it. A replica holds only what is routed to it (``Run.take``): its own
entry per request, in the order they came, and arrays grown as they
come. So a fleet's memory grows with its work, not with its replicas
times its trace: a replica that gets nothing holds its manager's pools
and little else (``simulator/memory.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from blockspace.simulator.compiled import state as S
from blockspace.simulator.compiled.engine import Run, trace_nodes
from blockspace.simulator.routers import blocks_of
from blockspace.simulator.runs import SimulationConfig, SimulationResult, manager_name_of
from blockspace.workloads import TraceRequest


@dataclass(frozen=True)
class FleetTrace:
    """The trace as the compiled engine holds it, once for a whole fleet."""

    requests: S.Requests  # an entry per request (sample), in trace order (``S.new_requests``)
    chunks: np.ndarray  # every request's chunk ids, one after another
    nodes: np.ndarray  # each chunk id's node in the tree of prompts (``trace_keys.py``)
    num_nodes: int
    position_of: dict[int, int]  # a trace request's index -> its place in the trace

    @classmethod
    def of(cls, trace: list[TraceRequest], config: SimulationConfig) -> FleetTrace:
        requests, chunks = S.new_requests(trace, config.num_samples, config.max_output_len)
        nodes, num_nodes = trace_nodes(chunks, requests, config.scheduler.enable_prefix_caching)
        return cls(requests, chunks, nodes, num_nodes, {entry.index: position for position, entry in enumerate(trace)})


class CompiledReplica:
    """One engine of a fleet, on the compiled loop; it starts with nothing routed."""

    def __init__(
        self, trace: FleetTrace, manager_class: type, config: SimulationConfig,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:  # fmt: skip
        """``config``: the replica's own (one engine, ``fleet.py``)."""
        self.trace, self.on_progress = trace, on_progress
        self.run = Run([], manager_class, config, shared=(trace.chunks, trace.nodes, trace.num_nodes))
        self.manager_name = manager_name_of(manager_class)
        self.num_samples, self.block_size = config.num_samples, config.scheduler.block_size
        self.routed_blocks = 0

    # -- what the fleet does --------------------------------------------------------------
    def add(self, entry: TraceRequest) -> None:
        """A trace request routed here: its samples arrive at ``entry.arrival_s``
        (a closed loop may have moved it), after every request routed before."""
        n = self.num_samples
        self.run.take(self.trace.requests, self.trace.position_of[entry.index] * n, n, entry.arrival_s)
        self.routed_blocks += blocks_of(entry.input_length, self.block_size) * n

    def advance(self, until: float) -> None:
        """Run every step that starts before ``until`` (``Simulation.advance``).
        Not called when it would run none (its clock at or past ``until``, or
        nothing routed here to do): a call into compiled code costs more than
        a short step, and a router asks at every arrival."""
        if until < math.inf and ((self.clock >= until and not self.stalled) or not self.has_work()):
            return
        self.run.advance(until, self.on_progress)

    def result(self, wall_s: float, startup_s: float) -> SimulationResult:
        """The replica's result, once ``advance(math.inf)`` has returned."""
        return self.run.result(self.manager_name, wall_s, startup_s)

    def held_bytes(self) -> int:
        """The bytes of the arrays this replica holds: its manager's (pools,
        key table, tables, tracker) and its loop's; the fleet's trace, which
        every replica reads (``FleetTrace``), is not counted."""
        store, loop = self.run.manager.store, self.run.loop
        own = S.array_bytes(store.gpu, store.cpu, store.keys, store.tables, store.tracker, loop, self.run.requests)
        return own - self.trace.chunks.nbytes - self.trace.nodes.nbytes  # the loop's chunks and nodes are the fleet's

    # -- what a router and a closed loop read --------------------------------------------
    @property
    def routed(self) -> int:
        return int(self.run.loop.meta[S.NUM_ROUTED])

    @property
    def num_done(self) -> int:
        return self.run.num_done()

    @property
    def clock(self) -> float:
        return float(self.run.loop.clock[0])

    @property
    def stalled(self) -> bool:
        return bool(self.run.loop.meta[S.IS_STALLED])

    def outstanding(self) -> int:
        return self.routed - self.num_done

    def outstanding_blocks(self) -> int:
        return self.routed_blocks - int(self.run.loop.meta[S.DONE_BLOCKS])

    def cached_tokens(self, entry: TraceRequest) -> int:
        first = self.trace.position_of[entry.index] * self.num_samples
        return self.run.cached_tokens(int(self.trace.requests.chunk_lo[first]), entry.input_length)

    def has_work(self) -> bool:
        loop = self.run.loop
        return bool(loop.meta[S.NUM_PENDING] < loop.meta[S.NUM_ROUTED] or loop.queue_ends[:, 1].any())

    def finished_at(self) -> list[tuple[int, float]]:
        """(trace index, time) of each request finished here (``Simulation.finished_at``): in the
        order they finished, those of one step in the order they were routed here."""
        requests, routed = self.run.requests, self.routed
        done = np.flatnonzero(requests.status[:routed] == S.FINISHED)
        done = done[np.argsort(requests.finish[done], kind="stable")]
        return list(zip(requests.trace_index[done].tolist(), requests.finish[done].tolist()))

    def unfinished(self) -> list[int]:
        """The trace indexes of the requests routed here and not done, in order (``Simulation.unfinished``)."""
        requests, routed = self.run.requests, self.routed
        live = requests.status[:routed] < S.FINISHED  # waiting, running or swapped
        return sorted(set(requests.trace_index[:routed][live].tolist()))

    def num_done_by(self, at: float) -> int:
        """Requests done at or before ``at`` (as far as the replica has run)."""
        return int(np.searchsorted(self._done_at(), at, side="right"))

    def done_after(self, at: float) -> list[float]:
        """When the requests done after ``at`` were done, in order."""
        times = self._done_at()
        return times[np.searchsorted(times, at, side="right") :].tolist()

    def _done_at(self) -> np.ndarray:
        loop = self.run.loop
        return loop.done_at[: loop.meta[S.NUM_DONE]]


__all__ = ["CompiledReplica", "FleetTrace"]
