"""The roofline's data (``blockspace.simulator.gpus`` and ``.models``): each GPU
has its datasheet figures and their source, each built-in model counts the
parameters its makers publish, a config.json reads to the same shape, and
every bad ``--gpu`` or ``--model`` is one ``InvalidArgumentError`` naming the
option."""

from __future__ import annotations

import json

import pytest

from blockspace.errors import InvalidArgumentError
from blockspace.simulator.gpu import KVCacheModel
from blockspace.simulator.gpus import GPUS, gpu_named
from blockspace.simulator.models import MODELS, ModelShape, model_named, read_config

# The totals the models' makers publish (model cards, Hugging Face's count of the weights).
PUBLISHED_TOTAL = {
    "llama-3.1-8b": 8.03e9,
    "llama-3.1-70b": 70.6e9,
    "qwen2.5-7b": 7.62e9,
    "qwen2.5-72b": 72.7e9,
    "mistral-7b": 7.25e9,
    "mixtral-8x7b": 46.7e9,
    "qwen3-30b-a3b": 30.5e9,
}

# Published config.json files, whole (the keys read and those that are not).
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
QWEN_25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 152064,
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}
CONFIGS = {
    "llama-3.1-8b": LLAMA_31_8B,
    "qwen2.5-7b": QWEN_25_7B,
    "mixtral-8x7b": MIXTRAL_8X7B,
    "qwen3-30b-a3b": QWEN3_30B_A3B,
}


def written(tmp_path, config, name="config.json"):
    """``config`` (a dict, or text as it is) in a file under ``tmp_path``; its path."""
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return path


def model_error(tmp_path, config):
    """The message of reading ``config`` as a config.json, which must be refused."""
    with pytest.raises(InvalidArgumentError) as refused:
        read_config(written(tmp_path, config))
    assert str(refused.value).startswith("--model: "), refused.value
    return str(refused.value)


# -- GPUs ----------------------------------------------------------------------------------------------


def test_the_six_gpus_are_there_under_their_gpu_names():
    assert {"A100-80GB-SXM", "H100-SXM", "H200", "B200", "L40S", "MI300X"} <= set(GPUS)
    assert all(name == gpu.name for name, gpu in GPUS.items())


@pytest.mark.parametrize("gpu", GPUS.values(), ids=GPUS)
def test_every_gpu_has_a_source_and_positive_figures(gpu):
    assert "http" in gpu.source and gpu.label and gpu.link and gpu.host_link
    figures = (gpu.bf16_tflops, gpu.memory_gb, gpu.memory_tb_s, gpu.link_gb_s, gpu.host_gb_s)
    assert all(figure > 0 for figure in figures)
    assert gpu.fp8_tflops is None or gpu.fp8_tflops >= gpu.bf16_tflops
    assert gpu.host_gb_s <= gpu.link_gb_s  # the host link is never the faster one


def test_only_the_a100_has_no_fp8():
    assert [gpu.name for gpu in GPUS.values() if gpu.fp8_tflops is None] == ["A100-80GB-SXM"]


def test_each_generation_reads_memory_faster():
    assert GPUS["B200"].memory_tb_s > GPUS["H200"].memory_tb_s > GPUS["H100-SXM"].memory_tb_s
    assert GPUS["H100-SXM"].memory_tb_s > GPUS["A100-80GB-SXM"].memory_tb_s > GPUS["L40S"].memory_tb_s


def test_the_h200_is_an_h100_with_more_and_faster_memory():
    h100, h200 = GPUS["H100-SXM"], GPUS["H200"]
    assert (h200.bf16_tflops, h200.fp8_tflops, h200.link_gb_s) == (h100.bf16_tflops, h100.fp8_tflops, h100.link_gb_s)
    assert h200.memory_gb > h100.memory_gb


def test_a_gpu_is_named_in_any_case():
    assert gpu_named("h100-sxm") is GPUS["H100-SXM"]
    assert gpu_named(" mi300x ") is GPUS["MI300X"]


