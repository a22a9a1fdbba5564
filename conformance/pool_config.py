"""The configuration every conformance driver shares: a manager's
constructor arguments, and whether requests may carry an encoder prompt.
The Hypothesis machine (``configs.Config``) and the seeded walk
(``walk.Config``) add how they draw calls; this module needs no Hypothesis,
so the walk (and ``blockspace soak``) run without the test extras."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ManagerConfig:
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    watermark: float | None = 0.0  # None: the constructor's own default (not passed)
    sliding_window: int | None = None
    enable_caching: bool = False
    encoder_decoder: bool = False  # requests may carry an encoder prompt

    def args(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The constructor's positional and keyword arguments."""
        keywords: dict[str, Any] = {"sliding_window": self.sliding_window, "enable_caching": self.enable_caching}
        if self.watermark is not None:
            keywords["watermark"] = self.watermark
        return (self.block_size, self.num_gpu_blocks, self.num_cpu_blocks), keywords

    def kwargs(self) -> dict[str, Any]:
        """The constructor's arguments, all by name."""
        positional, keywords = self.args()
        return dict(zip(("block_size", "num_gpu_blocks", "num_cpu_blocks"), positional), **keywords)
