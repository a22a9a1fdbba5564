"""vLLM 0.9.2's real v0 scheduler over Mooncake requests, with the block manager swapped.

Why: ``blockspace bench`` times the managers against each other on calls we
generate. This script asks the question a vLLM user asks: inside vLLM's own
``vllm.core.scheduler.Scheduler`` (no model, no GPU), how much wall time goes
into the block manager when it is vLLM's ``SelfAttnBlockSpaceManager``
("vllm"), blockspace's "fast" or "reference" (or any ``package.module:Class``)?
And it proves that swapping the manager changes nothing the scheduler decides.

What is measured. The scheduler's ``block_manager`` is replaced by a timer
whose attributes are the manager's methods, each wrapped in a closure that adds
``perf_counter()`` deltas and a call count per method (vLLM's own manager is
wrapped the same way). The timer's own cost is calibrated on a no-op method and
subtracted per call; the figures are the time inside the manager, per method
and in total, plus the wall time of the whole run (the engine loop below:
scheduler, emulated model output and manager; the decision digests are timed
apart and left out, their time reported beside it). The run time is that wall
time less the timer's cost over all its calls: what a vLLM user waits for
with the manager in place, untimed; the manager's share is the time inside it
over the run time.

Why in turns. The machine is shared, so a slow spell must not land on one
manager only: each round runs every manager one after another on the same
scenario (caching on, caching off), and the best (minimum) of the rounds is
kept per manager, per method and for the totals. Before timing, every manager
runs once over a few requests (Numba compilation, cache loading, first-use
costs are not counted); paths those few requests do not reach (eviction,
swapping) first run in round 1, so quote figures from ``--rounds 2`` or
more. The objects alive before a run are frozen out of the
garbage collector, so its passes do not walk the trace's token lists.

The emulated engine loop (what ``LLMEngine.step`` does, synchronously, no
async output processing). The clock is virtual: a step lasts ``--step-ms``
(default 50 ms); before each step every request that has arrived by the clock
is added (``Sequence``/``SequenceGroup`` built from the trace, token ids from
the chunk ids as the simulator makes them, ``SamplingParams(max_tokens=
output_length, ignore_eos=True)``); when nothing is queued or running the
clock jumps to the next arrival. Then ``scheduler.schedule()``, and the
model's output as vLLM's engine applies it: for each scheduled group, in
batch order, ``update_num_computed_tokens(token_chunk_size)``; if the group
samples (``do_sample``: decode, or the last chunk of its prefill) one token is
appended to its sequence (``output_token_id(request, 0, position)``), vLLM's
``StopChecker`` marks it finished at ``max_tokens`` (or ``max_model_len``) and
a finished sequence is freed at once (``scheduler.free_seq``, as the
single-step output processor does); if any group finished this step,
``scheduler.free_finished_seq_groups()``. Until every request has finished
(a prompt longer than ``max_model_len`` or than the GPU is ignored by vLLM,
the same for every manager).

Determinism. The scheduler reads ``time.time()`` for the access times that
drive LRU eviction (``access_all_blocks_in_seq``) and for its prompt delay;
the ``time`` name inside ``vllm.core.scheduler`` is replaced by the virtual
clock for the run, so every manager sees identical times. Each step's
decisions are digested: the scheduled (request id, chunk size, do_sample) in
order, the preempted and ignored request ids, blocks to swap in / out / copy,
the block tables and computed block ids of the ``SequenceGroupMetadata`` list,
then at the end the GPU prefix-cache hit rate. Every run of every manager must
give the same digests; if not, the run stops with exit status 1 naming the
first differing step and what differed there.

Usage (from an environment with vLLM 0.9.2 and blockspace; see docs/performance.md)::

    python scripts/vllm_scheduler_bench.py --trace TRACE.jsonl --requests 500 --json out.json
    python scripts/vllm_scheduler_bench.py --requests 20 --impls vllm,fast --caching on --rounds 3

Defaults: 16-token blocks, 49,152 GPU blocks, no CPU blocks (vLLM preempts by
recomputation by default; ``--preemption-mode swap`` needs ``--num-cpu-blocks``),
chunked prefill with 2,048 batched tokens, 256 sequences, ``max_model_len``
the longest prompt + output of the requests. Exit status: 0 the decisions
agree, 1 they differ, 2 bad arguments or no vLLM 0.9.2.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import sys
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

from blockspace.errors import InvalidArgumentError
from blockspace.interfaces import load_manager_class
from blockspace.simulator.timed import TIMED_METHODS
from blockspace.workloads import TraceRequest, load_trace, output_token_id, prompt_token_ids

VLLM_VERSION = "0.9.2"
VLLM = "vllm"  # the name of vLLM's own manager among the implementations
# The manager methods vLLM's scheduler may call: the simulator's list plus the
# encoder-decoder and reset calls.
METHODS = (*TIMED_METHODS, "free_cross", "get_cross_block_table", "reset_prefix_cache")
DIGEST_PARTS = ("scheduled", "preempted", "ignored", "swap_in", "swap_out", "copy", "tables", "computed")
CALIBRATION_CALLS = 20_000
CALIBRATION_PASSES = 7


class UsageError(Exception):
    """Bad arguments or a missing vLLM: reported as ``error: ...``, exit status 2."""


# -- vLLM, imported only when the script runs ------------------------------------------------


def import_vllm() -> SimpleNamespace:
    """The vLLM 0.9.2 pieces the run needs."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its INFO lines at import and per config
    hint = "set up a venv with vLLM 0.9.2, see docs/performance.md"
    try:
        import vllm
        import vllm.core.scheduler as scheduler_module
        from vllm.config import CacheConfig, SchedulerConfig
        from vllm.core.block_manager import SelfAttnBlockSpaceManager
        from vllm.engine.output_processor.stop_checker import StopChecker
        from vllm.inputs import token_inputs
        from vllm.sampling_params import SamplingParams
        from vllm.sequence import Logprob, Sequence, SequenceGroup, SequenceStatus
        from vllm.utils import Device
    except Exception as error:  # ImportError, or anything a half-installed vLLM raises while importing
        raise UsageError(f"cannot import vLLM's v0 scheduler ({type(error).__name__}: {error}); {hint}") from None
    if vllm.__version__ != VLLM_VERSION:
        raise UsageError(f"this is vLLM {vllm.__version__}, the benchmark needs {VLLM_VERSION}; {hint}")
    logging.getLogger("vllm").setLevel(logging.ERROR)  # "Sequence group ... is preempted" warnings
    return SimpleNamespace(
        version=vllm.__version__,
        scheduler_module=scheduler_module,
        SchedulerConfig=SchedulerConfig,
        CacheConfig=CacheConfig,
        StopChecker=StopChecker,
        token_inputs=token_inputs,
        SamplingParams=SamplingParams,
        Logprob=Logprob,
        Sequence=Sequence,
        SequenceGroup=SequenceGroup,
        gpu=Device.GPU,
        running=SequenceStatus.RUNNING,
        own_manager=SelfAttnBlockSpaceManager,
    )


