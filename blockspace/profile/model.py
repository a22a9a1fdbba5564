"""A Llama-shaped decoder stack with random weights, whose steps are timed.

Random weights cost the same to multiply as trained ones, and need no
download. Each layer is Llama's: RMSNorm, one fused QKV projection,
grouped-query attention, the output projection, RMSNorm, and the SwiGLU MLP
(gate and up fused, then down), with both residual adds.

A step runs the tokens of one batch through every layer together, as a
serving engine does: the prompt tokens of a prefill and one token for each
decoding sequence share the projections and the MLP; attention is done per
kind, with plain torch (``scaled_dot_product_attention``), not a paged
kernel:

- the prefill attends causally over its own prompt (K and V repeated to the
  query heads: prefill is bound by compute, not by reading K and V);
- each decoding sequence's query heads attend its whole cached context,
  read from a contiguous buffer once per KV head, as a grouped-query decode
  kernel reads it (the query heads of a KV head are folded into the query
  length, which is exact here: a decode token attends every cached token).

Left out, because they are small beside what is kept or not part of a
step's GPU work in proportion to the batch: rotary embeddings, writing the
new tokens' K and V into the cache, the embedding lookup and the LM head
(about 1 GB of Llama-3-8B's 16 GB of weights, so the measured overhead is a
little under the real one) and sampling. All layers share one K/V buffer:
the buffer of a large batch is far larger than any cache, so every layer
still reads it from memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from blockspace.profile.plan import ModelShape

EPS = 1e-5


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


class DecoderStack:
    """``layers`` decoder layers of ``shape`` on ``device``, random weights."""

    def __init__(self, shape: ModelShape, layers: int, device: torch.device) -> None:
        self.shape = shape
        self.dtype = getattr(torch, shape.dtype)
        self.device = device
        hidden, inner = shape.hidden_size, shape.intermediate_size
        qkv = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
        self.layers = [
            {
                "norm1": torch.ones(hidden, dtype=self.dtype, device=device),
                "qkv": self.random(hidden, qkv),
                "out": self.random(shape.num_heads * shape.head_dim, hidden),
                "norm2": torch.ones(hidden, dtype=self.dtype, device=device),
                "gate_up": self.random(hidden, 2 * inner),
                "down": self.random(inner, hidden),
            }
            for _ in range(layers)
        ]

    def random(self, rows: int, cols: int) -> torch.Tensor:
        """A weight whose products keep the activations near unit scale."""
        return torch.randn(rows, cols, dtype=self.dtype, device=self.device) * rows**-0.5

    def inputs(self, num_tokens: int) -> torch.Tensor:
        """Hidden states of ``num_tokens`` tokens entering the first layer."""
        return torch.randn(num_tokens, self.shape.hidden_size, dtype=self.dtype, device=self.device)

    def kv_cache(self, decode_seqs: int, context: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``context`` cached tokens for each of ``decode_seqs`` sequences."""
        size = (decode_seqs, self.shape.num_kv_heads, context, self.shape.head_dim)
        return (
            torch.randn(size, dtype=self.dtype, device=self.device),
            torch.randn(size, dtype=self.dtype, device=self.device),
        )

    def step(self, x: torch.Tensor, prefill_tokens: int, kv: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """Run the batch ``x`` (the first ``prefill_tokens`` rows a prompt, one
        row for each decoding sequence after them, attending ``kv``) through
        every layer."""
        shape = self.shape
        heads, kv_heads, head_dim = shape.num_heads, shape.num_kv_heads, shape.head_dim
        group = heads // kv_heads
        for layer in self.layers:
            q, k, v = (rms_norm(x, layer["norm1"]) @ layer["qkv"]).split(
                [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1
            )
            parts = []
            if prefill_tokens:
                tokens = prefill_tokens
                pq = q[:tokens].view(tokens, heads, head_dim).transpose(0, 1)
                pk = k[:tokens].view(tokens, kv_heads, head_dim).transpose(0, 1).repeat_interleave(group, dim=0)
                pv = v[:tokens].view(tokens, kv_heads, head_dim).transpose(0, 1).repeat_interleave(group, dim=0)
                attended = F.scaled_dot_product_attention(pq, pk, pv, is_causal=True)
                parts.append(attended.transpose(0, 1).reshape(tokens, heads * head_dim))
            if kv is not None:
                seqs = x.shape[0] - prefill_tokens
                dq = q[prefill_tokens:].view(seqs, kv_heads, group, head_dim)
                attended = F.scaled_dot_product_attention(dq, kv[0], kv[1])
                parts.append(attended.reshape(seqs, heads * head_dim))
            x = x + torch.cat(parts) @ layer["out"]
            gate, up = (rms_norm(x, layer["norm2"]) @ layer["gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["down"]
        return x


__all__ = ["DecoderStack", "rms_norm"]
