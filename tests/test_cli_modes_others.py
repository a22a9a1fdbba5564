"""Every option of ``blockspace soak``, ``bench``, ``gpu-bench``,
``gpu-profile`` and ``conformance`` does what it says in every mode of its
command, or is refused there by name (issue #40), as
tests/test_cli_modes.py holds for ``blockspace simulate``.

A command's modes are the ways it runs: the soak's parts (its random
operations alone, its trace replay alone, both); bench, gpu-bench and
gpu-profile run one way each (gpu-bench's run is the GPU's or, without one,
the CPU-only one, whichever this machine has); conformance's are its four
profiles, each with a few cheap checks, and the quick profile with a scope
for the explorer beside them. The options are read off
each parser, and each needs a ``Probe``: the words it is tried with and
what the run must show for them. So an option added without a probe fails
``test_every_option_has_a_probe``, and then every (option, mode) pair runs:
it must either exit as its probe says with the value visible in what the
command wrote (its JSON, its files, its output), or exit 2 with one
``error:`` line naming the option, having written nothing. A command's
``refused`` lists the pairs that must be refused; every other pair must be
honoured.

The soak runs for real (100 operations and an 8-request trace, well under
a second each). So does gpu-bench, on a tiny batch with its copy
configurations cut to the CPU-only one (so that a GPU machine runs it as
fast). bench's parts take seconds to minutes, so its four parts are
stand-ins here that record what they were asked for: what is probed is
what the command hands them and writes. gpu-profile times stand-in steps
(its model is still built, its swap still timed), so that the fit, and
with it what --max-fit-error and --attempts decide, does not depend on the
load of the machine. conformance runs for real, on checks of a second or
less each (a state machine of 2 examples, a sweep, a scope cut at depth 2),
and a manager that disagrees at once (``NeverAdmits``) shows the options
that only a failure shows.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import blockspace.bench.cli as bench
import blockspace.bench.gpu as gpu_bench
import blockspace.conformance.cli as conformance
import blockspace.conformance.symbolic as symbolic
import blockspace.kit_options as kit_options
import blockspace.profile.cli as gpu_profile
import blockspace.soak.cli as soak
import blockspace.soak.options as soak_options
from blockspace.bench.report import REPORT_MARKER as MARKER
from blockspace.conformance.check import CheckResult
from blockspace.conformance.runner import PROFILES, checks_for, with_changes
from blockspace.conformance.scope import SCOPES, scope_from
from blockspace.errors import InvalidArgumentError
from blockspace.interfaces import load_manager_class
from blockspace.validation import check_mode_options, option_name
from helpers import trace_lines

RAY = importlib.util.find_spec("ray") is not None

TRACE = "trace.jsonl"  # 8 requests, one a second
OTHER_TRACE = "other.jsonl"  # 5 requests


# -- what a finished command shows ---------------------------------------------------------
@dataclass
class Outcome:
    """A command's run: its exit status, what it printed and the folder it ran in."""

    argv: list[str]
    status: int
    out: str
    err: str
    folder: Path
    seen: dict[str, Any] = field(default_factory=dict)  # what the stand-ins were asked for

    def named(self, option: str, default: str) -> Path:
        """The path ``option`` names on the command line (``default`` when it is not there)."""
        words = self.argv
        return self.folder / next((words[i + 1] for i, word in enumerate(words[:-1]) if word == option), default)

    def json(self, option: str, default: str) -> dict[str, Any]:
        return json.loads(self.named(option, default).read_text())


@dataclass(frozen=True)
class Probe:
    """How an option is tried: its words on the command line, what the run
    must show for them, and the exit status that goes with it."""

    words: list[str]
    shows: Callable[[Outcome], bool]
    status: int = 0


@dataclass(frozen=True)
class Command:
    """A command's probes, the command line of each of its modes (by the
    option each part belongs to: a probe replaces its option's part), and
    the (option, mode) pairs that must be refused."""

    main: Callable[[list[str]], int]
    parser: Callable[[], argparse.ArgumentParser]
    modes: dict[str, dict[str, list[str]]]
    probes: dict[str, Probe]
    refused: set[tuple[str, str]]


