"""Every option of ``blockspace simulate`` does what it says in every mode,
or is refused there by name (issue #40).

The modes: a single run, ``--compare``, ``--sweep`` (the option given once,
beside a swept key), ``--find max-rate``, and ``swept`` (the option itself
as a ``--sweep`` key, with two values). The options are read off the
parser, and each needs a ``PROBE`` below: the value it is tried with and
how a run shows that value. So a new option without a probe fails
``test_every_option_has_a_probe``, and then every (option, mode) pair is
run: it must either exit 0 with the value visible in what the run wrote
(the configuration each run used, its requests, its files, its output),
or exit 2 with one ``error:`` line naming the option, having written
nothing. ``REFUSED`` lists the pairs that must be refused; every other pair
must be honoured.

The runs are small (a trace of 8 requests, the reference manager, one
worker in this process), so the whole grid takes about a minute.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.dummy import Pool as ThreadPool
from pathlib import Path
from typing import Any

import pytest

import blockspace.simulator.cli as simulate
from blockspace.simulator import executor
from blockspace.simulator.cli import DEFAULT_KV_MEMORY_GIB, DEFAULT_SWAP_SPACE_GIB, ROOFLINE_KNOBS
from blockspace.simulator.gpu import KVCacheModel
from blockspace.simulator.sweep import NOT_SWEPT, sweepable
from blockspace.validation import option_name
from blockspace.workloads import TraceRequest, describe, gamma_arrivals, parse_lines, synthetic
from helpers import trace_lines

TRACE = "trace.jsonl"  # 8 requests, one a second
OTHER_TRACE = "other.jsonl"  # 5 requests
MODES = ("single", "compare", "sweep", "find", "swept")
RAY = importlib.util.find_spec("ray") is not None


# -- what a finished command shows ---------------------------------------------------------
@dataclass
class Run:
    """One run as its outputs show it: the configuration it used, its manager,
    its requests, its SLO and the span from the first arrival to the end."""

    config: dict[str, Any]
    manager: str
    requests: int
    slo: str | None
    span_s: float
    offered: float  # requests a second between the first arrival and the last
    workload: dict[str, Any]  # its requests, as workloads.describe gives them


@dataclass
class View:
    """What a command wrote and printed."""

    out: Path
    stdout: str
    runs: list[Run] = field(default_factory=list)
    document: dict[str, Any] = field(default_factory=dict)  # simulation.json, sweep.json or capacity.json


def run_of(document: dict[str, Any], summary: dict[str, Any]) -> Run:
    slo = summary["slo"]
    return Run(document["config"], summary["manager"], summary["requests"]["arrived"], slo and slo["text"],
               summary["simulated_s"], summary["load"]["offered_requests_per_s"], document["workload"])  # fmt: skip


def view_of(out: Path, stdout: str) -> View:
    """The runs of whichever outputs the command wrote under ``out``."""
    view = View(out, stdout)
    if (out / "capacity.json").exists():
        view.document = json.loads((out / "capacity.json").read_text())
        for search in view.document["configurations"]:
            span = (search["requests"] - 1) / search["trace_rate_requests_per_s"]
            view.runs.append(Run(search["config"], view.document["manager"], search["requests"],
                                 view.document["slo"], span, search["offered_requests_per_s"],
                                 search["workload"]))  # fmt: skip
    elif (out / "sweep.json").exists():
        view.document = json.loads((out / "sweep.json").read_text())
        for k in range(len(view.document["runs"])):
            document = json.loads((out / "sweep" / f"run-{k}.json").read_text())
            view.runs.append(run_of(document, document["runs"][0]))
    elif (out / "simulation.json").exists():
        view.document = json.loads((out / "simulation.json").read_text())
        view.runs = [run_of(view.document, summary) for summary in view.document["runs"]]
    return view


# -- the probes ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """How an option is tried: its values (the first in every mode, both in a
    sweep), the command-line words for a value, and whether a run, or the
    whole view, shows the value. ``run`` checks each run (and is what a
    sweep needs); ``view`` checks the command's outputs as a whole."""

    values: tuple[str, ...]
    words: Callable[[str], list[str]]
    run: Callable[[Run, str], bool] | None = None
    view: Callable[[View, str], bool] | None = None


