"""The roofline clock (``roofline.py``, ``clock.py``): its counts by hand,
the KV shape a config.json gives, the clock a run names, the options it
refuses, and its error on the published points it was not tuned on."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from blockspace.errors import InvalidArgumentError
from blockspace.simulator import clock
from blockspace.simulator.cli import main as simulate
from blockspace.simulator.gpus import gpu_named
from blockspace.simulator.models import model_named
from blockspace.simulator.roofline import HELD_OUT_ERROR, Roofline
from helpers import trace_lines

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

# Llama-3.1-8B, counted from its config.json by hand: 8,030,261,248 weights, of which the input
# embeddings and the LM head are 128,256 x 4,096 = 525,336,576 each
LAYER_WEIGHTS = 8_030_261_248 - 2 * 525_336_576  # what a token passes through, besides the LM head
READ_WEIGHTS = 8_030_261_248 - 525_336_576  # read once a step: all but the input table (a row a token)
H100_FLOPS, H100_BYTES = 989.4e12 * 0.5, 3.35e12 * 0.8  # at these efficiencies


def test_a_prefill_and_a_decode_of_llama_8b_on_an_h100_by_hand():
    roof = Roofline(gpu_named("H100-SXM"), model_named("llama-3.1-8b"), compute_efficiency=0.5,
                    bandwidth_efficiency=0.8, host_overhead_ms=3.0)  # fmt: skip
    c = roof.coefficients(16)
    # a lone 2,048-token prompt: compute bound
    flops = 2 * LAYER_WEIGHTS * 2048 + 2 * 525_336_576 + 4 * 32 * 32 * 128 * (2048 * 2049 // 2)
    bytes_read = 2 * READ_WEIGHTS + 131_072 * 2048  # BF16 weights, and K and V written for each token
    assert flops / H100_FLOPS > bytes_read / H100_BYTES
    prefill = clock.step_seconds(clock.ROOFLINE, c, 2048, 0, 1, 0, 0, clock.chunk_attention(0, 2048), 0)
    assert prefill == pytest.approx(3e-3 + flops / H100_FLOPS, rel=1e-12)
    # 32 decodes of 1,000-token contexts: bandwidth bound
    flops = 2 * LAYER_WEIGHTS * 32 + 2 * 525_336_576 * 32 + 4 * 32 * 32 * 128 * 32_000
    bytes_read = 2 * READ_WEIGHTS + 131_072 * (32_000 + 32)
    assert bytes_read / H100_BYTES > flops / H100_FLOPS
    decode = clock.step_seconds(clock.ROOFLINE, c, 0, 32, 0, 32_000, 0, 0, 0)
    assert decode == pytest.approx(3e-3 + bytes_read / H100_BYTES, rel=1e-12)
    assert 7e-3 < decode - 3e-3 < 8e-3  # 16 GB of weights at 2.7 TB/s, and 4 GB of KV


def test_tensor_parallelism_splits_the_work_and_adds_the_all_reduces():
    one, four = (Roofline(gpu_named("H100-SXM"), model_named("llama-3.1-70b"), tp) for tp in (1, 4))
    c1, c4 = one.coefficients(16), four.coefficients(16)
    assert c4[clock.COMPUTE_TOKEN] == pytest.approx(c1[clock.COMPUTE_TOKEN] / 4)
    assert c4[clock.WEIGHTS] == pytest.approx(c1[clock.WEIGHTS] / 4)
    assert c1[clock.COMM_TOKEN] == c1[clock.COMM_STEP] == 0
    # 80 layers x 2 all-reduces of 8,192 BF16 values a token, a ring moving 2 x 3/4 of them at 450 GB/s
    assert c4[clock.COMM_TOKEN] == pytest.approx(160 * 1.5 * 8192 * 2 / 450e9)
    assert c4[clock.COMM_STEP] == pytest.approx(160 * 10e-6)
    assert four.kv_cache().num_kv_heads == 2 and one.kv_cache().num_kv_heads == 8  # a GPU's share of 8 KV heads


def test_a_mixture_reads_the_experts_its_batch_touches_and_computes_the_ones_it_uses():
    roof = Roofline(gpu_named("H200"), model_named("mixtral-8x7b"))
    c = roof.coefficients(16)
    one = clock.step_seconds(clock.ROOFLINE, c, 0, 1, 0, 100, 0, 0, 0)  # one token reads its two experts
    assert one == pytest.approx(
        c[clock.HOST] + c[clock.WEIGHTS] + 2 * c[clock.EXPERT] + 101 * c[clock.KV_TOKEN], rel=1e-12
    )
    flops = (clock.COMPUTE_TOKEN, clock.COMPUTE_LOGITS, clock.COMPUTE_PAIR)
    no_compute = tuple(0.0 if place in flops else value for place, value in enumerate(c))
    many = clock.step_seconds(clock.ROOFLINE, no_compute, 0, 4096, 0, 0, 0, 0, 0)  # a large batch: all eight
    assert many == pytest.approx(c[clock.HOST] + c[clock.WEIGHTS] + 8 * c[clock.EXPERT] + 4096 * c[clock.KV_TOKEN])
    active, total = model_named("mixtral-8x7b").active_params(), model_named("mixtral-8x7b").total_params()
    assert c[clock.COMPUTE_TOKEN] == pytest.approx(2 * (active - 2 * 32000 * 4096) / (989.4e12 * 0.5))
    assert active < total / 3


def test_the_kv_shape_comes_from_the_config_json(tmp_path):
    config = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 16,
              "num_hidden_layers": 12, "num_key_value_heads": 4, "vocab_size": 32000}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    roof = Roofline(gpu_named("L40S"), model_named(str(tmp_path)), tensor_parallel=2)
    assert roof.kv_cache().bytes_per_token == 2 * 12 * (4 // 2) * (2048 // 16) * 2
    (tmp_path / "trace.jsonl").write_text(trace_lines(3))
    argv = ["--trace", str(tmp_path / "trace.jsonl"), "--model", str(tmp_path / "config.json"), "--gpu", "L40S",
            "--tensor-parallel", "2", "--kv-memory-gib", "1", "--no-plot", "--quiet",
            "--out", str(tmp_path / "o")]  # fmt: skip
    assert simulate(argv) == 0
    document = json.loads((tmp_path / "o" / "simulation.json").read_text())
    assert document["config"]["num_gpu_blocks"] == 2**30 // (16 * roof.kv_cache().bytes_per_token)
    assert document["runs"][0]["clock"].startswith("roofline, L40S x TP 2")


def test_a_gpu_or_tensor_parallelism_changes_the_default_pool(tmp_path):
    (tmp_path / "trace.jsonl").write_text(trace_lines(2))

    def blocks(*options: str) -> int:
        out = tmp_path / "-".join(options)
        argv = ["--trace", str(tmp_path / "trace.jsonl"), *options, "--no-plot", "--quiet", "--out", str(out)]
        assert simulate(argv) == 0
        return json.loads((out / "simulation.json").read_text())["config"]["num_gpu_blocks"]

    h100, h200 = blocks("--gpu", "H100-SXM"), blocks("--gpu", "H200")
    assert h200 > h100 > 0
    one, two = blocks("--model", "llama-3.1-70b", "--gpu", "H200", "--tensor-parallel", "2"), blocks(
        "--model", "llama-3.1-70b", "--gpu", "H200", "--tensor-parallel", "4")  # fmt: skip
    assert two > 2 * one  # half the heads a GPU, and more memory left by the weights


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--gpu", "H900"], "error: --gpu: unknown GPU 'H900'"),
        (["--model", "gpt-9"], "error: --model: unknown model 'gpt-9'"),
        (["--model", "llama-3.1-8b", "--num-layers", "40"], "error: --num-layers cannot go with --model"),
        (["--gpu", "H100-SXM", "--step-overhead-ms", "2"], "error: --step-overhead-ms cannot go with --gpu"),
        (["--tensor-parallel", "2"], "error: --tensor-parallel goes with --gpu or --model"),
        (["--gpu", "A100-80GB-SXM", "--dtype", "fp8"], "error: --dtype fp8: --gpu A100-80GB-SXM has no FP8"),
        (["--gpu", "L40S", "--model", "llama-3.1-70b"], "error: --model llama-3.1-70b in bf16 needs 131.4 GiB"),
        (["--gpu", "H100-SXM", "--compute-efficiency", "1.5"], "error: --compute-efficiency must be <= 1"),
        (["--model", "llama-3.1-8b", "--tensor-parallel", "3"], "error: --tensor-parallel 3 does not divide"),
    ],
)
def test_a_bad_gpu_model_or_knob_is_one_error_line_and_exit_2(tmp_path, options, said):
    command = [sys.executable, "-m", "blockspace", "simulate", *options, "--max-requests", "2", "--no-plot",
               "--quiet", "--out", str(tmp_path / "out")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(said) and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_bad_config_json_is_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 4096}')
    with pytest.raises(InvalidArgumentError, match="--model"):
        model_named(str(tmp_path / "config.json"))


def test_the_held_out_published_points_are_within_the_target():
    """The clock tuned on half of the published points (scripts/roofline_check.py) misses the
    other half by at most 15 % at the median, the issue's target."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import roofline_check
    finally:
        sys.path.remove(str(SCRIPTS))
    result = roofline_check.report(json.loads(roofline_check.POINTS.read_text())["points"])
    held_out = result["summary"]["held_out"]
    assert held_out["points"] >= 12 and held_out["median_error"] <= 0.15
    assert round(held_out["median_error"], 3) == HELD_OUT_ERROR  # the range a search gives
    assert result["knobs"] == {name: getattr(Roofline, name) for name in result["knobs"]}  # the defaults are tuned
    tuned = {p["point"] for p in result["predictions"]["tune"]}
    assert tuned.isdisjoint(p["point"] for p in result["predictions"]["held_out"])


