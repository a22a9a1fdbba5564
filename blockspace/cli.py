"""The ``blockspace`` command: one entry point, one module per subcommand.

blockspace simulate     replay a trace through a continuous-batching scheduler
blockspace bench        micro and macro benchmarks, reference against fast
blockspace conformance  check one implementation against another
blockspace soak         long random run looking for leaks
blockspace gpu-bench    benchmark the CUDA kernels against vLLM v0's way
blockspace gpu-profile  measure a GPU's step times for simulate --step-model

A subcommand's module is imported only once its extra is known to be
there; ``--help`` of a subcommand whose options are described outside its
module (``help_from``) needs no extra at all, so a user can read what a
command does before installing what it needs.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import version
from typing import NamedTuple

from blockspace.errors import InvalidArgumentError, MissingExtraError
from blockspace.extras import require
from blockspace.validation import refuse


class Subcommand(NamedTuple):
    module: str  # has main(argv) -> exit status
    extra: str | None  # needed before the module is imported (simulate checks its own: only its plot needs it)
    summary: str
    help_from: str | None = None  # "module:function" building the parser without the extra


SUBCOMMANDS = {
    "simulate": Subcommand(
        "blockspace.simulator.cli", None, "replay a request trace through a continuous-batching scheduler"
    ),
    "bench": Subcommand(
        "blockspace.bench.cli",
        "bench",
        "benchmark the implementations side by side",
        "blockspace.bench.cli:build_parser",
    ),  # fmt: skip
    "conformance": Subcommand(
        "blockspace.conformance.cli",
        "conformance",
        "prove two implementations agree",
        "blockspace.kit_options:build_parser",
    ),  # fmt: skip
    "soak": Subcommand(
        "blockspace.soak.cli",
        "conformance",
        "long random run looking for leaks, drift and disagreement",
        "blockspace.soak.options:build_parser",
    ),
    "gpu-bench": Subcommand(
        "blockspace.bench.gpu",
        "gpu",
        "benchmark the CUDA kernels (table sync, slot mapping, KV copies)",
        "blockspace.bench.gpu_options:build_parser",
    ),
    "gpu-profile": Subcommand(
        "blockspace.profile.cli", None, "measure this GPU's step times into a file for simulate --step-model"
    ),  # checks its own extra (torch only: no numba-cuda), after its options
}
HELP = ("-h", "--help")


def usage() -> str:
    lines = ["usage: blockspace {" + ",".join(SUBCOMMANDS) + "} [options]", "       blockspace --version", ""]
    lines += [f"  {name:<12} {command.summary}" for name, command in SUBCOMMANDS.items()]
    lines += ["", "blockspace COMMAND --help describes a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in HELP:
        print(usage())
        return 0
    if args and args[0] in ("-V", "--version"):
        print(f"blockspace {version('blockspace')}")
        return 0
    if not args or args[0] not in SUBCOMMANDS:
        said = f"unknown command {args[0]!r}" if args else "no command given"
        return refuse(InvalidArgumentError(f"{said}: choose one of {', '.join(SUBCOMMANDS)} (blockspace --help)"))
    command = SUBCOMMANDS[args[0]]
    if command.help_from is not None and any(arg in HELP for arg in args[1:]):
        module_name, _, function = command.help_from.partition(":")
        getattr(importlib.import_module(module_name), function)().print_help()
        return 0
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(
            0, os.getcwd()
        )  # --impl / --manager mypackage.module:Class from the current folder, as python -m
    try:
        if command.extra is not None:
            require(command.extra, f"blockspace {args[0]}")
        from blockspace.compile_notice import watch

        watch()  # every command may build the fast manager, whose first run compiles its kernels
        status = int(importlib.import_module(command.module).main(args[1:]) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at exit
        return status
    except MissingExtraError as error:
        return refuse(error)
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly, as a Unix tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's final flush of stdout must not fail again
        return 1


if __name__ == "__main__":
    sys.exit(main())