# -- settings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """One benchmark's configuration (the parsed command line)."""

    trace: str | None
    requests: int
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int | None  # None: the longest prompt + output of the requests
    preemption_mode: str | None  # None: vLLM's choice (recompute for single-sequence groups)
    step_s: float
    caching: tuple[bool, ...]
    impls: tuple[str, ...]
    rounds: int
    warmup_requests: int
    json_path: str | None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit; main reports it
        self.print_usage(sys.stderr)
        raise UsageError(message)


def parse_args(argv: list[str] | None) -> Settings:
    parser = _Parser(
        description="Time the block manager inside vLLM 0.9.2's v0 scheduler, per method, for each "
        "implementation, and check that the scheduling decisions are identical.",
    )
    parser.add_argument("--trace", default=None, help="Mooncake trace (JSONL); default: the bundled sample")
    parser.add_argument("--requests", type=int, default=500, help="the first N requests of the trace (default 500)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-gpu-blocks", type=int, default=49152)
    parser.add_argument("--num-cpu-blocks", type=int, default=0)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=None, help="default: longest prompt + output")
    parser.add_argument("--preemption-mode", choices=("recompute", "swap"), default=None)
    parser.add_argument("--step-ms", type=float, default=50.0, help="virtual duration of one step (default 50)")
    parser.add_argument("--caching", choices=("on", "off", "both"), default="both", help="prefix caching")
    parser.add_argument(
        "--impls",
        default="vllm,fast,reference",
        help="comma-separated: vllm, fast, reference, "
        "or package.module:Class (the first is the baseline of the ratios)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="turns over all implementations (best kept; default 2)")
    parser.add_argument("--warmup-requests", type=int, default=8, help="requests of the untimed warm-up run")
    parser.add_argument("--json", dest="json_path", default=None, help="write the results here")
    args = parser.parse_args(argv)
    impls = tuple(name.strip() for name in args.impls.split(",") if name.strip())
    settings = Settings(
        trace=args.trace,
        requests=args.requests,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        num_cpu_blocks=args.num_cpu_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        preemption_mode=args.preemption_mode,
        step_s=args.step_ms / 1000.0,
        caching={"on": (True,), "off": (False,), "both": (True, False)}[args.caching],
        impls=impls,
        rounds=args.rounds,
        warmup_requests=args.warmup_requests,
        json_path=args.json_path,
    )
    check_settings(settings)
    return settings


def check_settings(settings: Settings) -> None:
    at_least = {
        "--requests": (settings.requests, 1),
        "--block-size": (settings.block_size, 1),
        "--num-gpu-blocks": (settings.num_gpu_blocks, 1),
        "--num-cpu-blocks": (settings.num_cpu_blocks, 0),
        "--max-num-batched-tokens": (settings.max_num_batched_tokens, 1),
        "--max-num-seqs": (settings.max_num_seqs, 1),
        "--rounds": (settings.rounds, 1),
        "--warmup-requests": (settings.warmup_requests, 0),
    }
    if settings.max_model_len is not None:
        at_least["--max-model-len"] = (settings.max_model_len, 1)
    for flag, (value, least) in at_least.items():
        if value < least:
            raise UsageError(f"{flag} must be >= {least}, got {value}")
    if not settings.step_s > 0:
        raise UsageError(f"--step-ms must be > 0, got {settings.step_s * 1000.0}")
    if not settings.impls:
        raise UsageError("--impls names no implementation")
    if len(set(settings.impls)) != len(settings.impls):
        raise UsageError(f"--impls names an implementation twice: {','.join(settings.impls)}")
    if settings.preemption_mode == "swap" and settings.num_cpu_blocks == 0:
        raise UsageError("--preemption-mode swap needs --num-cpu-blocks > 0")


def manager_classes(impls: tuple[str, ...]) -> dict[str, type | None]:
    """Each implementation's class; None for vLLM's own (the scheduler builds it)."""
    classes: dict[str, type | None] = {}
    for name in impls:
        if name == VLLM:
            classes[name] = None
            continue
        try:
            classes[name] = load_manager_class(name)
        except (ValueError, ImportError, AttributeError) as error:
            raise UsageError(f"--impls: cannot load {name!r} ({error})") from None
    return classes


# -- the timer -----------------------------------------------------------------------------


class TimedManager:
    """Stands in for the scheduler's ``block_manager``: each manager method a
    closure that adds its wall time and a call to the method's tallies; any
    other attribute is the manager's own."""

    def __init__(self, manager: Any, methods: tuple[str, ...] = METHODS) -> None:
        self._manager = manager
        self.elapsed: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        for name in methods:
            method = getattr(manager, name, None)
            if method is not None:
                self.elapsed[name] = 0.0
                self.calls[name] = 0
                setattr(self, name, self._timed(name, method))

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        perf_counter = time.perf_counter
        elapsed, calls = self.elapsed, self.calls

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = perf_counter()
            result = method(*args, **kwargs)
            elapsed[name] += perf_counter() - start
            calls[name] += 1
            return result

        return timed

    def __getattr__(self, name: str) -> Any:  # only for what the constructor did not set
        return getattr(self._manager, name)


class _NoOp:
    def noop(self, *args: Any, **kwargs: Any) -> None:
        return None


def calibrate_timer() -> float:
    """Seconds the timer adds to one call: what it records around a no-op
    method called as the scheduler calls (best of a few passes)."""
    best = float("inf")
    argument = object()
    for _ in range(CALIBRATION_PASSES):
        timer = TimedManager(_NoOp(), ("noop",))
        noop = timer.noop
        for _ in range(CALIBRATION_CALLS):
            noop(argument, 0)
        best = min(best, timer.elapsed["noop"] / CALIBRATION_CALLS)
    return best


# -- the virtual clock ---------------------------------------------------------------------


class VirtualTime:
    """Replaces the ``time`` module inside ``vllm.core.scheduler``: ``time()``
    is the virtual clock, everything else (``perf_counter``) the real one."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@contextmanager
def virtual_time(scheduler_module: Any) -> Iterator[VirtualTime]:
    clock = VirtualTime()
    real = scheduler_module.time
    scheduler_module.time = clock
    try:
        yield clock
    finally:
        scheduler_module.time = real


# -- requests and the scheduler ------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A trace request with its prompt's token ids (made once, shared by every run)."""

    index: int
    arrival_s: float
    prompt: list[int]
    max_tokens: int


def make_requests(trace: list[TraceRequest]) -> list[Request]:
    return [
        Request(r.index, r.arrival_s, prompt_token_ids(list(r.hash_ids), r.input_length), r.output_length)
        for r in trace
    ]


def default_max_model_len(requests: list[Request]) -> int:
    return max(len(r.prompt) + r.max_tokens for r in requests)


def build_scheduler(
    v: SimpleNamespace, settings: Settings, caching: bool, max_model_len: int, scheduler_cls: type | None = None
) -> Any:
    """vLLM's scheduler (or ``scheduler_cls``, as ``--scheduler-cls`` names one)
    as the engine would build it for this configuration."""
    scheduler_config = v.SchedulerConfig(
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_num_seqs=settings.max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        preemption_mode=settings.preemption_mode,
    )
    cache_config = v.CacheConfig(
        block_size=settings.block_size,
        gpu_memory_utilization=0.9,
        swap_space=0,
        cache_dtype="auto",
        enable_prefix_caching=caching,
    )
    cache_config.num_gpu_blocks = settings.num_gpu_blocks
    cache_config.num_cpu_blocks = settings.num_cpu_blocks
    return (scheduler_cls or v.scheduler_module.Scheduler)(scheduler_config, cache_config, lora_config=None)


def make_manager(cls: type, settings: Settings, caching: bool) -> Any:
    """The manager under test, built with the keywords vLLM's scheduler passes."""
    return cls(
        block_size=settings.block_size,
        num_gpu_blocks=settings.num_gpu_blocks,
        num_cpu_blocks=settings.num_cpu_blocks,
        sliding_window=None,
        enable_caching=caching,
    )


def make_group(v: SimpleNamespace, request: Request, block_size: int) -> Any:
    """The request as vLLM's engine adds it: one sequence, sampling n=1."""
    seq = v.Sequence(request.index, v.token_inputs(request.prompt), block_size)
    params = v.SamplingParams(max_tokens=request.max_tokens, ignore_eos=True, detokenize=False)
    return v.SequenceGroup(str(request.index), [seq], arrival_time=request.arrival_s, sampling_params=params)


# -- one step: the decisions' digest, the model's output ------------------------------------


def _digest(value: Any) -> bytes:
    return hashlib.blake2b(repr(value).encode(), digest_size=8).digest()


def _ids_digest(rows: Iterator[tuple[Any, Any]]) -> bytes:
    """Digest of (label, block ids) rows; the ids through ``list`` (a manager
    may answer a list subclass)."""
    hasher = hashlib.blake2b(digest_size=8)
    for label, ids in rows:
        hasher.update(repr(label).encode())
        hasher.update(array("q", list(ids)).tobytes())
    return hasher.digest()


def step_digest(metadata_list: list[Any], outputs: Any, preempted: list[str]) -> tuple[bytes, ...]:
    """One digest per part of the step's decisions (``DIGEST_PARTS``)."""
    return (
        _digest(
            [
                (s.seq_group.request_id, s.token_chunk_size, m.do_sample)
                for s, m in zip(outputs.scheduled_seq_groups, metadata_list)
            ]
        ),
        _digest(preempted),
        _digest([g.request_id for g in outputs.ignored_seq_groups]),
        _digest([tuple(pair) for pair in outputs.blocks_to_swap_in]),
        _digest([tuple(pair) for pair in outputs.blocks_to_swap_out]),
        _digest([tuple(pair) for pair in outputs.blocks_to_copy]),
        _ids_digest(((m.request_id, seq_id), table) for m in metadata_list for seq_id, table in m.block_tables.items()),
        _ids_digest((m.request_id, m.computed_block_nums or ()) for m in metadata_list),
    )


def preempted_ids(scheduler: Any, running_before: set[str]) -> list[str]:
    """Groups that were running before the step and are now waiting (recompute) or swapped."""
    return [
        g.request_id
        for queue in (scheduler.waiting, scheduler.swapped)
        for g in queue
        if g.request_id in running_before
    ]


def apply_model_output(
    v: SimpleNamespace, scheduler: Any, stop_checker: Any, metadata_list: list[Any], outputs: Any
) -> None:
    """What vLLM's engine does with the model's output (synchronous, one step)."""
    finished_now = False
    for meta, scheduled in zip(metadata_list, outputs.scheduled_seq_groups):
        group = scheduled.seq_group
        if group.is_finished():
            continue
        group.update_num_computed_tokens(meta.token_chunk_size or 0)
        if meta.do_sample:
            seq = group.first_seq
            token = output_token_id(seq.seq_id, 0, seq.get_output_len())
            seq.append_token_id(token, {token: v.Logprob(0.0)})
            stop_checker.maybe_stop_sequence(seq, 0, group.sampling_params)
            if seq.is_finished():
                scheduler.free_seq(seq)
        finished_now = finished_now or group.is_finished()
    if finished_now:
        scheduler.free_finished_seq_groups()


# -- one run ------------------------------------------------------------------------------


@dataclass
class RunResult:
    """One manager's run over one scenario."""

    impl: str
    steps: list[tuple[bytes, ...]] = field(repr=False)
    step_times: list[float] = field(repr=False)
    manager: str = ""  # the class the scheduler held, module.Class
    final: bytes = b""
    elapsed: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    digest_s: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)

    def digest(self) -> str:
        hasher = hashlib.blake2b(digest_size=16)
        for parts in self.steps:
            hasher.update(b"".join(parts))
        hasher.update(self.final)
        return hasher.hexdigest()