def test_the_readmes_capacity_question_prints_its_range_and_price(tmp_path):
    """The README's command, as it stands there (its output folder and workers aside), prints the line it shows."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    command = re.search(r"blockspace simulate (--gpu .*?)\n```", readme, re.S).group(1).replace("\\\n", " ").split()
    argv = [*command, "--workers", "1", "--no-plot", "--quiet", "--out", str(tmp_path / "out")]
    done = subprocess.run([sys.executable, "-m", "blockspace", "simulate", *argv], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = " ".join(re.search(r"It ends with a line such as `(.*?)`", readme, re.S).group(1).split())
    assert said in done.stdout
    found = json.loads((tmp_path / "out" / "capacity.json").read_text())["configurations"][0]
    assert found["min_replicas"] == 21 and found["clock_range"]["error"] == HELD_OUT_ERROR


def test_a_gpu_profile_file_is_set_against_the_roofline_of_its_gpu_and_model(tmp_path, capsys):
    """scripts/measured_vs_roofline.py, the GPU check's last step: steps timed exactly as the
    roofline (less its host cost) says are off by nothing, and a file without points is refused."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import measured_vs_roofline
    finally:
        sys.path.remove(str(SCRIPTS))
    roof = Roofline(gpu_named("H200"), model_named("llama-3.1-8b"), host_overhead_ms=0.0)
    c = roof.coefficients(16)
    steps = [(2048, 0, 0), (0, 64, 1000), (512, 32, 2000)]

    def exactly(p: int, d: int, x: int) -> float:
        pairs = clock.chunk_attention(0, p)
        return 1e3 * clock.step_seconds(clock.ROOFLINE, c, p, d, 1 if p else 0, d * x, 0, pairs, 0)

    points = [{"prefill_tokens": p, "decode_seqs": d, "context": x, "measured_ms": exactly(p, d, x)}
              for p, d, x in steps]  # fmt: skip
    (tmp_path / "model.json").write_text(json.dumps({"version": 1, "fit": {"points": points}}))
    argv = ["--step-model", str(tmp_path / "model.json"), "--gpu", "H200", "--model", "llama-3.1-8b"]
    assert measured_vs_roofline.main([*argv, "--json", str(tmp_path / "out.json")]) == 0
    figures = json.loads((tmp_path / "out.json").read_text())
    assert figures["worst_error"] < 1e-9 and len(figures["rows"]) == 3
    (tmp_path / "model.json").write_text(json.dumps({"version": 1}))
    assert measured_vs_roofline.main(argv) == 2
    assert capsys.readouterr().err.startswith("error: --step-model")


def test_the_price_of_a_run_is_its_gpus_for_its_span_at_the_given_rate(tmp_path):
    """--gpu-cost on a tiny trace: 2 replicas of TP 2 hold 4 GPUs from the first arrival to the last finish."""
    (tmp_path / "trace.jsonl").write_text(trace_lines(4))
    argv = ["--trace", str(tmp_path / "trace.jsonl"), "--gpu", "H100-SXM", "--tensor-parallel", "2", "--replicas", "2",
            "--gpu-cost", "4.5", "--no-plot", "--quiet", "--out", str(tmp_path / "out")]  # fmt: skip
    assert simulate(argv) == 0
    run = json.loads((tmp_path / "out" / "simulation.json").read_text())["runs"][0]
    cost, span = run["cost"], run["simulated_s"]
    outputs = sum(4 + i % 3 for i in range(4))  # trace_lines' outputs
    assert cost["gpus"] == 4 and cost["gpu_hours"] == pytest.approx(4 * span / 3600)
    assert cost["dollars"] == pytest.approx(4.5 * 4 * span / 3600)
    assert cost["dollars_per_million_output_tokens"] == pytest.approx(cost["dollars"] / outputs * 1e6)