def flag(option: str) -> Callable[[str], list[str]]:
    return lambda value: [option, value]


def config_at(path: str, convert: Callable[[str], Any]) -> Callable[[Run, str], bool]:
    """The run's configuration holds the value at ``path`` (dots between keys)."""

    def holds(run: Run, value: str) -> bool:
        found: Any = run.config
        for key in path.split("."):
            found = found[key]
        return found == convert(value)

    return holds


def option(path: str, convert: Callable[[str], Any], *values: str) -> Probe:
    """A probe for an option that sets one field of the run's configuration."""
    return Probe(values, flag(option_name(path.rsplit(".", 1)[-1])), run=config_at(path, convert))


def blocks_of(**shape: int) -> Callable[[Run, str], bool]:
    """The run's GPU pool is what the default KV memory holds at that model shape."""

    def holds(run: Run, value: str) -> bool:
        (name,) = shape
        kv = KVCacheModel(**{name: int(value)})
        return run.config["num_gpu_blocks"] == kv.num_blocks(DEFAULT_KV_MEMORY_GIB, 16)

    return holds


def shape(name: str, *values: str) -> Probe:
    return Probe(values, flag(option_name(name)), run=blocks_of(**{name: 0}))


def plotted(view: View, value: str) -> bool:
    """The command drew its plot (one per mode) under --out."""
    return any((view.out / f"{kind}.png").exists() for kind in ("simulation", "sweep", "capacity"))


def arrivals(option: str, at: Callable[[str], tuple[float, float, int]]) -> Probe:
    """A probe for an option of ``--request-rate``'s arrivals: ``at(value)``
    gives (rate, burstiness, seed); the run's offered rate is the one those
    arrivals of the 8-request trace have."""

    def holds(run: Run, value: str) -> bool:
        drawn = [r.arrival_s for r in gamma_arrivals(parse_lines(trace_lines(8).splitlines(), TRACE), *at(value))]
        return run.offered == pytest.approx((len(drawn) - 1) / (drawn[-1] - drawn[0]), rel=1e-12)

    values = {"--request-rate": ("20", "10"), "--burstiness": ("4", "0.5"), "--seed": ("5", "6")}[option]
    return Probe(values, flag(option), run=holds)


SYNTHETIC = 8  # requests of --workload synthetic in the probes (--max-requests)


def offered(requests: list[TraceRequest]) -> float:
    return (len(requests) - 1) / (requests[-1].arrival_s - requests[0].arrival_s)


def made(dest: str, convert: Callable[[str], Any], *values: str, **given: Any) -> Probe:
    """A probe for an option of the synthetic workload: the run replayed the
    requests ``workloads.synthetic`` makes with that value (and ``given``,
    the options WITH puts beside it), as their description and offered
    rate show."""

    def holds(run: Run, value: str) -> bool:
        requests = synthetic(SYNTHETIC, **given, **{dest: convert(value)})
        return run.workload == describe(requests) and run.offered == pytest.approx(offered(requests), rel=1e-12)

    return Probe(values, flag(option_name(dest)), run=holds)


