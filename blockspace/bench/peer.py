"""``blockspace simulate`` against its nearest peer, NVIDIA Dynamo's mocker,
on the same Mooncake trace with the same settings, timed in turns.

    python -m blockspace.bench.peer --trace conversation.jsonl --requests 1000,2000,all --rounds 2

Why: the mocker is the other vLLM-style scheduler and paged block manager
with prefix caching that replays a Mooncake trace offline (in Rust, shipped
on PyPI as ai-dynamo-runtime). Its speed is the yardstick for ours, and this
says how far apart the two are, measured the same way on the same machine.

For each size (the first N requests of the trace), each round runs ours on
each engine and then theirs, so a slow spell of a shared machine slows all
alike:

- ours as a user runs it: ``python -m blockspace simulate ... --no-plot
  --quiet`` as a subprocess, once with ``--engine compiled`` (the default)
  and once with ``--engine python``, each timed whole (start-up, loading,
  reporting), and the replay's own wall time read from the simulation.json
  it writes;
- theirs: ``dynamo._core.run_mocker_trace_replay`` in offline mode (simulated
  time: nothing sleeps), in a subprocess too, timed around the call.

Each round also times the **token floor**: making the prompts of those
requests as token-id lists, as a ``Sequence`` holds them
(``get_token_ids()``, vLLM's interface), and converting each once to int64,
the least a NumPy block manager does with a prompt before it keys a block.
No replay that hands its prompts to the manager through that interface can
take less; the mocker keys blocks from the trace's chunk ids and never makes
a token (docs/measurements/2026-12-06-simulator-figures.md, *The floor*).

Both get block size 16, 49,152 GPU blocks, at most 256 sequences and 2,048
batched tokens per step, prefix caching and chunked prefill on (see
``mocker_replay``). Each figure is the best of its rounds; a ratio is an
engine's replay wall time over the mocker's call, and the floor's ratio the
token floor's over the mocker's call (the compiled engine makes no token
list, so the floor bounds only the Python engine). Without the mocker
installed ours is still timed, and the ratios left out. A benchmark, not a test: nothing here
asserts a speed; the exit status is 1 only when a run fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from blockspace.errors import BlockSpaceError, InvalidArgumentError
from blockspace.validation import Range, check_output_file, check_ranges, command_parser, refuse, write_output
from blockspace.workloads import TRACE_ENV, TraceError, load_trace, trace_file, trace_source

INSTALL = "pip install --no-deps ai-dynamo-runtime"  # the mocker; never a dependency of blockspace

# The settings both replays share: vLLM's, and `blockspace simulate`'s options for them.
BLOCK_SIZE = 16
NUM_GPU_BLOCKS = 49_152
MAX_NUM_SEQS = 256
MAX_NUM_BATCHED_TOKENS = 2_048
TRACE_BLOCK_SIZE = 512  # tokens per Mooncake hash id


ROUTER_MODES = {"round_robin": "round_robin", "kv_aware": "kv_router"}  # --router: ours -> the mocker's router_mode


def mocker_replay(trace_file: str, replicas: int = 1, router: str = "round_robin") -> dict[str, Any]:
    """Replay ``trace_file`` (Mooncake JSONL, every line of it: the mocker has
    no request limit, so the caller writes the first N lines to a file) in
    Dynamo's mocker; its timing and its own summary.

    How our settings map onto the call (ai-dynamo-runtime 1.6)::

        extra_engine_args={"engine": {...}}   the mocker's vLLM-style engine:
            block_size=16                     = simulate --block-size (default 16)
            num_gpu_blocks=49_152             = simulate --num-gpu-blocks 49152
            max_num_seqs=256                  = simulate --max-num-seqs 256
            max_num_batched_tokens=2_048      = simulate --max-num-batched-tokens 2048
            enable_prefix_caching=True        = simulate's default --enable-prefix-caching
            enable_chunked_prefill=True       ours always chunks a prefill to the token budget
            speedup_ratio=1.0                 scales the mocker's simulated step times only;
                                              offline replay never sleeps on them
        replay_mode="offline"                 discrete-event replay in simulated time, one engine
        num_workers=replicas                  engines behind its router (ours: --replicas)
        router_mode=ROUTER_MODES[router]      round_robin = ours; kv_router, its KV router = our kv_aware
        trace_format="mooncake"               timestamp (ms), input_length, output_length, hash_ids
        trace_block_size=512                  tokens per hash id, as ours reads them
        arrival_speedup_ratio=1.0             = simulate --time-scale 1 (arrivals as the trace has them)

    The watermark is left at the mocker's default, 0.01, which is ours too.
    """
    from dynamo._core import run_mocker_trace_replay  # imported here: the mocker is optional

    engine = {
        "block_size": BLOCK_SIZE,
        "num_gpu_blocks": NUM_GPU_BLOCKS,
        "max_num_seqs": MAX_NUM_SEQS,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "speedup_ratio": 1.0,
    }
    start = time.perf_counter()
    result = run_mocker_trace_replay(
        [trace_file],
        extra_engine_args={"engine": engine},
        replay_mode="offline",
        num_workers=replicas,
        router_mode=ROUTER_MODES[router],
        trace_format="mooncake",
        trace_block_size=TRACE_BLOCK_SIZE,
        arrival_speedup_ratio=1.0,
    )
    call_s = time.perf_counter() - start
    summary = result.summary
    return {
        "call_s": call_s,
        "wall_time_ms": summary.get("wall_time_ms"),
        "finished": summary.get("completed_requests"),
        "requests": summary.get("num_requests"),
    }


def _mocker_child() -> None:
    """The mocker's subprocess: ``mocker_replay(*argv[1:])`` as one JSON line on stdout."""
    print(json.dumps(mocker_replay(sys.argv[1], int(sys.argv[2]), sys.argv[3])))


