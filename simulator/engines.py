"""The simulator's two engines, and the one place a run picks between them.

- ``python``: ``Simulation`` driving ``Scheduler`` (``simulation.py``,
  ``scheduler.py``): the readable policy, for any ``BlockSpaceManager``.
- ``compiled``: the same policy as Numba code calling fast's kernels
  (``compiled/``), for fast's manager only. It is the twin the tests hold
  equal to the Python engine, decision for decision and figure for figure.

``auto`` (the command's default) takes the compiled engine wherever it can
run: a fast manager, and no step path asked for (step paths are the Python
engine's ways to reach a manager).
"""

from __future__ import annotations

from typing import Any

from blockspace.errors import InvalidArgumentError
from blockspace.simulator.runs import ENGINES, SimulationConfig, SimulationResult
from blockspace.simulator.simulation import run_simulation
from blockspace.workloads import TraceRequest

CHOICES = ("auto", *ENGINES)


def can_compile(manager_class: type) -> bool:
    """Does the compiled engine run this manager (fast's, or a subclass)?"""
    from blockspace.fast.manager import FastBlockSpaceManager

    return isinstance(manager_class, type) and issubclass(manager_class, FastBlockSpaceManager)


def resolve(choice: str, manager_class: type, step: str, where: str = "--engine") -> str:
    """The engine ``choice`` means for this manager and step path
    (``InvalidArgumentError`` naming ``where`` when it cannot run them)."""
    if choice == "auto":
        return "compiled" if can_compile(manager_class) and step == "auto" else "python"
    if choice == "compiled":
        if not can_compile(manager_class):
            raise InvalidArgumentError(
                f"{where}: the compiled engine runs fast's kernels, and {manager_class.__name__} is not fast's "
                "manager (use the python engine)"
            )
        if step != "auto":
            raise InvalidArgumentError(
                f"{where}: --step {step} picks how the Python engine reaches the manager; the compiled engine "
                "has no step paths (drop --step, or use the python engine)"
            )
    return choice


def replay(trace: list[TraceRequest], manager_class: type, config: SimulationConfig, **hooks: Any) -> SimulationResult:
    """Replay ``trace`` through a fresh ``manager_class`` on ``config.engine``
    (a fleet of them, with ``config.replicas`` > 1, a closed loop, or failures: ``fleet.py``; prefill and
    decode apart: ``disaggregated.py``)."""
    if config.prefill_replicas:
        from blockspace.simulator.disaggregated import replay_disaggregated

        return replay_disaggregated(trace, manager_class, config, **hooks)
    if config.replicas > 1 or config.max_concurrency is not None or config.failures:
        from blockspace.simulator.fleet import replay_fleet

        return replay_fleet(trace, manager_class, config, **hooks)
    if config.engine == "compiled":
        from blockspace.simulator.compiled.engine import run_compiled

        return run_compiled(trace, manager_class, config, **hooks)
    return run_simulation(trace, manager_class, config, **hooks)


__all__ = ["CHOICES", "ENGINES", "can_compile", "replay", "resolve"]