def run_once(
    v: SimpleNamespace,
    settings: Settings,
    requests: list[Request],
    impl: str,
    cls: type | None,
    caching: bool,
    max_model_len: int,
) -> RunResult:
    """The emulated engine loop over ``requests`` with ``impl`` as the manager."""
    scheduler = build_scheduler(v, settings, caching, max_model_len)
    manager = scheduler.block_manager if cls is None else make_manager(cls, settings, caching)
    timer = TimedManager(manager)
    scheduler.block_manager = timer
    stop_checker = v.StopChecker(max_model_len, lambda seq: None)
    result = RunResult(impl, steps=[], step_times=[])
    pending = deque(requests)
    stats = {"scheduled_groups": 0, "scheduled_tokens": 0, "preempted": 0, "ignored": 0, "copies": 0}
    gc.collect()
    gc.freeze()
    try:
        with virtual_time(v.scheduler_module) as clock:
            clock.now = pending[0].arrival_s if pending else 0.0
            start = time.perf_counter()
            while pending or scheduler.has_unfinished_seqs():
                if pending and not scheduler.has_unfinished_seqs():
                    clock.now = max(clock.now, pending[0].arrival_s)
                while pending and pending[0].arrival_s <= clock.now:
                    scheduler.add_seq_group(make_group(v, pending.popleft(), settings.block_size))
                digest_start = time.perf_counter()
                running_before = {g.request_id for g in scheduler.running}
                result.digest_s += time.perf_counter() - digest_start
                metadata_list, outputs, _ = scheduler.schedule()
                digest_start = time.perf_counter()
                preempted = preempted_ids(scheduler, running_before)
                result.steps.append(step_digest(metadata_list, outputs, preempted))
                result.step_times.append(clock.now)
                result.digest_s += time.perf_counter() - digest_start
                apply_model_output(v, scheduler, stop_checker, metadata_list, outputs)
                stats["scheduled_groups"] += len(metadata_list)
                stats["scheduled_tokens"] += sum(m.token_chunk_size for m in metadata_list)
                stats["preempted"] += len(preempted)
                stats["ignored"] += len(outputs.ignored_seq_groups)
                stats["copies"] += len(outputs.blocks_to_copy)
                if (
                    not metadata_list
                    and not outputs.ignored_seq_groups
                    and not scheduler.running
                    and not scheduler.swapped
                ):
                    if not pending:
                        raise RuntimeError(
                            f"{impl}: the scheduler stalled at step {len(result.steps) - 1}: "
                            f"{len(scheduler.waiting)} requests wait on an empty GPU"
                        )
                    clock.now = max(clock.now, pending[0].arrival_s - settings.step_s)
                clock.now += settings.step_s
            result.wall_s = time.perf_counter() - start - result.digest_s
    finally:
        gc.unfreeze()
    hit_rate = manager.get_prefix_cache_hit_rate(v.gpu)
    result.final = _digest(round(hit_rate, 12))
    stats.update(steps=len(result.steps), virtual_s=round(clock.now, 6), gpu_hit_rate=hit_rate)
    result.stats = stats
    result.elapsed, result.calls = dict(timer.elapsed), dict(timer.calls)
    result.manager = f"{type(manager).__module__}.{type(manager).__qualname__}"
    return result


