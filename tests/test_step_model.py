"""A step-time model in a file (``blockspace.simulator.step_model``): what is
written loads back as it was, and every bad file is one
``InvalidArgumentError`` that starts with the file's name and says what is
wrong, so that ``--step-model: <message>`` tells a user what to fix."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from blockspace.errors import InvalidArgumentError
from blockspace.profile.plan import ModelShape
from blockspace.simulator.gpu import KVCacheModel, StepTimeModel
from blockspace.simulator.step_model import (
    COEFFICIENTS,
    check_kv_cache,
    load_step_model,
    save_step_model,
    step_model_json,
)

GOOD = {
    "version": 1,
    "step_overhead_ms": 3.5,
    "prefill_token_us": 41.0,
    "decode_seq_us": 12,
    "kv_token_read_ns": 29.5,
    "swap_block_us": 44.0,
}


def test_a_saved_model_loads_back_equal_with_its_provenance_kept(tmp_path):
    model = StepTimeModel(step_overhead_ms=3.5, prefill_token_us=41.0, decode_seq_us=0.0, kv_token_read_ns=29.5)
    provenance = {"source": "by hand", "measured_on": "NVIDIA H200", "model": {"num_layers": 32}, "fit": {}}
    path = tmp_path / "model.json"
    save_step_model(model, path, provenance)
    assert load_step_model(path) == model
    written = json.loads(path.read_text())
    assert written == {"version": 1, **{name: getattr(model, name) for name in COEFFICIENTS}, **provenance}
    assert path.read_text().endswith("}\n")


def test_the_built_in_defaults_and_a_file_with_only_the_required_keys_load(tmp_path):
    path = tmp_path / "defaults.json"
    save_step_model(StepTimeModel(), path)
    assert load_step_model(str(path)) == StepTimeModel()
    path.write_text(json.dumps(GOOD))
    assert load_step_model(path) == StepTimeModel(3.5, 41.0, 12.0, 29.5, 44.0)


def with_changes(**changes) -> str:
    """GOOD's text with ``changes`` (a value of None removes the key)."""
    found = {**GOOD, **changes}
    return json.dumps({key: value for key, value in found.items() if value is not None})


BAD = {
    "not JSON": ("{", "is not JSON (Expecting property name enclosed in double quotes at line 1, column 2)"),
    "a list": ("[1, 2]", "holds a JSON array, not an object of step-time coefficients"),
    "a number": ("4.0", "holds a JSON number, not an object"),
    "unknown key": (with_changes(speed=1), "unknown key 'speed' (known: version, step_overhead_ms,"),
    "misspelt key": (
        with_changes(prefill_token_us=None, prefil_token_us=4),
        "unknown key 'prefil_token_us' (known: ",
    ),
    "misspelt key, and missing": (
        with_changes(prefill_token_us=None, prefil_token_us=4),
        "; missing key 'prefill_token_us'",
    ),
    "missing keys": (
        with_changes(decode_seq_us=None, swap_block_us=None),
        "missing keys 'decode_seq_us', 'swap_block_us'",
    ),
    "no version": (with_changes(version=None), "missing key 'version'"),
    "a later version": (with_changes(version=2), "version 2 is not one this blockspace reads (it reads version 1)"),
    "a version as text": (with_changes(version="1"), 'version "1" is not one'),
    "a version as a bool": (with_changes(version=True), "version true is not one"),
    "text": (with_changes(decode_seq_us="12"), 'decode_seq_us must be a number, got "12"'),
    "a bool": (with_changes(decode_seq_us=True), "decode_seq_us must be a number, got true"),
    "explicit null": (json.dumps({**GOOD, "decode_seq_us": None}), "decode_seq_us must be a number, got null"),
    "a list value": (with_changes(decode_seq_us=[1]), "decode_seq_us must be a number, got [1]"),
    "negative": (with_changes(kv_token_read_ns=-1), "kv_token_read_ns must be >= 0, got -1"),
    "NaN": (with_changes(kv_token_read_ns=float("nan")), "kv_token_read_ns must be a finite number, got nan"),
    "infinite": (with_changes(swap_block_us=float("inf")), "swap_block_us must be a finite number, got inf"),
    "too large for a float": (with_changes(swap_block_us=10**400), "swap_block_us must be a finite number"),
    "no time at all": (
        with_changes(step_overhead_ms=0, prefill_token_us=0, decode_seq_us=0),
        "a step must take some time",
    ),
    "source not text": (with_changes(source=5), "source must be a string, got 5"),
    "model not an object": (with_changes(model=[32]), "model must be an object, got [32]"),
}