PROBES: dict[str, Probe] = {
    "workload": Probe(("synthetic",), flag("--workload"),
                      view=lambda v, value: all(r.workload == describe(synthetic(SYNTHETIC)) for r in v.runs)),
    "input_len": made("input_len", int, "64", "32"),
    "output_len": made("output_len", int, "16", "8"),
    "input_len_std": made("input_len_std", float, "100", "50"),
    "output_len_std": made("output_len_std", float, "20", "10"),
    "shared_prefix_ratio": made("shared_prefix_ratio", float, "0.5", "1"),
    "prefix_groups": made("prefix_groups", int, "2", "4", shared_prefix_ratio=0.5),
    "turns": made("turns", int, "2", "3"),
    "turn_gap": made("turn_gap", float, "3", "0.5", turns=2),
    "trace": Probe((OTHER_TRACE,), flag("--trace"), view=lambda v, value: {r.requests for r in v.runs} == {5}),
    "max_requests": Probe(("3", "5"), flag("--max-requests"), run=lambda r, value: r.requests == int(value)),
    "time_scale": Probe(("3", "2"), flag("--time-scale"), run=lambda r, value: r.span_s >= 6.99 * float(value)),
    "scale_users": Probe(("2", "3"), flag("--scale-users"), run=lambda r, value: r.requests == 8 * int(value)),
    "fail": Probe(("0@2+3",), flag("--fail"),
                  run=lambda r, value: r.config["failures"] == [{"replica": 0, "start_s": 2.0, "end_s": 5.0}]),
    "spare": Probe(("1",), flag("--spare")),  # --find min-replicas only: tests/test_failures.py
    "spare_window": Probe(("60",), flag("--spare-window")),
    "request_rate": arrivals("--request-rate", lambda value: (float(value), 1.0, 0)),
    "burstiness": arrivals("--burstiness", lambda value: (20.0, float(value), 0)),
    "seed": arrivals("--seed", lambda value: (20.0, 1.0, int(value))),
    "replicas": option("replicas", int, "2", "3"),
    "max_concurrency": option("max_concurrency", int, "4", "2"),
    "router": option("router", str, "least_loaded", "kv_aware"),
    "router_weight": option("router_weight", float, "2", "0.5"),
    "prefill_replicas": option("prefill_replicas", int, "1", "2"),
    "decode_replicas": Probe(("2", "3"), flag("--decode-replicas"), run=lambda r, value: r.config["replicas"]
                             == 1 + int(value)),
    "kv_link_gbps": option("kv_link_gbps", float, "100", "200"),
    "router_lag": Probe(("50", "200"), flag("--router-lag"), run=config_at("router_lag_s", lambda v: float(v) / 1000)),
    "manager": Probe(("fast",), flag("--manager"), view=lambda v, value: all(
        r.manager.endswith("FastBlockSpaceManager") or r.manager == "fast" for r in v.runs)),
    "compare": Probe(("reference@calls,reference",), flag("--compare"),
                     view=lambda v, value: len(v.runs) == 2 and "identical" in v.stdout),
    "step": option("scheduler.step", str, "calls", "auto"),
    "engine": option("engine", str, "python", "compiled"),  # tried with fast's manager (argv_for): both run
    "block_size": option("scheduler.block_size", int, "32", "64"),
    "num_gpu_blocks": option("num_gpu_blocks", int, "300", "400"),
    "kv_memory_gib": Probe(("0.5", "1"), flag("--kv-memory-gib"), run=lambda r, value: r.config["num_gpu_blocks"]
                           == KVCacheModel().num_blocks(float(value), 16)),
    "num_cpu_blocks": option("num_cpu_blocks", int, "7", "9"),
    "swap_space_gib": Probe(("0.25", "0.5"), flag("--swap-space-gib"), run=lambda r, value: r.config["num_cpu_blocks"]
                            == KVCacheModel().num_blocks(float(value), 16)),
    "watermark": option("watermark", float, "0.05", "0.1"),
    "enable_prefix_caching": Probe(("off", "on"), lambda value: [f"--{'no-' * (value == 'off')}enable-prefix-caching"],
                                   run=config_at("scheduler.enable_prefix_caching", lambda value: value == "on")),
    "num_layers": shape("num_layers", "16", "8"),
    "num_kv_heads": shape("num_kv_heads", "4", "2"),
    "head_dim": shape("head_dim", "64", "32"),
    "dtype_bytes": shape("dtype_bytes", "1", "4"),
    "max_num_seqs": option("scheduler.max_num_seqs", int, "3", "5"),
    "max_num_batched_tokens": option("scheduler.max_num_batched_tokens", int, "4096", "1024"),
    "preemption_mode": option("scheduler.preemption_mode", str, "swap", "recompute"),
    "n": Probe(("2", "3"), flag("--n"), run=config_at("num_samples", int)),
    "max_output_len": option("max_output_len", int, "3", "2"),
    "step_model": Probe(("model_a.json", "model_b.json"), flag("--step-model"), run=lambda r, value: r.config[
        "step_time"]["step_overhead_ms"] == {"model_a.json": 7.5, "model_b.json": 9.5}[value]),
    "step_overhead_ms": option("step_time.step_overhead_ms", float, "5.5", "6.5"),
    "prefill_token_us": option("step_time.prefill_token_us", float, "55", "65"),
    "decode_seq_us": option("step_time.decode_seq_us", float, "15", "25"),
    "kv_token_read_ns": option("step_time.kv_token_read_ns", float, "35", "45"),
    "swap_block_us": option("step_time.swap_block_us", float, "55", "65"),
    "gpu": Probe(("H100-SXM", "H200"), flag("--gpu"), run=config_at("step_time.gpu.name", str)),
    "model": Probe(("llama-3.1-8b", "qwen2.5-7b"), flag("--model"), run=config_at("step_time.model.name", str)),
    "dtype": option("step_time.dtype", str, "fp8", "bf16"),
    "kv_dtype": option("step_time.kv_dtype", str, "fp8", "bf16"),
    "tensor_parallel": option("step_time.tensor_parallel", int, "2", "4"),
    "compute_efficiency": option("step_time.compute_efficiency", float, "0.4", "0.6"),
    "bandwidth_efficiency": option("step_time.bandwidth_efficiency", float, "0.7", "0.9"),
    "host_overhead_ms": option("step_time.host_overhead_ms", float, "2", "4"),
    "gpu_cost": Probe(("3", "4"), flag("--gpu-cost"), run=config_at("gpu_cost_per_hour", float)),
    "out": Probe(("elsewhere",), flag("--out"), view=lambda v, value: v.out.name == value and bool(v.runs)
                 and not (v.out.parent / "out").exists()),
    "slo": Probe(("ttft=5s",), flag("--slo"), view=lambda v, value: all(r.slo == value for r in v.runs)),
    "requests_out": Probe(("r.jsonl",), flag("--requests-out"), view=lambda v, value: len(
        (v.out.parent / value).read_text().splitlines()) == sum(r.requests for r in v.runs)),
    "no_plot": Probe(("on",), lambda value: [], view=plotted),  # tried by leaving it out: a plot is drawn
    "quiet": Probe(("on",), lambda value: [], view=lambda v, value: "[1/2]" in v.stdout or "tried" in v.stdout
                   or "\x1b[" in v.stdout),  # tried by leaving it out: progress is shown
    "find": Probe(("max-rate",), lambda value: ["--find", value, "--slo", "e2e=1000s"],
                  view=lambda v, value: (v.out / "capacity.json").exists() and len(v.runs) >= 1),
    "target": Probe(("50",), flag("--target"), view=lambda v, value: v.document["target"] == 0.5),
    "seeds": Probe(("2",), flag("--seeds"), view=lambda v, value: [c["seed_range"]["seeds"] for c in v.document[
        "configurations"]] == [[0, 1]]),
    "sweep": Probe(("n=1,2",), flag("--sweep"),
                   view=lambda v, value: [r.config["num_samples"] for r in v.runs] == [1, 2]),
    "workers": Probe(("2",), flag("--workers"), view=lambda v, value: POOLS == [2] * len(POOLS) and bool(POOLS)),
    "executor": Probe(("ray",), flag("--executor"), view=lambda v, value: bool(v.runs) and RAY),
    "address": Probe(("local",), flag("--address"), view=lambda v, value: bool(v.runs) and RAY
                     and os.environ.get("RAY_ADDRESS") == value),
}  # fmt: skip