# -- comparing and summarising -----------------------------------------------------------


def first_difference(baseline: RunResult, other: RunResult) -> str | None:
    """Where ``other``'s decisions first depart from ``baseline``'s, or None."""
    for step, (mine, theirs) in enumerate(zip(baseline.steps, other.steps)):
        if mine != theirs:
            parts = [name for name, a, b in zip(DIGEST_PARTS, mine, theirs) if a != b]
            return f"step {step} (virtual time {baseline.step_times[step]:.3f} s): {', '.join(parts)} differ"
    if len(baseline.steps) != len(other.steps):
        step = min(len(baseline.steps), len(other.steps))
        return (
            f"step {step}: one run ended after {step} steps, the other has {max(len(baseline.steps), len(other.steps))}"
        )
    if baseline.final != other.final:
        return (
            f"after the last step: the GPU prefix-cache hit rate differs ({baseline.stats['gpu_hit_rate']!r} "
            f"against {other.stats['gpu_hit_rate']!r})"
        )
    return None


def differing_calls(baseline: RunResult, other: RunResult) -> str:
    """The methods the scheduler called a different number of times ('' if none)."""
    names = sorted(set(baseline.calls) | set(other.calls))
    return ", ".join(
        f"{name} {baseline.calls.get(name, 0)} against {other.calls.get(name, 0)}"
        for name in names
        if baseline.calls.get(name, 0) != other.calls.get(name, 0)
    )