def options(command: Command) -> list[str]:
    return [a.dest for a in command.parser()._actions if a.option_strings and a.dest != "help"]


def argv_for(command: Command, dest: str, mode: str) -> list[str]:
    parts = {**command.modes[mode], dest: command.probes[dest].words}
    return [word for words in parts.values() for word in words]


# -- blockspace soak -----------------------------------------------------------------------
def soak_ops(outcome: Outcome) -> dict[str, Any]:
    return outcome.json("--json", "s.json")["ops"]


def soak_replay(outcome: Outcome) -> dict[str, Any]:
    return outcome.json("--json", "s.json")["trace"]["figures"]


OPS = {"ops": ["--ops", "100"], "impl": ["--impl", "reference"]}
REPLAY = {"trace": ["--trace", TRACE], "compare": ["--compare", "reference,reference@calls"]}
SOAK = Command(
    soak.main,
    soak_options.build_parser,
    modes={
        "ops": {**OPS, "json": ["--json", "s.json"]},
        "trace": {"ops": ["--ops", "0"], **REPLAY, "json": ["--json", "s.json"]},
        "both": {**OPS, **REPLAY, "json": ["--json", "s.json"]},
    },
    probes={
        "impl": Probe(["--impl", "fast"], lambda o: soak_ops(o)["implementation"].endswith("FastBlockSpaceManager")),
        "ops": Probe(["--ops", "20000"], lambda o: soak_ops(o)["num_ops"] >= 20000),  # 100 stop after ~14,000
        "check_every": Probe(
            ["--check-every", "7"],  # else a check a walk, and one every 10,000 calls
            lambda o: soak_ops(o)["invariant_checks"] >= soak_ops(o)["num_ops"] // 7,
        ),
        "trace": Probe(["--trace", OTHER_TRACE], lambda o: soak_replay(o)["trace_file"]["requests_replayed"] == 5),
        "compare": Probe(
            ["--compare", "reference@calls,reference"],
            lambda o: (
                soak_replay(o)["identical_decisions"]
                and soak_replay(o)["options"]["compare"] == "reference@calls,reference"
            ),
        ),
        "out": Probe(
            ["--out", "elsewhere"],
            lambda o: (o.folder / "elsewhere" / "simulation.json").exists() and not (o.folder / "out").exists(),
        ),
        "json": Probe(["--json", "r.json"], lambda o: o.json("--json", "")["passed"] is True),
    },
    refused={
        ("impl", "trace"),  # --ops 0: no operations, no manager of theirs
        ("check_every", "trace"),
        ("compare", "ops"),  # no --trace: no replay, no managers or folder of its
        ("out", "ops"),
    },
)


# -- blockspace bench ----------------------------------------------------------------------
PART = {
    "startup": {name: dict.fromkeys(("import_s", "import_and_first_call_s", "import_and_first_request_s"), 0.5)
                for name in ("cold", "warm")},
    "methods": {"allocate": {"reference": 2.0, "fast": 1.0}},
    "replay": {"requests": 30, "max_output": 32, "clock_overhead_us": 0.1,
               **{name: {"calls": 10, "seconds": 1.0, "ops_per_s": 10.0, "manager_seconds": 0.5,
                         "manager_us_per_call": 50.0} for name in ("reference", "fast", "floor")}},
    "batched": [{"num_seqs": 256, **{key: dict.fromkeys(("reference_ms", "fast_ms", "ratio", "array_ms",
                                                         "array_ratio"), 1.0)
                                     for key in ("manager_only", "with_tensors")}}],
}  # fmt: skip
MACHINE = {"nproc": 2, "cpu": "a CPU", "python": "3", "numpy": "2", "numba": "0", "load_average": [0.0] * 3}


def parts_asked(outcome: Outcome) -> set[bool]:
    return set(outcome.seen["quick"].values())


