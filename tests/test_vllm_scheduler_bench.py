"""scripts/vllm_scheduler_bench.py: vLLM 0.9.2's real scheduler with the block manager swapped.

Runs only where vLLM 0.9.2 imports (a venv set up by hand, see docs/performance.md).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

NEEDS = "needs vLLM 0.9.2 (a venv set up by hand, see docs/performance.md)"
vllm = pytest.importorskip("vllm", reason=NEEDS)
if getattr(vllm, "__version__", None) != "0.9.2":
    pytest.skip(f"{NEEDS}; this is vLLM {getattr(vllm, '__version__', '?')}", allow_module_level=True)
pytest.importorskip("vllm.core.scheduler", reason=NEEDS)  # not a stand-in package holding only vllm/core

from blockspace.reference import ReferenceBlockSpaceManager  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "vllm_scheduler_bench.py"
# A smaller GPU than the default: vLLM's manager makes a Python object per block at every run.
SMALL = ["--requests", "20", "--warmup-requests", "2", "--num-gpu-blocks", "8192", "--rounds", "1"]


def _load_script():
    spec = importlib.util.spec_from_file_location("vllm_scheduler_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


bench = _load_script()


class ReversedTables(ReferenceBlockSpaceManager):
    """Deliberately wrong: every block table handed to the scheduler is reversed."""

    def get_block_table(self, seq):
        return list(reversed(super().get_block_table(seq)))


def test_all_managers_decide_alike_and_are_timed(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main([*SMALL, "--caching", "both", "--impls", "vllm,fast,reference", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["decisions_equal"] is True
    assert report["config"]["num_requests"] == 20
    assert set(report["scenarios"]) == {"caching_on", "caching_off"}
    for scenario in report["scenarios"].values():
        assert scenario["decisions_equal"] is True and scenario["mismatch"] is None
        impls = scenario["impls"]
        assert list(impls) == ["vllm", "fast", "reference"]
        assert len({impl["digest"] for impl in impls.values()}) == 1
        assert len({impl["steps"] for impl in impls.values()}) == 1 and impls["vllm"]["steps"] > 20
        for impl in impls.values():
            methods = impl["best"]["methods"]
            for name in ("can_allocate", "allocate", "append_slots", "free", "get_block_table"):
                assert methods[name]["calls"] > 0 and methods[name]["seconds"] >= 0
            assert methods["allocate"]["calls"] >= 20
            assert impl["best"]["total_s"] > 0 and impl["best"]["wall_s"] > 0
            assert impl["best"]["total_s"] < impl["best"]["run_s"] < impl["best"]["wall_s"]
            assert impl["best"]["manager_share"] == impl["best"]["total_s"] / impl["best"]["run_s"]
            assert len(impl["rounds"]) == 1
        assert impls["vllm"]["manager"] == "vllm.core.block_manager.SelfAttnBlockSpaceManager"
        assert impls["fast"]["manager"] == "blockspace.fast.manager.FastBlockSpaceManager"
        assert set(scenario["ratios"]) == {"vllm/fast", "vllm/reference"}
        assert set(scenario["ratios"]["vllm/fast"]) == {"inside", "wall", "run"}
    on = report["scenarios"]["caching_on"]["impls"]["vllm"]["best"]["methods"]
    assert on["get_num_cached_tokens"]["calls"] > 0 and on["get_common_computed_block_ids"]["calls"] > 0
    assert report["timer_overhead_s"] > 0
    printed = capsys.readouterr().out
    assert "caching on:" in printed and "caching off:" in printed and "inside the manager (s)" in printed
    assert "the manager, share of the run" in printed


def test_preemption_by_swap_decides_alike(tmp_path):
    """Short prompts sharing a first chunk, long outputs, a small GPU: the
    scheduler preempts (swap) and swaps back in, under every manager."""
    trace = tmp_path / "tiny.jsonl"
    lines = []
    for i in range(16):
        length = 600 + 37 * i
        chunks = [0] + [100 + 10 * i + k for k in range(-(-length // 512) - 1)]
        lines.append(
            json.dumps(
                {"timestamp": 100 * i, "input_length": length, "output_length": 200 + 13 * i, "hash_ids": chunks}
            )
        )
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "bench.json"
    argv = [
        "--trace",
        str(trace),
        "--requests",
        "16",
        "--warmup-requests",
        "2",
        "--num-gpu-blocks",
        "160",
        "--num-cpu-blocks",
        "512",
        "--preemption-mode",
        "swap",
        "--json",
        str(out),
    ]
    assert bench.main(argv) == 0
    report = json.loads(out.read_text())
    for scenario in report["scenarios"].values():
        assert scenario["decisions_equal"] is True
        assert scenario["stats"]["preempted"] > 0
        impls = scenario["impls"]
        assert len({impl["digest"] for impl in impls.values()}) == 1
        for impl in impls.values():
            methods = impl["best"]["methods"]
            assert methods["swap_out"]["calls"] > 0 and methods["swap_in"]["calls"] > 0


def test_a_wrong_manager_fails_the_decision_check(tmp_path, capsys):
    out = tmp_path / "bench.json"
    wrong = f"{__name__}:ReversedTables"
    assert bench.main([*SMALL, "--caching", "off", "--impls", f"vllm,{wrong}", "--json", str(out)]) == 1
    error = capsys.readouterr().err
    assert "decisions differ (caching off)" in error and "tables differ" in error
    assert "step " in error
    report = json.loads(out.read_text())
    assert report["decisions_equal"] is False
    assert report["scenarios"]["caching_off"]["decisions_equal"] is False


def test_bad_arguments_exit_2(capsys):
    assert bench.main(["--requests", "0"]) == 2
    assert "error: --requests must be >= 1" in capsys.readouterr().err
    assert bench.main(["--impls", "vllm,nonesuch"]) == 2
    assert "error: --impls: cannot load 'nonesuch'" in capsys.readouterr().err
    assert bench.main(["--caching", "sometimes"]) == 2
    assert "error: argument --caching" in capsys.readouterr().err
