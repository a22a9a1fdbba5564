"""A run's memory, estimated before it starts, and the limit it must fit.

Why: a fleet's memory grows with its replicas. A run that will not fit is
refused by name before any work (``FleetMemoryError``: the command's one
``error:`` line), and ``--find min-replicas`` stops its doubling at the
largest fleet that fits; without this, such a run works for minutes and is
then killed by the kernel, or ends in ``MemoryError``.

How the estimate is derived (``estimate``), in bytes:

- ``ENGINE_BYTES``: what a run adds to the process before its first
  request, the kernels loaded (measured: a one-request replay's address
  space grew 231 MB past the imports, its resident set 151 MB);
- the replicas held at once (all of them on one clock; one at a time for a
  fleet replayed apart, ``fleet.py``) times one replica's **idle bytes**:
  measured here, by building one replica as the fleet would, with Python's
  allocator traced (``idle_bytes``; numpy reports its buffers there too).
  At the default configuration, the compiled engine's is 4.8 MB, 4.4 MB of
  it the GPU pool's per-block arrays (49,152 blocks);
- what grows with the work: each prompt block a replica caches takes a
  content key (``BLOCK_BYTES``: its tokens, parent and extra ids, two hash
  slots and a pool index entry, twice over since the table doubles),
  at most a full key table per replica held; and each output token at
  most a step of the results' timeline (its row and its merged copy, and
  an inter-token gap: ``TOKEN_BYTES``, measured); and each replica's
  result and summary, held to the end whether it got work or not
  (``RESULT_BYTES``, measured).

Tested (``tests/test_fleet_memory.py``) to be within a factor of 2 of the
resident set measured; the figures are in
docs/measurements/2026-12-06-replica-memory.md.

The limit (``memory_limit``) is the least room left under: the
address-space limit (``ulimit -v``, ``RLIMIT_AS``) less the address space
the process maps now; the cgroup's memory limit (v2 ``memory.max``, v1
``memory.limit_in_bytes``) less its usage; and the memory available
(``MemAvailable`` in /proc/meminfo).
"""

from __future__ import annotations

import math
import resource
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from blockspace.errors import InvalidArgumentError
from blockspace.simulator.compiled.state import array_bytes
from blockspace.simulator.runs import SimulationConfig
from blockspace.workloads import TraceRequest

ENGINE_BYTES = 256 << 20  # the kernels loaded and the first buffers (231 MB of address space measured)
TOKEN_BYTES = 256  # an output token's share of the results, at most (207 B measured: 1,024 replicas, one a step)
RESULT_BYTES = 32 << 10  # a replica's result and summary (24 KB measured: 100,000 replicas against 1,024)
KEY_FIELDS_BYTES = 48  # a key's parent and extra ids, two hash slots, an entry in each pool's key index
GIB = 1 << 30


class FleetMemoryError(InvalidArgumentError, MemoryError):
    """A run whose estimated memory is more than the room it has (``check_fits``)."""


@dataclass(frozen=True)
class Limit:
    """The room a run has, in bytes, and what set it, in words."""

    bytes: int
    name: str


@dataclass(frozen=True)
class Estimate:
    """A run's memory, as ``estimate`` derives it (the module docstring)."""

    bytes: int  # all of it
    replicas_held: int  # replicas whose state is held at once
    idle_bytes: int  # one replica's, before any work
    work_bytes: int  # what grows with the requests


def idle_bytes(manager_class: type, config: SimulationConfig) -> int:
    """The bytes one replica of ``config`` holds before it gets work: one is
    built as a fleet builds it, with Python's allocator traced."""
    single = config.single()
    build = _replica_builder(manager_class, single)
    build()  # the modules' first allocations are not the replica's
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        replica = build()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        if not tracing:
            tracemalloc.stop()
    del replica
    return max(held, 0)


def _replica_builder(manager_class: type, config: SimulationConfig) -> Callable[[], object]:
    """A function that builds one idle replica of ``config`` as its engine's fleet does."""
    if config.engine == "compiled":
        from blockspace.simulator.compiled.replica import CompiledReplica, FleetTrace

        shared = FleetTrace.of([], config)
        return lambda: CompiledReplica(shared, manager_class, config)
    from blockspace.simulator.simulation import Simulation

    return lambda: Simulation([], manager_class, config)


def replicas_held(config: SimulationConfig) -> int:
    """Replicas whose state is held at once: all, on one clock; apart
    (``fleet.py``), as many as go at once (``executor.threads_for``)."""
    from blockspace.simulator.executor import threads_for

    apart = config.engine != "python" and not config.reads_replicas
    return threads_for(config.replicas) if apart else config.replicas


