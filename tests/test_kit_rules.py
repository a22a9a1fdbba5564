"""The rules the CrossHair checks compare: read off the reference module,
each with a fast twin.

``symbolic.rule_names`` finds the rules of ``blockspace.reference.rules``
(no hand-kept list), and ``crosshair diffbehavior`` compares each with the
function of the same name in ``blockspace.conformance.kernels``, which
calls the kernel of that name in ``blockspace.fast.rules``. A reference
rule missing from either would be met only by the slow symbolic profile,
as a CrossHair error; here it fails in the default run, named.
"""

from __future__ import annotations

import os.path
import sys
import types
from types import ModuleType

import pytest

from blockspace.conformance import kernels, symbolic
from blockspace.fast import rules as fast_rules


def twinless(names: list[str], *twins: ModuleType) -> list[str]:
    """Each of ``names`` that some module of ``twins`` has nothing callable
    for, as ``"name: not in module"`` (a Numba kernel is callable, not a
    Python function, so ``inspect.isfunction`` would miss it)."""
    return [
        f"{name}: not in {twin.__name__}" for name in names for twin in twins if not callable(getattr(twin, name, None))
    ]


def check_twins(rules: ModuleType | None, *twins: ModuleType) -> None:
    """Fails naming every rule of ``rules`` (None: the reference's) without a twin."""
    missing = twinless(symbolic.rule_names(rules), *twins)
    assert not missing, "reference rules with no fast twin:\n" + "\n".join(missing)


def fake_rules(name: str, source: str) -> ModuleType:
    """A module named ``name`` whose functions are defined by ``source`` (so
    their ``__module__`` is ``name``, as a real module's own functions')."""
    module = types.ModuleType(name)
    exec(source, module.__dict__)
    return module


FAKE_SOURCE = """
from os.path import join  # imported, not a rule

class Status:  # a class, not a rule
    pass

def kept(a: int) -> int:
    return a

def lost(a: int) -> int:
    return a
"""


def test_every_reference_rule_has_a_fast_twin():
    names = symbolic.rule_names()
    assert "cdiv" in names, names  # the reference's rules were found
    check_twins(None, kernels, fast_rules)


def test_every_kernel_adapter_is_a_reference_rule():
    """The other way: an adapter whose rule left the reference would never be compared."""
    orphans = sorted(set(symbolic.rule_names(kernels)) - set(symbolic.rule_names()))
    assert not orphans, f"functions of blockspace.conformance.kernels with no reference rule: {orphans}"


def test_the_twin_check_names_the_rule_without_a_twin():
    rules = fake_rules("fake_rules", FAKE_SOURCE)
    assert symbolic.rule_names(rules) == ["kept", "lost"]  # own functions, in order: not join, not Status
    twins = types.ModuleType("fake_fast")
    twins.kept = lambda a: a
    twins.lost = None  # present, but nothing to call
    with pytest.raises(AssertionError, match=r"\blost: not in fake_fast\b") as raised:
        check_twins(rules, twins)
    assert "kept" not in str(raised.value)
    twins.lost = os.path.join  # any callable is a twin
    check_twins(rules, twins)


def test_both_crosshair_checks_run_on_the_rules_of_the_reference_module(monkeypatch):
    """Both checks follow the module: a rule added there is checked without
    touching the kit (CrossHair itself stubbed out: only the targets count)."""
    ran: list[list[str]] = []

    def crosshair(args: list[str], timeout: float) -> tuple[int, str, float]:
        ran.append(args)
        return 0, "", 0.0

    monkeypatch.setattr(symbolic, "_crosshair", crosshair)
    monkeypatch.setitem(sys.modules, symbolic.RULES_MODULE, fake_rules(symbolic.RULES_MODULE, FAKE_SOURCE))
    contracts = symbolic.check_contracts()
    assert [args[-1] for args in ran] == [f"{symbolic.RULES_MODULE}.kept", f"{symbolic.RULES_MODULE}.lost"]
    ran.clear()
    diffbehavior = symbolic.check_diffbehavior()
    assert [args[-2:] for args in ran] == [
        [f"{symbolic.RULES_MODULE}.{name}", f"blockspace.conformance.kernels.{name}"] for name in ("kept", "lost")
    ]
    assert list(contracts.extra["rules"]) == list(diffbehavior.extra["rules"]) == ["kept", "lost"]
