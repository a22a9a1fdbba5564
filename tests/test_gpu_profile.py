"""``blockspace gpu-profile``: a tiny run on the CPU writes a step model that
``load_step_model`` reads; every bad option, a bad --out, no torch and no
CUDA are one ``error:`` line and exit status 2 before anything is timed;
and the fit finds the coefficients a linear model was made of."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import blockspace.profile.cli as gpu_profile
from blockspace import extras
from blockspace.cli import main as blockspace
from blockspace.profile.fit import fit_steps, relative_errors, terms
from blockspace.profile.plan import ModelShape, Step, plan_steps, spread
from blockspace.simulator.gpu import KVCacheModel, StepTimeModel
from blockspace.simulator.step_model import COEFFICIENTS, load_step_model

TINY = ["--num-layers", "4", "--layers-to-time", "2", "--hidden-size", "64", "--num-heads", "4",
        "--num-kv-heads", "2", "--intermediate-size", "128", "--dtype", "float32", "--max-prefill-tokens", "32",
        "--max-batch", "4", "--max-context", "32", "--repeats", "2", "--warmup", "1"]  # fmt: skip


def one_error_line(err: str) -> str:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_tiny_cpu_run_writes_a_model_that_loads(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "new" / "folder" / "model.json"  # a folder that can be made is made
    assert blockspace(["gpu-profile", "--device", "cpu", "--out", str(out), *TINY]) == 0
    model = load_step_model(out)
    values = [getattr(model, name) for name in COEFFICIENTS]
    assert all(math.isfinite(value) and value >= 0 for value in values), values
    assert model.step_overhead_ms + model.prefill_token_us > 0 and model.swap_block_us > 0
    written = json.loads(out.read_text())
    assert "--device cpu" in written["source"] and "not a GPU" in written["measured_on"]
    shape = written["model"]
    assert shape["num_layers"] == 4 and shape["layers_timed"] == 2 and shape["head_dim"] == 16
    assert shape["block_bytes"] == 16 * KVCacheModel(4, 2, 16, 4).bytes_per_token
    points = written["fit"]["points"]
    assert len(points) == len(plan_steps(32, 4, 32)) and all(point["measured_ms"] > 0 for point in points)
    said = capsys.readouterr().out
    assert f"wrote {out}" in said and "kv_token_read_ns" in said


@pytest.fixture
def no_work(monkeypatch):
    """Timing anything fails the test: every check comes first."""

    def work(*args, **kwargs):
        raise AssertionError("the timing started before every option was checked")

    monkeypatch.setattr(gpu_profile, "profile", work)


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch; assert not torch.cuda.is_available()"]).returncode != 0,
    reason="a CUDA GPU is here (or no torch)",
)
def test_without_cuda_the_default_device_is_refused_in_one_line(tmp_path, capsys, no_work):
    out = tmp_path / "model.json"
    assert blockspace(["gpu-profile", "--out", str(out), *TINY]) == 2
    captured = capsys.readouterr()
    err = one_error_line(captured.err)
    assert "--device cuda: torch finds no CUDA GPU here; --device cpu" in err and captured.out == ""
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--out", "."], "--out .: is a folder"),
        (["--out", "afile/model.json"], "--out afile/model.json: "),
        (["--num-layers", "0"], "--num-layers must be >= 1, got 0"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
        (["--max-context", "x"], "--max-context: invalid int value: 'x'"),
        (["--hidden-size", "100"], "--hidden-size 100 must be a multiple of --num-heads (32)"),
        (["--num-kv-heads", "6"], "--num-heads 32 must be a multiple of --num-kv-heads (6)"),
        (["--num-layers", "4", "--layers-to-time", "5"], "--layers-to-time 5 must be <= --num-layers (4)"),
        (["--dtype", "int8"], "--dtype: invalid choice: 'int8'"),
        (["--device", "tpu"], "--device: invalid choice: 'tpu'"),
    ],
)
def test_a_bad_option_or_out_is_one_error_line_before_any_timing(tmp_path, monkeypatch, capsys, no_work, argv, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file, not a folder\n")
    assert blockspace(["gpu-profile", "--device", "cpu", *argv]) == 2
    captured = capsys.readouterr()
    assert said in one_error_line(captured.err) and captured.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_without_torch_the_help_shows_and_a_run_names_the_extra(monkeypatch, capsys, no_work):
    real = extras.find_spec
    monkeypatch.setattr(extras, "find_spec", lambda name: None if name == "torch" else real(name))
    with pytest.raises(SystemExit) as stopped:  # argparse's --help
        blockspace(["gpu-profile", "--help"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.startswith("usage: blockspace gpu-profile")
    assert blockspace(["gpu-profile", "--device", "cpu"]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert "blockspace gpu-profile needs the [gpu] extra (missing: torch): pip install 'blockspace[gpu]'" in err
    check = "import sys, blockspace.profile.cli; print('torch' in sys.modules)"  # the command imports it when it runs
    assert subprocess.run([sys.executable, "-c", check], capture_output=True, text=True).stdout == "False\n"


def test_only_the_command_line_names_the_profile_package():
    """The managers, the kit and the simulator never import it (nor torch through it)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    folders = ("blockspace", "fast", "reference", "conformance", "simulator")
    sources = [p for folder in folders for p in (root / folder).rglob("*.py")]
    outside = [p for p in sources if (root / "blockspace" / "profile") not in p.parents]
    naming = {str(p.relative_to(root)) for p in outside if "blockspace.profile" in p.read_text()}
    assert naming == {"blockspace/cli.py"} and len(outside) > 50, naming  # cli.py: its module's name, as text