BENCH = Command(
    bench.main,
    bench.build_parser,
    modes={"run": {"json": ["--json", "b.json"]}},
    probes={
        "quick": Probe(
            ["--quick"],
            lambda o: (
                parts_asked(o) == {True}
                and len(o.seen["quick"]) == len(PART)
                and o.json("--json", "b.json")["quick"] is True
                and "`blockspace bench --quick`" in o.out
            ),
        ),
        "json": Probe(
            ["--json", "figures.json"],
            lambda o: {k: o.json("--json", "")[k] for k in PART} == PART and parts_asked(o) == {False},
        ),
        "markdown": Probe(
            ["--markdown", "report.md"],
            lambda o: o.named("--markdown", "").read_text() == f"kept\n{MARKER}\n\n" + o.out[:-1],
        ),  # the print ends with a newline of its own
    },
    refused=set(),
)


# -- blockspace gpu-bench ------------------------------------------------------------------
def tables(outcome: Outcome) -> dict[str, Any]:
    figures = outcome.json("--json", "g.json")
    return figures["tables"] if figures["tables"]["slots_equal"] and figures["tables"]["table_equal"] else {}


def skipped(outcome: Outcome) -> list[bool]:
    """Whether each copy configuration was skipped for the time budget."""
    return ["skipped" in row for row in outcome.json("--json", "g.json")["copies"]]


GPU_BENCH = Command(
    gpu_bench.main,
    gpu_bench.build_parser,
    modes={
        "run": {
            "seqs": ["--seqs", "16"],
            "steps": ["--steps", "5"],
            "budget_s": ["--budget-s", "0"],
            "json": ["--json", "g.json"],
        }
    },
    probes={
        "json": Probe(
            ["--json", "other.json"], lambda o: "tables" in o.json("--json", "") and not (o.folder / "g.json").exists()
        ),
        "seqs": Probe(["--seqs", "12"], lambda o: tables(o).get("num_seqs") == 12),
        "steps": Probe(["--steps", "4"], lambda o: tables(o).get("num_steps") == 4),
        "block_size": Probe(["--block-size", "8"], lambda o: tables(o).get("block_size") == 8),
        "budget_s": Probe(["--budget-s", "600"], lambda o: skipped(o) == [False]),  # 0 skips every copy config
    },
    refused=set(),
)


# -- blockspace gpu-profile ----------------------------------------------------------------
def model(outcome: Outcome) -> dict[str, Any]:
    return outcome.json("--out", "m.json")["model"]


def points(outcome: Outcome, key: str) -> int:
    return max(point[key] for point in outcome.json("--out", "m.json")["fit"]["points"])


def built(outcome: Outcome, what: str) -> set[Any]:
    """What the stacks that were timed had (see ``stand_in_steps``)."""
    return {stack[what] for stack in outcome.seen["stacks"]}


def not_written(outcome: Outcome) -> bool:
    return not outcome.named("--out", "m.json").exists()


