"""What a run is given and what it leaves, for both engines.

Why its own module: the Python engine (``simulation.py``) and its compiled
twin (``compiled/engine.py``) are peers. Each takes a ``SimulationConfig``
and gives back a ``SimulationResult``; neither imports the other, and what
they share lives here (issue #52). ``simulation`` and ``scheduler`` still
export these names, so every import path that worked keeps working.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from blockspace.errors import BlockSpaceError, InvalidConfigError
from blockspace.simulator.clock import Clock
from blockspace.simulator.decisions import StepRecord
from blockspace.simulator.failures import Failure, Failures, outages_of
from blockspace.simulator.gpu import StepTimeModel
from blockspace.simulator.metrics import Metrics
from blockspace.simulator.routers import ROUTERS, STATIC

PREEMPTION_MODES = ("recompute", "swap")
STEP_PATHS = ("auto", "calls", "rows")  # auto: the row API where the manager offers it (row_step.py)


@dataclass(frozen=True)
class SchedulerConfig:
    """vLLM's scheduler knobs (names as in vLLM's ``SchedulerConfig``)."""

    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"
    record_tables: bool = False  # hash block tables, CoW pairs and swap mappings into each StepRecord
    step: str = "auto"  # how decodes reach the manager: STEP_PATHS

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidConfigError(f"{name} must be a positive int, got {value!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InvalidConfigError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}), as vLLM requires"
            )
        if self.enable_prefix_caching and self.max_num_batched_tokens < self.block_size:
            raise InvalidConfigError("with prefix caching, max_num_batched_tokens must hold at least one block")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise InvalidConfigError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        if self.step not in STEP_PATHS:
            raise InvalidConfigError(f"step must be one of {STEP_PATHS}, got {self.step!r}")


ENGINES = ("python", "compiled")  # simulation.py and its twin compiled/engine.py (engines.py picks one)


class SimulationStalledError(BlockSpaceError, RuntimeError):
    """Requests are queued, none can run, and nothing will change that."""


@dataclass(frozen=True)
class SimulationConfig:
    """Everything that decides a run besides the trace and the manager."""

    num_gpu_blocks: int
    num_cpu_blocks: int
    watermark: float = 0.01
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    step_time: Clock = field(default_factory=StepTimeModel)  # linear, a --step-model file, or a roofline
    num_samples: int = 1  # n: samples per trace request, each its own request of one sequence (vLLM 0.9.2)
    max_output_len: int | None = None  # cap on each request's output length
    engine: str = "python"  # which engine replays it (engines.py)
    replicas: int = 1  # engines of this configuration behind one router, on one clock (fleet.py)
    router: str = "round_robin"  # how the router picks a replica (routers.py)
    router_weight: float = 1.0  # kv_aware: the weight of the blocks to prefill against the load
    router_lag_s: float | None = None  # kv_aware: it sees the caches as they were this long ago (None: as they are)
    max_concurrency: int | None = None  # a closed loop: at most this many requests in flight (fleet.py)
    gpu_cost_per_hour: float | None = None  # dollars a GPU-hour (--gpu-cost): the summary's price; decides nothing
    failures: tuple[Failure, ...] = ()  # replicas that go down (--fail; failures.py)
    prefill_replicas: int = 0  # above 0: that many of the replicas prefill, the rest decode (disaggregated.py)
    kv_link_gbps: float = 400.0  # disaggregated: gigabits a second from a prefill replica to a decode replica
    kv_block_bytes: int = 0  # disaggregated: the bytes of one block's KV, all layers, that cross the link

    def __post_init__(self) -> None:
        if not isinstance(self.num_samples, int) or self.num_samples < 1:
            raise InvalidConfigError(f"n must be a positive int, got {self.num_samples!r}")
        if self.max_output_len is not None and self.max_output_len < 1:
            raise InvalidConfigError(f"max_output_len must be >= 1, got {self.max_output_len}")
        if self.engine not in ENGINES:
            raise InvalidConfigError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise InvalidConfigError(f"replicas must be a positive int, got {self.replicas!r}")
        if self.router not in ROUTERS:
            raise InvalidConfigError(f"router must be one of {tuple(ROUTERS)}, got {self.router!r}")
        if not self.router_weight >= 0:
            raise InvalidConfigError(f"router_weight must be >= 0, got {self.router_weight!r}")
        if self.router_lag_s is not None and (self.router != "kv_aware" or not self.router_lag_s >= 0):
            raise InvalidConfigError(
                f"router_lag_s is kv_aware's and >= 0, got {self.router_lag_s!r} for {self.router}"
            )
        if self.router_lag_s is not None and self.max_concurrency is not None:
            raise InvalidConfigError("router_lag_s: a closed loop's sending times are not known ahead of their arrival")
        if self.max_concurrency is not None and (not isinstance(self.max_concurrency, int) or self.max_concurrency < 1):
            raise InvalidConfigError(f"max_concurrency must be a positive int, got {self.max_concurrency!r}")
        if self.gpu_cost_per_hour is not None and not self.gpu_cost_per_hour >= 0:
            raise InvalidConfigError(f"gpu_cost_per_hour must be >= 0, got {self.gpu_cost_per_hour!r}")
        if self.failures:
            outages_of(self.failures, self.replicas)  # a replica the fleet has, never down twice at once
            if self.num_samples > 1:
                raise InvalidConfigError("failures retry a trace request whole: n above 1 would send again samples"
                                         " already done")  # fmt: skip
            if self.max_concurrency is not None:
                raise InvalidConfigError("failures go with arrivals of their own: a closed loop's in-flight count"
                                         " would hold the requests a failed replica lost")  # fmt: skip
        if self.prefill_replicas:
            if not isinstance(self.prefill_replicas, int) or not 0 < self.prefill_replicas < self.replicas:
                raise InvalidConfigError(f"prefill_replicas must leave a decode replica: {self.prefill_replicas!r} of"
                                         f" {self.replicas} replicas")  # fmt: skip
            if not self.kv_link_gbps > 0 or self.kv_block_bytes < 1:
                raise InvalidConfigError(f"a disaggregated fleet moves KV over a link of kv_link_gbps > 0 (got"
                                         f" {self.kv_link_gbps!r}) in blocks of kv_block_bytes >= 1 (got"
                                         f" {self.kv_block_bytes!r})")  # fmt: skip
            for name, default in (("failures", ()), ("max_concurrency", None), ("router_lag_s", None)):
                if getattr(self, name) != default:
                    raise InvalidConfigError(f"a disaggregated fleet takes no {name} (not modelled there)")
            if self.num_samples > 1:
                raise InvalidConfigError("a disaggregated fleet moves requests of one sample: n must be 1")

    def single(self) -> SimulationConfig:
        """The configuration of one of its engines: no fleet, no closed loop, no failure."""
        return replace(self, replicas=1, max_concurrency=None, failures=(), prefill_replicas=0, router_lag_s=None)

    @property
    def gpus(self) -> int:
        """The GPUs the run holds: its replicas, each over its clock's tensor-parallel GPUs (one without a roofline)."""
        return self.replicas * getattr(self.step_time, "tensor_parallel", 1)

    @property
    def reads_replicas(self) -> bool:
        """Does the run read its engines as they run: a router that reads
        them, or a closed loop waiting for a request to be done? Then its
        engines run on one clock (fleet.py). Failures too: the router sends
        a failed replica's requests again, to the live ones."""
        return (
            (self.replicas > 1 and self.router not in STATIC) or self.max_concurrency is not None or bool(self.failures)
        )


