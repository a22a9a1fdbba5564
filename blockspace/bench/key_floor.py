"""The time fast's content table takes to key every prompt block of a trace,
block by block: the floor under any replay that keys blocks this way.

    python -m blockspace.bench.key_floor --trace conversation.jsonl --max-requests 2000

Why: issue #41 asks the compiled engine for half the mocker's time on the
whole conversation trace. Each prompt block is keyed once on admission
(``content.key_chain``: its 16 tokens hashed, then probed and compared in
the table), so the keying alone bounds the replay from below, however the
rest of the engine is built. This times it on the trace's own prompts,
three ways: into an empty table (every block new, as on first sight), into
the full table (every block found), and the hash alone (no table), which
says how much of a block's cost is the arithmetic and how much is waiting
on memory. A benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from blockspace.bench.timing import report, trace_command
from blockspace.errors import BlockSpaceError
from blockspace.fast import content as C
from blockspace.fast.handles import handle
from blockspace.validation import Range, command_parser, refuse
from blockspace.workloads import TRACE_ENV, trace_source

RANGES = {"max_requests": Range(least=1), "block_size": Range(least=1)}


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("python -m blockspace.bench.key_floor", __doc__)
    parser.add_argument(
        "--trace", type=Path, help=f"Mooncake-format JSONL (default: ${TRACE_ENV}, else the bundled sample)"
    )
    parser.add_argument("--max-requests", type=int, help="key only the first N requests' prompts (default: all)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block")
    parser.add_argument("--json", type=Path, help="write the figures here (default: not written)")
    return parser


@njit(cache=True)
def _hash_blocks(tokens, num_blocks, block_size):  # type: ignore[no-untyped-def]  # compiled: typed by Numba
    """The content hash of each block, and nothing else (the arithmetic's share)."""
    total = 0
    for index in range(num_blocks):
        total ^= C._hash(-1, tokens, index * block_size, block_size, 0)
    return total


def measure(prompts: list[np.ndarray], block_size: int) -> dict[str, Any]:
    """Seconds to key every full block of ``prompts`` into an empty table, into
    the same table again, and to hash them only."""
    num_blocks = [len(tokens) // block_size for tokens in prompts]
    total = sum(num_blocks)
    capacity = 1 << max(8, (total - 1).bit_length())  # room for every key: no growth inside the clock
    keys = C.new_keys(block_size, capacity)
    table = handle(keys)
    outs = [np.full(n, -1, np.int64) for n in num_blocks]
    warm = C.new_keys(block_size)
    C.key_chain(handle(warm), -1, np.zeros(block_size, np.int64), 0, np.zeros(1, np.int64), 0, 1)  # compile outside
    _hash_blocks(np.zeros(block_size, np.int64), 1, block_size)
    figures: dict[str, Any] = {"prompts": len(prompts), "blocks": total, "block_size": block_size}
    for label in ("new", "found"):
        started = time.perf_counter()
        for tokens, out in zip(prompts, outs):
            C.key_chain(table, -1, tokens, 0, out, 0, len(out))
        figures[f"{label}_s"] = time.perf_counter() - started
        figures[f"keys_after_{label}"] = int(keys.count[0])
    started = time.perf_counter()
    for tokens, n in zip(prompts, num_blocks):
        _hash_blocks(tokens, n, block_size)
    figures["hash_s"] = time.perf_counter() - started
    return figures


def table(figures: dict[str, Any]) -> str:
    blocks = figures["blocks"]
    lines = [
        f"{figures['prompts']:,} prompts, {blocks:,} full blocks of {figures['block_size']} tokens, "
        f"{figures['keys_after_new']:,} distinct",
        "",
        "| keying | seconds | ns / block |",
        "| --- | ---: | ---: |",
    ]
    for label, name in (("new", "into an empty table"), ("found", "into the full table"), ("hash", "hash only")):
        seconds = figures[f"{label}_s"]
        lines.append(f"| {name} | {seconds:.3f} | {seconds / blocks * 1e9:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; 2 for a bad option, said before anything is timed."""
    try:
        args, trace = trace_command(build_parser(), argv, RANGES)
    except BlockSpaceError as error:
        return refuse(error)
    print(trace_source(args.trace), flush=True)
    prompts = [np.array(request.prompt_token_ids(), np.int64) for request in trace]
    figures = measure(prompts, args.block_size)
    report(table(figures), figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
