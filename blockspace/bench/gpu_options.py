"""The options of ``blockspace gpu-bench``, apart from its run (``gpu.py``),
which imports torch and numba-cuda: so ``blockspace gpu-bench --help``
works before the [gpu] extra is installed (``blockspace/cli.py``'s ``help_from``)."""

from __future__ import annotations

import argparse

from blockspace.validation import Range, command_parser

DESCRIPTION = (
    "The CUDA kernels against vLLM v0's way, in one bounded run: block table sync and slot mapping, "
    "KV copies and swaps."
)
RANGES = {"seqs": Range(least=1), "steps": Range(least=1), "block_size": Range(least=1), "budget_s": Range(least=0)}


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("blockspace gpu-bench", DESCRIPTION)
    parser.add_argument(
        "--json", metavar="PATH", help="write every figure to this JSON file, after each part (default: not written)"
    )
    parser.add_argument("--seqs", type=int, help="sequences per step for (a) (default: 1024 on a GPU, 64 without)")
    parser.add_argument("--steps", type=int, help="timed steps for (a) (default: 300 on a GPU, 20 without)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block for (a)")
    parser.add_argument(
        "--budget-s", type=float, default=150.0, help="seconds after which the remaining copy configs are skipped"
    )
    return parser
