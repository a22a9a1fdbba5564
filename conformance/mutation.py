"""How strong is the kit? Mutation testing of the reference core, of the
fast manager's kernels and of the Python layer around them.

Each mutant is one small change made by mutmut's mutation operators (``<``
-> ``<=``, ``+ 1`` -> ``+ 2``, ``and`` -> ``or``, a dropped argument, ...),
in the reference core (``--target reference``), inside the kernels
of the fast manager (``--target fast``; they run as plain Python
under ``NUMBA_DISABLE_JIT=1``, so a mutant costs no compile), or in the
fast manager's Python layer, every line outside its kernels (``--target
fast-python``: table and tracker rows, key space, appends, swaps, the row
and batch APIs, the store, the argument checks, the manager; the kernels
are compiled once per work directory and loaded from Numba's cache after,
since a mutant never touches them). The kit must
tell the mutated manager apart from a pristine copy of the reference: the
quick profile (the sweeps, every state-machine family, then the trace
replays and the long runs; no shrinking, we only ask *whether* it fails) runs
with ``{"pristine": <unmutated reference>, "mutant": <the mutated
manager>}``. A mutant is *killed* when a check fails (or the run crashes
or hangs), *survived* otherwise. The score is killed / all.

    python -m blockspace.conformance.mutation --sample 200 --workers 2 --out mutants.json
    python -m blockspace.conformance.mutation --target fast --sample 300 --seed 1 --out fast-mutants.json
    python -m blockspace.conformance.mutation --target fast-python --sample 100 --seed 1 --out python-mutants.json
    python -m blockspace.conformance.mutation --target fast --rerun fast-mutants.json --profile full --timeout 600

The full profile (2000 examples a family, in 20 rounds of 100: the first
is the quick profile itself, and a cut run has tried every family) takes
tens of minutes a mutant, so it is meant for the quick profile's survivors
(``--rerun``); a mutant it has not told apart when ``--timeout`` runs out
counts as survived.

Needs ``mutmut`` (2.x, for its mutation operators; not a dependency of
blockspace). Each worker gets its own copy of the sources under ``--workdir``;
the checkout is never touched.
"""

from __future__ import annotations

import argparse
import ast
import faulthandler
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

from blockspace.outputs import write_text

ROOT = Path(__file__).resolve().parent.parent
CORE = (
    "reference/allocator.py",
    "reference/content.py",
    "reference/evictor.py",
    "reference/hit_rate.py",
    "reference/manager.py",
    "reference/rules.py",
    "reference/table.py",
    "reference/tracker.py",
)
FAST_KERNELS = (  # the modules of the fast manager's kernels; only lines inside a kernel are mutated
    "fast/content.py",
    "fast/pool.py",
    "fast/row_api_kernels.py",
    "fast/rules.py",
    "fast/table.py",
    "fast/tracker.py",
)
FAST_PYTHON = (  # the fast manager's Python layer; only lines outside its kernels are mutated
    "fast/allocations.py",
    "fast/appends.py",
    "fast/batch.py",
    "fast/checks.py",
    "fast/key_space.py",
    "fast/manager.py",
    "fast/row_api.py",
    "fast/row_args.py",
    "fast/store.py",
    "fast/swaps.py",
    "fast/table_rows.py",
    "fast/tracker_rows.py",
)
TARGETS = {"reference": CORE, "fast": FAST_KERNELS, "fast-python": FAST_PYTHON}
PACKAGES = {
    "blockspace": "blockspace",
    "reference": "blockspace/reference",
    "fast": "blockspace/fast",
    "conformance": "blockspace/conformance",
}


KERNEL_DECORATORS = ("njit", "counting", "borrowing")  # the last two: fast/borrowing.py's


