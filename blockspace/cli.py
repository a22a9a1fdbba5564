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

import gc
import importlib
import os
import sys
from importlib.metadata import version
from typing import Any, NamedTuple

from blockspace.errors import InvalidArgumentError, MissingExtraError
from blockspace.extras import require
from blockspace.interrupts import say_interrupted
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
    os.environ.setdefault(HUGE_PAGES, "0")  # before numpy is imported
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
    stdout = sys.stdout
    guard = sys.stdout = ClosedPipeGuard(stdout)
    try:
        if command.extra is not None:
            require(command.extra, f"blockspace {args[0]}")
        from blockspace.compile_notice import watch

        watch()  # every command may build the fast manager, whose first run compiles its kernels
        if argv is None:  # the process's own command, not a caller's: its collector is left as it is
            # What the imports made (Numba's objects, some hundred thousand) lives as long as the process:
            # out of the collector's generations, a full collection while a trace loads or a report is made
            # no longer walks it all (0.2 s of a full-trace simulate's 1.6 s outside the replay, measured)
            gc.freeze()
        status = int(importlib.import_module(command.module).main(args[1:]) or 0)
        guard.flush()
    except MissingExtraError as error:
        return refuse(error)
    except KeyboardInterrupt as stop:  # Ctrl-C, wherever it came: one line, 130, no traceback (interrupts.py)
        return say_interrupted(stop)
    finally:
        sys.stdout = stdout
    return CLOSED_PIPE if status == 0 and guard.reader_gone else status


# Why numpy is told not to ask for transparent huge pages (NUMPY_MADVISE_HUGEPAGE=0, unless the
# user set it): on Linux numpy advises huge pages for every array of 4 MB or more, and the
# kernel then zeroes, and may first compact, 2 MB at each first touch. A replay makes such arrays
# (a manager's key table, a loop's logs) and touches them once or twice, so it gains little
# and pays in system time: on the project's 2-core machine a fleet of four replicas spent 0.5 s
# (0.3 to 1.2 s) of system time with them and 0.2 s without, and one replica's median was the
# same either way (docs/measurements/2026-12-05-fleet-cost.md).
HUGE_PAGES = "NUMPY_MADVISE_HUGEPAGE"

# The exit status of a command whose every file was written but whose reader stopped reading
# its standard output early (``blockspace simulate | head -3``): 128 + SIGPIPE, the status a
# shell reports for a Unix tool the closed pipe ended, so that ``set -o pipefail`` scripts see
# it the same way. A failure of the command itself (1, 2) wins over it.
CLOSED_PIPE = 141


class ClosedPipeGuard:
    """Standard output that outlives its reader.

    When the reader goes away (``| head``), a write raises ``BrokenPipeError``.
    Stopping there would lose the files the command had yet to write
    (the plot after the summary), though they do not depend on what was
    printed. So the guard sends the rest of the output to the null device
    and lets the command finish; ``reader_gone`` tells the exit status.
    Everything else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        return self._guarded(self.stream.write, text) or len(text)

    def flush(self) -> None:
        self._guarded(self.stream.flush)

    def _guarded(self, call: Any, *args: Any) -> Any:
        if self.reader_gone:
            return None
        try:
            return call(*args)
        except BrokenPipeError:
            self.reader_gone = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())  # what is still buffered, and Python's last flush, go nowhere
            os.close(devnull)
            return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


if __name__ == "__main__":
    sys.exit(main())
