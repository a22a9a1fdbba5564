"""Models from their shape: what a roofline clock needs to know of a model, read from its config.json.

Why: the simulator's step time becomes a roofline (``roofline.py``). Its
arithmetic is about 2 FLOPs per parameter a token passes through
(``active_params``); its memory traffic is the weights a step reads (all of
them for a dense model; for a mixture of experts, the experts the batch's
tokens pick, counted in ``expert_params``) plus each context token's K and
V (``kv_bytes_per_token``), which also size the KV blocks. All of it follows
from a handful of numbers in a Hugging Face ``config.json``: a ``ModelShape``.

What is counted, for a Llama-style decoder (Llama, Mistral, Qwen2/2.5,
Qwen3, and their mixture-of-experts kin Mixtral, Qwen2-MoE, Qwen3-MoE):

* the token embeddings, and the LM head unless tied to them;
* per layer: attention's q, k, v and o projections (with q/k/v biases where
  the model has them, Qwen2's), two RMSNorms (and Qwen3's per-head q/k
  norms), and the MLP: SwiGLU's three matrices (gate, up, down) of
  ``intermediate_size``; for a mixture of experts, every routed expert
  (each a SwiGLU of ``intermediate_size``), the router, and any shared
  experts; plus the final norm.

The totals match those the models publish (Llama-3.1-8B 8.03B, Mixtral-8x7B
46.7B of which 12.9B active, Qwen2.5-72B 72.7B, ...) within 0.2 %.

Approximations:

* **Active parameters** (``active_params``) are those one token uses: the
  dense part (embeddings, attention, norms, router, LM head) and its
  ``experts_per_token`` routed experts plus the shared ones. The embeddings
  are counted, as the cards count them (Mixtral's "12.9B active"), although
  looking one up costs no arithmetic: the roofline may leave them out.
* **Every layer alike.** A model whose layers differ (DeepSeek's first dense
  layers, Qwen-MoE's ``mlp_only_layers``) or whose attention is another kind
  (DeepSeek's multi-head latent attention) is refused, not approximated.
  What the keys read here do not describe is left out: MLP biases, where a
  config asks for them, and Qwen2-MoE's shared-expert gate (``hidden_size``
  weights a layer).

Shapes compare by architecture only: a shape read from a file equals the
built-in one of the same model, whatever their ``name`` and ``source``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blockspace.errors import InvalidArgumentError
from blockspace.validation import check_keys, read_json_object

OPTION = "--model"
_SIZES = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size")
_COUNTS = ("num_experts", "experts_per_token", "num_shared_experts", "shared_intermediate_size")


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape (see the module docstring)."""

    name: str = field(compare=False)
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # the dense MLP's width; for a mixture of experts, each routed expert's
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int = 0  # routed experts per layer; 0: dense
    experts_per_token: int = 0
    num_shared_experts: int = 0  # experts every token passes through, besides its routed ones
    shared_intermediate_size: int = 0  # a shared expert's width; 0: intermediate_size
    attention_bias: bool = False  # q, k and v projections with biases (Qwen2)
    qk_norm: bool = False  # an RMSNorm over each head's q and k (Qwen3)
    source: str = field(default="", compare=False)  # the config.json it was read from (path or HF repo)

    def __post_init__(self) -> None:
        for key in _SIZES:
            _check_size(getattr(self, key), key, minimum=1)
        for key in _COUNTS:
            _check_size(getattr(self, key), key, minimum=0)
        if self.num_heads % self.num_kv_heads:
            raise InvalidArgumentError(
                f"the {self.num_kv_heads} KV heads do not divide the {self.num_heads} attention heads"
            )
        if (self.num_experts or self.experts_per_token) and not 0 < self.experts_per_token <= self.num_experts:
            raise InvalidArgumentError(
                f"the experts per token ({self.experts_per_token}) must be 1 to the {self.num_experts} experts"
            )
        if self.num_shared_experts and not self.num_experts:
            raise InvalidArgumentError("shared experts without routed ones: a dense model's MLP is intermediate_size")

    @property
    def is_moe(self) -> bool:
        """A mixture of experts (routed experts in every layer)."""
        return self.num_experts > 0

    def total_params(self) -> int:
        """Every weight: embeddings, LM head unless tied, and every expert of every layer."""
        return self._outside_layers() + self.num_layers * (self._dense_layer() + self.num_experts * self._expert())

    def active_params(self) -> int:
        """The weights one token passes through (its ``experts_per_token`` routed experts, of a MoE)."""
        routed = self.experts_per_token if self.is_moe else 0
        return self._outside_layers() + self.num_layers * (self._dense_layer() + routed * self._expert())

    def expert_params(self) -> int:
        """One routed expert's weights in all layers (0 for a dense model): what a step reads per expert it uses."""
        return self.num_layers * self._expert() if self.is_moe else 0

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        """K and V of one token in every layer, at ``kv_dtype_bytes`` a value."""
        _check_size(kv_dtype_bytes, "kv_dtype_bytes", minimum=1)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_dtype_bytes

    def _outside_layers(self) -> int:
        """Embeddings, the LM head unless tied, and the final norm."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    def _dense_layer(self) -> int:
        """A layer's weights every token uses: attention, norms, and the MLP or the router and shared experts."""
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = 2 * self.hidden_size * q_width + 2 * self.hidden_size * kv_width
        attention += q_width + 2 * kv_width if self.attention_bias else 0
        attention += 2 * self.head_dim if self.qk_norm else 0
        if not self.is_moe:
            return attention + 2 * self.hidden_size + self._swiglu(self.intermediate_size)
        shared = self.num_shared_experts * self._swiglu(self.shared_intermediate_size or self.intermediate_size)
        return attention + 2 * self.hidden_size + self.hidden_size * self.num_experts + shared

    def _expert(self) -> int:
        """One routed expert in one layer (0 for a dense model, whose MLP is in ``_dense_layer``)."""
        return self._swiglu(self.intermediate_size) if self.is_moe else 0

    def _swiglu(self, width: int) -> int:
        """Gate, up and down projections of a SwiGLU MLP ``width`` wide."""
        return 3 * self.hidden_size * width