CUDA = gpu_bench.torch.cuda.is_available()
GPU_PROFILE = Command(
    gpu_profile.main,
    gpu_profile.build_parser,
    modes={
        "run": {
            "device": ["--device", "cpu"],
            "out": ["--out", "m.json"],
            "num_layers": ["--num-layers", "4"],
            "layers_to_time": ["--layers-to-time", "2"],
            "hidden_size": ["--hidden-size", "64"],
            "num_heads": ["--num-heads", "4"],
            "num_kv_heads": ["--num-kv-heads", "2"],
            "intermediate_size": ["--intermediate-size", "128"],
            "dtype": ["--dtype", "float32"],
            "max_prefill_tokens": ["--max-prefill-tokens", "32"],
            "max_batch": ["--max-batch", "4"],
            "max_context": ["--max-context", "32"],
            "repeats": ["--repeats", "2"],
            "warmup": ["--warmup", "1"],
        }
    },
    probes={
        "out": Probe(
            ["--out", "sub/other.json"], lambda o: "fit" in o.json("--out", "") and not (o.folder / "m.json").exists()
        ),
        "device": Probe(["--device", "cuda"], lambda o: "--device cpu" not in o.json("--out", "m.json")["source"]),
        "num_layers": Probe(["--num-layers", "6"], lambda o: model(o)["num_layers"] == 6),
        "layers_to_time": Probe(
            ["--layers-to-time", "3"], lambda o: model(o)["layers_timed"] == 3 and built(o, "layers") == {3}
        ),
        "hidden_size": Probe(
            ["--hidden-size", "128"], lambda o: model(o)["hidden_size"] == 128 and built(o, "hidden") == {128}
        ),
        "num_heads": Probe(
            ["--num-heads", "8"],
            lambda o: (
                model(o)["num_heads"] == 8 and model(o)["head_dim"] == 8 and built(o, "qkv_width") == {(8 + 2 * 2) * 8}
            ),
        ),
        "num_kv_heads": Probe(
            ["--num-kv-heads", "4"],
            lambda o: model(o)["num_kv_heads"] == 4 and built(o, "qkv_width") == {(4 + 2 * 4) * 16},
        ),
        "intermediate_size": Probe(
            ["--intermediate-size", "256"],
            lambda o: model(o)["intermediate_size"] == 256 and built(o, "gate_up_width") == {512},
        ),
        "dtype": Probe(
            ["--dtype", "bfloat16"],
            lambda o: model(o)["dtype"] == "bfloat16" and built(o, "dtype") == {"torch.bfloat16"},
        ),
        "block_size": Probe(
            ["--block-size", "32"],
            lambda o: model(o)["block_size"] == 32 and model(o)["block_bytes"] == 32 * 2 * 4 * 2 * 16 * 4,
        ),
        "max_prefill_tokens": Probe(["--max-prefill-tokens", "64"], lambda o: points(o, "prefill_tokens") == 64),
        "max_batch": Probe(["--max-batch", "8"], lambda o: points(o, "decode_seqs") == 8),
        "max_context": Probe(["--max-context", "64"], lambda o: points(o, "context") == 64),
        "repeats": Probe(
            ["--repeats", "3"],
            lambda o: o.seen["timed"] == {(1, 3)} and o.json("--out", "m.json")["fit"]["repeats"] == 3,
        ),
        "warmup": Probe(
            ["--warmup", "2"], lambda o: o.seen["timed"] == {(2, 2)} and o.json("--out", "m.json")["fit"]["warmup"] == 2
        ),
        # The stand-in steps fit to within 14%: a bound of 10% refuses the fit (exit 1, no file).
        "max_fit_error": Probe(
            ["--max-fit-error", "0.1"],
            lambda o: "over --max-fit-error 0.1," in o.err and o.seen["passes"] == 3 and not_written(o),
            status=1,
        ),
        "attempts": Probe(
            ["--attempts", "2", "--max-fit-error", "0.1"],
            lambda o: o.seen["passes"] == 2 and "with every step timed 2 times" in o.err and not_written(o),
            status=1,
        ),
    },
    refused=set() if CUDA else {("device", "run")},  # no CUDA GPU here: --device cuda is refused by name
)


# -- blockspace conformance ----------------------------------------------------------------
WRONG = "wrong_manager:NeverAdmits"  # written into the folder by the workspace fixture
WRONG_MANAGER = """\
from blockspace import AllocStatus
from blockspace.reference import ReferenceBlockSpaceManager


class NeverAdmits(ReferenceBlockSpaceManager):
    def can_allocate(self, seq_group, num_lookahead_slots=0):
        return AllocStatus.LATER  # the reference says OK to the first request of every check
"""


def report(outcome: Outcome) -> dict[str, Any]:
    return outcome.json("--json", "c.json")


def statuses(outcome: Outcome) -> dict[str, str]:
    return {check["name"]: check["status"] for check in report(outcome)["checks"]}


def explorers(outcome: Outcome) -> list[dict[str, Any]]:
    return [check for check in report(outcome)["checks"] if check["name"].startswith("explore[")]


