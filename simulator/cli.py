"""``blockspace simulate``: replay a request trace through the scheduler
with one manager (or two, compared) and report what happened.

With no arguments it replays the bundled Mooncake sample with the fast
manager, prints
the summary, and writes ``simulation.png`` and ``simulation.json`` into
``out/``. Every option is described in docs/simulator.md.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blockspace.errors import BlockSpaceError, InvalidArgumentError
from blockspace.extras import require
from blockspace.interrupts import Interrupted, raised_by_ctrl_c
from blockspace.outputs import replacing, write_text
from blockspace.simulator.clock import Clock
from blockspace.simulator.engines import CHOICES as ENGINE_CHOICES
from blockspace.simulator.engines import replay, resolve
from blockspace.simulator.failures import Outage, busiest_window, outages_of, parse_fail
from blockspace.simulator.gpu import KVCacheModel, StepTimeModel
from blockspace.simulator.gpus import GPUS
from blockspace.simulator.memory import FleetMemoryError, check_fits, fleet_cap
from blockspace.simulator.models import MODELS
from blockspace.simulator.prices import gpu_cost
from blockspace.simulator.report import (
    first_difference,
    format_comparison,
    format_summary,
    warnings_for,
    write_json,
)
from blockspace.simulator.roofline import (
    DEFAULT_GPU,
    DEFAULT_MODEL,
    DTYPE_BYTES,
    KV_DTYPES,
    DoesNotFitError,
    Roofline,
    roofline_of,
)
from blockspace.simulator.routers import ROUTERS
from blockspace.simulator.row_step import offers_rows
from blockspace.simulator.runs import PREEMPTION_MODES, STEP_PATHS, SchedulerConfig, SimulationConfig, SimulationResult
from blockspace.simulator.slo import SLO, parse_slo
from blockspace.simulator.step_model import COEFFICIENTS, MeasuredClock, load_step_model
from blockspace.simulator.summary import summarize
from blockspace.validation import (
    Range,
    check_distinct_outputs,
    check_mode_options,
    check_output_dir,
    check_output_file,
    check_ranges,
    command_parser,
    given_options,
    load_manager,
    option_name,
    refuse,
)
from blockspace.workloads import (
    SYNTHETIC_RANGES,
    SYNTHETIC_REQUESTS,
    TRACE_ENV,
    TraceRequest,
    describe,
    gamma_arrivals,
    load_trace_option,
    scale_arrivals,
    scale_users,
    synthetic,
    trace_file,
    trace_source,
)

if TYPE_CHECKING:
    from blockspace.simulator import capacity, fleet_size

DEFAULT_KV_LINK_GBPS = 400.0  # one ConnectX-7 or similar NIC a replica, as disaggregated deployments give each GPU
# --spare's outage: five minutes, about a replica's restart (a model's weights loaded again, its graphs captured)
DEFAULT_SPARE_WINDOW_S = 300.0
DEFAULT_KV_MEMORY_GIB = 96.0  # H200 141 GB x 0.9 utilisation - 16 GB weights - activations
DEFAULT_SWAP_SPACE_GIB = 4.0  # vLLM's default swap space


# --workload synthetic's defaults are workloads.synthetic's own: one place for them.
SYNTHETIC_DEFAULTS = {name: inspect.signature(synthetic).parameters[name].default for name in SYNTHETIC_RANGES}


ArgumentGroup = argparse._ArgumentGroup  # what add_argument_group returns; argparse names it privately


def build_parser() -> argparse.ArgumentParser:
    """The parser, one argument group at a time, in the order ``--help`` lists them (OPTION_GROUPS)."""
    parser = command_parser("blockspace simulate", __doc__)
    for title, add_options in OPTION_GROUPS:
        add_options(parser.add_argument_group(title))
    return parser


def _trace_and_manager_options(group: ArgumentGroup) -> None:
    _trace_options(group)
    _manager_options(group)


def _trace_options(source: ArgumentGroup) -> None:
    """Which requests arrive, and when."""
    source.add_argument(
        "--workload", choices=("trace", "synthetic"), default="trace",
        help="replay a trace (--trace), or requests made up by the options of the synthetic workload below"
             " (default: trace)",
    )  # fmt: skip
    source.add_argument(
        "--trace", type=Path, help=f"Mooncake-format JSONL (default: ${TRACE_ENV}, else the bundled sample)"
    )
    source.add_argument(
        "--max-requests", type=int,
        help=f"replay only the first N requests (default: all of a trace; {SYNTHETIC_REQUESTS} with --workload"
             " synthetic)",
    )  # fmt: skip
    source.add_argument(
        "--scale-users", type=float, metavar="K",
        help="K times the trace's users: each conversation copied with fresh chunk ids for what it alone holds, its"
             " shape kept, starting where a conversation of the trace starts (workloads.scale_users; default: 1)",
    )  # fmt: skip
    arrivals = source.add_mutually_exclusive_group()
    arrivals.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply the trace's arrival times (2 = half the request rate)"
    )
    arrivals.add_argument(
        "--request-rate", type=float,
        help="new arrival times at this many requests a second, gaps drawn from a gamma distribution; the trace"
             " keeps its prompts and outputs; with --workload synthetic, conversations started a second (default:"
             " the trace's own times; one conversation a second)",
    )  # fmt: skip
    source.add_argument(
        "--burstiness", type=float, default=1.0,
        help="the shape of --request-rate's gaps: 1 Poisson, below 1 burstier, above 1 more even (default: 1)",
    )  # fmt: skip
    source.add_argument(
        "--seed", type=int, default=0,
        help="seeds --request-rate's arrivals, the requests of --workload synthetic and --scale-users' copies"
             " (default: 0)",
    )  # fmt: skip
    source.add_argument(
        "--max-concurrency", type=int,
        help="a closed loop: at most this many requests in flight, each sent at its arrival or when one is done,"
             " whichever is later, as vLLM's serving benchmark's semaphore (default: none)",
    )  # fmt: skip


def _manager_options(source: ArgumentGroup) -> None:
    """Which manager decides, and which engine and step path run it."""
    source.add_argument("--manager", default="fast", help="reference | fast | placeholder | package.module:Class")
    source.add_argument(
        "--compare", metavar="A,B",
        help="run two managers and require identical decisions; NAME@calls or NAME@rows picks the Python engine's"
             " step path, NAME@compiled the compiled engine (default: one run, of --manager)",
    )  # fmt: skip
    source.add_argument(
        "--engine", choices=ENGINE_CHOICES, default="auto",
        help="compiled: the step as compiled code calling fast's kernels (fast only); python: the readable"
             " policy, any manager; auto: compiled where it can run (default)",
    )  # fmt: skip
    source.add_argument(
        "--step", choices=STEP_PATHS, default="auto",
        help="decodes through the manager's row API (rows), per call (calls), or rows where offered (auto)",
    )  # fmt: skip


# --workload synthetic's options: (name, type, meaning), each defaulting to workloads.synthetic's own.
SYNTHETIC_OPTIONS: tuple[tuple[str, type, str], ...] = (
    ("input_len", int, "mean prompt tokens of a conversation's first turn, and of each later message (vLLM's"
                       " --random-input-len, the mocker's isl)"),
    ("output_len", int, "mean output tokens (vLLM's --random-output-len, the mocker's osl)"),
    ("input_len_std", float, "standard deviation of --input-len's normal draws, rounded and at least 1;"
                             " 0: every message that long"),
    ("output_len_std", float, "standard deviation of --output-len's normal draws; 0: every output that long"),
    ("shared_prefix_ratio", float, "the share of a first prompt's 512-token chunks that its prefix group"
                                   " shares, in [0, 1] (the mocker's shared_prefix_ratio)"),
    ("prefix_groups", int, "groups a conversation joins, drawn uniformly; a group's prompts begin with the"
                           " same chunks (the mocker's num_prefix_groups)"),
    ("turns", int, "requests a conversation makes; each turn's prompt is the last turn's prompt, then fresh"
                   " tokens for its answer and the next message"),
    ("turn_gap", float, "seconds from one turn's arrival to the next turn's, answered or not"),
)  # fmt: skip


def _synthetic_options(made: ArgumentGroup) -> None:
    for name, kind, meaning in SYNTHETIC_OPTIONS:
        made.add_argument(option_name(name), type=kind, default=SYNTHETIC_DEFAULTS[name], help=meaning)


def _fleet_options(fleet: ArgumentGroup) -> None:
    fleet.add_argument("--replicas", type=int, default=1, help="engines behind one router, each with every option"
                       " below (default: 1)")  # fmt: skip
    fleet.add_argument("--router", choices=tuple(ROUTERS), default="round_robin",
                       help="how the router picks a replica: in turn, fewest outstanding requests, or the least"
                            " cost of blocks to prefill and blocks outstanding (default: round_robin)")  # fmt: skip
    fleet.add_argument("--router-weight", type=float, default=1.0,
                       help="kv_aware: the weight of the prompt blocks a replica lacks against its outstanding"
                            " blocks (default: 1, as Dynamo's KV router)")  # fmt: skip
    fleet.add_argument("--prefill-replicas", type=int, default=0, metavar="P",
                       help="P of the replicas only prefill, the rest only decode, each prompt's KV moved over"
                            " --kv-link-gbps (disaggregated serving; default: 0, every replica does both)")  # fmt: skip
    fleet.add_argument("--decode-replicas", type=int, metavar="D",
                       help="with --prefill-replicas: D decode replicas, P + D in all (default: --replicas less"
                            " P)")  # fmt: skip
    fleet.add_argument("--kv-link-gbps", type=float, default=DEFAULT_KV_LINK_GBPS, metavar="GBPS",
                       help=f"with --prefill-replicas: gigabits a second from a prefill replica to a decode replica"
                            f" (default: {DEFAULT_KV_LINK_GBPS:g}, one 400 Gb/s NIC)")  # fmt: skip
    fleet.add_argument("--router-lag", type=float, metavar="MS",
                       help="kv_aware: the router sees each replica's prefix cache as it was MS milliseconds"
                            " before the arrival, as a router fed by cache events that lag does (default: as it"
                            " is)")  # fmt: skip
    fleet.add_argument("--fail", action="append", default=[], metavar="REPLICA@TIME[+DURATION]",
                       help="replica REPLICA (from 0) goes down at TIME seconds for DURATION (default: for good), its"
                            " unfinished requests sent again to the live replicas; rolling@START/INTERVAL/DOWNTIME"
                            " takes each replica down in turn (repeatable; default: none)")  # fmt: skip


def _kv_cache_options(memory: ArgumentGroup) -> None:
    memory.add_argument("--block-size", type=int, default=16, help="tokens per block")
    gpu = memory.add_mutually_exclusive_group()
    gpu.add_argument("--num-gpu-blocks", type=int, help="GPU blocks (default: as many as --kv-memory-gib holds)")
    gpu.add_argument("--kv-memory-gib", type=float, help=f"GPU memory for KV cache (default: {DEFAULT_KV_MEMORY_GIB})")
    cpu = memory.add_mutually_exclusive_group()
    cpu.add_argument("--num-cpu-blocks", type=int, help="CPU swap blocks (default: as many as --swap-space-gib holds)")
    cpu.add_argument("--swap-space-gib", type=float, help=f"CPU swap space (default: {DEFAULT_SWAP_SPACE_GIB})")
    memory.add_argument(
        "--watermark", type=float, default=0.01, help="share of GPU blocks kept free at admission, in [0, 1)"
    )
    memory.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="prefix caching")  # fmt: skip


def _model_options(model: ArgumentGroup) -> None:
    model.add_argument("--num-layers", type=int, default=KVCacheModel.num_layers, help="layers")
    model.add_argument("--num-kv-heads", type=int, default=KVCacheModel.num_kv_heads, help="KV heads per layer")
    model.add_argument("--head-dim", type=int, default=KVCacheModel.head_dim, help="dimension of a head")
    model.add_argument("--dtype-bytes", type=int, default=KVCacheModel.dtype_bytes, help="bytes per KV value")


def _roofline_options(roof: ArgumentGroup) -> None:
    roof.add_argument("--gpu", metavar="NAME", help=f"the GPU, for a roofline clock: one of {', '.join(GPUS)}"
                      f" (default: the linear clock; with --model alone, {DEFAULT_GPU})")  # fmt: skip
    roof.add_argument("--model", metavar="NAME|PATH",
                      help=f"the model, for a roofline clock and the KV shape: one of {', '.join(MODELS)}, or a"
                      f" Hugging Face config.json (default: the options above; with --gpu alone,"
                      f" {DEFAULT_MODEL})")  # fmt: skip
    roof.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default=Roofline.dtype, help="the weights' type")
    roof.add_argument("--kv-dtype", choices=KV_DTYPES, default=Roofline.kv_dtype,
                      help="the KV cache's type (auto: the weights')")  # fmt: skip
    roof.add_argument("--tensor-parallel", type=int, default=Roofline.tensor_parallel, metavar="N",
                      help="GPUs a replica's model is split over")  # fmt: skip
    roof.add_argument("--compute-efficiency", type=float, default=Roofline.compute_efficiency,
                      help="the share of the GPU's dense peak FLOP/s a step reaches")  # fmt: skip
    roof.add_argument("--bandwidth-efficiency", type=float, default=Roofline.bandwidth_efficiency,
                      help="the share of its memory bandwidth a step reaches")  # fmt: skip
    roof.add_argument("--host-overhead-ms", type=float, default=Roofline.host_overhead_ms,
                      help="a fixed host cost per step (scheduling, launches, sampling)")  # fmt: skip


def _scheduler_options(sched: ArgumentGroup) -> None:
    sched.add_argument("--max-num-seqs", type=int, default=256, help="sequences per step")
    sched.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget per step")
    sched.add_argument("--preemption-mode", choices=PREEMPTION_MODES, default="recompute", help="how to preempt")
    sched.add_argument("--n", type=int, default=1,
                       help="samples per request: N requests of one sequence each, sharing the prompt only "
                       "through the prefix cache (vLLM 0.9.2's parallel sampling)")  # fmt: skip
    sched.add_argument("--max-output-len", type=int, help="cap every request's output length (default: no cap)")


def _step_time_options(timing: ArgumentGroup) -> None:
    timing.add_argument(
        "--step-model", type=Path, metavar="FILE",
        help="the step-time model's coefficients from a JSON file (blockspace gpu-profile writes one), instead of"
             " the five options below (default: those options)",
    )  # fmt: skip
    timing.add_argument(
        "--step-overhead-ms", type=float, default=StepTimeModel.step_overhead_ms, help="fixed cost of a step"
    )
    timing.add_argument("--prefill-token-us", type=float, default=StepTimeModel.prefill_token_us,
                        help="cost of an uncached prompt token")  # fmt: skip
    timing.add_argument("--decode-seq-us", type=float, default=StepTimeModel.decode_seq_us,
                        help="cost of a decoding sequence")  # fmt: skip
    timing.add_argument("--kv-token-read-ns", type=float, default=StepTimeModel.kv_token_read_ns,
                        help="cost of reading a context token's K and V in a decode")  # fmt: skip
    timing.add_argument("--swap-block-us", type=float, default=StepTimeModel.swap_block_us,
                        help="cost of swapping a block in or out")  # fmt: skip


def _output_options(output: ArgumentGroup) -> None:
    output.add_argument("--out", type=Path, default=Path("out"), help="folder for the plot and JSON")
    output.add_argument(
        "--slo", metavar="BOUNDS",
        help="latency targets, any of ttft, tpot, e2e with a unit (s, ms, us), e.g. ttft=2s,tpot=100ms: the summary"
             " says how many requests met them and the goodput (default: none)",
    )  # fmt: skip
    output.add_argument(
        "--requests-out", type=Path, metavar="FILE",
        help="write one JSON line per request: its admissions, tokens, latencies and outcome (default: not written)",
    )  # fmt: skip
    output.add_argument(
        "--gpu-cost", type=gpu_cost, metavar="DOLLARS",
        help="dollars a GPU-hour, for every GPU or per --gpu name (H100-SXM=3.0,L40S=1.0): the run's price per"
             " million output tokens and its GPU-hours; --find min-cost's prices (default: none)",
    )  # fmt: skip
    output.add_argument("--no-plot", action="store_true", help="skip the PNG")
    output.add_argument("--quiet", action="store_true", help="no progress bar")


def _capacity_options(finding: ArgumentGroup) -> None:
    finding.add_argument(
        "--find", choices=("max-rate", "min-replicas", "min-cost"),
        help="max-rate: the highest request rate (the trace's arrivals scaled) at which --target %% of the requests"
             " meet --slo; min-replicas: the fewest replicas behind --router that do; min-cost: the cheapest fleet"
             " of each --sweep of gpu and tensor_parallel at --gpu-cost; each found by bisection with the runs in"
             " parallel, and run again on a clock faster and slower by its measured error (default: one replay)",
    )  # fmt: skip
    finding.add_argument(
        "--seeds", type=int, default=1, metavar="K",
        help="with --find and drawn arrivals (--request-rate, --workload synthetic): search K draws, seeds --seed"
             " on, and give the answers' range (default: 1)",
    )  # fmt: skip
    finding.add_argument(
        "--spare", type=int, metavar="K",
        help="with --find min-replicas: the fewest replicas that meet the SLO with K of them down for the busiest"
             " --spare-window of the trace, both during it and outside it (default: none down)",
    )  # fmt: skip
    finding.add_argument(
        "--spare-window", type=float, default=DEFAULT_SPARE_WINDOW_S, metavar="SECONDS",
        help=f"with --spare: how long the K replicas are down (default: {DEFAULT_SPARE_WINDOW_S:g})",
    )  # fmt: skip
    finding.add_argument(
        "--target", type=float, default=90.0, help="with --find: the share of requests that must meet --slo, in %%"
    )


def _sweep_options(sweeping: ArgumentGroup) -> None:
    sweeping.add_argument(
        "--sweep", metavar="KEY=V1,V2", action="append", default=[],
        help="run every combination of these values of simulate options (repeatable), e.g. num_gpu_blocks=8192,16384"
             " (default: no sweep)",
    )  # fmt: skip
    sweeping.add_argument("--workers", type=int, help="parallel runs of a sweep (default: one per core)")
    sweeping.add_argument("--executor", choices=("process", "ray"), default="process",
                          help="where a sweep's or a search's runs go: worker processes or a Ray cluster")  # fmt: skip
    sweeping.add_argument("--address", metavar="HOST:PORT",
                          help="with --executor ray: the running Ray cluster to join (what `ray start --head`"
                               " prints, or auto) (default: $RAY_ADDRESS, else a local one Ray starts)")  # fmt: skip


# The argument groups, in --help's order: each title, and the function that adds its options.
OPTION_GROUPS: tuple[tuple[str, Callable[[ArgumentGroup], None]], ...] = (
    ("trace and managers", _trace_and_manager_options),
    ("synthetic workload (--workload synthetic; workloads.synthetic)", _synthetic_options),
    ("fleet (simulator/fleet.py, routers.py)", _fleet_options),
    ("KV cache", _kv_cache_options),
    ("model (bytes per KV token)", _model_options),
    ("GPU and model: a roofline clock (simulator/roofline.py)", _roofline_options),
    ("scheduler", _scheduler_options),
    ("step-time model", _step_time_options),
    ("output", _output_options),
    ("capacity (simulator/capacity.py)", _capacity_options),
    ("sweeps (simulator/sweep.py)", _sweep_options),
)


# Every numeric option's range: checked before anything runs (a sweep's values too), so a
# bad value is one ``error:`` line (exit 2), never a traceback or a failure at the end of a
# long run. The watermark is a share of the GPU blocks below 1, as vLLM's CacheConfig has it.
RANGES = {
    "max_requests": Range(least=1),
    "tensor_parallel": Range(least=1, most=64),
    "compute_efficiency": Range(above=0, most=1),
    "bandwidth_efficiency": Range(above=0, most=1),
    "host_overhead_ms": Range(least=0),
    "time_scale": Range(above=0),
    "scale_users": Range(above=0),
    "spare": Range(least=1),
    "spare_window": Range(above=0),
    "request_rate": Range(above=0),
    "burstiness": Range(above=0),
    "seed": Range(least=0),
    "replicas": Range(least=1),
    "max_concurrency": Range(least=1),
    "router_weight": Range(least=0),
    "router_lag": Range(least=0),
    "prefill_replicas": Range(least=0),
    "decode_replicas": Range(least=1),
    "kv_link_gbps": Range(above=0),
    "block_size": Range(least=1),
    "num_gpu_blocks": Range(least=1),
    "kv_memory_gib": Range(above=0),
    "num_cpu_blocks": Range(least=0),
    "swap_space_gib": Range(least=0),
    "watermark": Range(least=0, below=1),
    "num_layers": Range(least=1),
    "num_kv_heads": Range(least=1),
    "head_dim": Range(least=1),
    "dtype_bytes": Range(least=1),
    "max_num_seqs": Range(least=1),
    "max_num_batched_tokens": Range(least=1),
    "n": Range(least=1),
    "max_output_len": Range(least=1),
    "step_overhead_ms": Range(least=0),
    "prefill_token_us": Range(least=0),
    "decode_seq_us": Range(least=0),
    "kv_token_read_ns": Range(least=0),
    "swap_block_us": Range(least=0),
    "workers": Range(least=1),
    "target": Range(above=0, most=100),
    "seeds": Range(least=1, most=100),
    **SYNTHETIC_RANGES,  # workloads.py's, which workloads.synthetic checks too
}
OUTPUTS = ("simulation.json", "simulation.png")  # what a run writes under --out
# the roofline's options besides --gpu and --model: Roofline's fields of the same names
ROOFLINE_KNOBS = ("dtype", "kv_dtype", "tensor_parallel", "compute_efficiency", "bandwidth_efficiency",
                  "host_overhead_ms")  # fmt: skip


# The options that only some modes read. A mode is one of --find, --sweep and --compare, or a
# single run when none is given. Written where no mode reads it, an option would change nothing,
# so it is refused by name: NEEDS, read only beside one of these options; APART, never beside them.
SYNTHETIC = "workload synthetic"  # the mode of --workload synthetic (option_name writes it so)
NEEDS: dict[str, tuple[tuple[str, ...], str]] = {
    "target": (("find",), "it is the share of requests the search must keep within --slo"),
    "seeds": (("find",), "it is how many draws of the arrivals a search's answer ranges over"),
    "workers": (("sweep", "find"), "it sets how many of their runs go at once"),
    "executor": (("sweep", "find"), "it sets where their runs go"),
    "address": (("sweep", "find"), "it names the Ray cluster their runs go to"),
    "burstiness": (("request_rate",), "it shapes the gaps between the arrivals --request-rate draws"),
    "seed": (
        ("request_rate", SYNTHETIC, "scale_users"),
        "it seeds the arrivals --request-rate draws, the synthetic requests and --scale-users' copies",
    ),
    "spare": (("find",), "it is what --find min-replicas keeps down"),
    "spare_window": (("find",), "it is how long --find min-replicas keeps --spare down"),
    "router": (("replicas", "prefill_replicas"), "it picks among replicas"),
    "router_weight": (("replicas", "prefill_replicas"), "it weighs kv_aware's choice among replicas"),
    "router_lag": (("replicas",), "it delays what kv_aware sees of the replicas"),
    "decode_replicas": (("prefill_replicas", "find"), "it is the other side of a disaggregated fleet"),
    "kv_link_gbps": (
        ("prefill_replicas", "decode_replicas"),
        "it carries the KV from prefill replicas to decode replicas",
    ),
    **{name: (("gpu", "model"), "it shapes the roofline clock of --gpu and --model") for name in ROOFLINE_KNOBS},
    **{name: ((SYNTHETIC,), "it shapes the requests the synthetic workload makes") for name in SYNTHETIC_RANGES},
}
# options that other options go with, given or swept
OPTION_MODES = ("request_rate", "replicas", "gpu", "model", "scale_users", "prefill_replicas", "decode_replicas")
APART: dict[str, tuple[tuple[str, ...], str]] = {
    "requests_out": (("sweep", "find"), "it writes the requests of one run, and these make many"),
    "compare": (("sweep", "find"), "it runs one manager: use --manager"),
    "manager": (("compare",), "--compare names both managers"),
    "trace": ((SYNTHETIC,), "the synthetic workload makes its requests, it reads none"),
    "time_scale": ((SYNTHETIC,), "it scales a trace's own times; synthetic conversations start at --request-rate"),
    "scale_users": (
        (SYNTHETIC, "request_rate"),
        "it copies a trace's conversations at their own times; --request-rate and the synthetic workload draw times",
    ),
    **{
        name: (("model",), "--model sets the KV shape")
        for name in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes")
    },
    **{
        name: (("gpu", "model"), "the roofline clock of --gpu and --model replaces the linear clock's constants")
        for name in COEFFICIENTS
    },
}


def check_modes(args: argparse.Namespace, given: frozenset[str]) -> None:
    """No option is written where its mode does not read it (``NEEDS``, ``APART``;
    the message is every command's, from blockspace.validation)."""
    from blockspace.simulator.sweep import swept_dest

    swept = {swept_dest(spec) for spec in args.sweep}
    written = given | swept  # a swept option is read by its runs as a given one is
    modes = [mode for mode in ("find", "sweep", "compare") if getattr(args, mode)]
    modes += [SYNTHETIC] if args.workload == "synthetic" else []  # a sweep cannot change it (sweep.NOT_SWEPT)
    searched = ["replicas"] if args.find in ("min-replicas", "min-cost") else []  # the search sets it
    check_mode_options(written, modes + searched + [name for name in OPTION_MODES if name in written], NEEDS, APART)
    if "router_weight" in written and args.router != "kv_aware" and "router" not in swept:
        raise InvalidArgumentError(f"--router-weight goes with --router kv_aware: --router {args.router} has no weight")
    if "router_lag" in written and args.router != "kv_aware" and "router" not in swept:
        raise InvalidArgumentError(f"--router-lag goes with --router kv_aware: --router {args.router} reads no cache")
    if "router_lag" in written and "max_concurrency" in written:
        raise InvalidArgumentError("--router-lag cannot go with --max-concurrency: a closed loop's sending times are"
                                   " not known before the requests before them are done")  # fmt: skip
    check_disaggregated(args, written, swept)
    one_replica = args.replicas == 1 and "replicas" not in swept and not searched and not args.prefill_replicas
    for name in ("router_weight", "router_lag", "router"):
        if name in written and one_replica:
            raise InvalidArgumentError(
                f"{option_name(name)} goes with --replicas above 1: one replica leaves no choice"
            )
    if args.find == "max-rate" and "max_concurrency" in written:
        raise InvalidArgumentError(
            "--max-concurrency cannot go with --find max-rate: a closed loop sends a request when one is done, so"
            " the arrival rate the search scales has no effect (to find the highest concurrency within the SLO,"
            " --sweep max_concurrency=V1,V2 with --slo)"
        )
    if "seeds" in written and "request_rate" not in written and args.workload != "synthetic":
        raise InvalidArgumentError(
            "--seeds goes with drawn arrivals, --request-rate or --workload synthetic: a trace's own arrivals are one"
        )
    if "address" in written and args.executor != "ray":
        raise InvalidArgumentError("--address goes with --executor ray: it names the Ray cluster to join")
    check_failures(args, written, swept)
    if "turn_gap" in written and args.turns == 1 and "turns" not in swept:
        raise InvalidArgumentError("--turn-gap goes with --turns above 1: a conversation of one turn has no gap")
    if "prefix_groups" in written and args.shared_prefix_ratio == 0 and "shared_prefix_ratio" not in swept:
        raise InvalidArgumentError(
            "--prefix-groups goes with --shared-prefix-ratio above 0: with no shared chunks a group shares nothing"
        )


def check_disaggregated(args: argparse.Namespace, written: Collection[str], swept: Collection[str]) -> None:
    """``--prefill-replicas`` leaves decode replicas, and goes with what a disaggregated fleet models."""
    if "decode_replicas" in written and "replicas" in written:
        raise InvalidArgumentError("--decode-replicas cannot go with --replicas: P + D are the replicas")
    searching = args.find in ("min-replicas", "min-cost")
    split = "prefill_replicas" in written and args.prefill_replicas or "prefill_replicas" in swept
    if "decode_replicas" in written and not split and not searching:
        raise InvalidArgumentError("--decode-replicas goes with --prefill-replicas, or with --find min-replicas"
                                   " (which then counts the prefill replicas in front of them)")  # fmt: skip
    if not split and "decode_replicas" not in written:
        return
    if split and searching and "decode_replicas" in written:
        raise InvalidArgumentError(f"--decode-replicas cannot go with --prefill-replicas and --find {args.find}:"
                                   " the search counts one side, give the other")  # fmt: skip
    total = args.replicas if args.decode_replicas is None else args.prefill_replicas + args.decode_replicas
    fixed = "replicas" not in swept and "decode_replicas" not in swept
    if not searching and fixed and args.prefill_replicas >= total:
        raise InvalidArgumentError(f"--prefill-replicas {args.prefill_replicas} leaves no decode replica of"
                                   f" {total} (give --decode-replicas, or more --replicas)")  # fmt: skip
    for name in ("fail", "max_concurrency", "router_lag"):
        if name in written:
            raise InvalidArgumentError(f"--prefill-replicas cannot go with {option_name(name)}: a disaggregated"
                                       " fleet does not model it")  # fmt: skip
    if args.n > 1 or "n" in swept:
        raise InvalidArgumentError("--prefill-replicas goes with --n 1: a disaggregated fleet moves requests of one"
                                   " sample")  # fmt: skip


def check_failures(args: argparse.Namespace, written: Collection[str], swept: Collection[str]) -> None:
    """``--fail`` parsed into ``failures.Failure`` values, and it and ``--spare`` where they mean something."""
    args.fail = tuple(parse_fail(text) for text in args.fail)
    if "spare" in written and args.find != "min-replicas":
        raise InvalidArgumentError(f"--spare goes with --find min-replicas: --find {args.find} counts no replicas")
    if "spare_window" in written and "spare" not in written:
        raise InvalidArgumentError("--spare-window goes with --spare: it is how long the spare replicas are down")
    if not args.fail:
        return
    if "spare" in written:
        raise InvalidArgumentError("--fail cannot go with --spare: the search takes --spare replicas down itself")
    if args.find in ("min-replicas", "min-cost") and any(isinstance(f, Outage) for f in args.fail):
        raise InvalidArgumentError(f"--fail REPLICA@TIME cannot go with --find {args.find}: the search changes the"
                                   " replica count (use rolling@START/INTERVAL/DOWNTIME, or --spare)")  # fmt: skip
    if "max_concurrency" in written:
        raise InvalidArgumentError("--fail cannot go with --max-concurrency: a closed loop would count the requests"
                                   " a failed replica lost as in flight")  # fmt: skip
    if args.n > 1 or "n" in swept:
        raise InvalidArgumentError("--fail goes with --n 1: a retry sends a trace request again whole, and would"
                                   " send again samples already done")  # fmt: skip
    if "replicas" not in swept and args.find in (None, "max-rate"):  # the fleet the runs have
        outages_of(args.fail, args.replicas)  # a replica the fleet has; none down twice at once, nor all for good


def check_arguments(args: argparse.Namespace, given: frozenset[str] = frozenset()) -> None:
    """Every option in its range (``InvalidArgumentError`` naming the first
    that is not) and read by the mode it is given in; ``--slo`` parsed into
    an ``SLO``; ``--requests-out`` a file that can be written, apart from
    the files ``--out`` will hold."""
    check_ranges(args, RANGES)
    check_modes(args, given)
    args.slo = None if args.slo is None else parse_slo(args.slo)
    if args.requests_out is not None:
        check_output_file(args.requests_out, "--requests-out")
        files = {"--requests-out": args.requests_out, **{f"--out's {name}": args.out / name for name in OUTPUTS}}
        check_distinct_outputs(files, {"--out": args.out})


def check_extras(args: argparse.Namespace) -> None:
    """The plot needs matplotlib and the progress bar rich (the ``[sim]``
    extra): checked before the run, not found missing at its end."""
    if not args.no_plot:
        require("sim", "the plot of blockspace simulate (or pass --no-plot)", "matplotlib")
    if not args.quiet and sys.stdout.isatty():
        require("sim", "the progress bar of blockspace simulate (or pass --quiet)", "rich")


def roofline(args: argparse.Namespace) -> Roofline | None:
    """The roofline of ``--gpu`` and ``--model``, if either is given."""
    if args.gpu is None and args.model is None:
        return None
    return roofline_of(args.gpu, args.model, **{name: getattr(args, name) for name in ROOFLINE_KNOBS})


def disaggregated(args: argparse.Namespace) -> bool:
    """Are prefill and decode apart: ``--prefill-replicas``, or ``--decode-replicas`` behind a search of the prefill?"""
    return bool(args.prefill_replicas or args.decode_replicas)


def replicas_of(args: argparse.Namespace) -> int:
    """All the replicas: ``--replicas``, or P + D apart. A search of the fewest
    (min-replicas, min-cost) sets them itself, and counts the decode replicas
    behind ``--prefill-replicas``, or the prefill replicas in front of
    ``--decode-replicas`` (fleet_size.py): its template holds the one given
    and one of the other."""
    if args.find in ("min-replicas", "min-cost"):
        return (args.prefill_replicas or 1) + (args.decode_replicas or 1) if disaggregated(args) else 1
    return args.replicas if args.decode_replicas is None else args.prefill_replicas + args.decode_replicas


def simulation_config(args: argparse.Namespace, record_tables: bool) -> SimulationConfig:
    roof = roofline(args)
    kv = KVCacheModel(args.num_layers, args.num_kv_heads, args.head_dim, args.dtype_bytes) if roof is None else \
        roof.kv_cache()  # fmt: skip
    num_gpu_blocks = args.num_gpu_blocks
    if num_gpu_blocks is None:
        default = DEFAULT_KV_MEMORY_GIB if roof is None else roof.kv_memory_gib()
        gib = default if args.kv_memory_gib is None else args.kv_memory_gib
        num_gpu_blocks = kv.num_blocks(gib, args.block_size)
        if num_gpu_blocks < 1:
            raise InvalidArgumentError(
                f"--kv-memory-gib {gib} holds no block of {kv.bytes_per_block(args.block_size):,} bytes"
            )
    num_cpu_blocks = args.num_cpu_blocks
    if num_cpu_blocks is None:
        gib = DEFAULT_SWAP_SPACE_GIB if args.swap_space_gib is None else args.swap_space_gib
        num_cpu_blocks = kv.num_blocks(gib, args.block_size)
    return SimulationConfig(
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        watermark=args.watermark,
        scheduler=SchedulerConfig(
            block_size=args.block_size,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_prefix_caching=args.enable_prefix_caching,
            preemption_mode=args.preemption_mode,
            record_tables=record_tables,
            step=args.step,
        ),
        step_time=step_time_model(args, kv, roof),
        num_samples=args.n,
        max_output_len=args.max_output_len,
        replicas=replicas_of(args),
        max_concurrency=args.max_concurrency,
        router=args.router,
        router_weight=args.router_weight,
        router_lag_s=None if args.router_lag is None else args.router_lag / 1000,
        prefill_replicas=args.prefill_replicas or int(disaggregated(args)),
        kv_link_gbps=args.kv_link_gbps,
        kv_block_bytes=kv.bytes_per_block(args.block_size),
        gpu_cost_per_hour=None if args.gpu_cost is None else args.gpu_cost.price(roof and roof.gpu.name),
        failures=args.fail,
    )


def step_time_model(args: argparse.Namespace, kv: KVCacheModel, roof: Roofline | None = None) -> Clock:
    """The clock: ``--step-model FILE`` (measured), else the roofline of
    ``--gpu`` and ``--model``, else the five coefficient options. A file and
    the options at once is refused: a coefficient given on the command line
    and then replaced by the file's would be silently ignored. So is a file
    measured on a model whose KV cache (``kv``) is not this run's: its step
    times are another model's. A sweep calls this for each of its
    configurations before any runs."""
    given = StepTimeModel(
        args.step_overhead_ms, args.prefill_token_us, args.decode_seq_us, args.kv_token_read_ns, args.swap_block_us
    )
    if args.step_model is None:
        return given if roof is None else roof
    changed = [name for name in COEFFICIENTS if getattr(given, name) != getattr(StepTimeModel(), name)]
    if changed:
        raise InvalidArgumentError(f"--step-model replaces the step-time options: drop {option_name(changed[0])}")
    try:
        return MeasuredClock(**asdict(load_step_model(args.step_model, kv)), path=str(args.step_model))
    except InvalidArgumentError as error:
        raise InvalidArgumentError(f"--step-model: {error}") from None


def load_requests(args: argparse.Namespace) -> list[TraceRequest]:
    """The requests to replay: the trace read, checked and not empty
    (``load_trace_option``), arriving at ``--request-rate`` where it is
    given, else at the trace's times scaled by ``--time-scale``; or, with
    ``--workload synthetic``, the requests its options make."""
    if args.workload == "synthetic":
        try:
            return synthetic(
                SYNTHETIC_REQUESTS if args.max_requests is None else args.max_requests,
                **{name: getattr(args, name) for name in SYNTHETIC_RANGES},
                rate=args.request_rate, burstiness=args.burstiness, seed=args.seed,
            )  # fmt: skip
        except InvalidArgumentError as error:
            raise InvalidArgumentError(f"--workload synthetic: {error}") from None
    requests = load_trace_option(args.trace, args.max_requests)
    if args.scale_users is not None:
        try:
            requests = scale_users(requests, args.scale_users, args.seed)
        except InvalidArgumentError as error:  # more fresh chunk ids than a prompt may hold
            raise InvalidArgumentError(f"--scale-users: {error}") from None
    if args.request_rate is not None:
        return gamma_arrivals(requests, args.request_rate, args.burstiness, args.seed)
    return scale_arrivals(requests, args.time_scale)


def workload_source(args: argparse.Namespace) -> str:
    """Where the requests come from, in words, for what a run prints and
    writes: the trace (``trace_source``), or the synthetic workload."""
    return "a synthetic workload" if args.workload == "synthetic" else trace_source(args.trace)


def offered_rate(args: argparse.Namespace) -> float | None:
    """``--request-rate`` where it is a rate of requests. With ``--workload
    synthetic`` and ``--turns`` above 1 it starts conversations of several
    requests each, so the requests' rate is their own (None here)."""
    return None if args.workload == "synthetic" and args.turns > 1 else args.request_rate


def resolve_manager(name: str, option: str = "--manager") -> type:
    """The manager class for a name, checked to be a manager (``InvalidArgumentError`` naming ``option``)."""
    return load_manager(name, option)


def resolve_run(name: str, default_step: str, default_engine: str) -> tuple[type, str, str]:
    """``NAME``, ``NAME@STEP`` or ``NAME@compiled`` of ``--compare``: the
    manager class, the step path and the engine (a bare name runs on
    ``--engine``, with ``--step``)."""
    manager, at, step = name.partition("@")
    if at and step not in (*STEP_PATHS, "compiled"):
        raise InvalidArgumentError(
            f"--compare: {name!r}: after @ comes a step path ({', '.join(STEP_PATHS)}) or compiled"
        )
    cls = resolve_manager(manager, "--compare")
    if step == "compiled":
        return cls, "auto", resolve("compiled", cls, "auto", f"--compare: {name!r}")
    if at:
        check_step(cls, step, f"--compare: {name!r}")
        return cls, step, "python"
    return cls, default_step, resolve(default_engine, cls, default_step)


def check_step(cls: type, step: str, where: str) -> None:
    """The step path ``rows`` needs a manager with the row API."""
    if step == "rows" and not offers_rows(cls):
        raise InvalidArgumentError(f"{where}: {cls.__name__} offers no row API (fast/row_api.py)")


# What load_requests reads: the runs of a sweep that agree on these replay the same requests.
REQUEST_OPTIONS = ("workload", "max_requests", "scale_users", "time_scale", "request_rate", "burstiness", "seed",
                   *SYNTHETIC_RANGES)  # fmt: skip


def preparer(
    sweeps: list[tuple[str, list[Any]]], manager_class: type, at_once: int = 1
) -> Callable[[argparse.Namespace], tuple[SimulationConfig, list[TraceRequest]]]:
    """One swept run's options -> its configuration and its requests,
    loading the trace once per choice of its requests and arrivals; a combination of
    values that does not go together (among them the step path ``rows``
    for a manager without rows), or a fleet that will not fit in memory
    with ``at_once`` runs going at once (``memory.check_fits``), is an
    ``InvalidArgumentError`` naming them."""
    traces: dict[tuple[Any, float], list[TraceRequest]] = {}

    def prepare(run_args: argparse.Namespace) -> tuple[SimulationConfig, list[TraceRequest]]:
        swept = ", ".join(f"{name}={getattr(run_args, name)}" for name, _ in sweeps)
        try:
            check_step(manager_class, run_args.step, "--step rows")
            engine = resolve(run_args.engine, manager_class, run_args.step)
            config = replace(simulation_config(run_args, record_tables=False), engine=engine)
        except BlockSpaceError as error:  # a deployment that cannot exist keeps its kind, and its reason as the cause
            kind = DoesNotFitError if isinstance(error, DoesNotFitError) else InvalidArgumentError  # min-cost skips it
            raise kind(f"--sweep ({swept}): {error}" if sweeps else str(error)) from error
        key = tuple(getattr(run_args, name) for name in REQUEST_OPTIONS)
        if key not in traces:
            traces[key] = load_requests(run_args)
        if config.replicas > 1:  # as a single run's plan checks its fleet, before any run
            try:
                check_fits(traces[key], manager_class, config, share=at_once)
            except FleetMemoryError as error:
                raise FleetMemoryError(f"--sweep ({swept}): {error}" if sweeps else str(error)) from None
        return config, traces[key]

    return prepare


def _sweep(parser: argparse.ArgumentParser, args: argparse.Namespace, given: frozenset[str]) -> int:
    """``--sweep``: every configuration checked, then the runs (sweep.py)."""
    from blockspace.simulator.sweep import configurations, parse_sweeps, sweep

    sweeps = parse_sweeps(args.sweep, parser, RANGES, given)
    at_once = min(args.workers or os.cpu_count() or 1, len(configurations(sweeps)))  # sweep()'s workers
    return sweep(args, sweeps, preparer(sweeps, resolve_manager(args.manager), at_once), workload_source(args))


def search_once(
    args: argparse.Namespace,
    config: SimulationConfig,
    trace: list[TraceRequest],
    rate: float | None,
    most: int,
    near: float | None,
    say: Callable[[str], None] | None,
    decode: int = 0,
) -> capacity.RateAnswer | fleet_size.ReplicaAnswer:
    """One search of ``config`` (``--find``'s: the fewest replicas, up to
    ``most``, or the highest rate, from the trace's ``rate``), its first
    round ``near`` an answer where one is expected close by; ``decode``:
    the decode replicas in front of which it counts the prefill ones."""
    from blockspace.simulator import capacity, fleet_size

    workers = args.workers or os.cpu_count() or 1
    if args.find != "max-rate":  # min-replicas, and min-cost's searches
        window = busiest_window(trace, args.spare_window) if args.spare else (0.0, 0.0)
        template = fleet_size.Try(1, trace, config, args.manager, args.slo, args.spare or 0, window, decode)
        counts = fleet_size.evaluator(template, workers, args.executor, say)
        return fleet_size.find_min_replicas(counts, args.target / 100, workers, most,
                                            None if near is None else int(near))  # fmt: skip
    assert rate is not None  # a rate search's points have one (capacity.base_rate)
    rates = capacity.evaluator(trace, config, args.manager, args.slo, workers, args.executor, rate, say)
    return capacity.find_max_rate(rates, rate, args.target / 100, workers, near=None if near is None else near / rate)


@dataclass(frozen=True)
class Point:
    """One configuration a ``--find`` searches: its swept values, its
    configuration and requests, the rate the search scales (max-rate), its
    largest fleet and the line saying memory set it (min-replicas), and the
    other draws of its arrivals (``--seeds``: seed, requests, rate)."""

    values: dict[str, Any]
    config: SimulationConfig
    trace: list[TraceRequest]
    offered: float | None  # the requests' own rate as drawn (max-rate)
    rate: float | None  # the rate the search scales (max-rate)
    most: int = 0  # min-replicas: the largest fleet that fits in memory
    bound: str | None = None
    draws: tuple[tuple[int, list[TraceRequest], float | None], ...] = ()
    decode: int = 0  # disaggregated min-replicas: the decode replicas given, the prefill ones counted


def find_points(
    args: argparse.Namespace, sweeps: list[tuple[str, list[Any]]], fleet: bool
) -> tuple[list[Point], list[Any]]:
    """Every configuration of a ``--find`` checked and loaded, before any run;
    with ``--find min-cost``, those that do not fit skipped (``min_cost.Skipped``)."""
    from blockspace.simulator import capacity, fleet_size, min_cost
    from blockspace.simulator.sweep import configurations

    workers = args.workers or os.cpu_count() or 1
    manager = resolve_manager(args.manager)
    prepare = preparer(sweeps, manager, workers)
    points, skipped = [], []
    for values in configurations(sweeps):
        run_args = argparse.Namespace(**{**vars(args), **values})
        try:
            config, trace = prepare(run_args)
        except DoesNotFitError as error:
            if args.find != "min-cost":
                raise
            skipped.append(min_cost.Skipped(values, str(error.__cause__ or error)))
            continue
        offered = None if fleet else capacity.base_rate(trace)  # as drawn, where --request-rate names the rate
        draws = []
        for seed in range(args.seed + 1, args.seed + args.seeds):
            drawn = load_requests(argparse.Namespace(**{**vars(run_args), "seed": seed}))
            draws.append((seed, drawn, None if fleet else offered_rate(run_args) or capacity.base_rate(drawn)))
        most, bound = fleet_cap(trace, manager, config, fleet_size.MAX_REPLICAS, workers) if fleet else (0, None)
        points.append(
            Point(
                values,
                config,
                trace,
                offered,
                offered_rate(run_args) or offered,
                most,
                bound,
                tuple(draws),
                run_args.decode_replicas or 0,
            )
        )
    if not points:
        raise InvalidArgumentError(f"--find min-cost: no configuration fits: {skipped[0].why}")
    return points, skipped


def search_ranges(
    args: argparse.Namespace, point: Point, search: Any
) -> tuple[capacity.RateAnswer | fleet_size.ReplicaAnswer, Interrupted | None]:
    """The central answer ``search`` with its ranges: the answers on a clock
    faster and slower by its measured error, and on the other draws of the
    arrivals (``--seeds``), each search starting near the central answer.
    Stopped by Ctrl-C, the central answer is kept whole, with the ranges
    found so far, and the ``Interrupted`` returned."""
    from blockspace.simulator import capacity

    clock = point.config.step_time
    try:
        if not isinstance(clock, Roofline):
            print(f"no clock range: the clock ({clock.describe().split(',')[0]}) has no measured error")
        elif search.value is not None:  # the answer again on a clock faster and slower by its error
            paced = [replace(point.config, step_time=clock.paced(pace)) for pace in (1 - clock.error, 1 + clock.error)]
            ends = [search_once(args, one, point.trace, point.rate, point.most, search.value, None, point.decode)
                    for one in paced]  # fmt: skip
            faster, slower = (end.value for end in ends)
            found = capacity.ClockRange(clock.error, faster, slower, sum(end.runs for end in ends))
            search = replace(search, clock_range=found)
        if point.draws:
            draws = [search_once(args, point.config, drawn, rate, point.most, search.value, None, point.decode)
                     for _, drawn, rate in point.draws]  # fmt: skip
            seeds = (args.seed, *(seed for seed, _, _ in point.draws))
            answers = (search.value, *(draw.value for draw in draws))
            search = replace(search, seed_range=capacity.SeedRange(seeds, answers, sum(draw.runs for draw in draws)))
    except Interrupted as stop:
        return search, stop
    return search, None


def _find(parser: argparse.ArgumentParser, args: argparse.Namespace, given: frozenset[str], command: list[str]) -> int:
    """``--find``, for one configuration or each of a ``--sweep``: everything
    checked, then one search per configuration with its ranges (capacity.py,
    fleet_size.py), priced and compared with ``--find min-cost`` (min_cost.py)."""
    from blockspace import __version__
    from blockspace.simulator import capacity, fleet_size, min_cost
    from blockspace.simulator.executor import use_ray
    from blockspace.simulator.sweep import parse_sweeps

    fleet = args.find != "max-rate"  # min-replicas and min-cost search replica counts
    if args.slo is None:
        raise InvalidArgumentError(f"--find {args.find} needs --slo, the targets it must keep (e.g. ttft=2s)")
    if args.find == "min-cost" and args.gpu_cost is None:
        raise InvalidArgumentError("--find min-cost needs --gpu-cost, the price of a GPU-hour (of each GPU swept)")
    sweeps = parse_sweeps(args.sweep, parser, RANGES, given)
    if fleet and "replicas" in given | {name for name, _ in sweeps}:
        raise InvalidArgumentError(f"--replicas cannot go with --find {args.find}: the search sets it")
    points, skipped = find_points(args, sweeps, fleet)
    check_output_dir(args.out, "--out", capacity.OUTPUTS)
    if args.executor == "ray":  # the last check: it joins the cluster
        use_ray(args.address)
    workers = args.workers or os.cpu_count() or 1
    source = workload_source(args)
    searches: list[capacity.RateAnswer | fleet_size.ReplicaAnswer] = []
    stopped = None  # Ctrl-C's Interrupted, once a search was stopped: its points are kept, the rest not run
    for point in points:
        config, trace = point.config, point.trace
        named = "".join(f", {name}={value}" for name, value in point.values.items())
        under = "" if "router" in point.values else f" under {config.router}"  # a swept router is named once, below
        replicas = (
            f"prefill replicas in front of {point.decode} decode" if point.decode else
            f"decode replicas behind {config.prefill_replicas} prefill" if config.prefill_replicas else "replicas"
        )  # fmt: skip
        goal = f"the fewest {replicas}{under}" if fleet else "the highest rate"
        if args.spare:
            start, end = busiest_window(trace, args.spare_window)
            goal += f", {args.spare} of them down from {start:g} s to {end:g} s (the busiest {args.spare_window:g} s),"
        print(f"finding {goal} at which {args.target:g}% of {len(trace):,} requests from {source} meet "
              f"{args.slo}{named}: {workers} run(s) a round, {args.executor}")  # fmt: skip
        say = None if args.quiet else partial(print, flush=True)
        # the configuration searched, which the command adds to its answer (capacity.Answer)
        searched: dict[str, Any] = {"values": point.values, "config": config, "requests": len(trace),
                                    "workload": describe(trace)}  # fmt: skip
        search: capacity.RateAnswer | fleet_size.ReplicaAnswer
        if point.bound is not None:
            print(point.bound, flush=True)
        try:
            central = search_once(args, config, trace, point.rate, point.most, None, say, point.decode)
            search = (
                replace(central, router=config.router, **searched)
                if isinstance(central, fleet_size.ReplicaAnswer)
                else replace(
                    central,
                    arrival_times=capacity.arrival_times(trace),
                    offered_requests_per_s=point.offered,
                    **searched,
                )
            )
            search, stopped = search_ranges(args, point, search)
        except Interrupted as stop:  # Ctrl-C: the points tried so far, written below marked incomplete
            search = replace(stop.partial, **searched)
            stopped = stop
        except Exception as error:  # a run broke (perhaps the user's manager): a failed search, not a bad option
            if raised_by_ctrl_c(error):
                raise KeyboardInterrupt from error
            return refuse(f"a run of the search failed: {type(error).__name__}: {error}", 1)
        print(fleet_size.format_answer(search, args.slo, config.router) if isinstance(search, fleet_size.ReplicaAnswer)
              else capacity.format_answer(search, args.slo))  # fmt: skip
        searches.append(search)
        if stopped is not None:
            break
    costs = None
    if args.find == "min-cost" and stopped is None:
        costs = min_cost.price(searches, skipped)  # type: ignore[arg-type]  # min-cost searches replica counts
        print(min_cost.format_costs(costs, f"{args.target:g}% of requests within {args.slo}"))
    elif len(searches) > 1 and stopped is None:
        print(capacity.format_answers(searches, "min replicas" if fleet else "max rate"))
    args.out.mkdir(parents=True, exist_ok=True)
    document = {"command": shlex.join(command), "version": __version__, "find": args.find, "trace": source,
                "manager": args.manager, "slo": str(args.slo), "target": args.target / 100,
                "complete": stopped is None, "configurations": [search.to_json() for search in searches]}  # fmt: skip
    if costs is not None:
        document["min_cost"] = asdict(costs)
    write_text(args.out / "capacity.json", json.dumps(document, indent=1))
    print(f"figures: {args.out / 'capacity.json'}")
    if stopped is not None:  # no plot: Ctrl-C asked to stop now
        runs = sum(search.runs for search in searches)
        raise Interrupted(f"{runs:,} finished run(s) kept in {args.out / 'capacity.json'}, marked incomplete")
    if not args.no_plot:
        size = max(len(point.trace) for point in points)
        within = f"within {args.slo} for {args.target:g}% of {size:,} requests of {source}"
        from blockspace.simulator.capacity_plot import plot_costs, plot_curves

        plot_curves(args.out / "capacity.png", searches, f"{'fewest replicas' if fleet else 'max rate'} {within}",
                    "max-rate" if not fleet else "min-replicas")  # fmt: skip
        print(f"plot:    {args.out / 'capacity.png'}")
        if costs is not None:
            plot_costs(args.out / "cost.png", searches, costs, f"cost of each fleet {within}")  # type: ignore[arg-type]
            print(f"plot:    {args.out / 'cost.png'}")
    return 0


def _progress_bar(total: int, label: str, enabled: bool) -> tuple[Any, Callable[[int], None] | None]:
    """A rich progress bar over requests done, when stdout is a terminal."""
    if not enabled or not sys.stdout.isatty():
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    progress = Progress(*columns, console=Console(), transient=True)  # its own console: the shared one keeps state
    task = progress.add_task(label, total=total)
    progress.start()
    return progress, lambda num_done: progress.update(task, completed=num_done)


def _run(trace: list[TraceRequest], manager_class: type, config: SimulationConfig, quiet: bool) -> SimulationResult:
    label = f"{manager_class.__name__} ({config.engine} engine)"
    progress, on_progress = _progress_bar(len(trace) * config.num_samples, label, not quiet)
    try:
        return replay(trace, manager_class, config, on_progress=on_progress)
    finally:
        if progress is not None:
            progress.stop()


@dataclass(frozen=True)
class Plan:
    """A run of ``blockspace simulate`` whose every option, manager, request
    and output path has been checked: what ``execute`` needs and nothing to
    refuse any more."""

    args: argparse.Namespace
    runs: list[tuple[type, SimulationConfig]]  # the manager class and configuration (engine included) of each run
    trace: list[TraceRequest]
    command: list[str]  # the command line, as given


def plan(args: argparse.Namespace, command: list[str], given: frozenset[str] = frozenset()) -> Plan:
    """Check everything a single or compared run needs, writing nothing
    (``InvalidArgumentError`` naming the option for the first bad value)."""
    if args.compare:
        names = [name.strip() for name in args.compare.split(",") if name.strip()]
        if len(names) != 2:
            raise InvalidArgumentError(f"--compare takes two managers, A,B; got {args.compare!r}")
        if "step" in given and all("@" in name for name in names):
            raise InvalidArgumentError("--step: both managers of --compare name their step path (NAME@STEP)")
        runs = [resolve_run(name, args.step, args.engine) for name in names]
    else:
        cls = resolve_manager(args.manager)
        runs = [(cls, args.step, resolve(args.engine, cls, args.step))]
    for cls, step, _ in runs:
        check_step(cls, step, "--step rows")
    config = simulation_config(args, record_tables=len(runs) > 1)
    configs = [
        (cls, replace(config, scheduler=replace(config.scheduler, step=step), engine=engine))
        for cls, step, engine in runs
    ]
    trace = load_requests(args)
    check_output_dir(args.out, "--out", OUTPUTS)
    for cls, run_config in configs:  # a fleet that will not fit in memory is refused now, not killed later
        if run_config.replicas > 1:
            check_fits(trace, cls, run_config)
    return Plan(args, configs, trace, command)


def parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace, frozenset[str]]:
    """The command line parsed, every option in its range and read by its
    mode, the extras it needs there; and the options written on it."""
    parser = build_parser()
    args = parser.parse_args(argv)
    given = given_options(parser, sys.argv[1:] if argv is None else argv)
    check_arguments(args, given)
    check_extras(args)
    return parser, args, given