# The options an option goes with (validation's NEEDS), given beside it in every mode. The
# synthetic workload's replaces the trace (argv_for), with a few requests.
SYNTHETIC_RUN = {"workload": ["--workload", "synthetic"], "max_requests": ["--max-requests", str(SYNTHETIC)]}
WITH: dict[str, dict[str, list[str]]] = {
    "burstiness": {"request_rate": ["--request-rate", "20"]},
    "seed": {"request_rate": ["--request-rate", "20"]},
    "seeds": {"request_rate": ["--request-rate", "20"]},
    "address": {"executor": ["--executor", "ray"]},
    "router": {"replicas": ["--replicas", "2"]},
    "router_weight": {"replicas": ["--replicas", "2"], "router": ["--router", "kv_aware"]},
    "prefill_replicas": {"replicas": ["--replicas", "3"]},
    "decode_replicas": {"prefill_replicas": ["--prefill-replicas", "1"]},
    "kv_link_gbps": {"replicas": ["--replicas", "2"], "prefill_replicas": ["--prefill-replicas", "1"]},
    "router_lag": {"replicas": ["--replicas", "2"], "router": ["--router", "kv_aware"]},
    "workload": {"max_requests": SYNTHETIC_RUN["max_requests"]},
    **{
        name: SYNTHETIC_RUN
        for name in ("input_len", "output_len", "input_len_std", "output_len_std", "shared_prefix_ratio", "turns")
    },
    "prefix_groups": {**SYNTHETIC_RUN, "shared_prefix_ratio": ["--shared-prefix-ratio", "0.5"]},
    "turn_gap": {**SYNTHETIC_RUN, "turns": ["--turns", "2"]},
    # the roofline's knobs go with --gpu (or --model)
    **{name: {"gpu": ["--gpu", "H100-SXM"]} for name in ROOFLINE_KNOBS},
}

