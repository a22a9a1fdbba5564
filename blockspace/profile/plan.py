"""What ``blockspace gpu-profile`` measures: the model's shape, and the
steps whose times the five coefficients are fitted to.

The steps are chosen so that each coefficient moves on its own across them:
prefill-only steps of growing prompts (the prefill token cost), decode-only
steps of growing batches at a few context lengths (the per-sequence cost,
and, at a fixed batch, the cost per context token), and mixed steps, as
chunked prefill runs them, which check that the costs add up. Sizes grow by
a factor of four, so a handful of steps spans a wide range and the
smallest, which are mostly the fixed overhead, pin the intercept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from blockspace.simulator.step_model import DTYPE_BYTES  # the dtypes a step-model file's model may name


@dataclass(frozen=True)
class ModelShape:
    """A Llama-style decoder (the defaults: Llama-3-8B's layers in BF16)."""

    num_layers: int = 32
    hidden_size: int = 4096
    num_heads: int = 32
    num_kv_heads: int = 8
    intermediate_size: int = 14336
    dtype: str = "bfloat16"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token in every layer (the simulator's ``KVCacheModel``)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    def block_bytes(self, block_size: int) -> int:
        """What one KV block holds, and so what swapping it moves."""
        return block_size * self.kv_bytes_per_token


class Step(NamedTuple):
    """One batch: ``prefill_tokens`` of one new prompt, and ``decode_seqs``
    sequences each decoding one token over ``context`` cached tokens."""

    prefill_tokens: int
    decode_seqs: int
    context: int


def spread(top: int, count: int) -> list[int]:
    """``top``, a quarter of it, a sixteenth, ... (``count`` sizes at most, none below 1), smallest first."""
    return sorted({max(1, top // 4**k) for k in range(count)})


def plan_steps(max_prefill_tokens: int, max_batch: int, max_context: int) -> list[Step]:
    """The steps to time (see the module docstring), smallest sizes up to the given largest."""
    contexts = spread(max_context, 3)
    prefill = [Step(tokens, 0, 0) for tokens in spread(max_prefill_tokens, 5)]
    decode = [Step(0, batch, context) for batch in spread(max_batch, 5) for context in contexts]
    mixed = [Step(max(1, max_prefill_tokens // 4), max(1, max_batch // 4), context) for context in contexts]
    return prefill + decode + mixed


__all__ = ["DTYPE_BYTES", "ModelShape", "Step", "plan_steps", "spread"]