def prepare(argv: list[str] | None) -> Plan:
    """The checked plan of a single or compared run's command line (the soak
    replays one); ``BlockSpaceError`` for the first bad value."""
    _, args, given = parse(argv)
    if args.sweep:
        raise InvalidArgumentError("--sweep: a sweep is many runs, not one plan (blockspace simulate runs it)")
    return plan(args, command_line(argv), given)


def execute(planned: Plan) -> tuple[int, dict[str, Any]]:
    """Run a plan, print the summary, write the JSON (and the plot); the exit
    status (1: the compared managers decided differently, or a manager failed
    during the run) and the figures written."""
    args, trace, config = planned.args, planned.trace, planned.runs[0][1]
    print(f"replaying {len(trace):,} requests from {workload_source(args)} ({config.num_gpu_blocks:,} GPU blocks, "
          f"{config.num_cpu_blocks:,} CPU blocks, block size {config.scheduler.block_size})")  # fmt: skip
    results = []
    for cls, run_config in planned.runs:
        try:
            results.append(_run(trace, cls, run_config, args.quiet))
        except Exception as error:  # the manager (perhaps the user's) broke: a failed run, not a bad option
            if raised_by_ctrl_c(error):
                raise KeyboardInterrupt from error
            failure = f"the run of {cls.__name__} failed: {type(error).__name__}: {error}"
            return refuse(failure, 1), {"trace": workload_source(args), "error": failure}

    reporting_started = time.perf_counter()
    summaries = [summarize(result, args.slo) for result in results]
    extra: dict[str, Any] = {"trace": workload_source(args), **provenance(planned)}
    status = 0
    for summary in summaries:
        for warning in warnings_for(summary):
            print(f"warning: {summary.manager.rsplit('.', 1)[-1]}: {warning}", file=sys.stderr)
    if len(results) == 1:
        print(format_summary(summaries[0]))
    else:
        print(format_comparison(summaries))
        difference = first_difference(results[0].records, results[1].records)
        extra["identical_decisions"] = difference is None
        if difference is None:
            print(f"  scheduling decisions, block tables, CoW pairs and swap mappings: identical "
                  f"({len(results[0].records):,} steps)")  # fmt: skip
        else:
            print(f"  DECISIONS DIFFER: {difference}")
            extra["first_difference"] = difference
            status = 1

    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "simulation.json"
    write_json(json_path, results, summaries, extra)
    print(f"figures: {json_path}")
    if args.requests_out is not None:
        write_requests(args.requests_out, results, args.slo)
        print(f"requests: {args.requests_out}")
    if not args.no_plot:
        from blockspace.simulator.plot import plot_runs

        png_path = args.out / "simulation.png"
        plot_runs(png_path, results, workload_source(args), args.slo)
        print(f"plot:    {png_path}")
    print(time_split(results, time.perf_counter() - reporting_started))
    return status, {**extra, "runs": [summary.to_json() for summary in summaries]}


