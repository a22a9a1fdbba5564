"""Timing helpers shared by the benchmarks: the best of several runs, a
wrapper that clocks every call into a manager, the two implementations,
and the checked arguments and output of a benchmark over a trace."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from blockspace.validation import Range, check_output_file, check_ranges, write_output
from blockspace.workloads import TraceRequest, load_trace_option


def best_time(run: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` runs, in seconds (the least disturbed one)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def implementations() -> dict[str, type]:
    from blockspace.fast import FastBlockSpaceManager
    from blockspace.reference import ReferenceBlockSpaceManager

    return {"reference": ReferenceBlockSpaceManager, "fast": FastBlockSpaceManager}


class Clocked:
    """A manager whose calls are timed one by one: the time spent inside the
    manager, without the scheduler around it (the same wrapper for both)."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._manager, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        self.__dict__[name] = timed
        return timed

    @classmethod
    def overhead(cls, num_calls: int = 100_000) -> float:
        """Seconds the timing adds to each call's measured time (the clock reads
        and the wrapper's call), taken off the replay's time inside the
        manager: a method that does nothing, timed through the wrapper, less
        the same method called directly."""

        class Idle:
            def call(self, value: int) -> None:
                return None

        direct, clocked = Idle().call, cls(Idle())
        timed = clocked.call

        def through_wrapper() -> float:
            clocked.seconds = 0.0
            for value in range(num_calls):
                timed(value)
            return clocked.seconds

        def called_directly() -> float:
            start = time.perf_counter()
            for value in range(num_calls):
                direct(value)
            middle = time.perf_counter()
            for _ in range(num_calls):
                pass
            return (middle - start) - (time.perf_counter() - middle)

        wrapped = min(through_wrapper() for _ in range(5))
        bare = min(called_directly() for _ in range(5))
        return max(0.0, wrapped - bare) / num_calls


def trace_command(
    parser: Any, argv: Sequence[str] | None, ranges: Mapping[str, Range]
) -> tuple[Any, list[TraceRequest]]:
    """A trace benchmark's arguments (``--trace``, ``--max-requests``,
    ``--json`` and the ranges named), all checked, and its trace, read and
    checked before anything is timed; ``BlockSpaceError`` names the wrong option."""
    args = parser.parse_args(argv)
    check_ranges(args, ranges)
    if args.json:
        check_output_file(args.json, "--json")
    return args, load_trace_option(args.trace, args.max_requests)


def report(text: str, figures: dict[str, Any], json_path: Any) -> None:
    """A benchmark's table printed, and its figures written to ``--json`` when given."""
    print(text)
    if json_path:
        write_output(json_path, json.dumps(figures, indent=1))