def _check_size(value: Any, key: str, minimum: int) -> int:
    """``value`` when it is an int (not a bool) >= ``minimum``; else ``InvalidArgumentError`` naming ``key``."""
    if type(value) is not int or value < minimum:
        wanted = "a positive integer" if minimum else "an integer >= 0"
        raise InvalidArgumentError(f"{key} must be {wanted}, got {json.dumps(value)}")
    return value


# -- reading a config.json -------------------------------------------------------------------------
# The keys of the config.json files of the families in the module docstring. A key present with the
# value null counts as absent (configs write that).
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
NUM_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")  # Mixtral; Qwen-MoE; DeepSeek: the first found
SHARED_WIDTH = "shared_expert_intermediate_size"  # Qwen2-MoE: one shared expert this wide
QKV_BIAS_TYPES = ("qwen2", "qwen2_moe")  # q/k/v biases without a config key saying so
QK_NORM_TYPES = ("qwen3", "qwen3_moe")
UNEVEN_LAYERS = {"first_k_dense_replace": 0, "mlp_only_layers": [], "decoder_sparse_step": 1, "moe_layer_freq": 1}


def read_config(path: str | Path) -> ModelShape:
    """The shape of the model whose Hugging Face ``config.json`` is at ``path``.

    Anything wrong is one ``InvalidArgumentError`` whose message starts with
    ``--model: `` and the file's name (the CLI says it as it is): the file
    missing, unreadable or not a JSON object, a missing key (all named), a
    size that is not a positive integer, heads that do not divide, or a
    shape this module does not describe (layers that differ, latent attention).
    """
    try:
        return _shape_in(path)
    except InvalidArgumentError as error:
        raise InvalidArgumentError(f"{OPTION}: {error}") from None


def _shape_in(path: str | Path) -> ModelShape:
    """``read_config``'s shape, its messages starting with the file's name."""
    found = {
        key: value for key, value in read_json_object(path, "model configuration keys").items() if value is not None
    }
    check_keys(found, REQUIRED, tuple(found), str(path))  # a config.json holds many keys not read here: none unknown
    try:
        return _shape_from(found, name=Path(path).parent.name or Path(path).stem, source=str(path))
    except InvalidArgumentError as error:
        raise InvalidArgumentError(f"{path}: {error}") from None