def main(argv: list[str] | None = None) -> int:
    """Exit status 0, or 1 when compared runs differ or a run fails; 2 for a
    bad option, said before anything ran or was written."""
    try:
        parser, args, given = parse(argv)
        if args.find:
            return _find(parser, args, given, command_line(argv))
        if args.sweep:
            return _sweep(parser, args, given)
        planned = plan(args, command_line(argv), given)
    except BlockSpaceError as error:
        return refuse(error)
    return execute(planned)[0]


def command_line(argv: list[str] | None) -> list[str]:
    """The command as the user gave it (``blockspace simulate`` and its arguments)."""
    return ["blockspace", "simulate", *(sys.argv[1:] if argv is None else argv)]


def provenance(planned: Plan) -> dict[str, Any]:
    """What a reader of simulation.json needs to run it again: the command
    line, every option's value, the package version, and the trace file
    with its SHA-256 (the bundled sample's too; a synthetic workload has no
    file, its options make it again); and what the requests were
    (``workloads.describe``)."""
    from blockspace import __version__

    args = planned.args
    options = {name: str(value) if isinstance(value, Path | SLO) else value for name, value in vars(args).items()}
    read_from = None
    if args.workload == "trace":
        path = trace_file(args.trace)
        read_from = {
            "path": str(path),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "requests_replayed": len(planned.trace),
        }
    return {
        "command": shlex.join(planned.command),
        "version": __version__,
        "options": options,
        "trace_file": read_from,
        "workload": describe(planned.trace),
    }