# The (option, mode) pairs that must be refused by name; every other pair must be honoured.
REFUSED = {
    ("manager", "compare"),  # --compare names both managers
    *((name, "compare") for name in ("find", "sweep", "target", "workers", "executor")),
    *((name, mode) for name in ("compare", "requests_out") for mode in ("sweep", "find")),
    *((name, mode) for name in ("target", "seeds") for mode in ("single", "sweep")),
    ("seeds", "compare"),
    *((name, "single") for name in ("workers", "executor")),
    *(((name, mode) for name in ("executor", "address") for mode in ("sweep", "find")) if not RAY else ()),
    ("address", "single"),
    ("address", "compare"),  # --address goes with --executor ray
    *((name, "swept") for name in NOT_SWEPT),
    ("max_concurrency", "find"),  # a closed loop: the rate --find max-rate scales has no effect (issue #51)
    *((name, mode) for name in ("spare", "spare_window") for mode in MODES),  # --find min-replicas only
}

# Each mode's command line, by the option each part belongs to; a probe replaces its option's part.
BASE: dict[str, dict[str, list[str]]] = {
    "single": {"trace": ["--trace", TRACE], "manager": ["--manager", "reference"]},
    "compare": {"trace": ["--trace", TRACE], "compare": ["--compare", "reference,reference@calls"]},
    "sweep": {"trace": ["--trace", TRACE], "manager": ["--manager", "reference"], "workers": ["--workers", "1"],
              "sweep": ["--sweep", "max_num_seqs=7,9"]},
    "find": {"trace": ["--trace", TRACE], "manager": ["--manager", "reference"], "workers": ["--workers", "1"],
             "find": ["--find", "max-rate"], "slo": ["--slo", "e2e=1000s"]},
}  # fmt: skip
for base in BASE.values():
    base.update({"no_plot": ["--no-plot"], "quiet": ["--quiet"], "out": ["--out", "out"]})
BASE["swept"] = BASE["sweep"]
POOLS: list[int] = []  # the number of workers of each pool the runs asked for


def argv_for(dest: str, mode: str) -> list[str]:
    """The mode's command line with the option's probe in it (swept: as the sweep)."""
    probe = PROBES[dest]
    parts = {**BASE[mode], **WITH.get(dest, {})}  # with the options it goes with
    if dest == "workload" or "workload" in parts:  # the synthetic workload reads no trace
        parts.pop("trace")
    if mode == "swept":
        parts["sweep"] = ["--sweep", f"{dest}={','.join(probe.values)}"]
        if dest == "engine":
            parts["manager"] = ["--manager", "fast"]
    else:
        parts.pop(dest, None)
        if dest == "compare":  # names both managers: --manager goes
            parts.pop("manager", None)
        if dest == "engine" and "manager" in parts:  # the compiled engine runs fast's manager only
            parts["manager"] = ["--manager", "fast"]
        if mode == "sweep" and dest == "max_num_seqs":  # given once beside a sweep of another key
            parts["sweep"] = ["--sweep", "watermark=0.01,0.02"]
        parts[dest] = probe.words(probe.values[0])
    return [word for words in parts.values() for word in words]


def options() -> dict[str, Any]:
    return {a.dest: a for a in simulate.build_parser()._actions if a.option_strings and a.dest != "help"}