def _shape_from(found: dict[str, Any], name: str, source: str) -> ModelShape:
    """The shape a config.json's keys (``REQUIRED`` among them, no null values) describe."""
    _refuse_uneven_layers(found)
    return ModelShape(
        name=name,
        source=source,
        **_sizes(found),
        **_experts(found),
        tie_word_embeddings=_flag(found, ("tie_word_embeddings",), default=False),
        attention_bias=_flag(found, ("attention_bias", "qkv_bias"), default=_model_type(found) in QKV_BIAS_TYPES),
        qk_norm=_flag(found, ("use_qk_norm",), default=_model_type(found) in QK_NORM_TYPES),
    )


def _sizes(found: dict[str, Any]) -> dict[str, int]:
    """The attention and MLP sizes, each checked under its key: ``num_key_value_heads`` defaults to
    the heads, ``head_dim`` to hidden / heads, an expert's width is ``moe_intermediate_size`` where
    given (Qwen-MoE, DeepSeek), else ``intermediate_size`` (dense models, Mixtral)."""
    hidden, heads = _size(found, "hidden_size"), _size(found, "num_attention_heads")
    if "head_dim" not in found and hidden % heads:
        raise InvalidArgumentError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    width = "moe_intermediate_size" if "moe_intermediate_size" in found else "intermediate_size"
    return {
        "hidden_size": hidden,
        "num_layers": _size(found, "num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": _size(found, "num_key_value_heads", default=heads),
        "head_dim": _size(found, "head_dim", default=hidden // heads),
        "intermediate_size": _size(found, width),
        "vocab_size": _size(found, "vocab_size"),
    }


def _experts(found: dict[str, Any]) -> dict[str, int]:
    """A mixture of experts' counts (none for a dense model): Qwen2-MoE has one shared expert
    ``shared_expert_intermediate_size`` wide, DeepSeek ``n_shared_experts`` as wide as the others."""
    key = next((key for key in NUM_EXPERTS if key in found), None)
    if key is None or found[key] == 0:
        return {}
    shared_width = _size(found, SHARED_WIDTH, default=0, minimum=0)
    return {
        "num_experts": _size(found, key),
        "experts_per_token": _size(found, "num_experts_per_tok"),
        "num_shared_experts": _size(found, "n_shared_experts", default=1 if shared_width else 0, minimum=0),
        "shared_intermediate_size": shared_width,
    }


def _refuse_uneven_layers(found: dict[str, Any]) -> None:
    """``InvalidArgumentError`` for latent attention, or a mixture of experts whose layers are not all alike."""
    if "kv_lora_rank" in found:
        raise InvalidArgumentError("multi-head latent attention (kv_lora_rank, DeepSeek-V2/V3) is not modelled")
    if not any(key in found for key in NUM_EXPERTS):
        return
    for key, even in UNEVEN_LAYERS.items():
        if found.get(key, even) != even:
            raise InvalidArgumentError(f"{key} {json.dumps(found[key])} mixes dense and expert layers: not modelled")


def _size(found: dict[str, Any], key: str, default: int | None = None, minimum: int = 1) -> int:
    """``found[key]`` (``default`` where absent, missing if none), checked to be an integer >= ``minimum``."""
    if key not in found and default is None:
        raise InvalidArgumentError(f"missing key {key!r}")
    return _check_size(found.get(key, default), key, minimum)


def _flag(found: dict[str, Any], keys: tuple[str, ...], default: bool) -> bool:
    """The first of ``keys`` present, checked to be true or false; ``default`` where none is."""
    key = next((key for key in keys if key in found), None)
    if key is None:
        return default
    if not isinstance(found[key], bool):
        raise InvalidArgumentError(f"{key} must be true or false, got {json.dumps(found[key])}")
    return found[key]


def _model_type(found: dict[str, Any]) -> str:
    return str(found.get("model_type", ""))


# The built-in models: the keys read here of each model's published config.json, as it gives them
# (its Hugging Face repo is the source). Read through copies where the repo is gated (Meta's,
# Mistral's): fine-tunes' configs naming it as their base (_name_or_path), or a recipe's table of them.
PUBLISHED: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-3.1-8b": (
        "meta-llama/Llama-3.1-8B",
        {
            "model_type": "llama",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "tie_word_embeddings": False,
            "vocab_size": 128256,
        },
    ),
    "llama-3.1-70b": (
        "meta-llama/Llama-3.1-70B",
        {
            "model_type": "llama",
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_attention_heads": 64,
            "num_hidden_layers": 80,
            "num_key_value_heads": 8,
            "tie_word_embeddings": False,
            "vocab_size": 128256,
        },
    ),
    "llama-3.1-405b": (
        "meta-llama/Llama-3.1-405B",
        {
            "model_type": "llama",
            "hidden_size": 16384,
            "intermediate_size": 53248,
            "num_attention_heads": 128,
            "num_hidden_layers": 126,
            "num_key_value_heads": 8,
            "tie_word_embeddings": False,
            "vocab_size": 128256,
        },
    ),
    "llama-2-7b": (
        "meta-llama/Llama-2-7b-hf",
        {
            "model_type": "llama",
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 32,
            "tie_word_embeddings": False,
            "vocab_size": 32000,
        },
    ),
    "llama-2-70b": (
        "meta-llama/Llama-2-70b-hf",
        {
            "model_type": "llama",
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_attention_heads": 64,
            "num_hidden_layers": 80,
            "num_key_value_heads": 8,
            "tie_word_embeddings": False,
            "vocab_size": 32000,
        },
    ),
    "qwen2.5-7b": (
        "Qwen/Qwen2.5-7B",
        {
            "model_type": "qwen2",
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_attention_heads": 28,
            "num_hidden_layers": 28,
            "num_key_value_heads": 4,
            "tie_word_embeddings": False,
            "vocab_size": 152064,
        },
    ),
    "qwen2.5-72b": (
        "Qwen/Qwen2.5-72B",
        {
            "model_type": "qwen2",
            "hidden_size": 8192,
            "intermediate_size": 29568,
            "num_attention_heads": 64,
            "num_hidden_layers": 80,
            "num_key_value_heads": 8,
            "tie_word_embeddings": False,
            "vocab_size": 152064,
        },
    ),
    "mistral-7b": (
        "mistralai/Mistral-7B-v0.3",
        {
            "model_type": "mistral",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "tie_word_embeddings": False,
            "vocab_size": 32768,
        },
    ),
    "mixtral-8x7b": (
        "mistralai/Mixtral-8x7B-v0.1",
        {
            "model_type": "mixtral",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "num_local_experts": 8,
            "tie_word_embeddings": False,
            "vocab_size": 32000,
        },
    ),
    "qwen3-30b-a3b": (
        "Qwen/Qwen3-30B-A3B",
        {
            "model_type": "qwen3_moe",
            "head_dim": 128,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_attention_heads": 32,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "num_hidden_layers": 48,
            "num_key_value_heads": 4,
            "tie_word_embeddings": False,
            "vocab_size": 151936,
        },
    ),
}
MODELS: dict[str, ModelShape] = {
    name: _shape_from(config, name, f"https://huggingface.co/{repo}/blob/main/config.json")
    for name, (repo, config) in PUBLISHED.items()
}


def model_named(name_or_path: str) -> ModelShape:
    """A built-in model by name (any case), else the model whose config.json is at ``name_or_path``
    (or in that folder); ``InvalidArgumentError`` naming ``--model`` and the built-in names otherwise."""
    built_in = MODELS.get(name_or_path.strip().lower())
    if built_in is not None:
        return built_in
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InvalidArgumentError(
            f"{OPTION}: unknown model {name_or_path!r}: neither a built-in name ({', '.join(MODELS)})"
            " nor a config.json file"
        )
    return read_config(path)


__all__ = ["MODELS", "ModelShape", "model_named", "read_config"]