def all_failed(outcome: Outcome) -> bool:
    """Every check ran and failed (``NeverAdmits`` is wrong from its first request)."""
    return bool(statuses(outcome)) and set(statuses(outcome).values()) == {"failed"}


def machines_ran(outcome: Outcome, test: Callable[[dict[str, Any]], bool]) -> bool:
    machines = [check for check in report(outcome)["checks"] if check["name"].startswith("machine[")]
    return bool(machines) and all(test(check) for check in machines)


SAMPLED = {"examples": ["--examples", "2"], "shrink_budget": ["--shrink-budget", "0.5"], "json": ["--json", "c.json"]}
CONFORMANCE = Command(
    conformance.main,
    kit_options.build_parser,
    modes={
        "quick": {
            "impl": ["--impl", "fast"],
            "profile": ["--profile", "quick"],
            "only": ["--only", "machine[plain]", "--only", "sweep[salts]"],
            **SAMPLED,
        },
        "quick+scope": {
            "impl": ["--impl", "fast"],
            "profile": ["--profile", "quick"],
            "only": ["--only", "sweep[salts]", "--only", "explore"],
            "scope": ["--scope", "plain"],
            "scope_set": ["--scope-set", "max_depth=2"],
            "json": ["--json", "c.json"],
        },
        "full": {
            "impl": ["--impl", "fast"],
            "profile": ["--profile", "full"],
            "only": ["--only", "machine[plain]", "--only", "sweep[salts]"],
            **SAMPLED,
        },
        "symbolic": {
            "impl": ["--impl", "fast"],
            "profile": ["--profile", "symbolic"],
            "only": ["--only", "machine[plain]"],
            **SAMPLED,
        },
        "exhaustive": {
            "impl": ["--impl", "fast"],
            "profile": ["--profile", "exhaustive"],
            "only": ["--only", "explore"],
            "scope_set": ["--scope-set", "max_depth=2"],
            "json": ["--json", "c.json"],
        },
    },  # fmt: skip
    probes={
        "impl": Probe(["--impl", WRONG], lambda o: report(o)["impl"] == WRONG and all_failed(o), status=1),
        "against": Probe(["--against", WRONG], lambda o: report(o)["against"] == WRONG and all_failed(o), status=1),
        "profile": Probe(
            ["--profile", "full"],
            lambda o: report(o)["profile"] == "full" and report(o)["settings"]["step_count"] == 80,
        ),
        "json": Probe(
            ["--json", "sub/other.json"],
            lambda o: bool(o.json("--json", "")["checks"]) and not (o.folder / "c.json").exists(),
        ),
        "only": Probe(
            ["--only", "plain"],
            lambda o: bool(statuses(o)) and all("plain" in name for name in statuses(o)) and report(o)["passed"],
        ),
        "examples": Probe(
            ["--examples", "3"],
            lambda o: (
                report(o)["settings"]["max_examples"] == 3
                and machines_ran(o, lambda check: 3 <= check["examples"] < 25)  # Hypothesis may add a few
            ),
        ),
        "shrink_budget": Probe(
            ["--shrink-budget", "0.25", "--impl", WRONG],
            lambda o: machines_ran(o, lambda check: check["shrink_budget_s"] == 0.25),
            status=1,
        ),
        "fail_fast": Probe(
            ["--fail-fast", "--impl", WRONG],
            lambda o: len(statuses(o)) == 1 and "--fail-fast: stopping after" in o.out and all_failed(o),
            status=1,
        ),
        "without": Probe(
            ["--without", "caching"],
            lambda o: (
                report(o)["capabilities"]["supports_caching"] is False
                and statuses(o).get("sweep[salts]", "skipped") == "skipped"
                and {"skipped", "passed"} <= set(statuses(o).values())
            ),
        ),
        "scope": Probe(["--scope", "swap"], lambda o: [c["scope"] for c in explorers(o)] == ["swap"]),
        "scope_set": Probe(
            ["--scope-set", "max_depth=1"], lambda o: bool(explorers(o)) and all(c["depth"] == 1 for c in explorers(o))
        ),
        "workers": Probe(
            ["--workers", "3"], lambda o: bool(explorers(o)) and all(c["workers"] == 3 for c in explorers(o))
        ),
        "executor": Probe(
            ["--executor", "ray"], lambda o: bool(explorers(o)) and all(c["executor"] == "ray" for c in explorers(o))
        ),
        "address": Probe(
            ["--executor", "ray", "--address", "local"],  # local: Ray's word for a cluster of this machine's own
            lambda o: os.environ.get("RAY_ADDRESS") == "local" and all(c["executor"] == "ray" for c in explorers(o)),
        ),
        "budget": Probe(
            ["--budget", "0.001"],  # spent while the first scope starts: it is cut at once, the others not begun
            lambda o: (
                report(o)["settings"]["budget_s"] == 0.001
                and explorers(o)[0]["cut"] == "time"
                and all("not begun" in c["detail"] for c in explorers(o)[1:])
            ),
        ),
    },
    refused={
        ("examples", "quick+scope"),  # no state machine: --examples, --shrink-budget read nothing
        ("shrink_budget", "quick+scope"),
        ("examples", "exhaustive"),
        ("shrink_budget", "exhaustive"),
        ("fail_fast", "symbolic"),  # one check: nothing after it to stop
        ("without", "symbolic"),  # machine[plain] needs no caching
        *(
            (dest, mode)
            for dest in ("scope", "scope_set", "workers", "budget", "executor", "address")
            for mode in ("quick", "full", "symbolic")
        ),
        *(
            ((dest, mode) for dest in ("executor", "address") for mode in ("quick+scope", "exhaustive"))
            if not RAY
            else ()
        ),
    },  # no explorer there (--only leaves it out)
)

