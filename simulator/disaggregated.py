"""Prefill and decode on separate replicas (``--prefill-replicas P
--decode-replicas D``): disaggregated serving, as vLLM 0.9.2's v0 engine
ran it (``kv_transfer_config``, experimental there), on either engine.

A request's way through the fleet:

1. **Prefill.** The router (``config.router``, over the P prefill replicas)
   sends it to a prefill replica, which runs it as a request of one output
   token, under the exact v0 policy (budget, chunking, preemption).
2. **Transfer.** When that token is sampled, the prompt's KV leaves for a
   decode replica: its blocks' bytes over the link (``kv_link_gbps``), one
   request's transfer not slowed by another's. The first token reaches the
   client with the KV: TTFT runs from the arrival to the transfer's end.
3. **Decode.** The router (the same rule, over the D decode replicas) sends
   it to a decode replica at the transfer's end. There it runs as v0's
   decode instance runs a received request: its scheduler schedules the
   prompt under its budget and chunking and allocates its blocks, but the
   forward pass over the received prompt costs the clock nothing
   (``clock.Received``); that step samples the first token again (vLLM
   samples it from the received hidden state; the client already has it),
   and decode steps give the rest, each as an aggregated replica's decode
   step of that request would.

The result is the fleet's, its replicas the prefill ones then the decode
ones (``SimulationResult.replicas``); each request's record joins its two
halves: its arrival, its admission, cached tokens and preemptions at the
prefill replica; its first token at the transfer's end; its tokens, finish
and status at the decode replica. A request the prefill replica ignored
(its prompt too long) never leaves it. The hit rate is the prefill pool's
(where prompts are computed). ``Disaggregation`` is what the summary adds.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import replace

from blockspace.simulator.clock import Received
from blockspace.simulator.fleet import Member, OneClock, engine_maker, merged
from blockspace.simulator.metrics import Metrics, ReplayedRequest, ReplayedSequence
from blockspace.simulator.routers import blocks_of
from blockspace.simulator.runs import SimulationConfig, SimulationResult, Transfers, collector_paused
from blockspace.workloads import TraceRequest


def transfer_seconds(config: SimulationConfig, prompt_tokens: int) -> float:
    """Seconds a prompt's KV takes over the link: its blocks' bytes at ``kv_link_gbps`` (0 on an infinite one)."""
    bits = blocks_of(prompt_tokens, config.scheduler.block_size) * config.kv_block_bytes * 8
    return bits / (config.kv_link_gbps * 1e9)


def replay_disaggregated(
    trace: list[TraceRequest],
    manager_class: type,
    config: SimulationConfig,
    on_progress: Callable[[int], None] | None = None,
) -> SimulationResult:
    """Replay ``trace`` through ``config.prefill_replicas`` prefill replicas
    and the rest decode replicas, on one clock; ``on_progress`` hears the
    requests the decode replicas are done with."""
    with collector_paused():
        return Disaggregated(trace, manager_class, config, on_progress).replay()


class Disaggregated:
    """The two pools on one clock, and the KV moving between them."""

    def __init__(
        self, trace: list[TraceRequest], manager_class: type, config: SimulationConfig,
        on_progress: Callable[[int], None] | None,
    ) -> None:  # fmt: skip
        self.trace, self.config = trace, config
        pools = replace(config, prefill_replicas=0)
        prefill_pool = replace(pools, replicas=config.prefill_replicas)
        decode_pool = replace(pools, replicas=config.replicas - config.prefill_replicas,
                              step_time=Received(config.step_time))  # fmt: skip
        self.prefill_trace = [replace(entry, output_length=1) for entry in trace]
        prefill_members: list[Member] = []
        self.decode_members: list[Member] = []

        def progress(_: int) -> None:
            if on_progress is not None:
                on_progress(sum(member.num_done for member in self.decode_members))

        new_prefill, prefill_s = engine_maker(self.prefill_trace, manager_class, prefill_pool.single(),
                                              prefill_members, lambda _: None)  # fmt: skip
        new_decode, decode_s = engine_maker(trace, manager_class, decode_pool.single(),
                                            self.decode_members, progress)  # fmt: skip
        self.startup_s = prefill_s + decode_s
        self.prefill = OneClock(self.prefill_trace, prefill_pool, new_prefill)
        self.decode = OneClock(trace, decode_pool, new_decode)
        self.pool_configs = prefill_pool, decode_pool
        self.by_index = {entry.index: entry for entry in trace}
        self.moving: list[tuple[float, int]] = []  # (the transfer's end, trace index): a heap
        self.taken = [0] * config.prefill_replicas  # each prefill replica's finished requests already moved
        self.first_token_s: dict[int, float] = {}  # a moved request's first token at the client
        self.transfer_s: list[float] = []

    def replay(self) -> SimulationResult:
        started = time.perf_counter()
        for entry in self.prefill_trace:
            self._move_until(entry.arrival_s)
            self.prefill.send(entry)
        self._move_until(math.inf)
        self.decode.advance(math.inf)
        return self._result(time.perf_counter() - started)

    def _move_until(self, until: float) -> None:
        """Both pools run the steps that start before ``until``, and every
        transfer that ends before it reaches a decode replica then, in the
        order they end (a prefill replica always runs ahead of a delivery:
        a transfer that ends earlier is found before it)."""
        while True:
            at = min(until, self.moving[0][0] if self.moving else math.inf)
            self.prefill.advance(at)
            self._prefilled()
            if self.moving and self.moving[0][0] <= at:
                end, index = heapq.heappop(self.moving)
                self.decode.advance(end)
                self.decode.send(replace(self.by_index[index], arrival_s=end))
            elif at >= until:
                return

    def _prefilled(self) -> None:
        """The requests the prefill replicas finished since the last look start their transfer."""
        for k, member in enumerate(self.prefill.replicas):
            assert member is not None  # no failures here (SimulationConfig refuses them)
            done = member.finished_at()
            for index, at in done[self.taken[k] :]:
                seconds = transfer_seconds(self.config, self.by_index[index].input_length)
                self.first_token_s[index] = at + seconds
                self.transfer_s.append(seconds)
                heapq.heappush(self.moving, (at + seconds, index))
            self.taken[k] = len(done)

    def _result(self, wall_s: float) -> SimulationResult:
        prefill = self.prefill.result(self.pool_configs[0], wall_s, self.startup_s)
        decode = self.decode.result(self.pool_configs[1], wall_s, self.startup_s)
        assignment = [
            self.config.prefill_replicas + decode.assignment[p] if entry.index in self.first_token_s else
            prefill.assignment[p] for p, entry in enumerate(self.trace)
        ]  # fmt: skip
        fleet = merged(prefill.replicas + decode.replicas, assignment, self.config, wall_s)
        fleet.metrics = self._joined(prefill.metrics, decode.metrics, fleet.metrics)
        fleet.metrics.startup_s = self.startup_s
        sent = sum(blocks_of(self.by_index[i].input_length, self.config.scheduler.block_size)
                   for i in self.first_token_s) * self.config.kv_block_bytes  # fmt: skip
        return replace(fleet, transfers=Transfers(self.transfer_s, sent))

    def _joined(self, prefill: Metrics, decode: Metrics, fleet: Metrics) -> Metrics:
        """Each request's record joined from its two halves (the module doc says which half gives what)."""
        moved = {request.request_id: request for request in decode.requests}
        fleet.requests = []
        for request in prefill.requests:
            there = moved.get(request.request_id)
            if there is None:  # it never left the prefill replica
                fleet.requests.append(request)
                continue
            seq = ReplayedSequence(there.seq.status, there.seq.get_output_len())
            fleet.requests.append(ReplayedRequest(request.request_id, request.index, request.sample,
                                                  request.arrival_s, request.num_prompt_tokens, seq))  # fmt: skip
        fleet.first_token_s = dict(prefill.first_token_s)
        fleet.first_token_s.update({str(index): at for index, at in self.first_token_s.items()})  # n is 1
        for name in ("finish_s", "last_token_s"):  # the decode replica's, for a request that moved
            stayed = {k: v for k, v in getattr(prefill, name).items() if k not in moved}
            setattr(fleet, name, {**stayed, **getattr(decode, name)})
        fleet.admitted_s, fleet.cached_tokens = dict(prefill.admitted_s), dict(prefill.cached_tokens)
        fleet.preemptions = {k: prefill.preemptions.get(k, 0) + decode.preemptions.get(k, 0)
                             for k in {*prefill.preemptions, *decode.preemptions}}  # fmt: skip
        fleet.swap_outs = {k: prefill.swap_outs.get(k, 0) + decode.swap_outs.get(k, 0)
                           for k in {*prefill.swap_outs, *decode.swap_outs}}  # fmt: skip
        fleet.final_hit_rate = prefill.final_hit_rate
        return fleet


__all__ = ["Disaggregated", "replay_disaggregated", "transfer_seconds"]
