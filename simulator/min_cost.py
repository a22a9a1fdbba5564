"""``--find min-cost``: the cheapest (GPU, tensor parallelism, replicas) that meets the SLO.

The question a serving engineer brings to a purchase: of the GPUs and
tensor-parallel degrees on offer (``--sweep gpu=H100-SXM,L40S --sweep
tensor_parallel=2,4``), which fleet serves this traffic within the SLO for
the least money? Each configuration is a ``--find min-replicas`` search
(``fleet_size.py``); its fleet costs replicas x tensor-parallel GPUs x the
GPU's price an hour (``--gpu-cost``, ``prices.py``), and the cheapest fleet
that keeps the target wins.

Why dollars an hour and not per token: the traffic is the same for every
configuration, so what one pays an hour to carry it is the comparison; the
price per million output tokens is shown beside it.

A configuration whose model does not fit, or does not split over its
tensor-parallel degree (``roofline.DoesNotFitError``), is no candidate:
it is listed as skipped with the reason, not refused, since finding which
ones fit is part of the question.

With the roofline's clock range (``capacity.ClockRange``), each fleet's
price has a range too, and the cheapest on a faster or slower clock is
named where it is another configuration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blockspace.simulator.fleet_size import ReplicaAnswer

NO_GPU = "GPU"  # the linear clock's GPU, which has no name (gpu.py's assumption)


@dataclass(frozen=True)
class Option:
    """One configuration's fleet at its answer, priced."""

    values: dict[str, Any]  # the swept options' values
    gpu: str
    tensor_parallel: int
    dollars_per_gpu_hour: float
    replicas: int | None  # the fewest that meet the SLO; None: none found
    faster_replicas: int | None  # on the clock faster and slower by its error (None: none found, or no range)
    slower_replicas: int | None
    ranged: bool  # was the clock's range run (a clock with a measured error, and an answer)?
    dollars_per_million_output_tokens: float | None  # at the answer

    def price(self, replicas: int) -> float:
        """What a fleet of ``replicas`` of this configuration costs an hour."""
        return replicas * self.tensor_parallel * self.dollars_per_gpu_hour

    def dollars_per_hour(self, replicas: int | None) -> float | None:
        """``price``, None for no fleet (none found)."""
        return None if replicas is None else self.price(replicas)

    @property
    def name(self) -> str:
        return f"{self.gpu} x TP {self.tensor_parallel}"


@dataclass(frozen=True)
class Skipped:
    """A configuration that could not run, and why."""

    values: dict[str, Any]
    why: str


@dataclass(frozen=True)
class CostAnswer:
    """The searches priced: every option, the skipped, and the cheapest on
    the clock, and on its faster and slower ends where a range was run."""

    options: tuple[Option, ...]
    skipped: tuple[Skipped, ...]
    cheapest: Option | None  # None: no configuration met the SLO
    cheapest_faster: Option | None
    cheapest_slower: Option | None
    clock_error: float | None  # the clock's measured error, where the range was run


def option_of(search: ReplicaAnswer) -> Option:
    """A search's configuration (``search.config``, a ``SimulationConfig``
    with a price) and answer, priced."""
    config = search.config
    assert config is not None and config.gpu_cost_per_hour is not None  # min-cost needs --gpu-cost
    clock = config.step_time
    at = next((point for point in search.curve if point.replicas == search.min_replicas), None)
    ends = search.clock_range
    return Option(
        values=search.values,
        gpu=clock.gpu.name if hasattr(clock, "gpu") else NO_GPU,
        tensor_parallel=getattr(clock, "tensor_parallel", 1),
        dollars_per_gpu_hour=config.gpu_cost_per_hour,
        replicas=search.min_replicas,
        faster_replicas=None if ends is None or ends.faster is None else int(ends.faster),
        slower_replicas=None if ends is None or ends.slower is None else int(ends.slower),
        ranged=ends is not None,
        dollars_per_million_output_tokens=None if at is None else at.dollars_per_million_output_tokens,
    )