@pytest.mark.parametrize(("text", "said"), list(BAD.values()), ids=list(BAD))
def test_a_bad_file_names_itself_and_the_problem(tmp_path, text, said):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InvalidArgumentError) as raised:
        load_step_model(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and said in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda path: None, "no such file"),
        (lambda path: path.mkdir(), "is a folder, not a file"),
        (lambda path: path.write_bytes(b'{"version": 1, "\xff": 2}'), "is not UTF-8 text"),
    ],
    ids=["missing", "a folder", "not UTF-8"],
)
def test_a_file_that_cannot_be_read_names_itself(tmp_path, make, said):
    path = tmp_path / "model.json"
    make(path)
    with pytest.raises(InvalidArgumentError, match=f"^{path}: {said}$"):
        load_step_model(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_says_so(tmp_path):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(GOOD))
    path.chmod(0)
    with pytest.raises(InvalidArgumentError, match=r": cannot read it \(Permission denied\)$"):
        load_step_model(path)


def test_saving_refuses_provenance_the_file_could_not_hold(tmp_path):
    with pytest.raises(InvalidArgumentError, match="unknown key 'device'"):
        step_model_json(StepTimeModel(), {"device": "cuda"})
    with pytest.raises(InvalidArgumentError, match="measured_on must be a string"):
        save_step_model(StepTimeModel(), tmp_path / "m.json", {"measured_on": 1})
    assert list(tmp_path.iterdir()) == []


def test_simulate_runs_on_the_file_s_model(tmp_path, capsys):
    """``blockspace simulate --step-model FILE``: every step then costs what
    the file says (here 10 ms flat), as the summary's busy time shows."""
    from blockspace.simulator.cli import main as simulate

    flat = StepTimeModel(10.0, 0.0, 0.0, 0.0, 0.0)
    save_step_model(flat, tmp_path / "flat.json", {"source": "a test"})
    out = tmp_path / "out"
    argv = [
        "--max-requests",
        "10",
        "--no-plot",
        "--quiet",
        "--out",
        str(out),
        "--step-model",
        str(tmp_path / "flat.json"),
    ]
    assert simulate(argv) == 0
    run = json.loads((out / "simulation.json").read_text())["runs"][0]
    assert run["busy_s"] == pytest.approx(0.010 * run["steps"])
    assert json.loads((out / "simulation.json").read_text())["config"]["step_time"]["step_overhead_ms"] == 10.0
    capsys.readouterr()
    assert simulate([*argv, "--decode-seq-us", "5"]) == 2  # the file and an option: which one would count?
    assert "drop --decode-seq-us" in capsys.readouterr().err


# -- the file's model against the run's KV cache ----------------------------------------------------------------
TINY_MODEL = {  # what blockspace gpu-profile writes for the tiny model of docs/gpu.md
    **dataclasses.asdict(ModelShape(2, 64, 4, 2, 128, "float32")),
    "head_dim": 16,
    "block_size": 16,
    "block_bytes": 16 * 512,
    "layers_timed": 2,
}
TINY_KV = ["--num-layers", "2", "--num-kv-heads", "2", "--head-dim", "16", "--dtype-bytes", "4"]


def simulate_argv(tmp_path, model_file, *more: str) -> list[str]:
    return ["--max-requests", "10", "--no-plot", "--quiet", "--out", str(tmp_path / "out"),
            "--step-model", str(model_file), *more]  # fmt: skip


def files_under(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_file_measured_on_another_model_is_refused_naming_both_and_the_options(tmp_path, capsys):
    from blockspace.simulator.cli import main as simulate

    path = tmp_path / "tiny.json"
    save_step_model(StepTimeModel(0.1, 7.0, 0.0, 50.0, 2.0), path, {"model": TINY_MODEL})
    assert simulate(simulate_argv(tmp_path, path)) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"error: --step-model: {path}: measured on a model whose KV cache is 2 layers x 2 KV heads x head dim 16"
        " x 4 bytes a value (512 bytes per token), but this run's is 32 layers x 8 KV heads x head dim 128 x 2"
        " bytes a value (131,072 bytes per token); --num-layers 2 --num-kv-heads 2 --head-dim 16 --dtype-bytes 4"
        " simulates the file's model (or measure this one with blockspace gpu-profile)\n"
    )
    assert captured.out == "" and files_under(tmp_path) == ["tiny.json"]
    assert simulate(simulate_argv(tmp_path, path, *TINY_KV)) == 0  # the options it names: the file's model
    assert (tmp_path / "out" / "simulation.json").is_file()