MOCKER_CHILD = "import sys; from blockspace.bench.peer import _mocker_child; _mocker_child()"


def mocker_installed() -> bool:
    """Whether ``dynamo._core`` can be found (found, not loaded: the child loads it)."""
    try:
        return find_spec("dynamo._core") is not None
    except (ImportError, ValueError):
        return False


def parse_sizes(text: str) -> list[int | None]:
    """``1000,2000,all`` -> ``[1000, 2000, None]`` (``None``: the whole trace)."""
    sizes: list[int | None] = []
    for item in text.split(","):
        item = item.strip().lower()
        if item == "all":
            size = None
        else:
            try:
                size = int(item.replace("_", ""))
            except ValueError:
                raise InvalidArgumentError(f"--requests: {item!r} is neither a whole number nor 'all'") from None
            if size < 1:
                raise InvalidArgumentError(f"--requests: {size} must be >= 1")
        if size not in sizes:
            sizes.append(size)
    return sizes


def trace_lines(path: Path | None) -> tuple[str, list[str]]:
    """(the trace file, its non-blank lines, one a request), every line
    checked by ``load_trace`` as ``blockspace simulate`` checks it."""
    if not load_trace(path):
        raise TraceError(f"trace {trace_source(path)} holds no requests")
    file = trace_file(path)
    return str(file.absolute()), [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(nothing on stderr)"


class RunFailed(Exception):
    """A replay's subprocess failed: the command exits 1 with this message."""


ENGINES = ("compiled", "python")  # ours, each timed in every round


def time_ours(
    trace_file: str, size: int, total: int, folder: Path, engine: str, replicas: int = 1, router: str = "round_robin"
) -> dict[str, Any]:
    """``blockspace simulate --engine ENGINE`` on the first ``size`` requests,
    as a subprocess: the command's wall time and the replay's, from its simulation.json."""
    command = [sys.executable, "-m", "blockspace", "simulate", "--trace", trace_file, "--engine", engine]
    if size < total:
        command += ["--max-requests", str(size)]
    if replicas > 1:
        command += ["--replicas", str(replicas), "--router", router]
    command += [
        "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks", str(NUM_GPU_BLOCKS),
        "--max-num-seqs", str(MAX_NUM_SEQS), "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS),
        "--enable-prefix-caching", "--no-plot", "--quiet", "--out", str(folder),
    ]  # fmt: skip
    (folder / "simulation.json").unlink(missing_ok=True)  # a figure read must be this run's
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    command_s = time.perf_counter() - start
    if done.returncode != 0:
        raise RunFailed(f"blockspace simulate exited {done.returncode}: {_last_line(done.stderr)}")
    try:
        run = json.loads((folder / "simulation.json").read_text())["runs"][0]
        return {"command_s": command_s, "replay_s": float(run["wall_s"]), "finished": run["requests"]["finished"]}
    except (OSError, ValueError, LookupError, TypeError) as error:
        raise RunFailed(f"blockspace simulate wrote no readable simulation.json in {folder}: {error}") from None


def time_theirs(
    lines: Sequence[str], size: int, folder: Path, replicas: int = 1, router: str = "round_robin"
) -> dict[str, Any]:
    """The mocker's replay of the first ``size`` requests, in a subprocess;
    ``command_s`` includes its start-up, ``call_s`` is the call alone."""
    trace_file = folder / f"first-{size}.jsonl"
    trace_file.write_text("\n".join(lines[:size]) + "\n", encoding="utf-8")
    start = time.perf_counter()
    child = [sys.executable, "-c", MOCKER_CHILD, str(trace_file), str(replicas), router]
    done = subprocess.run(child, capture_output=True, text=True)
    command_s = time.perf_counter() - start
    if done.returncode != 0:
        raise RunFailed(f"the mocker exited {done.returncode}: {_last_line(done.stderr)}")
    try:
        figures = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RunFailed(f"the mocker printed no figures: {_last_line(done.stdout + done.stderr)}") from None
    return {**figures, "command_s": command_s}


def token_floor(trace_file: str, size: int) -> float:
    """Seconds to make the first ``size`` prompts as token-id lists (what a
    ``Sequence`` returns from ``get_token_ids()``) and convert each once to
    int64: the floor under any replay through the manager interface."""
    requests = load_trace(trace_file, size)  # read and checked before the clock starts
    start = time.perf_counter()
    for request in requests:
        np.array(request.prompt_token_ids(), np.int64)
    return time.perf_counter() - start


def _best(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each timing the least of its rounds; the rest from the first round."""
    best = dict(rounds[0])
    for key in ("command_s", "replay_s", "call_s"):
        if key in best:
            best[key] = min(r[key] for r in rounds)
    return best


def measure(
    trace_file: str, lines: list[str], sizes: list[int], rounds: int, mocker: bool, replicas: int = 1,
    router: str = "round_robin",
) -> list[dict[str, Any]]:  # fmt: skip
    """Per size: the best of ``rounds`` of ours (and of the mocker's when installed), taken in turns;
    a fleet (``replicas`` above 1) on the compiled engine only (the Python engine's fleet takes minutes),
    and without the token floor, which bounds the Python engine only."""
    engines = ENGINES if replicas == 1 else ("compiled",)
    rows = []
    with tempfile.TemporaryDirectory(prefix="blockspace-peer-") as scratch:
        folder = Path(scratch)
        for size in sizes:
            ours: dict[str, list[dict[str, Any]]] = {engine: [] for engine in engines}
            theirs: list[dict[str, Any]] = []
            floors: list[float] = []
            for round_number in range(1, rounds + 1):
                for engine in engines:
                    say = f"[peer] {size:,} requests, round {round_number}: blockspace, {engine} engine ..."
                    print(say, file=sys.stderr, flush=True)
                    ours[engine].append(time_ours(trace_file, size, len(lines), folder / "simulate", engine, replicas,
                                                  router))  # fmt: skip
                if "python" in engines:  # the floor bounds the Python engine only
                    floors.append(token_floor(trace_file, size))
                if mocker:
                    print(f"[peer] {size:,} requests, round {round_number}: mocker ...", file=sys.stderr, flush=True)
                    theirs.append(time_theirs(lines, size, folder, replicas, router))
            row: dict[str, Any] = {"requests": size, **({"token_floor_s": min(floors)} if floors else {})}
            row.update({engine: _best(ours[engine]) for engine in engines})
            if mocker:
                row["mocker"] = _best(theirs)
                mocker_s = max(row["mocker"]["call_s"], 1e-9)
                row["ratios"] = {engine: row[engine]["replay_s"] / mocker_s for engine in engines}
                row["command_ratio"] = row["compiled"]["command_s"] / max(row["mocker"]["command_s"], 1e-9)
                if floors:
                    row["floor_ratio"] = row["token_floor_s"] / mocker_s
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], mocker: bool) -> str:
    lines = [
        "| requests | mocker s | mocker command s | compiled replay s | compiled command s | compiled / mocker "
        "| commands | python replay s | python / mocker | token floor s | floor / mocker |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        compiled, python = row["compiled"], row.get("python")
        theirs = f"{row['mocker']['call_s']:.3f} | {row['mocker']['command_s']:.2f}" if mocker else "- | -"
        ratio = {engine: f"{row['ratios'][engine]:.2f}x" if mocker and engine in row else "-" for engine in ENGINES}
        commands = f"{row['command_ratio']:.2f}x" if mocker else "-"
        floor_ratio = f"{row['floor_ratio']:.1f}x" if "floor_ratio" in row else "-"
        floor_s = f"{row['token_floor_s']:.3f}" if "token_floor_s" in row else "-"
        python_s = "-" if python is None else f"{python['replay_s']:.2f}"
        lines.append(
            f"| {row['requests']:,} | {theirs} | {compiled['replay_s']:.3f} | {compiled['command_s']:.2f} "
            f"| {ratio['compiled']} | {commands} | {python_s} | {ratio['python']} | {floor_s} "
            f"| {floor_ratio} |"
        )
    return "\n".join(lines)


def notes(rows: list[dict[str, Any]], mocker: bool) -> list[str]:
    """What a reader of the table must know: where the two did not finish the same requests."""
    said = []
    for row in rows:
        finished = row["compiled"]["finished"]
        if "python" in row and row["python"]["finished"] != finished:
            python = row["python"]["finished"]
            said.append(f"{row['requests']:,} requests: the compiled engine finished {finished}, the python {python}")
        if mocker and row["mocker"]["finished"] != finished:
            said.append(
                f"{row['requests']:,} requests: the mocker finished {row['mocker']['finished']}, blockspace {finished}"
            )
        elif finished != row["requests"]:
            said.append(f"{row['requests']:,} requests: blockspace finished {finished}")
    return said


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("python -m blockspace.bench.peer", __doc__)
    parser.add_argument(
        "--trace", type=Path, help=f"Mooncake-format JSONL (default: ${TRACE_ENV}, else the bundled sample)"
    )
    parser.add_argument("--requests", default="1000,2000,all", help="sizes, the first N requests each, or 'all'")
    parser.add_argument("--rounds", type=int, default=2, help="rounds in turns; the best of each is kept")
    parser.add_argument(
        "--replicas", type=int, default=1,
        help="a fleet: this many engines behind --router (the mocker's workers); compiled engine only",
    )  # fmt: skip
    parser.add_argument(
        "--router", choices=tuple(ROUTER_MODES), default="round_robin",
        help="with --replicas: ours; the mocker's round_robin, or its kv_router for kv_aware",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of the table")
    parser.add_argument("--out", metavar="FILE", help="also write what is printed here (default: not written)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit status 0, 2 for a bad option (said before anything is timed), 1 when a run fails."""
    try:
        args = build_parser().parse_args(argv)
        check_ranges(args, {"rounds": Range(least=1), "replicas": Range(least=1)})
        if args.router != "round_robin" and args.replicas == 1:
            raise InvalidArgumentError("--router goes with --replicas above 1: one engine leaves no choice")
        requested = parse_sizes(args.requests)
        if args.out:
            check_output_file(args.out, "--out")
        trace_file, lines = trace_lines(args.trace)
        too_many = [size for size in requested if size is not None and size > len(lines)]
        if too_many:
            raise InvalidArgumentError(
                f"--requests {too_many[0]:,}: the trace {trace_source(args.trace)} holds {len(lines):,} requests"
            )
    except BlockSpaceError as error:
        return refuse(error)
    sizes = list(dict.fromkeys(len(lines) if size is None else size for size in requested))
    mocker = mocker_installed()
    missing = None if mocker else f"the mocker is not installed (no dynamo._core; {INSTALL}): no ratio"
    try:
        rows = measure(trace_file, lines, sizes, args.rounds, mocker, args.replicas, args.router)
    except RunFailed as error:
        return refuse(error, 1)
    except KeyboardInterrupt:
        return refuse("interrupted", 130)
    if args.json:
        figures = {"trace": trace_file, "rounds": args.rounds, "replicas": args.replicas, "router": args.router,
                   "mocker": mocker, "note": missing, "rows": rows}  # fmt: skip
        text = json.dumps(figures, indent=1)
    else:
        fleet = f", {args.replicas} replicas under {args.router}" if args.replicas > 1 else ""
        header = (
            f"{len(lines):,}-request trace {trace_source(args.trace)}{fleet}, best of {args.rounds} round(s) in turns"
        )
        text = "\n".join([header, "", table(rows, mocker), *notes(rows, mocker), *([missing] if missing else [])])
    print(text)
    if args.out:
        write_output(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