def net_seconds(result: RunResult, overhead_s: float) -> dict[str, float]:
    """Seconds per method with the timer's own cost taken out (never below 0)."""
    return {name: max(0.0, result.elapsed[name] - overhead_s * result.calls[name]) for name in result.elapsed}


def run_seconds(result: RunResult, overhead_s: float) -> float:
    """The whole run as a vLLM user has it: the wall time (scheduler, model
    output, manager) without the timer's own cost."""
    return max(0.0, result.wall_s - overhead_s * sum(result.calls.values()))


def best_of(runs: list[RunResult], overhead_s: float) -> dict[str, Any]:
    """The minimum over the rounds: per method, of the total, of the wall and run times;
    the manager's share is the best total over the best run."""
    nets = [net_seconds(run, overhead_s) for run in runs]
    methods = {}
    for name in runs[0].elapsed:
        calls = runs[0].calls[name]
        seconds = min(net[name] for net in nets)
        methods[name] = {"calls": calls, "seconds": seconds, "us_per_call": seconds / calls * 1e6 if calls else 0.0}
    total_s = min(sum(net.values()) for net in nets)
    run_s = min(run_seconds(run, overhead_s) for run in runs)
    return {
        "total_s": total_s,
        "wall_s": min(run.wall_s for run in runs),
        "run_s": run_s,
        "manager_share": ratio(total_s, run_s),
        "digest_s": min(run.digest_s for run in runs),
        "methods": methods,
    }