def test_an_unknown_gpu_names_the_option_and_every_choice():
    with pytest.raises(InvalidArgumentError) as refused:
        gpu_named("H300")
    message = str(refused.value)
    assert message.startswith("--gpu: unknown GPU 'H300'; one of ")
    assert all(name in message for name in GPUS)


# -- models: the parameter counts ----------------------------------------------------------------


def test_the_built_in_models_are_there():
    assert set(PUBLISHED_TOTAL) <= set(MODELS)
    assert all(name == shape.name and "huggingface.co" in shape.source for name, shape in MODELS.items())


@pytest.mark.parametrize("name", PUBLISHED_TOTAL)
def test_a_built_in_model_counts_its_published_parameters_within_1_percent(name):
    assert MODELS[name].total_params() == pytest.approx(PUBLISHED_TOTAL[name], rel=0.01)


def test_llama_counts_every_weight_to_the_one():
    # embeddings + LM head + 32 layers of attention, SwiGLU MLP and two norms + the final norm
    assert MODELS["llama-3.1-8b"].total_params() == 8_030_261_248


def test_a_dense_model_uses_every_weight_and_has_no_experts():
    for shape in MODELS.values():
        if not shape.is_moe:
            assert shape.active_params() == shape.total_params()
            assert shape.expert_params() == 0


def test_mixtral_is_46_7b_of_which_12_9b_active():
    mixtral = MODELS["mixtral-8x7b"]
    assert mixtral.total_params() == pytest.approx(46.7e9, rel=0.01)
    assert mixtral.active_params() == pytest.approx(12.9e9, rel=0.01)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_a_moe_activates_less_than_it_holds_by_its_unused_experts(name):
    shape = MODELS[name]
    assert shape.active_params() < shape.total_params()
    unused = shape.num_experts - shape.experts_per_token
    assert shape.total_params() - shape.active_params() == unused * shape.expert_params()


def test_qwen3_30b_a3b_activates_about_3b():
    assert 3e9 < MODELS["qwen3-30b-a3b"].active_params() < 3.5e9


def test_llama_3_1_8b_stores_128_kib_of_kv_a_token_in_bf16():
    llama = MODELS["llama-3.1-8b"]
    assert llama.kv_bytes_per_token(2) == 131072 == KVCacheModel().bytes_per_token
    assert llama.kv_bytes_per_token(1) == 65536


def test_kv_bytes_need_a_positive_width():
    with pytest.raises(InvalidArgumentError, match="kv_dtype_bytes"):
        MODELS["llama-3.1-8b"].kv_bytes_per_token(0)


# -- models: config.json ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_a_published_config_json_reads_as_the_built_in_model(tmp_path, name):
    path = written(tmp_path, CONFIGS[name])
    shape = read_config(path)
    assert shape == MODELS[name]  # shapes compare by architecture, not by name or source
    assert (shape.name, shape.source) == (tmp_path.name, str(path))


def test_num_key_value_heads_defaults_to_the_heads_and_head_dim_to_their_width(tmp_path):
    config = {key: value for key, value in LLAMA_31_8B.items() if key != "num_key_value_heads"}
    shape = read_config(written(tmp_path, config))
    assert (shape.num_kv_heads, shape.head_dim) == (32, 128)


def test_a_given_head_dim_wins_over_hidden_over_heads(tmp_path):
    shape = read_config(written(tmp_path, LLAMA_31_8B | {"head_dim": 64}))
    assert shape.head_dim == 64
    assert shape.kv_bytes_per_token(2) == 65536


