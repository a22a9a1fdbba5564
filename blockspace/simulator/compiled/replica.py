"""A replica of a fleet on the compiled engine: the twin of ``Simulation``
as ``fleet.py`` drives it (``add``, ``advance``, and what a router or a
closed loop reads: ``routers.Replica``).

Why the whole trace at the start: the compiled loop's state is arrays, one
entry per request, indexed by the request's place in the trace (``r``,
``state.py``). A replica holds an entry for every request of the trace, and
``Loop.arrivals`` lists those routed to it, in order; the loop takes only
those. So a request routed here keeps the index, chunk ids and sequence id
it has everywhere, and a router's question about a request not yet routed
reads its prompt from the same arrays (``Run.cached_tokens``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from blockspace.simulator.compiled import state as S
from blockspace.simulator.compiled.engine import Run
from blockspace.simulator.routers import blocks_of
from blockspace.simulator.simulation import SimulationResult, manager_name_of
from blockspace.workloads import TraceRequest


class CompiledReplica:
    """One engine of a fleet, on the compiled loop; it starts with nothing routed."""

    def __init__(self, run: Run, on_progress: Callable[[int], None] | None = None) -> None:
        """``run``: a replay of the whole trace (``Run``), of which this replica takes what is routed to it."""
        self.run, self.on_progress = run, on_progress
        run.loop.meta[S.NUM_ROUTED] = 0
        self.manager_name = manager_name_of(type(run.manager))
        self.num_samples, self.block_size = run.config.num_samples, run.config.scheduler.block_size
        first_samples = run.requests.trace_index[:: self.num_samples].tolist()
        self.position_of = {index: position for position, index in enumerate(first_samples)}
        self.routed_blocks = 0

    # -- what the fleet does --------------------------------------------------------------
    def add(self, entry: TraceRequest) -> None:
        """A trace request routed here: its samples arrive at ``entry.arrival_s``
        (a closed loop may have moved it), after every request routed before."""
        loop, n = self.run.loop, self.num_samples
        first = self.position_of[entry.index] * n
        routed = int(loop.meta[S.NUM_ROUTED])
        loop.arrivals[routed : routed + n] = np.arange(first, first + n)
        self.run.requests.arrival[first : first + n] = entry.arrival_s
        loop.meta[S.NUM_ROUTED] = routed + n
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
        return self.run.cached_tokens(self.position_of[entry.index] * self.num_samples)

    def has_work(self) -> bool:
        loop = self.run.loop
        return bool(loop.meta[S.NUM_PENDING] < loop.meta[S.NUM_ROUTED] or loop.queue_ends[:, 1].any())

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


__all__ = ["CompiledReplica"]