def round_record(run: RunResult, overhead_s: float) -> dict[str, Any]:
    net = net_seconds(run, overhead_s)
    return {
        "total_s": sum(net.values()),
        "wall_s": run.wall_s,
        "run_s": run_seconds(run, overhead_s),
        "digest_s": run.digest_s,
        "methods": {
            name: {"calls": run.calls[name], "seconds": net[name], "raw_seconds": run.elapsed[name]}
            for name in run.elapsed
        },
    }


def ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def print_table(title: str, impls: tuple[str, ...], best: dict[str, dict[str, Any]], stats: dict[str, Any]) -> None:
    """Per method: calls, us/call per implementation, baseline/other ratios; then the totals."""
    baseline, others = impls[0], impls[1:]
    print(
        f"\n{title}: {stats['steps']} steps, {stats['scheduled_groups']} scheduled groups, "
        f"{stats['scheduled_tokens']} tokens, {stats['preempted']} preemptions, {stats['ignored']} ignored, "
        f"GPU prefix hit rate {stats['gpu_hit_rate']:.3f}"
    )
    header = f"{'method':<40} {'calls':>9}" + "".join(f" {name[:16] + ' us':>19}" for name in impls)
    header += "".join(f" {(baseline + '/' + name)[:16]:>16}" for name in others)
    print(header)
    print("-" * len(header))
    for method, row in best[baseline]["methods"].items():
        if not row["calls"]:
            continue
        line = f"{method:<40} {row['calls']:>9}"
        line += "".join(f" {best[name]['methods'][method]['us_per_call']:>19.3f}" for name in impls)
        line += "".join(
            f" {_x(ratio(row['seconds'], best[name]['methods'][method]['seconds'])):>16}" for name in others
        )
        print(line)
    print("-" * len(header))
    for label, key in (
        ("inside the manager (s)", "total_s"),
        ("whole run wall (s)", "wall_s"),
        ("  without the timer's cost (s)", "run_s"),
        ("  the digests, left out (s)", "digest_s"),
    ):
        line = f"{label:<40} {'':>9}" + "".join(f" {best[name][key]:>19.3f}" for name in impls)
        if key != "digest_s":
            line += "".join(f" {_x(ratio(best[baseline][key], best[name][key])):>16}" for name in others)
        print(line)
    shares = (best[name]["manager_share"] for name in impls)
    print(f"{'the manager, share of the run':<40} {'':>9}" + "".join(f" {_percent(share):>19}" for share in shares))


def environment() -> dict[str, Any]:
    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "cpu_count": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {name: version(name) for name in ("vllm", "blockspace", "numpy", "numba", "torch")},
    }


# -- the per-step calls, timed by phase ------------------------------------------------------

STEP_METHODS = (
    "can_append_slots",
    "append_slots",
    "get_block_table",
    "access_all_blocks_in_seq",
    "get_common_computed_block_ids",
    "mark_blocks_as_computed",
)
STEP_PROMPT_TOKENS = 2048  # each sequence's prompt: one chunked-prefill budget of the trace's tokens
STEP_DECODES = 48  # three block boundaries at block size 16
STEP_ROUNDS = 3


