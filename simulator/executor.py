"""Where many independent runs go: this process, a pool of worker
processes, or a Ray cluster.

Why its own module: a sweep (``sweep.py``) and the searches
(``capacity.py``, ``fleet_size.py``) all hand out runs that do not depend on one another, and
both want the same choice of executor (``--workers``, ``--executor``).
Worker processes are spawned, so each starts clean; Ray's ``Pool`` has the
same interface and spreads the runs over a cluster.

On Ctrl-C (or a run that fails) the pool is terminated, not joined: the
runs still going are not wanted, and joining would wait for them. Its
workers never hear SIGINT themselves (``interrupts.worker_pool``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from blockspace.interrupts import worker_pool
from blockspace.ray_cluster import join, ray_module, use_address

IN_POOL = False  # True in a worker of a pool (``mark_pool_worker``): the pool already runs one run a core
Job = TypeVar("Job")
Result = TypeVar("Result")
EXECUTORS = ("process", "ray")


def ray_pool() -> type:
    """Ray's ``Pool`` class (``MissingExtraError`` naming the [ray] extra
    without Ray), this process joined to its cluster (``ray_cluster.join``)."""
    ray_module()
    from ray.util.multiprocessing import Pool

    join()
    return Pool


def use_ray(address: str | None) -> None:
    """Runs go to Ray: checked installed, and the cluster at ``address``
    (``--address``, else ``RAY_ADDRESS``, else a local one) joined, before any work."""
    use_address(address)
    join()


def mark_pool_worker() -> None:
    """A pool's initializer: this process is one of its workers (``IN_POOL``)."""
    global IN_POOL
    IN_POOL = True


def threads_for(replicas: int) -> int:
    """How many replicas of a fleet replayed apart (``fleet.py``) go at once
    in this process: one a core it may use, at most its replicas; one in a
    pool's worker, whose siblings already take the other cores."""
    return 1 if IN_POOL else max(1, min(replicas, len(os.sched_getaffinity(0))))


def _pool(executor: str, workers: int) -> Any:
    """A pool with ``imap_unordered`` (worker processes, or Ray's), as a
    context (``interrupts.worker_pool``): terminated if the block raises."""
    if executor == "ray":
        return worker_pool(lambda: ray_pool()(processes=workers, initializer=mark_pool_worker))
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    return worker_pool(lambda: spawn.Pool(processes=workers, initializer=mark_pool_worker))


def map_unordered(function: Callable[[Job], Result], jobs: list[Job], workers: int, executor: str) -> Iterator[Result]:
    """``function(job)`` of every job, as each finishes. One worker runs them
    here, in order; more use a pool (``function`` must then be a module-level
    function, and the jobs picklable). Ctrl-C, a run that fails, or a caller
    that stops reading ends the pool's workers at once."""
    if executor == "process" and (workers == 1 or len(jobs) == 1):
        yield from map(function, jobs)
        return
    with _pool(executor, min(workers, len(jobs))) as pool:
        yield from pool.imap_unordered(function, jobs)


def rounds(
    function: Callable[[Job], Result],
    job_of: Callable[[Any], Job],
    order: Callable[[Result], float],
    workers: int,
    executor: str,
    say: Callable[[str], None] | None = None,
    said: Callable[[Result], str] = str,
) -> Callable[[list[Any]], Iterator[Result]]:
    """``evaluate(points)`` for a search (``capacity.py``, ``fleet_size.py``):
    each point's job (``job_of``) run in parallel, each answer as it comes
    (so that a search stopped by Ctrl-C keeps those of its last round);
    with ``say``, once the round is over, one line of what each answered
    (``said``), in ``order``'s order (the variable each answer was run at):
    a search over a long trace takes minutes, and a silent one looks hung."""

    def evaluate(points: list[Any]) -> Iterator[Result]:
        answers = []
        for answer in map_unordered(function, [job_of(point) for point in points], workers, executor):
            answers.append(answer)
            yield answer
        if say is not None:
            say("  tried " + ", ".join(said(answer) for answer in sorted(answers, key=order)))

    return evaluate


__all__ = ["EXECUTORS", "map_unordered", "ray_pool", "rounds", "use_ray"]
