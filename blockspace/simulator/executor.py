"""Where many independent runs go: this process, a pool of worker
processes, or a Ray cluster.

Why its own module: a sweep (``sweep.py``) and the searches
(``capacity.py``, ``fleet_size.py``) all hand out runs that do not depend on one another, and
both want the same choice of executor (``--workers``, ``--executor``).
Worker processes are spawned, so each starts clean; Ray's ``Pool`` has the
same interface and spreads the runs over a cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from blockspace.errors import MissingExtraError

Job = TypeVar("Job")
Result = TypeVar("Result")
EXECUTORS = ("process", "ray")


def ray_pool() -> type:
    """Ray's ``Pool`` class (``MissingExtraError`` without Ray)."""
    try:
        from ray.util.multiprocessing import Pool
    except ImportError:
        raise MissingExtraError("--executor ray needs Ray installed: pip install ray") from None
    return Pool


def _pool(executor: str, workers: int) -> Any:
    """A pool with ``imap_unordered``: worker processes, or Ray's."""
    if executor == "ray":
        return ray_pool()(processes=workers)
    import multiprocessing

    return multiprocessing.get_context("spawn").Pool(processes=workers)


def map_unordered(function: Callable[[Job], Result], jobs: list[Job], workers: int, executor: str) -> Iterator[Result]:
    """``function(job)`` of every job, as each finishes. One worker runs them
    here, in order; more use a pool (``function`` must then be a module-level
    function, and the jobs picklable)."""
    if executor == "process" and (workers == 1 or len(jobs) == 1):
        yield from map(function, jobs)
        return
    pool = _pool(executor, min(workers, len(jobs)))
    try:
        yield from pool.imap_unordered(function, jobs)
    finally:
        pool.close()
        pool.join()


def rounds(
    function: Callable[[Job], dict[str, Any]],
    job_of: Callable[[Any], Job],
    order: str,
    workers: int,
    executor: str,
    say: Callable[[str], None] | None = None,
    said: Callable[[dict[str, Any]], str] = str,
) -> Callable[[list[Any]], list[dict[str, Any]]]:
    """``evaluate(points)`` for a search (``capacity.py``, ``fleet_size.py``):
    each point's job (``job_of``) run in parallel, the answers sorted by
    their ``order`` key; with ``say``, one line a round of what each
    answered (``said``): a search over a long trace takes minutes, and a
    silent one looks hung."""

    def evaluate(points: list[Any]) -> list[dict[str, Any]]:
        jobs = [job_of(point) for point in points]
        answers = sorted(map_unordered(function, jobs, workers, executor), key=lambda answer: answer[order])
        if say is not None:
            say("  tried " + ", ".join(said(answer) for answer in answers))
        return answers

    return evaluate


__all__ = ["EXECUTORS", "map_unordered", "ray_pool", "rounds"]