COMMANDS = {
    "soak": SOAK,
    "bench": BENCH,
    "gpu-bench": GPU_BENCH,
    "gpu-profile": GPU_PROFILE,
    "conformance": CONFORMANCE,
}


# -- the stand-ins and the folder ----------------------------------------------------------
def stand_in_parts(monkeypatch, seen: dict[str, Any]) -> None:
    """bench's parts answer ``PART`` at once and record the ``quick`` each was given."""
    seen["quick"] = {}
    monkeypatch.setattr(bench, "machine", lambda: MACHINE)
    for name, attribute in (("startup", "startup"), ("methods", "method_latency"), ("replay", "replay_throughput"),
                            ("batched", "batched_step")):  # fmt: skip

        def part(quick: bool, name: str = name) -> Any:
            seen["quick"][name] = quick
            return json.loads(json.dumps(PART[name]))

        monkeypatch.setattr(bench, attribute, part)


def stand_in_steps(monkeypatch, seen: dict[str, Any]) -> None:
    """gpu-profile's steps take what a linear model says, one of them 30% more
    (the fit then misses a step by 14%), and the stacks timed and the warm-up and
    repeats asked for are recorded, as are the passes over the plan."""
    import blockspace.profile.measure as measure

    seen.update(stacks=[], timed=set(), passes=0, steps=0)

    def step_ms(stack, step, warmup, repeats):
        layer = stack.layers[0]
        seen["stacks"].append({"layers": len(stack.layers), "hidden": layer["norm1"].shape[0],
                               "qkv_width": layer["qkv"].shape[1], "gate_up_width": layer["gate_up"].shape[1],
                               "dtype": str(stack.dtype)})  # fmt: skip
        seen["timed"].add((warmup, repeats))
        seen["steps"] += 1
        linear = 0.1 + 5e-3 * step.prefill_tokens + 2e-3 * step.decode_seqs + 1e-4 * step.decode_seqs * step.context
        return linear * (1.3 if step == (0, 4, 2) else 1.0)

    monkeypatch.setattr(measure, "step_ms", step_ms)
    real_profile = gpu_profile.profile

    def profile(args, shape, layers, device):
        figures = real_profile(args, shape, layers, device)
        seen["passes"] = seen["steps"] // len(figures["steps"])
        return figures

    monkeypatch.setattr(gpu_profile, "profile", profile)


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A folder with the traces the soak's probes name and a report for
    bench's --markdown to rewrite; the stand-ins of bench and gpu-profile,
    and gpu-bench's copy configurations cut to the CPU-only one; the
    module of conformance's wrong manager, importable. Yields what the
    stand-ins saw."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BLOCKSPACE_TRACE", raising=False)
    (tmp_path / TRACE).write_text(trace_lines(8))
    (tmp_path / OTHER_TRACE).write_text(trace_lines(5))
    (tmp_path / "report.md").write_text(f"kept\n{MARKER}\nan earlier report, to be replaced\n")
    seen: dict[str, Any] = {}
    stand_in_parts(monkeypatch, seen)
    stand_in_steps(monkeypatch, seen)
    cpu_only = gpu_bench.copy_configs(False)
    monkeypatch.setattr(gpu_bench, "copy_configs", lambda on_gpu: cpu_only)
    (tmp_path / "wrong_manager.py").write_text(WRONG_MANAGER)  # conformance's --impl WRONG
    monkeypatch.syspath_prepend(str(tmp_path))
    return seen


