"""The compiled engine's driver: it builds the arrays, runs the compiled
loop (``loop.py``), makes room whenever the loop asks, and turns what the
loop left into the Python engine's ``SimulationResult``: the same
``Metrics``, and with recorded tables the same ``StepRecord`` list, so that
reports, sweeps, searches and ``--compare`` read both engines alike.

The block manager is a real ``FastBlockSpaceManager``: the loop runs fast's
kernels on that manager's own arrays (``blocks.py``), and the driver grows
them with the manager's own parts (the key space's collector, fast's
``grow_*``). After the run every request has been freed, so the manager is
left as the Python engine leaves its manager, and ``check_invariants`` holds.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from blockspace.enums import Device, SequenceStatus
from blockspace.errors import InvalidConfigError
from blockspace.fast import content as C
from blockspace.fast import table as T
from blockspace.fast import tracker as K
from blockspace.fast.dispatch import direct
from blockspace.fast.manager import FastBlockSpaceManager
from blockspace.simulator.compiled import loop as L
from blockspace.simulator.compiled import state as S
from blockspace.simulator.compiled import trace_keys as TK
from blockspace.simulator.compiled.blocks import Fast, probe_cached_tokens
from blockspace.simulator.compiled.digest import signed
from blockspace.simulator.decisions import StepRecord
from blockspace.simulator.metrics import Counts, Metrics, ReplayedRequest, ReplayedSequence, Timeline, filled
from blockspace.simulator.request import request_id_of
from blockspace.simulator.runs import (
    SimulationConfig,
    SimulationResult,
    SimulationStalledError,
    collector_paused,
    manager_name_of,
)
from blockspace.workloads import TraceRequest

PROGRESS_STEPS = 2000  # steps between two progress reports, when someone listens
# The loop and a router's probe, called without the dispatcher typing every argument once their one
# overload is compiled (fast/dispatch.py): typing the loop's tuples of arrays costs ~80 us a call, and
# a fleet calls the loop at arrivals and probes every replica at each.
run_loop, probe = direct(L.run), direct(probe_cached_tokens)
STATUS_OF = {
    S.FINISHED: SequenceStatus.FINISHED_LENGTH_CAPPED,
    S.IGNORED: SequenceStatus.FINISHED_IGNORED,
    S.ABORTED: SequenceStatus.FINISHED_ABORTED,
}


class CompiledSimulation:
    """One replay of a trace through fast's kernels, the loop compiled."""

    def __init__(
        self,
        trace: list[TraceRequest],
        manager_class: type,
        config: SimulationConfig,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        if not issubclass(manager_class, FastBlockSpaceManager):
            raise InvalidConfigError(f"the compiled engine runs fast's kernels: {manager_class.__name__} has none")
        self.trace, self.config, self.on_progress = trace, config, on_progress
        self.manager_class = manager_class
        self.manager_name = manager_name_of(manager_class)

    def run(self) -> SimulationResult:
        """Replay the trace (Python's collector paused, as the Python engine does)."""
        with collector_paused():
            return self._replay()

    def _replay(self) -> SimulationResult:
        startup_s = warm_up(self.manager_class, self.config)
        started = time.perf_counter()
        run = Run(self.trace, self.manager_class, self.config)
        run.advance(math.inf, self.on_progress)
        return run.result(self.manager_name, time.perf_counter() - started, startup_s)


class Run:
    """The arrays of one replay and the calls of the compiled loop."""

    def __init__(
        self, trace: list[TraceRequest], manager_class: type, config: SimulationConfig,
        shared: tuple[np.ndarray, np.ndarray, int] | None = None,
    ) -> None:  # fmt: skip
        """A replay of ``trace``; or, given a fleet's chunk ids, their nodes
        and the number of nodes (``shared``), of nothing yet: a replica,
        whose requests come by ``take`` (``replica.py``)."""
        sched = config.scheduler
        self.config = config
        self.manager = new_manager(manager_class, config)
        if shared is None:
            self.requests, chunks = S.new_requests(trace, config.num_samples, config.max_output_len)
            nodes, self.num_nodes = trace_nodes(chunks, self.requests, sched.enable_prefix_caching)
        else:
            self.requests = S.blank_requests(0)
            chunks, nodes, self.num_nodes = shared
        self.num_numbered = 0
        settings = np.zeros(S.NUM_CONFIG, np.int64)
        settings[S.BLOCK_SIZE], settings[S.CACHING] = sched.block_size, sched.enable_prefix_caching
        settings[S.MAX_SEQS], settings[S.MAX_TOKENS] = sched.max_num_seqs, sched.max_num_batched_tokens
        settings[S.SWAP_MODE] = sched.preemption_mode == "swap"
        settings[S.NUM_GPU], settings[S.NUM_CPU] = config.num_gpu_blocks, config.num_cpu_blocks
        settings[S.WATERMARK] = self.manager.watermark_blocks
        settings[S.RECORD] = sched.record_tables
        settings[S.PROGRESS_EVERY] = PROGRESS_STEPS
        settings[S.CLOCK] = config.step_time.kind
        coefficients = np.array(config.step_time.coefficients(sched.block_size), np.float64)
        longest = int((self.requests.prompt_len + self.requests.out_len).max(initial=0))
        self.loop = S.new_loop(settings, coefficients, chunks, nodes, self.requests, longest)
        self.longest = 0
        self._room_for(self.requests)  # rows first, while they are two columns wide
        self._number_nodes(self.requests)  # then the key index, made once at its size
        self._columns_for(longest)

    def take(self, requests: S.Requests, first: int, count: int, arrival_s: float) -> None:
        """Requests ``first`` up to ``first + count`` of a fleet's ``requests``
        (``S.new_requests`` of its trace) are routed here, arriving at
        ``arrival_s``, after every request routed before. They take the next
        entries of this replay's arrays, grown to hold them (``S.with_room``):
        a replica holds what it was sent, not the fleet's trace."""
        routed = int(self.loop.meta[S.NUM_ROUTED])
        longest = int((requests.prompt_len[first : first + count] + requests.out_len[first : first + count]).max())
        self.loop, self.requests = S.with_room(self.loop, self.requests, routed + count, longest)
        for mine, theirs in zip(self.requests, requests):
            mine[routed : routed + count] = theirs[first : first + count]
        self.requests.arrival[routed : routed + count] = arrival_s
        self.loop.arrivals[routed : routed + count] = np.arange(routed, routed + count)
        self.loop.meta[S.NUM_ROUTED] = routed + count
        self._number_nodes(requests, first, count)
        self._columns_for(longest)

    def _number_nodes(self, requests: S.Requests, first: int = 0, count: int | None = None) -> None:
        """Keys for the prompts of requests ``first`` up to ``first + count``
        (all, by default) on this replica: their nodes numbered, and fast's
        key table moved up past them (``trace_keys.py``; doubled, so that a
        fleet's replica moves it a few times)."""
        end = len(requests.arrival) if count is None else first + count
        if not self.config.scheduler.enable_prefix_caching or end == first:
            return
        if not len(self.loop.node_key):  # at the first request: an idle replica holds none
            self.loop = self.loop._replace(node_key=np.full(self.num_nodes, -1, np.int32))
        positions = TK.prompt_positions(requests.chunk_lo[first:end], requests.prompt_len[first:end])
        per_node = TK.keys_per_node(self.config.scheduler.block_size)
        self.num_numbered = TK.number_nodes(self.loop.node_key, self.loop.nodes, positions, self.num_numbered,
                                            per_node)  # fmt: skip
        key_space, first_key = self.manager.key_space, int(self.manager.store.keys.first[0])
        if self.num_numbered * per_node > first_key:
            wanted = self.num_numbered * per_node
            key_space.make_room(0, wanted if not first_key else max(wanted, 2 * first_key))

    def _columns_for(self, longest: int) -> None:
        """Table and tracker rows as wide as a sequence of ``longest`` tokens."""
        if longest <= self.longest and self.longest:
            return
        self.longest = max(self.longest, longest)
        num_cols = -(-self.longest // self.config.scheduler.block_size) + 1
        store = self.manager.store
        if store.tables.blocks.shape[1] < num_cols:
            store.tables = T.grow_tables(store.tables, num_cols=num_cols)
        if store.tracker.keys.shape[1] < num_cols:
            store.tracker = K.grow_tracker(store.tracker, num_cols=num_cols)

    def _room_for(self, requests: S.Requests) -> None:
        """Room, at once, for what ``requests`` (known at the start) will ask:
        what the loop asks at its first stop (a table row, and tracker rows
        for the requests waiting at the first step and two more:
        ``loop.room_for_step``), and keys for every block of fast's key table
        (those past each prompt's full blocks: ``trace_keys.py``) and what a
        step may ask beyond those made (a batch's blocks and two a request),
        at most twice the pools' blocks in the share such blocks have of all
        (the collector keeps the live keys to what the pools and rows name)
        and a batch's. The logs are sized with the loop (``S.first_log_sizes``).

        Why: fresh, the manager has no row on the loop's free stacks and a
        small key table (``fast/store.py``), and each stop of the loop for
        room is a call back into it besides the growth: a fleet of 256
        replicas replayed apart stopped seven times a replica, two with
        this (docs/measurements/2026-12-06-replica-memory.md). A fleet's
        replica on one clock gets its requests one by one, and grows as they
        come."""
        if not len(requests.arrival):
            return
        config, meta = self.config, self.loop.meta
        block_size = config.scheduler.block_size
        if config.scheduler.enable_prefix_caching:
            every = (requests.prompt_len + requests.out_len) // block_size + 1
            table_blocks = int((every - requests.prompt_len // block_size).sum())  # the trace keys the rest
            wanted = (
                table_blocks + config.scheduler.max_num_batched_tokens // block_size + 2 * len(requests.arrival) + 2
            )
            cached = 2 * (config.num_gpu_blocks + config.num_cpu_blocks) * table_blocks / int(every.sum())
            meta[S.NEED_KEYS] = min(wanted, math.ceil(cached) + config.scheduler.max_num_batched_tokens // block_size)
        waiting = int(np.count_nonzero(requests.arrival <= requests.arrival[0]))
        meta[S.NEED_TABLE_ROWS] = 1
        meta[S.NEED_TRACKER_ROWS] = min(config.scheduler.max_num_seqs, waiting) + 2
        self._make_room()

    def num_done(self) -> int:
        return int(self.loop.meta[S.NUM_DONE])

    def advance(
        self, until: float, on_progress: Callable[[int], None] | None = None, stop: threading.Event | None = None
    ) -> None:
        """Run every step that starts before ``until`` (``Simulation.advance``):
        all that was routed here when it is infinite, where a stall is an error.
        In a thread, ``stop`` set (Ctrl-C in the main one) ends it with
        ``KeyboardInterrupt`` at the loop's next return, within ``PROGRESS_STEPS``."""
        self.loop.until[0] = until
        num_done = self.num_done()
        while True:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            why = self.step()
            if on_progress is not None and self.num_done() != num_done:
                num_done = self.num_done()
                on_progress(num_done)
            if why == S.STALLED and until == math.inf:
                queues = self.loop.queue_ends
                raise SimulationStalledError(f"step {self.loop.meta[S.STEP] - 1}: {queues[0, 1]} waiting, "
                                             f"{queues[2, 1]} swapped, nothing can run")  # fmt: skip
            if why in (S.DONE, S.PAUSED, S.STALLED):
                return

    def result(self, manager_name: str, wall_s: float, startup_s: float) -> SimulationResult:
        """The run's result, once ``advance(math.inf)`` has returned."""
        self._release_tracker_rows()
        metrics = self.metrics()
        # the gaps are the metrics' now (a copy): the loop's log goes before the report reads them (4 million
        # gaps of the conversation trace are 33 MB, and the report's percentiles copy them once more)
        self.loop = self.loop._replace(gaps=np.zeros(0))
        metrics.wall_s, metrics.startup_s = wall_s, startup_s
        records = self.records() if self.config.scheduler.record_tables else []
        return SimulationResult(manager_name, self.config, metrics, records, self.manager)

    def fast(self) -> Fast:
        store = self.manager.store
        return Fast(store.gpu_ref, store.cpu_ref, store.keys_ref, store.tables_ref, store.tracker_ref, store.null_block)

    def step(self) -> int:
        """Run the loop until it stops, make room if it asked, and say why it stopped."""
        with np.errstate(over="ignore"):  # the digest wraps on purpose (only the uncompiled loop would warn)
            why = run_loop(self.fast(), self.loop, self.requests)
        meta = self.loop.meta
        if why == S.ROOM:
            self._make_room()
        elif why == S.ERROR_STOP:
            raise RuntimeError(f"the compiled engine: a kernel answered {meta[S.ERROR]} at step {meta[S.STEP]}")
        return int(why)

    def cached_tokens(self, chunk_lo: int, prompt_len: int) -> int:
        """Tokens of a prompt (its chunk ids from the trace's ``chunks[chunk_lo]`` on) that
        the prefix cache holds, asked as ``Simulation.cached_tokens`` asks the
        manager (``blocks.probe_cached_tokens``): a router's question, about a
        request perhaps never routed here."""
        if not self.config.scheduler.enable_prefix_caching:
            return 0
        loop, block_size = self.loop, self.config.scheduler.block_size
        scratch = np.empty(prompt_len // block_size, np.int64)
        return int(probe(self.manager.store.gpu_ref, loop.node_key, loop.nodes, chunk_lo, prompt_len, block_size,
                         scratch))  # fmt: skip

    def _make_room(self) -> None:
        """What the loop asked for (``meta[NEED_*]``): keys (the manager's
        collector, or a larger table), table and tracker rows (the arrays
        grown, the new rows onto the free stacks; at the first call every row
        joins, the fresh manager having used none), and log entries."""
        meta, store = self.loop.meta, self.manager.store
        if meta[S.NEED_KEYS] and not C.has_room(store.keys, int(meta[S.NEED_KEYS])):
            self.manager.key_space.make_room(int(meta[S.NEED_KEYS]))
        if meta[S.NEED_TABLE_ROWS] > meta[S.FREE_TABLE_ROWS]:
            old = store.tables.blocks.shape[0] if len(self.loop.free_table_rows) else 0
            store.tables = T.grow_tables(store.tables, num_rows=max(2 * old, old + int(meta[S.NEED_TABLE_ROWS])))
            self._free_rows("free_table_rows", S.FREE_TABLE_ROWS, old, store.tables.blocks.shape[0])
        if meta[S.NEED_TRACKER_ROWS] > meta[S.FREE_TRACKER_ROWS]:
            old = store.tracker.keys.shape[0] if len(self.loop.free_tracker_rows) else 0
            store.tracker = K.grow_tracker(store.tracker, num_rows=max(2 * old, old + int(meta[S.NEED_TRACKER_ROWS])))
            self._free_rows("free_tracker_rows", S.FREE_TRACKER_ROWS, old, store.tracker.keys.shape[0])
        if meta[S.NEED_LOG]:
            self._grow_logs(int(meta[S.NEED_LOG]))
        meta[S.NEED_KEYS] = meta[S.NEED_TABLE_ROWS] = meta[S.NEED_TRACKER_ROWS] = meta[S.NEED_LOG] = 0

    def _free_rows(self, name: str, count_slot: int, old: int, new: int) -> None:
        """Rows ``old`` up to ``new`` join the free stack named ``name``."""
        meta = self.loop.meta
        stack = np.zeros(new, np.int64)
        num_free = int(meta[count_slot])
        stack[:num_free] = getattr(self.loop, name)[:num_free]
        stack[num_free : num_free + new - old] = np.arange(new - 1, old - 1, -1)
        meta[count_slot] = num_free + new - old
        self.loop = self.loop._replace(**{name: stack})

    def _grow_logs(self, entries: int) -> None:
        loop = self.loop

        def grown(values: np.ndarray, used: int) -> np.ndarray:
            size = values.shape[-1]
            while size < used + entries + 2:
                size *= 2
            if size == values.shape[-1]:
                return values
            bigger = np.zeros((*values.shape[:-1], size), values.dtype)
            bigger[..., : values.shape[-1]] = values
            return bigger

        meta = loop.meta
        self.loop = loop._replace(
            events=grown(loop.events, int(meta[S.NUM_EVENTS])),
            admissions=grown(loop.admissions, int(meta[S.NUM_ADMISSIONS])),
            timeline=grown(loop.timeline, int(meta[S.NUM_TIMELINE])),
            step_times=grown(loop.step_times, int(meta[S.STEP])),
            gaps=grown(loop.gaps, int(meta[S.NUM_GAPS])),
            done_at=grown(loop.done_at, int(meta[S.NUM_DONE])),
            digests=grown(loop.digests, int(meta[S.STEP])),
            scheduled=grown(loop.scheduled, int(meta[S.NUM_SCHEDULED])) if loop.config[S.RECORD] else loop.scheduled,
        )

    def _release_tracker_rows(self) -> None:
        """The tracker rows still parked are emptied: the manager ends as the Python engine leaves it."""
        tracker = self.manager.store.tracker
        rows = self.requests.tracker_row[self.requests.tracker_row >= 0]
        tracker.num_keys[rows] = 0
        tracker.num_cached[rows] = 0
        self.requests.tracker_row[:] = -1

    # -- the results, as the Python engine gives them ----------------------------------
    def request_ids(self) -> list[str]:
        """The id of each request routed here (a replica's arrays may hold more entries, blank)."""
        n, count = self.config.num_samples, int(self.loop.meta[S.NUM_ROUTED])
        indexes, samples = self.requests.trace_index[:count].tolist(), self.requests.sample[:count].tolist()
        return [request_id_of(i, s, n) for i, s in zip(indexes, samples)]

    def metrics(self) -> Metrics:
        requests, loop, meta = self.requests, self.loop, self.loop.meta
        ids = self.request_ids()
        metrics = Metrics()
        arrived = loop.arrivals[: meta[S.NUM_PENDING]]  # in order of arrival (and of r)
        statuses = requests.status.tolist()
        for r in arrived.tolist():
            status = STATUS_OF.get(statuses[r], SequenceStatus.WAITING)
            metrics.requests.append(
                ReplayedRequest(
                    ids[r],
                    int(requests.trace_index[r]),
                    int(requests.sample[r]),
                    float(requests.arrival[r]),
                    int(requests.prompt_len[r]),
                    ReplayedSequence(status, int(requests.num_output[r])),
                )  # fmt: skip
            )
        for name, values in (("first_token_s", requests.first_token), ("finish_s", requests.finish)):
            target = getattr(metrics, name)
            for r in arrived[~np.isnan(values[arrived])].tolist():
                target[ids[r]] = float(values[r])
        for name, values in (
            ("cached_tokens", requests.cached_tokens),
            ("preemptions", requests.preemptions),
            ("swap_outs", requests.swap_outs),
        ):
            target = getattr(metrics, name)
            for r in arrived[values[arrived] != 0].tolist():
                target[ids[r]] = int(values[r])
        admissions = loop.admissions[:, : meta[S.NUM_ADMISSIONS]]
        for r, at in zip(admissions[0].astype(np.int64).tolist(), admissions[1].tolist()):
            metrics.admitted_s.setdefault(ids[r], []).append(at)
        for r in arrived[~np.isnan(requests.last_token[arrived])].tolist():
            metrics.last_token_s[ids[r]] = float(requests.last_token[r])
        filled(metrics.itl_s, loop.gaps[: meta[S.NUM_GAPS]])
        count = int(meta[S.NUM_TIMELINE])
        for column in dataclasses.fields(Timeline):  # the manager's calls are inlined in the compiled step: not timed
            kept = column.name in S.TIMELINE_ROWS
            filled(getattr(metrics.timeline, column.name),
                   loop.timeline[S.timeline_row(column.name), :count] if kept else np.zeros(count))  # fmt: skip
        metrics.counts = Counts(*meta[S.FIRST_COUNT : S.NUM_META].tolist())  # its fields' slots, in order
        metrics.final_hit_rate = (
            float(self.manager.get_prefix_cache_hit_rate(Device.GPU))
            if self.config.scheduler.enable_prefix_caching
            else 0.0
        )
        return metrics

    def records(self) -> list[StepRecord]:
        """Every step's decisions, as the Python engine records them."""
        loop, meta, ids = self.loop, self.loop.meta, self.request_ids()
        records = [
            StepRecord(step, time_s, digest=signed(digest))
            for step, (time_s, digest) in enumerate(
                zip(loop.step_times[: meta[S.STEP]].tolist(), loop.digests[: meta[S.STEP]].tolist())
            )
        ]
        scheduled = loop.scheduled[:, : meta[S.NUM_SCHEDULED]].tolist()
        for step, r, size in zip(*scheduled):
            records[step].scheduled.append((ids[r], size))
        events = loop.events[:, : meta[S.NUM_EVENTS]].tolist()
        for step, kind, r in zip(*events):
            getattr(records[step], S.EVENT_FIELDS[kind]).append(ids[r])
        return records


def trace_nodes(chunks: np.ndarray, requests: S.Requests, caching: bool) -> tuple[np.ndarray, int]:
    """The nodes of the trace's chunk ids and their number (``trace_keys.py``); none without caching."""
    if not caching:
        return np.zeros(0, np.int64), 0
    return TK.chunk_nodes(chunks, requests.chunk_lo, requests.prompt_len)


def warm_up(manager_class: type, config: SimulationConfig) -> float:
    """Seconds to compile the loop, or load it from Numba's cache: a replay
    of two small requests through the run's settings."""
    started = time.perf_counter()
    block_size = config.scheduler.block_size
    trace = [TraceRequest(i, 0.0, 2 * block_size + 1, 3, (i,)) for i in range(2)]
    run = Run(trace, manager_class, config)
    run.advance(math.inf)
    run.cached_tokens(0, 2 * block_size + 1)  # a router's question (fleet.py)
    return time.perf_counter() - started


def new_manager(manager_class: type, config: SimulationConfig) -> FastBlockSpaceManager:
    """A fresh manager of ``config``'s pools."""
    sched = config.scheduler
    return manager_class(  # a fast manager's class (CompiledSimulation checks)
        block_size=sched.block_size, num_gpu_blocks=config.num_gpu_blocks, num_cpu_blocks=config.num_cpu_blocks,
        watermark=config.watermark, enable_caching=sched.enable_prefix_caching,
    )  # fmt: skip


def replay_apart(
    shares: list[list[TraceRequest]], manager_class: type, config: SimulationConfig, threads: int = 1
) -> tuple[list[SimulationResult], float]:
    """Each share of a fleet's trace replayed on a replica of its own,
    ``threads`` at once, after one warm-up (``fleet.py``, a router that
    reads no replica); each result without its manager, and the warm-up's
    seconds.

    Why threads: the replicas share nothing, and the compiled loop lets go
    of the GIL (``loop.run``), so each core replays one. Why no more than
    that at once: the fleet holds only those replicas' state, and its
    replicas' figures. Each replica makes its own manager, freed with its
    run: most of a new manager's pool arrays are zeros the system maps as
    they are first touched, and a replica of a fleet of hundreds touches
    few. One manager for all, its fresh state restored before each, copied
    all 3.6 MB of the GPU pool's arrays into new buffers each time: at 256
    replicas on 2,000 requests, 5 % more wall time for the whole command, a
    third more system time (docs/measurements/2026-12-06-replica-memory.md).
    A replica sent nothing has one result, made once: a fleet larger than
    its trace has many."""
    name = manager_name_of(manager_class)
    stop = threading.Event()  # Ctrl-C: the threads end at their loop's next return

    def replay(share: list[TraceRequest]) -> SimulationResult:
        started = time.perf_counter()
        run = Run(share, manager_class, config)
        run.advance(math.inf, stop=stop)
        return dataclasses.replace(run.result(name, time.perf_counter() - started, startup_s), manager=None)

    with collector_paused():
        startup_s = warm_up(manager_class, config)
        busy = [share for share in shares if share]
        if threads > 1 and len(busy) > 1:
            with ThreadPoolExecutor(min(threads, len(busy))) as pool:
                try:
                    done = iter(list(pool.map(replay, busy)))
                except BaseException:
                    stop.set()  # before the pool's exit waits for its threads
                    raise
        else:
            done = map(replay, busy)
        idle = replay([]) if len(busy) < len(shares) else None
        results = [next(done) if share else idle for share in shares]
    return results, startup_s  # type: ignore[return-value]  # idle is made where a share is empty


def run_compiled(
    trace: list[TraceRequest], manager_class: type, config: SimulationConfig, **hooks: Any
) -> SimulationResult:
    """Replay ``trace`` through the compiled engine and return the result."""
    return CompiledSimulation(trace, manager_class, config, **hooks).run()


__all__ = ["CompiledSimulation", "replay_apart", "run_compiled", "warm_up"]
