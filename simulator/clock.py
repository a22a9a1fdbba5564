"""How long a step takes: one pure function of the batch and a clock's
coefficients, which both engines call (the compiled one compiled, as
``budget.py``'s rule is: ``numba_cache.ROOTS`` stamps this file with the
compiled parts).

Why one function: the step time decides the clock, so every arrival the
engines admit and every latency they report; two copies of the arithmetic
drift by a rounding and the engines' decisions part. Here it is written
once, on plain floats and ints, in an order both interpreters keep: no
``pow`` (the expected experts a batch touches is an integer power by
repeated squaring), no library call.

A clock is a kind and a tuple of coefficients (``coefficients()`` of
``gpu.StepTimeModel``, the linear clock of five constants and of a
``--step-model`` file, or of ``roofline.Roofline``). The batch is what a
step computes and reads, counted the same way by both engines
(``chunk_attention`` for a prefill chunk):

* ``prefill_tokens``: the prompt tokens computed (cache hits are not);
* ``decodes``: the decoding sequences, one token each;
* ``prefill_seqs``: the prefill chunks (each gives its last token's logits);
* ``decode_context``: the tokens each decode attends to, summed;
* ``prefill_context``: the tokens before each chunk's first computed one
  (its cached and earlier computed tokens), summed: the KV a chunk reads;
* ``prefill_pairs``: (query, key) pairs of the chunks' causal attention;
* ``swapped_blocks``: blocks copied in or out over the host link.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

LINEAR, ROOFLINE = 0, 1  # a clock's kind
# Added to a clock's kind: a replica whose prompts come computed, their KV over a link from a prefill
# replica (disaggregated.py): scheduling a prompt costs it nothing, as in vLLM's v0 disaggregated prefill
RECEIVED = 2

# The roofline's coefficients, in seconds (roofline.py derives them): their places
(
    HOST,  # a fixed host cost per step (scheduling, launch, sampling)
    SWAP_BLOCK,  # one block over the host link
    COMPUTE_TOKEN,  # the linear layers' FLOPs of one token
    COMPUTE_LOGITS,  # the LM head's FLOPs of one sampled token
    COMPUTE_PAIR,  # attention's FLOPs of one (query, key) pair
    WEIGHTS,  # reading the weights every token uses (all but the routed experts)
    NUM_EXPERTS,  # routed experts per layer (0: dense), a count
    EXPERTS_PER_TOKEN,  # a count
    EXPERT,  # reading one routed expert, all layers
    KV_TOKEN,  # reading or writing one token's K and V, all layers
    COMM_TOKEN,  # tensor parallelism's all-reduces of one token's activations, all layers
    COMM_STEP,  # their latency, all layers (0 without tensor parallelism)
) = range(12)
NUM_ROOFLINE = 12


class Clock(Protocol):
    """A clock as the engines take it: its kind and coefficients, and its name for the summary."""

    @property
    def kind(self) -> int: ...

    @property
    def error(self) -> float | None:
        """Its measured relative error (a search's range), None where nobody measured one."""
        ...

    def coefficients(self, block_size: int) -> tuple[float, ...]: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Received:
    """``clock`` on a decode replica of a disaggregated fleet: the same step
    times, less every prompt's forward pass (``RECEIVED``)."""

    clock: Clock

    @property
    def kind(self) -> int:
        return self.clock.kind + RECEIVED

    @property
    def error(self) -> float | None:
        return self.clock.error

    def coefficients(self, block_size: int) -> tuple[float, ...]:
        return self.clock.coefficients(block_size)

    def describe(self) -> str:
        return f"{self.clock.describe()}; prompts received computed (no prefill compute)"


def chunk_attention(start: int, new: int) -> int:
    """(query, key) pairs of a prefill chunk's causal attention: ``new``
    tokens computed after ``start`` earlier ones, each attending to those
    and to the chunk's tokens up to itself."""
    return new * start + new * (new + 1) // 2


def step_seconds(
    kind: int,
    c: Sequence[float],
    prefill_tokens: int,
    decodes: int,
    prefill_seqs: int,
    decode_context: int,
    prefill_context: int,
    prefill_pairs: int,
    swapped_blocks: int,
) -> float:
    """Seconds the step of this batch takes on the clock ``(kind, c)``."""
    if kind >= RECEIVED:  # the prompts' KV was received: their forward pass is not run
        kind -= RECEIVED
        prefill_tokens = prefill_seqs = prefill_context = prefill_pairs = 0
    if kind == LINEAR:  # gpu.StepTimeModel's five constants, in its units
        return (
            c[0] * 1e-3
            + c[1] * 1e-6 * prefill_tokens
            + c[2] * 1e-6 * decodes
            + c[3] * 1e-9 * decode_context
            + c[4] * 1e-6 * swapped_blocks
        )
    tokens = prefill_tokens + decodes
    if tokens == 0:
        return c[HOST] + c[SWAP_BLOCK] * swapped_blocks
    compute = (
        c[COMPUTE_TOKEN] * tokens
        + c[COMPUTE_LOGITS] * (decodes + prefill_seqs)
        + c[COMPUTE_PAIR] * (prefill_pairs + decode_context)
    )
    memory = c[WEIGHTS] + c[KV_TOKEN] * (decode_context + prefill_context + tokens)
    if c[NUM_EXPERTS] > 0:  # the routed experts the batch is expected to touch, E (1 - (1 - k/E)^T), at most E:
        # each token picks k of E at random (a real router is not uniform, so a batch touches fewer);
        # (1 - k/E)^T by squaring, the same operations in Python and compiled
        miss, power, left = 1.0 - c[EXPERTS_PER_TOKEN] / c[NUM_EXPERTS], 1.0, tokens
        while left:
            if left & 1:
                power *= miss
            miss *= miss
            left >>= 1
        memory += c[EXPERT] * c[NUM_EXPERTS] * (1.0 - power)
    return c[HOST] + c[SWAP_BLOCK] * swapped_blocks + max(compute, memory) + c[COMM_TOKEN] * tokens + c[COMM_STEP]


__all__ = ["Clock", "LINEAR", "NUM_ROOFLINE", "RECEIVED", "ROOFLINE", "Received", "chunk_attention", "step_seconds"]
