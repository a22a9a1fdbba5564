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


def test_vllm_passes_the_quick_profile_with_each_exclusion_named(tmp_path) -> None:
    """Every check of the default profile compares vLLM's manager with the
    reference; the calls vLLM cannot be compared on are counted by reason."""
    from blockspace.conformance import cli

    path = tmp_path / "report.json"
    assert cli.main(["--impl", VLLM, "--against", "reference", "--json", str(path)]) == 0
    import json

    report = json.loads(path.read_text())
    assert report["passed"] and len(report["checks"]) == 19
    refused = {reason for check in report["checks"] for reason in check.get("not_compared", {})}
    assert any(reason.startswith("a cache salt") for reason in refused)
    assert all(reason.startswith(("§14", "§15", "a ", "an ", "device ")) for reason in refused), refused
    assert not report["checks"][4].get("not_compared", {}).get("device 'GPU' (vLLM takes its own Device only)")
