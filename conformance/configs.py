"""Manager configurations the state machine runs, grouped in families.

Each family is a Hypothesis strategy of ``Config``. Pools are small on
purpose (1-10 GPU blocks, 0-12 CPU blocks, prompts up to ``3 * bs + 1``
tokens): admission answers LATER and NEVER, appends run out of blocks,
idle cached blocks get evicted and swaps fail for lack of room.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from blockspace.conformance.pool_config import ManagerConfig

BLOCK_SIZES = (1, 2, 4, 16)
WATERMARKS = (0.0, 0.01, 0.1, 0.25)
VLLM_DEFAULTS = {"watermark": 0.01, "sliding_window": None, "enable_caching": False}


@dataclass(frozen=True)
class Config(ManagerConfig):
    max_lookahead: int = 0  # lookahead slots drawn from 0..max_lookahead

    def manager_kwargs(self) -> dict[str, Any]:
        """Constructor arguments, as vLLM names them; those equal to vLLM's
        defaults are left out, so the managers' defaults are exercised too."""
        return {k: v for k, v in self.kwargs().items() if k not in VLLM_DEFAULTS or VLLM_DEFAULTS[k] != v}


@st.composite
def configs(
    draw: st.DrawFn,
    *,
    caching: bool = False,
    sliding_window: bool = False,
    encoder_decoder: bool = False,
) -> Config:
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    window = None
    if sliding_window:
        window = draw(st.sampled_from((0, 1, block_size, 2 * block_size + 1)))
    return Config(
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(3, 16) if sliding_window else st.integers(1, 10)),  # room to drop blocks
        num_cpu_blocks=draw(st.integers(0, 12)),
        watermark=draw(st.sampled_from(WATERMARKS)),
        sliding_window=window,
        enable_caching=caching,
        encoder_decoder=encoder_decoder,
        max_lookahead=draw(st.sampled_from((0, 0, 1, block_size + 1))),
    )


FAMILIES = {
    "plain": dict(),
    "caching": dict(caching=True),
    "sliding_window": dict(sliding_window=True),
    "encoder_decoder": dict(encoder_decoder=True),
}

# The capability a family needs from an implementation (None: every manager).
FAMILY_CAPABILITY = {
    "plain": None,
    "caching": "supports_caching",
    "sliding_window": "supports_sliding_window",
    "encoder_decoder": "supports_encoder_decoder",
}


def family_configs(family: str) -> st.SearchStrategy[Config]:
    if family not in FAMILIES:
        raise ValueError(f"unknown configuration family {family!r}: known are {', '.join(FAMILIES)}")
    return configs(**FAMILIES[family])