def step_calls(
    v: SimpleNamespace, settings: Settings, classes: dict[str, type | None], requests: list[Request], caching: bool
) -> dict[str, dict[str, float]]:
    """The calls vLLM's scheduler makes for every running sequence at every
    decode step, in its order (``can_append_slots`` for every group, then
    ``append_slots``, then per sequence ``get_block_table``,
    ``access_all_blocks_in_seq`` and with caching
    ``get_common_computed_block_ids``, then ``mark_blocks_as_computed``), each
    timed over the whole batch at once: one clock reading per phase, so the
    timer's own cost (as large as the smallest calls) does not enter. A batch
    of ``max_num_seqs`` sequences whose prompts are the trace's first
    requests cut to ``STEP_PROMPT_TOKENS``; rounds in turns, the best kept.
    Microseconds per call, per implementation."""
    best: dict[str, dict[str, float]] = {impl: dict.fromkeys(STEP_METHODS, float("inf")) for impl in classes}
    for _ in range(STEP_ROUNDS):
        for impl, cls in classes.items():
            for method, seconds in _step_phases(v, settings, cls, requests, caching).items():
                best[impl][method] = min(best[impl][method], seconds)
    return {
        impl: {m: t * 1e6 for m, t in times.items() if caching or m != "get_common_computed_block_ids"}
        for impl, times in best.items()
    }