def pairs() -> list[Any]:
    return [pytest.param(dest, mode, id=f"{dest}:{mode}") for dest in options() for mode in MODES]


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A folder with the traces and step models the probes name, a pool that
    runs its workers as threads of this process (and records how many it
    was asked for), and a standard output that says it is a terminal when
    the probe is --quiet's (a progress bar shows only on one)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BLOCKSPACE_TRACE", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "")  # --address sets it: recorded as it was, put back after each probe
    monkeypatch.delenv("RAY_ADDRESS")
    (tmp_path / TRACE).write_text(trace_lines(8))
    (tmp_path / OTHER_TRACE).write_text(trace_lines(5))
    for name, overhead in (("model_a.json", 7.5), ("model_b.json", 9.5)):
        coefficients = {"step_overhead_ms": overhead, "prefill_token_us": 40.0, "decode_seq_us": 10.0,
                        "kv_token_read_ns": 30.0, "swap_block_us": 40.0}  # fmt: skip
        (tmp_path / name).write_text(json.dumps({"version": 1, **coefficients}))
    POOLS.clear()

    def pool(kind: str, workers: int) -> Any:
        POOLS.append(workers)
        return ThreadPool(workers)

    monkeypatch.setattr(executor, "_pool", pool)
    return tmp_path


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def files(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def test_every_option_has_a_probe_and_every_sweepable_one_a_run_check():
    assert set(options()) == set(PROBES), set(options()) ^ set(PROBES)
    for dest in sweepable(simulate.build_parser()):
        assert PROBES[dest].run is not None and len(PROBES[dest].values) >= 2, dest
    assert {dest for dest, mode in REFUSED} <= set(options())


@pytest.mark.parametrize(("dest", "mode"), pairs())
def test_an_option_is_honoured_or_refused_by_name(workspace, monkeypatch, capsys, dest, mode):
    argv = argv_for(dest, mode)
    if dest == "quiet" and mode in ("single", "compare"):
        monkeypatch.setattr(sys, "stdout", Terminal())
    before = files(workspace)
    status = simulate.main(argv)
    captured = capsys.readouterr()
    stdout = sys.stdout.getvalue() if isinstance(sys.stdout, Terminal) else captured.out
    if (dest, mode) in REFUSED:
        assert status == 2, (argv, stdout[-2000:], captured.err)
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
        assert option_name(dest) in captured.err or f"{dest} " in captured.err, captured.err
        assert files(workspace) == before, "a refused command wrote something"
        return
    assert status == 0, (argv, captured.err)
    out = workspace / next((argv[i + 1] for i, word in enumerate(argv) if word == "--out"), "out")
    view = view_of(out, stdout)
    assert view.runs, f"{argv}: no run found under {out}"
    probe = PROBES[dest]
    if mode == "swept":
        assert probe.run is not None
        assert len(view.runs) == len(probe.values), (argv, len(view.runs))
        for run, value in zip(view.runs, probe.values):
            assert probe.run(run, value), (argv, value, run)
    elif probe.run is not None:
        for run in view.runs:
            assert probe.run(run, probe.values[0]), (argv, run)
    else:
        assert probe.view is not None and probe.view(view, probe.values[0]), (argv, view.runs, stdout[-1000:])


def test_the_swap_space_default_is_what_the_probes_assume():
    """The probes read pool sizes off the defaults: guard them."""
    assert (DEFAULT_KV_MEMORY_GIB, DEFAULT_SWAP_SPACE_GIB) == (96.0, 4.0)


@pytest.mark.parametrize(
    ("find", "slo", "answer"),
    [("max-rate", "e2e=1000s", "max_rate_requests_per_s"), ("min-replicas", "ttft=1us", "min_replicas")],
)
def test_a_search_whose_variable_has_no_effect_says_so_and_names_no_bound(workspace, capsys, find, slo, answer):
    """The grid's search (8 requests) where its variable changes nothing:
    every rate meets e2e=1000s, and no replica count meets a TTFT of 1 us.
    Each says so and names no bound (issue #51: a closed loop's search named
    24,580 req/s with exit 0)."""
    argv = [*BASE["find"]["trace"], "--manager", "reference", "--workers", "1", "--num-gpu-blocks", "64"]
    assert simulate.main([*argv, "--find", find, "--slo", slo, "--no-plot", "--quiet", "--out", "out"]) == 0
    stdout = capsys.readouterr().out
    (search,) = json.loads((workspace / "out" / "capacity.json").read_text())["configurations"]
    assert search["no_effect"] and search[answer] is None and search["runs"] >= 2
    assert f"{find.replace('-', ' ')}: no bound: " in stdout and "so it has no effect here" in stdout
