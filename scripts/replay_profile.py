"""Where a replay's time goes, kernel by kernel: ``blockspace simulate`` under
``perf``, with the compiled code named.

Why a script and not timers in the loop: the compiled engine is one Numba
function calling fast's kernels, and a timer around a 100 ns kernel costs
more than the kernel. ``perf record`` samples the running process instead,
and this script tells perf which compiled function each sample is in: at
exit, the child process writes ``/tmp/perf-PID.map`` (perf's format for
code made at run time) from every Numba function it compiled.

Numba's cache holds no symbol names, so the child compiles afresh into a
temporary cache folder (about a minute and a half; the first samples are the
compiler, and only the compiled functions are counted). A function LLVM
inlined into its caller counts as the caller.

    python scripts/replay_profile.py -- --trace TRACE [simulate options]

prints, for each compiled function, its samples as seconds and its share of
all samples in compiled code (the compiler's own time is in LLVM's, not
counted). Needs Linux ``perf``.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

FREQUENCY = 999  # samples a second


def short_name(symbol: str) -> str:
    """``module.function`` of a Numba symbol (``_ZN10blockspace4fast4pool4takeB4v300...``)."""
    if not symbol.startswith("_ZN"):
        return symbol
    parts, position = [], 3
    while position < len(symbol) and symbol[position].isdigit():
        end = position
        while symbol[end].isdigit():
            end += 1
        length = int(symbol[position:end])
        parts.append(symbol[end : end + length])
        position = end + length
    return ".".join(parts[-2:]) if parts else symbol


def write_perf_map() -> None:
    """``/tmp/perf-PID.map``: start, size and name of every compiled function."""
    import gc

    from numba.core.dispatcher import Dispatcher

    starts: set[tuple[int, str]] = set()
    for candidate in gc.get_objects():
        if not isinstance(candidate, Dispatcher):
            continue
        for compiled in candidate.overloads.values():
            library = compiled.library
            for function in library._final_module.functions:
                if not function.is_declaration:
                    address = library.get_pointer_to_function(function.name)
                    if address:
                        starts.add((address, short_name(function.name)))
    ordered = sorted(starts)
    with open(f"/tmp/perf-{os.getpid()}.map", "w") as out:
        for (address, name), after in zip(ordered, [*ordered[1:], (ordered[-1][0] + 4096, "")]):
            out.write(f"{address:x} {min(after[0] - address, 1 << 20):x} {name}\n")


def child(arguments: list[str]) -> int:
    atexit.register(write_perf_map)
    from blockspace.cli import main

    return main(["simulate", *arguments])


def profile(arguments: list[str]) -> int:
    if shutil.which("perf") is None:
        print("error: needs Linux perf on the PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="replay-profile-") as folder:
        data = os.path.join(folder, "perf.data")
        environment = {**os.environ, "NUMBA_CACHE_DIR": os.path.join(folder, "numba")}
        command = ["perf", "record", "-q", "-F", str(FREQUENCY), "-o", data, sys.executable, __file__, "--child"]
        ran = subprocess.run([*command, *arguments], env=environment)
        if ran.returncode in (2, 130):  # its arguments refused (it said why), or Ctrl-C
            return ran.returncode
        if ran.returncode != 0:
            print(f"error: the profiled command exited {ran.returncode}", file=sys.stderr)
            return 1
        report = subprocess.run(
            ["perf", "report", "-i", data, "--no-children", "--sort", "sym", "--stdio", "-q", "-n"],
            capture_output=True,
            text=True,
        )
    if report.returncode != 0:
        print(f"error: perf report exited {report.returncode}: {report.stderr.strip()[-300:]}", file=sys.stderr)
        return 1
    samples: Counter[str] = Counter()
    for line in report.stdout.splitlines():
        fields = line.split()  # share, samples, [.], symbol
        if len(fields) == 4 and fields[0].endswith("%") and fields[2] == "[.]" and is_compiled(fields[3]):
            samples[fields[3]] += int(fields[1])
    total = sum(samples.values())
    print(f"{'compiled function':<36} {'seconds':>8} {'share':>7}")
    for name, count in samples.most_common():
        if count >= 0.005 * total:
            print(f"{name:<36} {count / FREQUENCY:8.2f} {100 * count / total:6.1f}%")
    print(f"{'all compiled code':<36} {total / FREQUENCY:8.2f} {100.0:6.1f}%")
    return 0


def is_compiled(name: str) -> bool:
    """A name from the perf map (``module.function``), not one of Python's or LLVM's."""
    module, _, function = name.partition(".")
    return module.isidentifier() and function.isidentifier()


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("simulate", nargs=argparse.REMAINDER, help="blockspace simulate's options, after --")
    arguments = parser.parse_args().simulate
    return profile(arguments[1:] if arguments[:1] == ["--"] else arguments)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: perf and the child hear it too; the temporary folder is gone
        sys.exit(130)