def files(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def pairs() -> list[Any]:
    return [pytest.param(name, dest, mode, id=f"{name}:{dest}:{mode}")
            for name, command in COMMANDS.items() for dest in options(command) for mode in command.modes]  # fmt: skip


# -- the tests -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_has_a_probe(name):
    command = COMMANDS[name]
    assert set(options(command)) == set(command.probes), set(options(command)) ^ set(command.probes)
    assert {dest for dest, _ in command.refused} <= set(command.probes)
    assert {mode for _, mode in command.refused} <= set(command.modes)


@pytest.mark.parametrize(("name", "dest", "mode"), pairs())
def test_an_option_is_honoured_or_refused_by_name(workspace, monkeypatch, capsys, name, dest, mode):
    monkeypatch.setenv("RAY_ADDRESS", "")  # --address sets it: recorded as it was, put back after each probe
    monkeypatch.delenv("RAY_ADDRESS")
    command = COMMANDS[name]
    argv = argv_for(command, dest, mode)
    folder = Path.cwd()
    before = files(folder)
    status = command.main(argv)
    captured = capsys.readouterr()
    if (dest, mode) in command.refused:
        assert status == 2, (argv, captured.out[-2000:], captured.err)
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
        assert option_name(dest) in captured.err, captured.err
        assert files(folder) == before, "a refused command wrote something"
        return
    outcome = Outcome(argv, status, captured.out, captured.err, folder, workspace)
    probe = command.probes[dest]
    assert status == probe.status, (argv, captured.err[-2000:])
    assert probe.shows(outcome), (argv, captured.out[-2000:], captured.err[-2000:])


def test_the_soak_refuses_what_its_mode_does_not_read_in_the_shared_words(workspace, capsys):
    """The words of every command's refusal come from one place (and simulate's too)."""
    assert soak.main(["--ops", "0", "--trace", TRACE, "--check-every", "5"]) == 2
    said = capsys.readouterr().err
    assert said == "error: --check-every goes with --ops: it paces the invariant checks of the random operations," \
                   " and --ops 0 runs none\n"  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="^--a-b cannot go with --c: why$"):
        check_mode_options({"a_b"}, {"c"}, {}, {"a_b": (("c",), "why")})
    with pytest.raises(InvalidArgumentError, match="^--a-b goes with --c or --d: why$"):
        check_mode_options({"a_b"}, set(), {"a_b": (("c", "d"), "why")}, {})
    check_mode_options({"a_b"}, {"d"}, {"a_b": (("c", "d"), "why")}, {"a_b": (("e",), "")})  # read there: no error