def test_a_qwen2_moe_config_has_its_shared_expert(tmp_path):
    qwen2_moe = QWEN_25_7B | {"model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4}
    qwen2_moe |= {"moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632}
    shape = read_config(written(tmp_path, qwen2_moe))
    assert (shape.num_experts, shape.experts_per_token, shape.intermediate_size) == (60, 4, 1408)
    assert (shape.num_shared_experts, shape.shared_intermediate_size, shape.attention_bias) == (1, 5632, True)
    unshared = read_config(written(tmp_path, qwen2_moe | {"shared_expert_intermediate_size": 0}))
    shared_weights = shape.num_layers * 3 * shape.hidden_size * 5632
    assert shape.active_params() - unshared.active_params() == shared_weights
    assert shape.total_params() - unshared.total_params() == shared_weights


def test_a_model_is_named_by_built_in_name_file_or_folder(tmp_path):
    assert model_named("Llama-3.1-8B") is MODELS["llama-3.1-8b"]
    path = written(tmp_path, MIXTRAL_8X7B)
    assert model_named(str(path)) == model_named(str(tmp_path)) == MODELS["mixtral-8x7b"]


def test_an_unknown_model_names_the_option_and_the_built_in_names(tmp_path):
    with pytest.raises(InvalidArgumentError) as refused:
        model_named(str(tmp_path / "llama-9b"))
    message = str(refused.value)
    assert message.startswith("--model: unknown model ")
    assert all(name in message for name in MODELS)


def test_a_missing_config_file_is_named(tmp_path):
    with pytest.raises(InvalidArgumentError) as refused:
        read_config(tmp_path / "config.json")
    assert str(refused.value) == f"--model: {tmp_path / 'config.json'}: no such file"


BAD_CONFIGS = [
    ("{not json", "is not JSON"),
    ("[4096, 32]", "holds a JSON array"),
    ({"hidden_size": 4096}, "missing keys 'num_hidden_layers', 'num_attention_heads', 'intermediate_size'"),
    (LLAMA_31_8B | {"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
    (LLAMA_31_8B | {"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer, got 0"),
    (LLAMA_31_8B | {"num_hidden_layers": -1}, "num_hidden_layers must be a positive integer, got -1"),
    (LLAMA_31_8B | {"hidden_size": "4096"}, 'hidden_size must be a positive integer, got "4096"'),
    (LLAMA_31_8B | {"vocab_size": 1.5e5}, "vocab_size must be a positive integer, got 150000.0"),
    (LLAMA_31_8B | {"num_key_value_heads": 3}, "the 3 KV heads do not divide the 32 attention heads"),
    (LLAMA_31_8B | {"num_attention_heads": 30}, "hidden_size 4096 is not a multiple of num_attention_heads 30"),
    (LLAMA_31_8B | {"tie_word_embeddings": "no"}, 'tie_word_embeddings must be true or false, got "no"'),
    (MIXTRAL_8X7B | {"num_experts_per_tok": 9}, "the experts per token (9) must be 1 to the 8 experts"),
    ({k: v for k, v in MIXTRAL_8X7B.items() if k != "num_experts_per_tok"}, "missing key 'num_experts_per_tok'"),
    (QWEN3_30B_A3B | {"mlp_only_layers": [0]}, "mlp_only_layers [0] mixes dense and expert layers"),
    (QWEN3_30B_A3B | {"kv_lora_rank": 512}, "multi-head latent attention"),
]


@pytest.mark.parametrize(("config", "said"), BAD_CONFIGS, ids=[said[:40] for _, said in BAD_CONFIGS])
def test_a_bad_config_is_one_error_naming_the_option_the_file_and_the_key(tmp_path, config, said):
    message = model_error(tmp_path, config)
    assert message.startswith(f"--model: {tmp_path / 'config.json'}: ")
    assert said in message


def test_a_shape_made_by_hand_is_checked_too():
    with pytest.raises(InvalidArgumentError, match="num_heads must be a positive integer"):
        ModelShape("x", hidden_size=64, num_layers=1, num_heads=0, num_kv_heads=1, head_dim=8, intermediate_size=8,
                   vocab_size=8, tie_word_embeddings=True)  # fmt: skip
