"""The explorer with vLLM 0.9.2's own manager as a party (conformance/vllm_manager.py):
within the default scope the reference and vLLM agree on every compared transition,
and every transition left out is one of the spec's named §14 / §15 corners.

Needs vLLM 0.9.2 (a CPU venv as docs/performance.md makes it, then
``pip install -e '.[conformance]'`` there); skipped elsewhere."""

import pytest

NEEDS = "needs vLLM 0.9.2 (a venv set up by hand, see docs/performance.md)"
vllm = pytest.importorskip("vllm", reason=NEEDS)
if getattr(vllm, "__version__", None) != "0.9.2":
    pytest.skip(f"{NEEDS}; this is vLLM {getattr(vllm, '__version__', '?')}", allow_module_level=True)
pytest.importorskip("vllm.core.block_manager", reason=NEEDS)

from blockspace.conformance.explore import explore  # noqa: E402
from blockspace.conformance.scope import SCOPES  # noqa: E402

VLLM = "blockspace.conformance.vllm_manager:VllmManager"


def test_the_reference_agrees_with_vllm_within_the_default_scope() -> None:
    report = explore({"reference": "reference", "vllm": VLLM}, SCOPES["default"], workers=2)
    assert report.passed, report.failure
    assert report.exhausted and report.states > 1000
    assert report.excluded and all(
        reason.startswith(("§14", "§15", "a token id", "a lookahead", "an append")) for reason in report.excluded
    )


def test_a_wrong_manager_disagrees_with_vllm_too() -> None:
    """The comparison has teeth: vLLM against a broken reference fails."""
    report = explore(
        {"vllm": VLLM, "broken": "blockspace.conformance.broken:FifoFreeList"}, SCOPES["default"], workers=1
    )
    assert not report.passed and "free" in report.failure