def _step_phases(
    v: SimpleNamespace, settings: Settings, cls: type | None, requests: list[Request], caching: bool
) -> dict[str, float]:
    per_seq = -(-(STEP_PROMPT_TOKENS + STEP_DECODES) // settings.block_size) + 1
    roomy = replace(settings, num_gpu_blocks=max(settings.num_gpu_blocks, settings.max_num_seqs * per_seq))
    manager = make_manager(v.own_manager if cls is None else cls, roomy, caching)
    groups = []
    for index in range(settings.max_num_seqs):
        request = requests[index % len(requests)]
        prompt = Request(index, 0.0, request.prompt[:STEP_PROMPT_TOKENS], STEP_DECODES + 1)
        group = make_group(v, prompt, settings.block_size)
        seq = group.first_seq
        manager.get_num_cached_tokens(seq)
        manager.allocate(group)
        seq.status = v.running
        seq.data.update_num_computed_tokens(seq.get_len())
        manager.mark_blocks_as_computed(group, seq.get_len())
        groups.append(group)
    seqs = [group.first_seq for group in groups]
    seconds = dict.fromkeys(STEP_METHODS, 0.0)
    clock = time.perf_counter
    gc.disable()
    try:
        for step in range(STEP_DECODES):
            for seq in seqs:
                token = output_token_id(seq.seq_id, 0, step)
                seq.append_token_id(token, {token: v.Logprob(0.0)})
            start = clock()
            for group in groups:
                manager.can_append_slots(group, 0)
            phases = [clock()]
            for seq in seqs:
                manager.append_slots(seq, 0)
            phases.append(clock())
            for seq in seqs:
                manager.get_block_table(seq)
            phases.append(clock())
            for seq in seqs:
                manager.access_all_blocks_in_seq(seq, float(step))
            phases.append(clock())
            if caching:
                for seq in seqs:
                    manager.get_common_computed_block_ids([seq])
            phases.append(clock())
            for group in groups:
                manager.mark_blocks_as_computed(group, 1)
            phases.append(clock())
            for method, begin, end in zip(STEP_METHODS, [start, *phases], phases):
                seconds[method] += end - begin
            for seq in seqs:
                seq.data.update_num_computed_tokens(1)
    finally:
        gc.enable()
    return {method: total / (STEP_DECODES * len(seqs)) for method, total in seconds.items()}


def print_step_calls(title: str, per_call: dict[str, dict[str, float]]) -> None:
    impls = tuple(per_call)
    baseline, others = impls[0], impls[1:]
    print(f"\n{title}, the per-step calls timed by phase (us per call, {STEP_DECODES} decode steps):")
    header = f"{'method':<40}" + "".join(f" {name[:16]:>16}" for name in impls)
    header += "".join(f" {(baseline + '/' + name)[:16]:>16}" for name in others)
    print(header)
    for method, us in per_call[baseline].items():
        line = f"{method:<40}" + "".join(f" {per_call[name][method]:>16.3f}" for name in impls)
        line += "".join(f" {_x(ratio(us, per_call[name][method])):>16}" for name in others)
        print(line)


# -- the benchmark ---------------------------------------------------------------------------


def run_scenario(
    v: SimpleNamespace,
    settings: Settings,
    classes: dict[str, type | None],
    requests: list[Request],
    caching: bool,
    max_model_len: int,
    overhead_s: float,
) -> tuple[dict[str, Any], str | None]:
    """Warm-up, then the rounds in turns; the scenario's record and the first disagreement (or None)."""
    title = f"caching {'on' if caching else 'off'}"
    warmup = requests[: settings.warmup_requests]
    if warmup:
        took = []
        for impl, cls in classes.items():
            start = time.perf_counter()
            run_once(v, settings, warmup, impl, cls, caching, max_model_len)
            took.append(f"{impl} {time.perf_counter() - start:.1f} s")
        print(f"  {title}, warm-up over {len(warmup)} requests: {', '.join(took)}", flush=True)
    runs: dict[str, list[RunResult]] = {impl: [] for impl in classes}
    baseline: RunResult | None = None
    mismatch = None
    for round_index in range(settings.rounds):
        for impl, cls in classes.items():
            run = run_once(v, settings, requests, impl, cls, caching, max_model_len)
            print(
                f"  {title}, round {round_index + 1}: {impl:<12} "
                f"inside {sum(net_seconds(run, overhead_s).values()):8.3f} s,"
                f" run {run_seconds(run, overhead_s):8.3f} s, {len(run.steps)} steps",
                flush=True,
            )
            runs[impl].append(run)
            if baseline is None:
                baseline = run
            elif mismatch is None and (where := first_difference(baseline, run)) is not None:
                mismatch = (
                    f"decisions differ ({title}): {impl} (round {round_index + 1}) against "
                    f"{baseline.impl} (round 1) at {where}"
                )
            if mismatch is None and (counts := differing_calls(baseline, run)):
                mismatch = (
                    f"call counts differ ({title}): {impl} (round {round_index + 1}) against {baseline.impl}: {counts}"
                )
            if mismatch:
                break
        if mismatch:
            break
    best = {impl: best_of(impl_runs, overhead_s) for impl, impl_runs in runs.items() if impl_runs}
    impls = tuple(best)
    record = {
        "caching": caching,
        "decisions_equal": mismatch is None,
        "mismatch": mismatch,
        "stats": baseline.stats if baseline else {},
        "impls": {
            impl: {
                "manager": impl_runs[0].manager,
                "steps": len(impl_runs[0].steps),
                "digest": impl_runs[0].digest(),
                "stats": impl_runs[0].stats,
                "rounds": [round_record(run, overhead_s) for run in impl_runs],
                "best": best[impl],
            }
            for impl, impl_runs in runs.items()
            if impl_runs
        },
        "ratios": {
            f"{impls[0]}/{impl}": {
                "inside": ratio(best[impls[0]]["total_s"], best[impl]["total_s"]),
                "wall": ratio(best[impls[0]]["wall_s"], best[impl]["wall_s"]),
                "run": ratio(best[impls[0]]["run_s"], best[impl]["run_s"]),
            }
            for impl in impls[1:]
        },
    }
    if mismatch is None and baseline is not None:
        print_table(title, impls, best, baseline.stats)
        record["step_calls_us"] = step_calls(v, settings, classes, requests, caching)
        print_step_calls(title, record["step_calls_us"])
    return record, mismatch


def benchmark(settings: Settings) -> int:
    v = import_vllm()
    classes = manager_classes(settings.impls)
    env = environment()
    try:
        trace = load_trace(settings.trace, settings.requests)
    except InvalidArgumentError as error:
        raise UsageError(str(error)) from None
    requests = make_requests(trace)
    max_model_len = settings.max_model_len or default_max_model_len(requests)
    overhead_s = calibrate_timer()
    versions = ", ".join(f"{name} {version}" for name, version in env["versions"].items() if version)
    load = ", ".join(f"{x:.2f}" for x in env["load_average_at_start"])
    print(f"{env['cpu_count']} CPUs, load average at start {load}; Python {env['python']}, {versions}")
    print(
        f"{len(requests)} requests of {settings.trace or 'the bundled sample'}; block size {settings.block_size}, "
        f"{settings.num_gpu_blocks} GPU / {settings.num_cpu_blocks} CPU blocks, chunked prefill "
        f"{settings.max_num_batched_tokens} tokens, {settings.max_num_seqs} seqs, max_model_len {max_model_len}, "
        f"step {settings.step_s * 1000.0:g} ms virtual; {settings.rounds} round(s) in turns; "
        f"timer cost {overhead_s * 1e9:.0f} ns a call (subtracted)",
        flush=True,
    )
    report: dict[str, Any] = {
        "config": {
            **{k: getattr(settings, k) for k in settings.__dataclass_fields__},
            "max_model_len": max_model_len,
            "num_requests": len(requests),
        },
        "environment": env,
        "timer_overhead_s": overhead_s,
        "scenarios": {},
    }
    status = 0
    for caching in settings.caching:
        record, mismatch = run_scenario(v, settings, classes, requests, caching, max_model_len, overhead_s)
        report["scenarios"][f"caching_{'on' if caching else 'off'}"] = record
        if mismatch:
            print(f"error: {mismatch}", file=sys.stderr)
            status = 1
            break
    report["decisions_equal"] = status == 0
    if settings.json_path:
        with open(settings.json_path, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
        print(f"\nwrote {settings.json_path}")
    return status


def main(argv: list[str] | None = None) -> int:
    try:
        return benchmark(parse_args(argv))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
