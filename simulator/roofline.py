"""A step time from the GPU and the model: a roofline.

Why: the linear clock (``gpu.StepTimeModel``) holds five constants for one
GPU and one model. A serving engineer asks about their own GPU, model and
tensor parallelism; a roofline answers from datasheet figures
(``gpus.py``) and the model's shape (``models.py``), with two efficiencies
and two costs as named knobs, tuned on published measurements
(docs/measurements/2026-12-06-roofline.md).

A step is one forward pass over its batch (the terms: ``clock.py``). Per GPU
of a tensor-parallel group of ``tp``:

* **FLOPs**: 2 per weight a token passes through (its routed experts only,
  for a mixture of experts), the LM head for each sampled token, and 4 x
  layers x heads x head_dim per (query, key) pair of attention; all / tp;
* **bytes**: every weight read once (a mixture's routed experts: those the
  batch is expected to touch, ``clock.step_seconds``), and each token's
  K and V read for every token attended to and written for every token
  computed; the GPU's share of the KV heads (vLLM replicates a KV head
  across the GPUs when there are fewer heads than GPUs);
* the step takes the **larger** of FLOPs at ``compute_efficiency`` of the
  dense peak and bytes at ``bandwidth_efficiency`` of the memory bandwidth;
* plus **tensor parallelism's** two all-reduces per layer of each token's
  activations over the GPU link (a ring: 2 (tp - 1) / tp of the bytes),
  with ``allreduce_latency_us`` each, and a fixed **host cost** per step
  (scheduling, launches, sampling: a peer that left it out underpredicted
  TTFT by 17-56 %);
* a swapped block crosses the host link at its datasheet bandwidth.

What it cannot know: kernels (a real attention kernel is not at the peak's
fixed share), CUDA graphs, quantization schemes beyond a weight's bytes,
speculative decoding, and how the engine overlaps the host with the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from blockspace.errors import InvalidArgumentError, InvalidConfigError
from blockspace.simulator import clock
from blockspace.simulator.gpu import GIB, KVCacheModel
from blockspace.simulator.gpus import GPU, gpu_named
from blockspace.simulator.models import ModelShape, model_named

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}  # --dtype: the weights' (and matmuls') type
KV_DTYPES = ("auto", "bf16", "fp16", "fp8")  # --kv-dtype; auto: the weights' type
ACTIVATION_BYTES = 2  # an activation all-reduced between tensor-parallel GPUs (BF16)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of the GPU's memory it may use
DEFAULT_GPU, DEFAULT_MODEL = "H200", "llama-3.1-8b"  # today's assumption (gpu.py), where one is not given
# The median error of the tuned roofline on the published points held out of its tuning
# (docs/measurements/2026-12-06-roofline.md; tests/test_roofline.py holds it to scripts/roofline_check.py):
# a search's answer comes with the answers of a clock this much faster and slower.
HELD_OUT_ERROR = 0.115


class DoesNotFitError(InvalidArgumentError):
    """The model does not fit on the GPU at this tensor-parallel degree, or
    does not split over it: no such deployment exists (``--find min-cost``
    skips it, any other run refuses it)."""


@dataclass(frozen=True)
class Roofline:
    """The roofline clock of ``model`` on ``tensor_parallel`` x ``gpu`` (see the module doc)."""

    gpu: GPU
    model: ModelShape
    tensor_parallel: int = 1
    dtype: str = "bf16"
    kv_dtype: str = "auto"
    # the knobs: tuned on half of the published points (scripts/roofline_check.py), see the module doc
    compute_efficiency: float = 0.5  # of the dense peak FLOP/s
    bandwidth_efficiency: float = 0.95  # of the memory bandwidth
    host_overhead_ms: float = 6.0  # a fixed cost per step
    allreduce_latency_us: float = 10.0  # each all-reduce's fixed cost, with tensor parallelism
    activation_reserve_gib: float = 2.0  # per GPU, kept from the KV cache for the forward pass's activations
    assumed: tuple[str, ...] = ()  # the options not given, whose defaults it took (roofline_of), said in its name
    pace: float = 1.0  # every step this many times as long: a search's range (HELD_OUT_ERROR either way)

    kind = clock.ROOFLINE

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise InvalidArgumentError(f"--dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise InvalidArgumentError(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        if self.dtype == "fp8" and self.gpu.fp8_tflops is None:
            raise InvalidArgumentError(f"--dtype fp8: --gpu {self.gpu.name} has no FP8 tensor cores")
        if not (isinstance(self.tensor_parallel, int) and 1 <= self.tensor_parallel <= 64):
            raise InvalidArgumentError(
                f"--tensor-parallel must be a whole number 1 to 64, got {self.tensor_parallel!r}"
            )
        if self.model.num_heads % self.tensor_parallel:
            raise DoesNotFitError(
                f"--tensor-parallel {self.tensor_parallel} does not divide --model {self.model.name}'s "
                f"{self.model.num_heads} attention heads"
            )
        for name in ("compute_efficiency", "bandwidth_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise InvalidConfigError(f"{name} must be above 0 and at most 1, got {getattr(self, name)!r}")
        for name in ("host_overhead_ms", "allreduce_latency_us", "activation_reserve_gib"):
            if not getattr(self, name) >= 0:
                raise InvalidConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")

    @property
    def error(self) -> float:
        """The clock's measured error: its median on the held-out published points."""
        return HELD_OUT_ERROR

    def paced(self, pace: float) -> Roofline:
        """The same clock, every step ``pace`` times as long."""
        return replace(self, pace=pace)

    @property
    def weight_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes(self) -> int:
        return self.weight_bytes if self.kv_dtype == "auto" else DTYPE_BYTES[self.kv_dtype]

    def kv_cache(self) -> KVCacheModel:
        """One GPU's KV cache: its share of the KV heads (at least one: replicated below one a GPU)."""
        model = self.model
        heads = max(1, model.num_kv_heads // self.tensor_parallel)
        return KVCacheModel(model.num_layers, heads, model.head_dim, self.kv_bytes)

    def kv_memory_gib(self) -> float:
        """The KV cache vLLM would leave on each GPU: ``GPU_MEMORY_UTILIZATION``
        of its memory, less its share of the weights and the activation
        reserve; ``InvalidArgumentError`` if the weights do not fit."""
        weights_gib = self.model.total_params() * self.weight_bytes / self.tensor_parallel / GIB
        usable = self.gpu.memory_gb * 1e9 / GIB * GPU_MEMORY_UTILIZATION
        left = usable - weights_gib - self.activation_reserve_gib
        if left <= 0:
            raise DoesNotFitError(
                f"--model {self.model.name} in {self.dtype} needs {weights_gib:.1f} GiB of weights per GPU at "
                f"--tensor-parallel {self.tensor_parallel}, and --gpu {self.gpu.name} leaves {usable:.1f} GiB "
                f"(at {GPU_MEMORY_UTILIZATION:.0%}, less a {self.activation_reserve_gib:g} GiB activation reserve): "
                "raise --tensor-parallel"
            )
        return left

    def coefficients(self, block_size: int) -> tuple[float, ...]:
        """The clock's coefficients, in ``clock``'s order (seconds)."""
        model, tp = self.model, self.tensor_parallel
        peak = (self.gpu.fp8_tflops if self.dtype == "fp8" else self.gpu.bf16_tflops) or 0.0
        flop_s = peak * 1e12 * self.compute_efficiency
        byte_s = self.gpu.memory_tb_s * 1e12 * self.bandwidth_efficiency
        embedding = model.vocab_size * model.hidden_size  # the input table, read a row a token
        lm_head = 0 if model.tie_word_embeddings else embedding
        per_token = model.active_params() - embedding - lm_head  # the layers' weights a token passes through
        routed = model.num_experts * model.expert_params()
        weights = model.total_params() - (0 if model.tie_word_embeddings else embedding) - routed
        ring = 2 * (tp - 1) / tp * model.hidden_size * ACTIVATION_BYTES / (self.gpu.link_gb_s * 1e9)
        values = {
            clock.HOST: self.host_overhead_ms * 1e-3,
            clock.SWAP_BLOCK: self.kv_cache().bytes_per_block(block_size) / (self.gpu.host_gb_s * 1e9),
            clock.COMPUTE_TOKEN: 2 * per_token / tp / flop_s,
            clock.COMPUTE_LOGITS: 2 * embedding / tp / flop_s,
            clock.COMPUTE_PAIR: 4 * model.num_layers * model.num_heads * model.head_dim / tp / flop_s,
            clock.WEIGHTS: weights * self.weight_bytes / tp / byte_s,
            clock.NUM_EXPERTS: float(model.num_experts),
            clock.EXPERTS_PER_TOKEN: float(model.experts_per_token),
            clock.EXPERT: model.expert_params() * self.weight_bytes / tp / byte_s,
            clock.KV_TOKEN: self.kv_cache().bytes_per_token / byte_s,
            clock.COMM_TOKEN: 2 * model.num_layers * ring if tp > 1 else 0.0,
            clock.COMM_STEP: 2 * model.num_layers * self.allreduce_latency_us * 1e-6 if tp > 1 else 0.0,
        }
        counts = (clock.NUM_EXPERTS, clock.EXPERTS_PER_TOKEN)  # not times: the pace leaves them
        return tuple(values[place] * (1.0 if place in counts else self.pace) for place in range(clock.NUM_ROOFLINE))

    def describe(self) -> str:
        """The clock in one line, as the summary names it."""
        assumed = f" ({' and '.join(self.assumed)} not given: the usual assumption)" if self.assumed else ""
        assumed += f", every step x{self.pace:g}" if self.pace != 1 else ""
        return (
            f"roofline, {self.gpu.name} x TP {self.tensor_parallel}, {self.model.name} {self.dtype.upper()}{assumed}, "
            f"compute {self.compute_efficiency:g} / bandwidth {self.bandwidth_efficiency:g}, "
            f"host {self.host_overhead_ms:g} ms"
        )


def roofline_of(gpu: str | None, model: str | None, **knobs: Any) -> Roofline:
    """The roofline of a ``--gpu`` and a ``--model``; either may be None,
    and takes today's assumption (``DEFAULT_GPU``, ``DEFAULT_MODEL``), which
    its name then says."""
    assumed = tuple(option for option, given in (("--gpu", gpu), ("--model", model)) if given is None)
    return Roofline(gpu_named(gpu or DEFAULT_GPU), model_named(model or DEFAULT_MODEL), assumed=assumed, **knobs)


__all__ = ["DEFAULT_GPU", "DEFAULT_MODEL", "DTYPE_BYTES", "DoesNotFitError", "KV_DTYPES", "Roofline", "roofline_of"]