@pytest.mark.parametrize("wrong", ["slots", "kernel"])
def test_a_wrong_answer_makes_gpu_bench_exit_1(workspace, capsys, monkeypatch, wrong):
    """The slots differ from vLLM v0's, or a kernel moves nothing: the figures
    are of a wrong answer, and the exit status says so (it was 0)."""
    if wrong == "slots":
        real = gpu_bench.vllm_v0_step

        def shifted(*args: Any, **kwargs: Any) -> Any:
            table, slots = real(*args, **kwargs)
            return table, slots + 1

        monkeypatch.setattr(gpu_bench, "vllm_v0_step", shifted)
    else:
        monkeypatch.setattr(gpu_bench.BlockMover, "move", lambda self, pairs: None)
    assert gpu_bench.main(["--seqs", "8", "--steps", "3", "--json", "g.json"]) == 1
    failures = json.loads(Path("g.json").read_text())["failures"]
    said = capsys.readouterr().out
    expected = "(a): the synced table or slots differ" if wrong == "slots" else "the kernel's copy moved the wrong"
    assert any(expected in failure for failure in failures) and f"FAILED: {failures[0]}" in said, failures


def test_each_check_is_skipped_exactly_without_the_capability_it_is_said_to_need():
    """``Check.needs``, which the command reads before any check
    runs, says what each check does when it runs: skipped when that flag is
    False, run when every other flag is (each state machine, sweep, long
    run, trace replay, and each scope cut at depth 0)."""
    impls = {name: load_manager_class(name) for name in ("reference", "fast")}
    profile = with_changes(PROFILES["quick"], max_examples=1, step_count=5, trace_requests=2)
    scopes = [scope_from(name, ["max_depth=0"]) for name in SCOPES]
    declared = {check.name: check.needs for check in checks_for(impls, profile, {}, scopes=scopes)}
    names = list(declared)
    every_flag = dict.fromkeys(kit_options.CAPABILITIES, False)
    for name in names:
        needed = declared[name]
        flags = {needed: False} if needed else every_flag
        check = next(c for c in checks_for(impls, profile, flags, scopes=scopes, workers=1) if c.name == name)
        result = check.run()
        if needed:
            assert (result.status, result.detail) == ("skipped", f"{needed} is False"), name
        else:
            assert result.status == "passed", (name, result.detail[:500])
    assert {name.partition("[")[0] for name in names} == {"machine", "trace", "long", "sweep", "explore"}


def test_a_run_that_would_check_nothing_is_refused_naming_what_skips_it(workspace, capsys):
    """A manager without prefix caching, exploring the default scope (of the
    caching family) alone: before, exit 0 and one skipped check."""
    (Path("no_caching.py")).write_text(
        "from blockspace.reference import ReferenceBlockSpaceManager\n\n\n"
        "class NoCaching(ReferenceBlockSpaceManager):\n    supports_caching = False\n"
    )
    argv = ["--impl", "no_caching:NoCaching", "--profile", "exhaustive", "--only", "explore", "--scope", "default",
            "--json", "c.json"]  # fmt: skip
    assert conformance.main(argv) == 2
    assert capsys.readouterr().err == (
        "error: --impl no_caching:NoCaching lacks what every check of --profile exhaustive --only explore --scope "
        "default needs"
        " (explore[default]: supports_caching is False): nothing would be checked\n"
    )
    assert not Path("c.json").exists()


def test_a_run_whose_every_check_was_skipped_after_all_exits_1(workspace, capsys, monkeypatch):
    """A skip no option decides (here the CrossHair backend missing) shows
    only when the check runs: the run then checked nothing, and says so."""
    skipped = CheckResult("machine[symbolic]", "skipped", detail="hypothesis-crosshair is not installed")
    monkeypatch.setattr(symbolic, "check_symbolic_machine", lambda impls, profile: skipped)
    argv = ["--impl", "fast", "--profile", "symbolic", "--only", "machine[symbolic]", "--json", "c.json"]
    assert conformance.main(argv) == 1
    said = " ".join(capsys.readouterr().out.split())
    assert "nothing was checked: every check was skipped (its note says why), so the run does not pass" in said
    written = json.loads(Path("c.json").read_text())
    assert written["passed"] is False and written["totals"]["skipped"] == written["totals"]["checks"] == 1
