"""The ``blockspace`` command: one entry point, one module per subcommand.

blockspace simulate     replay a trace through a continuous-batching scheduler
blockspace bench        micro and macro benchmarks, reference against fast
blockspace conformance  check one implementation against another
blockspace gpu-bench    benchmark the CUDA kernels against vLLM v0's way
"""

from __future__ import annotations

import importlib
import os
import sys

from blockspace.errors import MissingExtraError
from blockspace.extras import require

# name: (module with main(argv), the extra it needs before anything is imported, summary);
# simulate checks its own extra, since it needs it only for the plot and the progress bar.
SUBCOMMANDS = {
    "simulate": ("blockspace.simulator.cli", None, "replay a request trace through a continuous-batching scheduler"),
    "bench": ("blockspace.bench.cli", "bench", "benchmark the implementations side by side"),
    "conformance": ("blockspace.conformance.cli", "conformance", "prove two implementations agree"),
    "soak": ("blockspace.soak.cli", "conformance", "long random run looking for leaks, drift and disagreement"),
    "gpu-bench": ("blockspace.bench.gpu", "gpu", "benchmark the CUDA kernels (table sync, slot mapping, KV copies)"),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in SUBCOMMANDS:
        print("usage: blockspace {" + ",".join(SUBCOMMANDS) + "} [options]\n")
        for name, (_, _, summary) in SUBCOMMANDS.items():
            print(f"  {name:<12} {summary}")
        return 0 if args and args[0] in ("-h", "--help") else 2
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # --impl / --manager mypackage.module:Class from the current folder, as python -m
    module_name, extra, _ = SUBCOMMANDS[args[0]]
    try:
        if extra is not None:
            require(extra, f"blockspace {args[0]}")
        module = importlib.import_module(module_name)
        return int(module.main(args[1:]) or 0)
    except MissingExtraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