@dataclass(frozen=True)
class Transfers:
    """What crossed a disaggregated fleet's link (``disaggregated.py``): each moved request's seconds, the bytes."""

    seconds: list[float]
    bytes: int


@dataclass
class SimulationResult:
    """What a run leaves: every figure in ``metrics``, the decision records
    (to compare runs), and the manager itself (to check its state)."""

    manager_name: str
    config: SimulationConfig
    metrics: Metrics
    records: list[StepRecord]
    manager: Any
    replicas: list[SimulationResult] = field(default_factory=list)  # a fleet's, each replica's own (fleet.py)
    assignment: list[int] = field(default_factory=list)  # a fleet's: the replica of each trace request, in order
    failures: Failures | None = None  # with --fail: the outages, and the requests they sent again
    transfers: Transfers | None = None  # a disaggregated fleet's: the KV it moved from prefill to decode


def manager_name_of(manager_class: type) -> str:
    """A manager as results and reports name it: its module and class."""
    return f"{manager_class.__module__}.{manager_class.__qualname__}"


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a replay, back as it was after (``Simulation.run`` says why)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


__all__ = [
    "ENGINES",
    "PREEMPTION_MODES",
    "STEP_PATHS",
    "SchedulerConfig",
    "SimulationConfig",
    "SimulationResult",
    "SimulationStalledError",
    "Transfers",
    "collector_paused",
    "manager_name_of",
]