def estimate(trace: list[TraceRequest], manager_class: type, config: SimulationConfig) -> Estimate:
    """The bytes a replay of ``trace`` through ``config``'s fleet will add to this process."""
    block_size = config.scheduler.block_size
    held = replicas_held(config)
    idle = idle_bytes(manager_class, config)
    key_bytes = 8 * block_size + KEY_FIELDS_BYTES
    prompt_blocks = sum(entry.input_length // block_size for entry in trace) * config.num_samples
    full_table = 4 * (config.num_gpu_blocks + config.num_cpu_blocks) * key_bytes  # twice the blocks, doubled
    keys = min(2 * prompt_blocks * key_bytes, held * full_table) if config.scheduler.enable_prefix_caching else 0
    cap = math.inf if config.max_output_len is None else config.max_output_len
    tokens = sum(min(entry.output_length, cap) for entry in trace) * config.num_samples
    work = int(keys + tokens * TOKEN_BYTES + config.replicas * RESULT_BYTES)
    return Estimate(ENGINE_BYTES + held * idle + work, held, idle, work)


def memory_limit() -> Limit:
    """The least room left under the process's limits (the module docstring)."""
    rooms = [Limit(_available(), "the memory available (MemAvailable)")]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        rooms.append(Limit(soft - _mapped(), "the address-space limit (ulimit -v)"))
    cgroup = _cgroup_room()
    if cgroup is not None:
        rooms.append(Limit(cgroup, "the cgroup's memory limit"))
    return min(rooms, key=lambda limit: limit.bytes)


def check_fits(
    trace: list[TraceRequest], manager_class: type, config: SimulationConfig, limit: Limit | None = None,
    share: int = 1,
) -> Estimate:  # fmt: skip
    """The run's estimate; ``FleetMemoryError`` if it is more than ``limit``
    (default: ``memory_limit()``) divided among ``share`` runs at once (a
    sweep's workers), saying both."""
    needed = estimate(trace, manager_class, config)
    limit = memory_limit() if limit is None else limit
    if share > 1:
        limit = Limit(limit.bytes // share, f"{limit.name}, for each of {share} runs at once")
    if needed.bytes > limit.bytes:
        raise FleetMemoryError(
            f"--replicas {config.replicas}: the run needs about {needed.bytes / GIB:.1f} GiB "
            f"({needed.replicas_held:,} replica(s) held at once, {needed.idle_bytes / 2**20:.1f} MiB each before any "
            f"work), more than the {max(limit.bytes, 0) / GIB:.1f} GiB left under {limit.name}"
        )
    return needed


def largest_fleet(
    trace: list[TraceRequest], manager_class: type, config: SimulationConfig, most: int, limit: Limit, share: int = 1
) -> int:
    """The most replicas, up to ``most``, whose run fits in ``limit`` divided
    among ``share`` runs at once (0: not even one). The estimate grows with
    the count, so a bisection finds it."""
    room = Limit(limit.bytes // share, limit.name)

    def fits(count: int) -> bool:
        return estimate(trace, manager_class, replace(config, replicas=count, prefill_replicas=0)).bytes <= room.bytes

    if fits(most):
        return most
    low, high = 0, most  # fits(low) (or low is 0), not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def fleet_cap(
    trace: list[TraceRequest], manager_class: type, config: SimulationConfig, most: int, share: int
) -> tuple[int, str | None]:
    """For ``--find min-replicas``: the largest fleet, up to ``most``, that
    fits in memory with ``share`` runs at once, and a sentence saying so
    where memory sets it (None where ``most`` fits); ``FleetMemoryError``
    where not even one replica does."""
    limit = memory_limit()
    count = largest_fleet(trace, manager_class, config, most, limit, share)
    if count == 0:
        check_fits(trace, manager_class, config.single(), Limit(limit.bytes // share, limit.name))
    if count >= most:
        return count, None
    needed = estimate(trace, manager_class, replace(config, replicas=count + 1, prefill_replicas=0))
    return count, (
        f"memory: at most {count:,} replicas fit ({count + 1:,} need about {needed.bytes / GIB:.1f} GiB a run, "
        f"{share} run(s) at once, {max(limit.bytes, 0) / GIB:.1f} GiB left under {limit.name}); "
        f"the search stops its doubling at {count:,}"
    )


def _available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable line")


def _mapped() -> int:
    """The address space the process maps now."""
    return int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()


def _cgroup_room() -> int | None:
    """The cgroup's memory limit less its usage, or None where none is set."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:  # v2
            folder = Path("/sys/fs/cgroup") / path.lstrip("/")
            limit, usage = folder / "memory.max", folder / "memory.current"
        elif "memory" in controllers.split(","):  # v1
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            limit, usage = folder / "memory.limit_in_bytes", folder / "memory.usage_in_bytes"
        else:
            continue
        try:
            text = limit.read_text().strip()
            if text == "max" or int(text) >= 1 << 60:  # v1 says "none" with a number near 2**63
                return None
            return int(text) - int(usage.read_text())
        except (OSError, ValueError):
            return None
    return None


__all__ = ["Estimate", "FleetMemoryError", "Limit", "array_bytes", "check_fits", "estimate", "fleet_cap", "idle_bytes",
           "largest_fleet", "memory_limit", "replicas_held"]  # fmt: skip
