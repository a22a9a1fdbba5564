"""The simulated GPU: how long a step takes and how many bytes a KV block holds.

The assumption (documented in docs/simulator.md): one H200-class GPU
(141 GB HBM3e at ~4.8 TB/s, ~990 dense BF16 TFLOP/s, PCIe Gen5 to the host)
serving a Llama-3-8B-class model in BF16: 32 layers, 8 KV heads of
dimension 128 (grouped-query attention), ~16 GB of weights.

**Step time.** A step runs one batch: the new (uncached) prompt tokens of
the prefill chunks and one token per decoding sequence. Its time is linear::

    step = step_overhead
         + prefill_token * prefill tokens            (compute bound, ~2 x 8e9 FLOP per token at ~40 % MFU)
         + decode_seq * decoding sequences           (sampling, per-sequence kernels)
         + kv_token_read * context tokens of decodes (attention reads each cached token's K and V)
         + swap_block * blocks swapped in or out     (block bytes over PCIe)

The overhead is mostly reading the weights once per step (16 GB / 4.8 TB/s
~ 3.4 ms) plus launch and scheduling costs. Prefix-cache hits are free:
their tokens are neither computed nor charged. Every constant is a knob.

**KV bytes.** A token stores K and V for every layer::

    bytes per token = 2 x num_layers x num_kv_heads x head_dim x dtype bytes
                    = 2 x 32 x 8 x 128 x 2 = 128 KiB
    bytes per block = block_size x bytes per token          (2 MiB at block size 16)

so ``--kv-memory-gib`` and ``--swap-space-gib`` become block counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from blockspace.errors import InvalidConfigError
from blockspace.simulator import clock

GIB = 2**30


@dataclass(frozen=True)
class StepTimeModel:
    """Seconds per step as a linear function of the batch (see module doc)."""

    step_overhead_ms: float = 4.0
    prefill_token_us: float = 45.0
    decode_seq_us: float = 40.0
    kv_token_read_ns: float = 30.0  # 128 KiB per token at ~4.4 TB/s effective
    swap_block_us: float = 45.0  # 2 MiB per block at ~48 GB/s (PCIe Gen5 x16, effective)

    def __post_init__(self) -> None:
        for name in ("step_overhead_ms", "prefill_token_us", "decode_seq_us", "kv_token_read_ns", "swap_block_us"):
            value = getattr(self, name)
            if not value >= 0:
                raise InvalidConfigError(f"{name} must be >= 0, got {value!r}")
        if self.step_overhead_ms + self.prefill_token_us + self.decode_seq_us <= 0:
            raise InvalidConfigError("a step must take some time: give the overhead or a per-token cost a value > 0")

    kind = clock.LINEAR
    error = None  # five assumed constants: no measured error, so no range

    def coefficients(self, block_size: int) -> tuple[float, ...]:
        """The clock's coefficients (``clock.step_seconds``), in this order and these units."""
        return (self.step_overhead_ms, self.prefill_token_us, self.decode_seq_us, self.kv_token_read_ns,
                self.swap_block_us)  # fmt: skip

    def step_seconds(
        self, num_prefill_tokens: int, num_decode_seqs: int, num_context_tokens: int, num_swapped_blocks: int
    ) -> float:
        """A step's seconds (``clock.step_seconds``: the linear clock reads no more of the batch)."""
        return clock.step_seconds(
            clock.LINEAR, self.coefficients(0), num_prefill_tokens, num_decode_seqs, 0, num_context_tokens, 0, 0,
            num_swapped_blocks,
        )  # fmt: skip

    def describe(self) -> str:
        """The clock in one line, as the summary names it."""
        return (
            f"linear, {self.step_overhead_ms:g} ms a step + {self.prefill_token_us:g} us a prefill token + "
            f"{self.decode_seq_us:g} us a decode + {self.kv_token_read_ns:g} ns a context token"
        )


@dataclass(frozen=True)
class KVCacheModel:
    """Bytes of KV cache per token of the simulated model."""

    num_layers: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def bytes_per_block(self, block_size: int) -> int:
        return block_size * self.bytes_per_token

    def num_blocks(self, gib: float, block_size: int) -> int:
        """Whole blocks that fit in ``gib`` GiB."""
        if not gib >= 0:
            raise InvalidConfigError(f"memory must be >= 0 GiB, got {gib!r}")
        return int(gib * GIB) // self.bytes_per_block(block_size)


__all__ = ["GIB", "KVCacheModel", "StepTimeModel"]