def kernel_lines(source: str) -> set[int]:
    """The (0-based) line numbers of the bodies of kernels (``@njit``, ``@counting`` or ``@borrowing``)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any(
            ast.unparse(decorator).split("(")[0] in KERNEL_DECORATORS for decorator in node.decorator_list
        ):
            assert node.end_lineno is not None  # ast.parse gives every statement its end
            lines.update(range(node.body[0].lineno - 1, node.end_lineno))
    return lines


# -- mutants -------------------------------------------------------------------------------
# Error messages are not compared (only error types are), so string mutants
# are left out: they would all survive, by design.
SKIPPED_TYPES = {"string", "fstring"}


def _operators() -> SimpleNamespace:
    from mutmut import mutations_by_type

    return SimpleNamespace(
        mutation_types_to_apply=set(mutations_by_type) - SKIPPED_TYPES, covered_lines_by_filename=None
    )


class MutationId(Protocol):
    """What is read of a mutmut mutation id (its ``RelativeMutationID``;
    mutmut ships no types)."""

    @property
    def line(self) -> str: ...

    @property
    def index(self) -> int: ...

    @property
    def line_number(self) -> int: ...


def enumerate_mutants(target: str = "reference", root: Path = ROOT) -> list[tuple[str, MutationId]]:
    """Every (file, mutmut mutation id) of ``target``'s files under ``root``
    (``fast``: inside the kernels; ``fast-python``: outside them)."""
    from mutmut import ALL, Context, list_mutations

    mutants: list[tuple[str, MutationId]] = []
    for name in TARGETS[target]:
        source = (root / name).read_text()
        kernels = kernel_lines(source)
        for mutation_id in list_mutations(Context(source=source, mutation_id=ALL, filename=name, config=_operators())):
            if target == "reference" or (mutation_id.line_number in kernels) == (target == "fast"):
                mutants.append((name, mutation_id))
    return mutants


def mutated_source(name: str, mutation_id: MutationId, root: Path = ROOT) -> str:
    from mutmut import Context, mutate

    context = Context(source=(root / name).read_text(), mutation_id=mutation_id, filename=name, config=_operators())
    source, num_done = mutate(context)
    assert num_done == 1
    return source


# -- work directories ----------------------------------------------------------------------
def build_workdir(workdir: Path) -> None:
    """``pkg/blockspace`` (with the reference and the kit inside, ready to be
    mutated) and ``pristine/pristine_reference`` (an untouched copy)."""
    shutil.rmtree(workdir, ignore_errors=True)
    for source, target in PACKAGES.items():
        shutil.copytree(
            ROOT / source, workdir / "pkg" / target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
        )
    pristine = workdir / "pristine" / "pristine_reference"
    shutil.copytree(ROOT / "reference", pristine, ignore=shutil.ignore_patterns("__pycache__"))
    for path in pristine.glob("*.py"):
        path.write_text(re.sub(r"\bblockspace\.reference\b", "pristine_reference", path.read_text()))


def _line(source: str, number: int) -> str:
    """Line ``number`` (0-based) of ``source``, stripped; "" past the end (a
    mutant that deletes a line can end the file early)."""
    lines = source.split("\n")
    return lines[number].strip() if number < len(lines) else ""


def sources_in(workdir: Path) -> Path:
    """Where a work directory keeps its copy of the sources, taken when it was
    built: mutants are made from it, so editing the checkout during a run
    changes nothing."""
    return workdir / "pkg" / "blockspace"


def run_mutant(
    workdir: Path, name: str, source: str, timeout: float, profile: str = "quick", jit: bool = False
) -> tuple[str, float, str]:
    """Install one mutant in ``workdir``, probe it, restore the original.
    Without ``jit`` the kernels run as Python (a kernel mutant costs no
    compile); with it they are compiled, once, into the work directory's
    Numba cache (a mutant of the Python layer leaves them as they are)."""
    package = Path(name).parent.name  # "reference" or "fast"
    target = workdir / "pkg" / "blockspace" / package / Path(name).name
    original = target.read_text()
    target.write_text(source)
    env = dict(
        os.environ, PYTHONPATH=f"{workdir / 'pkg'}{os.pathsep}{workdir / 'pristine'}", PYTHONDONTWRITEBYTECODE="1"
    )
    if package == "fast" and not jit:
        env["NUMBA_DISABLE_JIT"] = "1"  # the kernels run as the mutated Python, with no compile
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "blockspace.conformance.mutation", "--probe", package, "--profile", profile],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=workdir,
        )
        verdict = "survived" if done.returncode == 0 else "killed"
        why = (done.stdout.strip().splitlines() or [""])[-1]
        if verdict == "killed" and "Timeout (" in done.stderr:  # faulthandler's word: a layer of the explorer hung
            why = f"a hang (a layer of the explorer ran past {HANG_SECONDS} s)"
        elif verdict == "killed" and not why:  # the probe itself died: say how
            why = "crashed: " + (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    except subprocess.TimeoutExpired:  # quick: a hang; full and exhaustive: a long campaign cut short, not a kill
        verdict, why = ("killed", "timeout") if profile == "quick" else ("survived", f"not killed in {timeout:.0f} s")
    finally:
        target.write_text(original)
    return verdict, time.perf_counter() - started, why


# -- the probe (runs inside a work directory) ------------------------------------------------
def probe(target: str, profile: str = "quick") -> int:
    """Exit 1 at the first check of ``profile`` that tells the mutant (the
    ``target`` manager of this work directory) from the pristine reference.
    The quick and exhaustive profiles are ``kills.kill``'s (the sweeps first:
    they are the cheapest checks), the very question
    ``tests/test_conformance_broken.py`` asks of the broken managers.

    The full profile runs in rounds of the quick profile's size, the first
    of them the quick profile itself (its steps, then its traces and the
    long runs), the others at the full profile's steps, until every family
    has had the full profile's examples; then the traces with the full
    profile's requests. So it makes every check the quick profile makes,
    and a run cut by ``--timeout`` has spread its time over every family
    instead of spending it all on the first."""
    from hypothesis import Phase

    import blockspace.reference
    from blockspace.conformance.check import run_machine
    from blockspace.conformance.configs import FAMILIES
    from blockspace.conformance.kills import kill
    from blockspace.conformance.long_runs import long_run_checks
    from blockspace.conformance.runner import PROFILES, with_changes
    from blockspace.conformance.sweeps import sweep_checks
    from blockspace.conformance.trace import trace_checks

    assert "pkg" in blockspace.reference.__file__, "the probe must run in a work directory"
    impls = {"pristine": "pristine_reference:ReferenceBlockSpaceManager", "mutant": target}
    if profile != "full":  # a layer of the explorer that runs past HANG_SECONDS ends the process as a hang
        found = kill(impls, profile, before_layer=lambda: faulthandler.dump_traceback_later(HANG_SECONDS, exit=True))
        faulthandler.cancel_dump_traceback_later()
        print(found or "survived")
        return 1 if found else 0
    chosen = with_changes(PROFILES[profile], reduce_repro=False)  # whether it fails, not how short its repro
    quick = with_changes(PROFILES["quick"], reduce_repro=False)
    rounds = max(1, chosen.max_examples // quick.max_examples)
    later_rounds = with_changes(chosen, max_examples=chosen.max_examples // rounds)

    def killed_by(checks: list) -> bool:
        for check in checks:
            if check.run().status == "failed":
                print(f"killed by {check.name}")
                return True
        return False

    def killed_by_traces(num_requests: int) -> bool:
        return killed_by([*trace_checks(impls, num_requests, {}), *long_run_checks(impls, {})])

    if killed_by(sweep_checks(impls, {})):  # deterministic and the cheapest: first
        return 1
    for done in range(rounds):
        for family in FAMILIES:
            settings = quick if done == 0 else later_rounds
            if run_machine(impls, family, settings, phases=(Phase.explicit, Phase.generate)).status == "failed":
                print(f"killed by machine[{family}]" + (f" in round {done + 1}" if rounds > 1 else ""))
                return 1
        if done == 0 and killed_by_traces(quick.trace_requests):
            return 1
    if chosen.trace_requests != quick.trace_requests and killed_by_traces(chosen.trace_requests):
        return 1
    print("survived")
    return 0


# A layer of a mutant's scope takes at most about a minute (one worker); one that takes this long is a hang.
HANG_SECONDS = 120


def from_report(path: str, mutants: list[tuple[str, MutationId]], survivors_only: bool) -> list[tuple[str, MutationId]]:
    """The mutants an earlier report names (only its survivors, or all),
    found again by file, line text and index on the line: edits elsewhere
    in a file move line numbers, not these. A line text a file holds more
    than once (``count += 1``) is the one nearest the recorded line number."""
    with open(path) as handle:
        records = [r for r in json.load(handle)["results"] if not survivors_only or r["verdict"] == "survived"]
    by_text: dict[tuple[str, str, int], list[tuple[str, MutationId]]] = {}
    for name, m in mutants:
        by_text.setdefault((name, m.line.strip(), m.index), []).append((name, m))
    found = []
    for r in records:
        if same := by_text.get((r["file"], r["line"], r["index"])):
            found.append(min(same, key=lambda item: abs(item[1].line_number + 1 - r.get("line_number", 0))))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m blockspace.conformance.mutation")
    parser.add_argument("--probe", choices=("reference", "fast"), help=argparse.SUPPRESS)
    parser.add_argument("--target", choices=sorted(TARGETS), default="reference", help="what to mutate")
    parser.add_argument(
        "--profile",
        choices=("quick", "full", "exhaustive"),
        default="quick",
        help="the kit's profile each mutant faces",
    )
    parser.add_argument("--sample", type=int, default=0, help="mutants drawn at random (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0, help="only the first N mutants of the sample (0: all)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per mutant before it counts as hung")
    parser.add_argument("--workdir", default="/tmp/blockspace-mutation")
    parser.add_argument("--out", default="mutants.json")
    parser.add_argument("--rerun", metavar="JSON", help="only the survivors of an earlier report")
    parser.add_argument(
        "--again", metavar="JSON", help="every mutant of an earlier report (the same sample under another profile)"
    )
    args = parser.parse_args(argv)
    if args.probe:
        return probe(args.probe, args.profile)

    workdirs = [Path(args.workdir) / f"w{i}" for i in range(args.workers)]
    for workdir in workdirs:
        build_workdir(workdir)
    mutants = enumerate_mutants(args.target, sources_in(workdirs[0]))
    chosen = random.Random(args.seed).sample(mutants, args.sample) if 0 < args.sample < len(mutants) else mutants
    chosen = chosen[: args.first] if args.first > 0 else chosen
    if args.rerun or args.again:
        chosen = from_report(args.rerun or args.again, mutants, survivors_only=bool(args.rerun))
    free = list(workdirs)
    results = []

    def one(item: tuple[str, MutationId]) -> dict[str, Any]:
        workdir = free.pop()
        try:
            name, mutation_id = item
            source = mutated_source(name, mutation_id, sources_in(workdir))
            verdict, seconds, why = run_mutant(
                workdir, name, source, args.timeout, args.profile, jit=args.target == "fast-python"
            )
        finally:
            free.append(workdir)
        record: dict[str, Any] = {
            "file": name,
            "line_number": mutation_id.line_number + 1,
            "line": mutation_id.line.strip(),
            "mutant": _line(source, mutation_id.line_number),
            "index": mutation_id.index,
            "verdict": verdict,
            "seconds": round(seconds, 1),
            "why": why,
        }
        results.append(record)
        print(
            f"[{len(results)}/{len(chosen)}] {verdict:8} {name}:{record['line_number']} {record['line'][:70]}",
            flush=True,
        )
        document = {
            "target": args.target,
            "profile": args.profile,
            "total_mutants": len(mutants),
            "sampled": len(chosen),
            "results": results,
        }
        with writing:  # one thread at a time: the file is written whole, then renamed (outputs.py)
            write_text(args.out, json.dumps(document, indent=1))
        return record

    writing = threading.Lock()
    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(one, chosen))
    killed = sum(r["verdict"] == "killed" for r in results)
    print(
        f"mutation score: {killed}/{len(results)} = {killed / max(1, len(results)):.1%} "
        f"({len(mutants)} mutants of {args.target})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
