"""``--gpu-cost``: what a GPU-hour costs, one price for every GPU or one per GPU.

Why per GPU: ``--find min-cost`` weighs an H100 against an A100 or an
L40S, and they rent at different prices; one number would rank the
configurations by GPU count alone. No price is built in: prices change by
the month and by the contract, so the user gives them.

``--gpu-cost 3.0`` prices every GPU at $3.00 an hour; ``--gpu-cost
H100-SXM=3.0,A100-80GB-SXM=1.8`` prices those two (names as ``--gpu`` takes
them), and a run on any other GPU is refused before anything runs.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from blockspace.errors import InvalidArgumentError
from blockspace.simulator.gpus import gpu_named

ANY = ""  # the name a single price goes under: every GPU


@dataclass(frozen=True)
class GpuCost:
    """Dollars a GPU-hour by GPU name (``ANY``: every GPU), as ``--gpu-cost`` gave them."""

    prices: tuple[tuple[str, float], ...]

    def of(self, gpu: str) -> float | None:
        """The price of a GPU-hour of ``gpu`` (a ``--gpu`` name), None where none was given."""
        return dict(self.prices).get(ANY, dict(self.prices).get(gpu))

    def price(self, gpu: str | None) -> float:
        """A run's price of a GPU-hour on ``gpu`` (None: the linear clock's, which has no name);
        ``InvalidArgumentError`` where none was given, before any run."""
        if gpu is None and ANY not in dict(self.prices):
            raise InvalidArgumentError(f"--gpu-cost {self} prices GPUs by name: give --gpu, or one price for every GPU")
        dollars = self.of(gpu or ANY)
        if dollars is None:
            raise InvalidArgumentError(f"--gpu-cost {self} has no price for --gpu {gpu}")
        return dollars

    def __str__(self) -> str:
        return ",".join(f"{price:g}" if name == ANY else f"{name}={price:g}" for name, price in self.prices)


def gpu_cost(text: str) -> GpuCost:
    """``--gpu-cost``'s value: ``DOLLARS`` or ``GPU=DOLLARS,GPU=DOLLARS``
    (argparse's ``type``; a bad one is ``ArgumentTypeError``, one ``error:`` line)."""
    prices: dict[str, float] = {}
    for part in text.split(","):
        name, equals, number = part.rpartition("=")
        if equals and not name.strip():
            raise argparse.ArgumentTypeError(f"expected DOLLARS or GPU=DOLLARS,..., got {text!r}")
        try:
            gpu = gpu_named(name).name if equals else ANY
        except InvalidArgumentError as error:  # an unknown GPU: it names the choices
            raise argparse.ArgumentTypeError(str(error).removeprefix("--gpu: ")) from None
        try:
            price = float(number)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{number.strip()!r} is not a price in dollars") from None
        if not price >= 0 or price == float("inf"):
            raise argparse.ArgumentTypeError(f"a price must be a finite number >= 0, got {number.strip()!r}")
        if gpu in prices or (ANY in prices or gpu == ANY) and prices:
            raise argparse.ArgumentTypeError(f"give one price for each GPU, or one for all, got {text!r}")
        prices[gpu] = price
    return GpuCost(tuple(prices.items()))


__all__ = ["ANY", "GpuCost", "gpu_cost"]