def test_only_the_options_that_differ_are_named(tmp_path, capsys):
    from blockspace.simulator.cli import main as simulate

    path = tmp_path / "bf16.json"
    save_step_model(StepTimeModel(), path, {"model": {**TINY_MODEL, "dtype": "bfloat16"}})
    assert simulate(simulate_argv(tmp_path, path, *TINY_KV)) == 2
    err = capsys.readouterr().err
    assert "x 2 bytes a value (256 bytes per token), but this run's is" in err
    assert "; --dtype-bytes 2 simulates the file's model" in err and "--num-layers" not in err


@pytest.mark.parametrize(
    "model",
    [None, {}, {"name": "Llama-3-8B, by hand"}, {"num_layers": 32}, dataclasses.asdict(ModelShape())],
    ids=["no model key", "an empty model", "nothing to compare", "one field, the same", "Llama-3-8B's shape"],
)
def test_a_file_whose_model_agrees_or_says_nothing_comparable_is_accepted(tmp_path, model):
    from blockspace.simulator.cli import main as simulate

    path = tmp_path / "model.json"
    save_step_model(StepTimeModel(), path, None if model is None else {"model": model})
    assert simulate(simulate_argv(tmp_path, path)) == 0


def test_every_configuration_of_a_sweep_is_compared_before_any_run(tmp_path, capsys):
    """num_layers=2 suits the file and 32 does not: the sweep stops before its first run."""
    from blockspace.simulator.cli import main as simulate

    path = tmp_path / "tiny.json"
    save_step_model(StepTimeModel(), path, {"model": TINY_MODEL})
    argv = simulate_argv(tmp_path, path, *TINY_KV[2:], "--sweep", "num_layers=2,32")
    assert simulate(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --sweep (num_layers=32): --step-model: {path}: measured on a model whose KV")
    assert "but this run's is 32 layers x 2 KV heads" in err and "; --num-layers 2 simulates" in err
    assert files_under(tmp_path) == ["tiny.json"]
    llama = tmp_path / "llama.json"
    save_step_model(StepTimeModel(), llama, {"model": dataclasses.asdict(ModelShape())})
    argv = ["--max-requests", "10", "--no-plot", "--quiet", "--out", str(tmp_path / "out"), *TINY_KV]
    assert simulate([*argv, "--sweep", f"step_model={path},{llama}"]) == 2
    assert f": --step-model: {llama}: measured on a model whose KV cache is 32 layers" in capsys.readouterr().err
    assert files_under(tmp_path) == ["llama.json", "tiny.json"]


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("num_layers", "2", 'model.num_layers must be a whole number >= 1, got "2"'),
        ("head_dim", 0, "model.head_dim must be a whole number >= 1, got 0"),
        ("num_kv_heads", True, "model.num_kv_heads must be a whole number >= 1, got true"),
        ("dtype", "fp8", 'model.dtype must be one of bfloat16, float16, float32, got "fp8"'),
    ],
)
def test_a_model_field_that_cannot_be_compared_is_refused(tmp_path, field, value, said):
    path = tmp_path / "model.json"
    save_step_model(StepTimeModel(), path, {"model": {**TINY_MODEL, field: value}})
    assert load_step_model(path) == StepTimeModel()  # read alone, the model is only provenance
    with pytest.raises(InvalidArgumentError, match=f"^{path}: {said}$"):
        load_step_model(path, KVCacheModel(2, 2, 16, 4))


def test_the_comparison_is_of_the_fields_given(tmp_path):
    with pytest.raises(InvalidArgumentError, match=r"^here: measured on .*; --head-dim 64 simulates"):
        check_kv_cache({"head_dim": 64, "num_kv_heads": 8}, KVCacheModel(), "here")
    check_kv_cache({"head_dim": 128, "dtype": "float16"}, KVCacheModel(), "here")  # no error: they agree