def write_requests(path: Path, results: list[SimulationResult], slo: SLO | None) -> None:
    """``--requests-out``: one JSON line per request of each run (the
    schema is in docs/simulator.md), its folders made as needed. Times are
    rounded to the nanosecond, the finest unit of the step-time model
    (``kv_token_read_ns``): a sum of steps carries float noise below it
    (0.3841899999999999 is 0.38419). Written whole (``outputs.replacing``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as partial, open(partial, "w", encoding="utf-8") as out:
        for result in results:
            manager = result.manager_name.rsplit(".", 1)[-1]
            for record in result.metrics.request_records(slo):
                out.write(json.dumps({"manager": manager, **_nanoseconds(record)}) + "\n")


def _nanoseconds(value: Any) -> Any:
    """``value`` with every float in it rounded to 9 decimals."""
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, list):
        return [_nanoseconds(item) for item in value]
    if isinstance(value, dict):
        return {key: _nanoseconds(item) for key, item in value.items()}
    return value


def time_split(results: list[SimulationResult], reporting_s: float) -> str:
    """Where the wall time went: inside the manager, the rest of the run
    (scheduler and model loop), the warm-up, and the reporting."""
    python = [result for result in results if result.config.engine == "python"]
    manager_s = sum(sum(result.metrics.timeline.manager_s) for result in python)
    run_s = sum(result.metrics.wall_s for result in python)
    compiled_s = sum(result.metrics.wall_s for result in results if result.config.engine == "compiled")
    startup_s = sum(result.metrics.startup_s for result in results)
    parts = [f"scheduler and model {run_s - manager_s:.1f} s, manager {manager_s:.1f} s"] if python else []
    parts += [f"compiled step {compiled_s:.1f} s"] if len(python) < len(results) else []
    return f"time split: {', '.join(parts)}, start-up {startup_s:.1f} s, reporting {reporting_s:.1f} s"


if __name__ == "__main__":
    sys.exit(main())
