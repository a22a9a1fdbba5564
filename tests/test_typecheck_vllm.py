"""``scripts/typecheck.py`` where vLLM 0.9.2 is installed.

Why: elsewhere mypy finds no ``vllm`` and takes every vLLM name as ``Any``
(``ignore_missing_imports`` in pyproject.toml), so CI's type check, run
without vLLM, cannot see a wrong use of vLLM's types. Here mypy reads
vLLM's own, and the code that touches vLLM (``blockspace/vllm_plugin.py``,
``conformance/vllm_manager.py``) must pass against them too.

Runs under the interpreter of a venv that has vLLM 0.9.2 (set up by hand,
see docs/performance.md) with blockspace installed with its ``sim``,
``conformance`` and ``lint`` extras, whose types mypy reads as well;
skipped elsewhere, with the reason.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

NEEDS = "needs vLLM 0.9.2 (a venv set up by hand, see docs/performance.md)"
vllm = pytest.importorskip("vllm", reason=NEEDS)
if getattr(vllm, "__version__", None) != "0.9.2":
    pytest.skip(f"{NEEDS}; this is vLLM {getattr(vllm, '__version__', '?')}", allow_module_level=True)
pytest.importorskip("vllm.core.scheduler", reason=NEEDS)  # not a stand-in package holding only vllm/core
EXTRAS = "needs blockspace's extras in the vLLM venv: pip install -e '.[sim,conformance,lint]'"
for module in ("mypy", "matplotlib", "rich", "hypothesis"):
    pytest.importorskip(module, reason=EXTRAS)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_package_type_checks_against_vllms_own_types():
    ran = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "typecheck.py")], capture_output=True, text=True, timeout=900
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.startswith("Success: no issues found"), ran.stdout