# -- the plan and the fit, without torch ---------------------------------------------------------------------
def test_the_plan_spreads_each_size_from_one_to_its_largest():
    assert spread(256, 5) == [1, 4, 16, 64, 256] and spread(2, 5) == [1, 2] and spread(4096, 3) == [256, 1024, 4096]
    steps = plan_steps(2048, 256, 4096)
    assert [s for s in steps if not s.decode_seqs] == [Step(t, 0, 0) for t in (8, 32, 128, 512, 2048)]
    assert Step(0, 256, 4096) in steps and Step(512, 64, 256) in steps and len(steps) == 5 + 15 + 3
    assert ModelShape().kv_bytes_per_token == KVCacheModel().bytes_per_token == 128 * 1024
    assert ModelShape().block_bytes(16) == 2 * 2**20


def test_the_fit_recovers_the_coefficients_of_linear_times():
    steps = plan_steps(2048, 256, 4096)
    truth = StepTimeModel(step_overhead_ms=3.4, prefill_token_us=42.0, decode_seq_us=15.0, kv_token_read_ns=30.0)
    times = [1e3 * truth.step_seconds(s.prefill_tokens, s.decode_seqs, s.decode_seqs * s.context, 0) for s in steps]
    fit = fit_steps(steps, times)
    found = fit.step_time_model(swap_block_ms=0.045)
    for name in COEFFICIENTS:
        assert getattr(found, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert max(relative_errors(fit, steps, times)) < 1e-9


def test_a_cost_that_comes_out_negative_is_zero_and_the_rest_refitted():
    """Decode steps that get cheaper per sequence as the batch grows (noise,
    on a real device): the per-sequence cost is 0, not negative, and the
    others are fitted again without it."""
    steps = [Step(t, 0, 0) for t in (16, 64, 256)] + [Step(0, b, c) for b in (1, 4, 16) for c in (64, 1024)]
    times = [2.0 + 0.01 * s.prefill_tokens + 0.001 * s.decode_seqs * s.context - 0.05 * s.decode_seqs for s in steps]
    unclamped = np.linalg.lstsq(np.array([terms(s) for s in steps]), np.array(times), rcond=None)[0]
    assert unclamped[2] == pytest.approx(-0.05)  # what a plain fit would say
    fit = fit_steps(steps, times)
    assert fit.decode_seq_ms == 0
    assert fit.overhead_ms > 1.0 and fit.prefill_token_ms > 0.005 and fit.context_token_ms > 0.0005
    assert terms(Step(3, 2, 5)) == [1.0, 3, 2, 10]


# -- a fit too far off is timed again, then refused ------------------------------------------------------------
TRUTH = StepTimeModel(step_overhead_ms=0.1, prefill_token_us=5.0, decode_seq_us=2.0, kv_token_read_ns=100.0)


def linear_ms(step: Step) -> float:
    """What ``TRUTH`` says ``step`` takes, for the 4 layers of TINY (2 of them timed, so half)."""
    return 1e3 * TRUTH.step_seconds(step.prefill_tokens, step.decode_seqs, step.decode_seqs * step.context, 0) / 2


@pytest.fixture
def timings(monkeypatch):
    """Each step times as ``TRUTH`` says, except the decode-only steps of one
    sequence, which time ``slow[n]`` times slower in the n-th pass over the
    plan (a neighbour's burst of work, as it hit ``--device cpu`` on a
    shared machine); the passes made are counted."""
    pytest.importorskip("torch")
    import blockspace.profile.measure as measure

    found = {"slow": [1.0], "calls": 0}
    per_pass = len(plan_steps(32, 4, 32))

    def step_ms(stack, step, warmup, repeats):
        slow = found["slow"][min(found["calls"] // per_pass, len(found["slow"]) - 1)]
        found["calls"] += 1
        return linear_ms(step) * (slow if step.prefill_tokens == 0 and step.decode_seqs == 1 else 1.0)

    monkeypatch.setattr(measure, "step_ms", step_ms)
    return found


def test_a_fit_spoiled_by_a_slow_first_pass_is_timed_again_and_then_written(tmp_path, capsys, timings):
    timings["slow"] = [70.0, 1.0]
    out = tmp_path / "model.json"
    assert blockspace(["gpu-profile", "--device", "cpu", "--out", str(out), *TINY]) == 0
    said = capsys.readouterr().out
    assert "over --max-fit-error 0.5): timing every step again (2 of 3)" in said and f"wrote {out}" in said
    assert timings["calls"] == 2 * len(plan_steps(32, 4, 32))  # two passes, not three: the second fits
    fit = json.loads(out.read_text())["fit"]
    assert fit["attempts"] == 2 and fit["max_fit_error"] == 0.5 and fit["max_relative_error"] < 1e-6
    model = load_step_model(out)
    for name in COEFFICIENTS[:-1]:  # each step kept its fastest time: the true ones (the swap is timed for real)
        assert getattr(model, name) == pytest.approx(getattr(TRUTH, name), rel=1e-6), name


def test_a_fit_still_off_after_every_attempt_writes_nothing_and_says_by_how_much(tmp_path, capsys, timings):
    timings["slow"] = [70.0]
    out = tmp_path / "model.json"
    assert blockspace(["gpu-profile", "--device", "cpu", "--out", str(out), *TINY]) == 1
    captured = capsys.readouterr()
    err = one_error_line(captured.err)
    assert (
        "error: the fit misses the step of prefill 0, decode 1, context " in err
        and "with every step timed 3 times" in err
    )
    worst = float(err.split(" by ")[1].split("%")[0])
    assert worst > 90, err
    assert f"{out} not written" in err and "--repeats" in err and "a larger --max-fit-error accepts" in err
    assert f"{worst:.1f}%" in captured.out and "measured ms" in captured.out  # the table of every step
    assert "(3 of 3)" in captured.out and "wrote" not in captured.out
    assert timings["calls"] == 3 * len(plan_steps(32, 4, 32)) and not out.exists()


def test_attempts_and_the_bound_are_options(tmp_path, capsys, timings):
    timings["slow"] = [70.0]
    out = tmp_path / "model.json"
    assert blockspace(["gpu-profile", "--device", "cpu", "--out", str(out), *TINY, "--attempts", "1"]) == 1
    assert "with every step timed once" in one_error_line(capsys.readouterr().err) and not out.exists()
    assert blockspace(["gpu-profile", "--device", "cpu", "--out", str(out), *TINY, "--max-fit-error", "1"]) == 0
    fit = json.loads(out.read_text())["fit"]
    assert fit["attempts"] == 1 and 0.9 < fit["max_relative_error"] <= 1 and fit["max_fit_error"] == 1


def test_on_the_cpu_the_steps_are_timed_on_one_thread(tmp_path, monkeypatch):
    """torch's thread per core made each op wait for a core another process
    held: a 0.15 ms step timed 47 ms in every run. One thread while timing,
    and torch's own setting back afterwards."""
    torch = pytest.importorskip("torch")
    import blockspace.profile.measure as measure

    threads = []
    real = measure.step_ms
    monkeypatch.setattr(measure, "step_ms", lambda *args: threads.append(torch.get_num_threads()) or real(*args))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert blockspace(["gpu-profile", "--device", "cpu", "--out", str(tmp_path / "m.json"), *TINY]) == 0
        assert set(threads) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