def cheapest(options: Sequence[Option], replicas: str = "replicas") -> Option | None:
    """The option whose fleet (its ``replicas`` field: the answer, or an end
    of its range) costs least an hour; on a tie, at the answer, the one that
    drains the traffic sooner (the lower price a token), then the fewer
    GPUs, then the first."""

    def rank(index: int) -> tuple[float, float, int, int]:
        option = options[index]
        count = getattr(option, replicas)
        per_token = option.dollars_per_million_output_tokens if replicas == "replicas" else None
        return (option.dollars_per_hour(count) or 0.0, math.inf if per_token is None else per_token,
                count * option.tensor_parallel, index)  # fmt: skip

    found = [index for index, option in enumerate(options) if getattr(option, replicas) is not None]
    return options[min(found, key=rank)] if found else None


def price(searches: Sequence[ReplicaAnswer], skipped: Sequence[Skipped]) -> CostAnswer:
    """The answer of ``--find min-cost`` from its searches."""
    options = tuple(option_of(search) for search in searches)
    errors = [search.clock_range.error for search in searches if search.clock_range is not None]
    ranged = bool(errors)
    return CostAnswer(
        options=options,
        skipped=tuple(skipped),
        cheapest=cheapest(options),
        cheapest_faster=cheapest(options, "faster_replicas") if ranged else None,
        cheapest_slower=cheapest(options, "slower_replicas") if ranged else None,
        clock_error=errors[0] if ranged else None,
    )


def dollars(amount: float | None) -> str:
    return "-" if amount is None else f"${amount:,.2f}"


def format_costs(answer: CostAnswer, target: str) -> str:
    """A table of the options, the skipped, and the cheapest in a sentence
    (``target``: what the fleets must keep, in words)."""
    lines = [f"{'configuration':<28}  {'replicas':>9}  {'GPUs':>5}  {'$/hour':>11}  {'clock range $/hour':>24}  "
             "$/M output tokens"]  # fmt: skip
    for option in answer.options:
        low, high = (option.dollars_per_hour(count) for count in (option.faster_replicas, option.slower_replicas))
        ends = ["none found" if end is None else dollars(end) for end in (low, high)]
        span = "-" if not option.ranged or option.replicas is None else ends[0] if low == high else " to ".join(ends)
        gpus = "-" if option.replicas is None else f"{option.replicas * option.tensor_parallel:,}"
        count = "none" if option.replicas is None else f"{option.replicas:,}"
        lines.append(
            f"{option.name:<28}  {count:>9}  {gpus:>5}  {dollars(option.dollars_per_hour(option.replicas)):>11}"
            f"  {span:>24}  {dollars(option.dollars_per_million_output_tokens)}"
        )
    for skip in answer.skipped:
        named = ", ".join(f"{name}={value}" for name, value in skip.values.items())
        lines.append(f"skipped {named}: {skip.why}")
    best = answer.cheapest
    if best is None:
        lines.append(f"min cost: no configuration keeps {target}")
        return "\n".join(lines)
    assert best.replicas is not None
    lines.append(
        f"min cost: {best.name}, {best.replicas:,} replica(s) ({best.replicas * best.tensor_parallel:,} GPUs),"
        f" {dollars(best.dollars_per_hour(best.replicas))} an hour, "
        f"{dollars(best.dollars_per_million_output_tokens)} per million output tokens, keeps {target}"
    )
    for end, other, field in (
        ("shorter", answer.cheapest_faster, "faster_replicas"),
        ("longer", answer.cheapest_slower, "slower_replicas"),
    ):
        if other is None or answer.clock_error is None:
            continue
        fleet, at_best = other.price(getattr(other, field)), best.dollars_per_hour(getattr(best, field))
        if at_best is None or fleet < at_best:  # another configuration is cheaper at this end of the range
            lines.append(
                f"  with every step {answer.clock_error:.1%} {end} (the clock's error), {other.name} is cheapest: "
                f"{getattr(other, field):,} replica(s), {dollars(fleet)} an hour"
            )
    return "\n".join(lines)


__all__ = ["CostAnswer", "Option", "Skipped", "cheapest", "format_costs", "option_of", "price"]
