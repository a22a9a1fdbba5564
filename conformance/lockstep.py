"""Drive several managers with the same call and demand the same answer.

``Lockstep`` holds N managers (the first one is the yardstick, usually the
reference). ``call(name, *args)`` makes the call on each and compares what
came back: the same value of the same type (``AllocStatus`` is not ``bool``,
a list of tuples is not a list of lists, a numpy int is not an int), or an
error of the same type everywhere. Then, for every manager that offers
``snapshot()``, it compares the full observable state, and after an error it
checks that the error left each manager exactly as it was (every blockspace
error is raised before any change).

Any disagreement raises ``Divergence`` with the runnable call log (a
``Script``) that led to it, so a failure is its own bug report.

A manager may refuse to be compared on a call by raising ``Excluded``
(vLLM's own manager does, where vLLM crashes, half-changes its state, is
nondeterministic or reads an input it never checks: spec §14, §15). A
question (it changes nothing) is then not compared; any other call has
already changed the managers asked before it, so the excluded manager
leaves the lockstep and the rest of the run is compared without it. Each
exclusion is counted by its reason in ``EXCLUDED``, which every check reads
(``check.Check``), as the explorer counts its own.
"""

from __future__ import annotations

import enum
import functools
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from blockspace.conformance.script import Script
from blockspace.conformance.steps import DeviceMirror, decode_step, row_misuse, running, table_arrays
from blockspace.conformance.vllm_manager import Excluded
from blockspace.extras import missing_modules
from blockspace.interfaces import BATCH_API, ROW_API, load_manager_class, offers_rows
from blockspace.protocols import SequenceGroupLike
from blockspace.snapshot import diff

REPRO_HEADING = "\n\nRepro (runnable):\n"  # between a Divergence's message and its script
PURE = frozenset({  # calls that change nothing (spec §9)
    "can_allocate", "can_append_slots", "can_swap_in", "can_swap_out", "get_block_table",
    "get_cross_block_table", "get_num_free_gpu_blocks", "get_num_free_cpu_blocks", "get_prefix_cache_hit_rate",
})  # fmt: skip
EXCLUDED: Counter[str] = Counter()  # calls a manager refused to be compared on, by reason, in this process


class Divergence(AssertionError):
    """Two managers disagreed, or one broke an invariant; the message ends
    with a runnable repro. ``full_repro`` is the same script with every
    observation call in it too."""

    full_repro: str = ""


@dataclass
class Outcome:
    """What one call did in one manager: a returned value or a raised error."""

    value: Any = None
    error: BaseException | None = None

    @property
    def raised(self) -> bool:
        return self.error is not None

    def describe(self) -> str:
        if self.error is not None:
            return f"raised {type(self.error).__name__}: {self.error}"
        return f"returned {describe_value(self.value)}"


def describe_value(value: Any) -> str:
    """A value with its type, where the type is not obvious from the repr."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    text = repr(value)
    if type(value) not in (int, float, bool, str, list, tuple, dict, type(None)):
        text += f" ({type(value).__module__}.{type(value).__qualname__})"
    return text if len(text) < 400 else text[:400] + "..."


def mismatch(a: Any, b: Any, where: str = "value") -> str | None:
    """Why ``b`` is not the same as ``a`` (same type, same value, all the
    way down), or None when it is. Floats must be equal as IEEE doubles."""
    if type(a) is not type(b):
        return f"{where}: type {type(a).__qualname__} != {type(b).__qualname__} ({a!r} vs {b!r})"
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: length {len(a)} != {len(b)} ({a!r} vs {b!r})"
        for index, (x, y) in enumerate(zip(a, b)):
            problem = mismatch(x, y, f"{where}[{index}]")
            if problem:
                return problem
        return None
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return f"{where}: keys {sorted(a, key=repr)} != {sorted(b, key=repr)}"
        for key in a:
            problem = mismatch(a[key], b[key], f"{where}[{key!r}]")
            if problem:
                return problem
        return None
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return None
    if a != b:
        return f"{where}: {a!r} != {b!r}"
    return None


def same_error(expected: BaseException | None, got: BaseException | None) -> bool:
    """The same error type (or both none); or, from a manager that raises
    built-in errors where blockspace raises named ones (vLLM's, through
    ``vllm_manager.ForeignError``), an error of that built-in kind."""
    if type(expected) is type(got):
        return True
    if expected is None or got is None:
        return False
    foreign, other = (got, expected) if hasattr(got, "builtin") else (expected, got)
    kind = getattr(foreign, "builtin", None)
    return kind is not None and isinstance(other, kind)


def disagreements(outcomes: Mapping[str, Outcome]) -> list[str]:
    """How each manager's outcome differs from the yardstick's (the first):
    another error type, or another value (``mismatch``)."""
    (first_name, first), *others = outcomes.items()
    problems = []
    for name, outcome in others:
        if first.raised or outcome.raised:
            if not same_error(first.error, outcome.error):
                problems.append(f"{first_name} {first.describe()}\n  {name} {outcome.describe()}")
        elif why := mismatch(first.value, outcome.value):
            problems.append(f"{first_name} {first.describe()}\n  {name} {outcome.describe()}\n  ({why})")
    return problems


CONFIG_ATTRIBUTES = {  # constructor argument -> the attribute vLLM's manager (and ours) keeps it in
    "block_size": "block_size",
    "num_gpu_blocks": "num_total_gpu_blocks",
    "num_cpu_blocks": "num_total_cpu_blocks",
    "watermark": "watermark",
    "sliding_window": "sliding_window",
    "enable_caching": "enable_caching",
}


def built_from(managers: Mapping[str, Any]) -> tuple[dict[str, type], dict[str, Any]]:
    """The classes and constructor arguments that rebuild ``managers``, for
    the repro of a ``Lockstep`` made from instances: the arguments are read
    back from the yardstick's attributes, those of vLLM's own manager."""
    impls = {name: type(manager) for name, manager in managers.items()}
    first = next(iter(managers.values()), None)
    config = {arg: getattr(first, attr) for arg, attr in CONFIG_ATTRIBUTES.items() if hasattr(first, attr)}
    return impls, config


def config_problems(managers: Mapping[str, Any]) -> list[str]:
    """Where a manager's configuration attributes (``CONFIG_ATTRIBUTES``)
    differ from the yardstick's (schedulers and vLLM's own code read them),
    and where a manager offers the row or batch API in part: the kit finds
    an API by its methods, so a manager that lost one of them would
    otherwise be stepped through the per-sequence calls, unchecked."""
    first_name, first = next(iter(managers.items()))
    problems = [
        f"{name}.{attr} is {getattr(manager, attr)!r}, {first_name}.{attr} is {getattr(first, attr)!r}"
        for name, manager in managers.items()
        for attr in CONFIG_ATTRIBUTES.values()
        if hasattr(first, attr) and getattr(manager, attr, None) != getattr(first, attr)
    ]
    for name, manager in managers.items():
        for api, methods in (("ROW_API", ROW_API), ("BATCH_API", BATCH_API)):
            missing = [method for method in methods if not callable(getattr(manager, method, None))]
            if 0 < len(missing) < len(methods):
                problems.append(f"{name} offers {api} in part: no {', '.join(missing)}")
    return problems


class Lockstep:
    """N managers that must agree on every call.

    ``managers`` maps a display name to a manager; the first is the yardstick.
    ``script`` (optional) is the call log; every call made through ``call``
    is appended to it so a failure can print a runnable repro.
    """

    def __init__(self, managers: Mapping[str, Any], script: Script | None = None, every_call: bool = True) -> None:
        if len(managers) < 1:
            raise ValueError("Lockstep needs at least one manager")
        self.managers = dict(managers)
        self.script = script if script is not None else Script(*built_from(self.managers))
        self.num_calls = 0
        self.failed = False
        self.every_call = every_call  # False: snapshots only at ``checkpoint`` (big pools)
        self.on_failure: Callable[[str], None] | None = None  # hears of each failure before it is raised
        self.snapshots: dict[str, Any] = {}
        self.device_mirrors: dict[str, DeviceMirror] = {}  # ``check_device_tables``
        self._take_snapshots()
        self.check_config()

    def check_config(self) -> None:
        """Every manager keeps its configuration in vLLM's attributes with the
        yardstick's values, and offers an API whole or not at all (``config_problems``)."""
        if problems := config_problems(self.managers):
            self.fail("the configuration differs:\n  " + "\n  ".join(problems))

    @classmethod
    def build(
        cls, impls: Mapping[str, Any], script: Script | None = None, every_call: bool = True, **config: Any
    ) -> Lockstep:
        """Managers from classes or version names (``"reference"``,
        ``"package.module:Class"``), all built with the same ``config``."""
        managers = {}
        for name, impl in impls.items():
            impl_cls = load_manager_class(impl) if isinstance(impl, str) else impl
            managers[name] = impl_cls(**config)
        return cls(managers, script if script is not None else Script(impls, config), every_call)

    @property
    def offers_rows(self) -> bool:
        """Does any manager offer the row API (so that ``row_step`` compares the ways)?"""
        return any(offers_rows(manager) for manager in self.managers.values())

    @property
    def reference(self) -> Any:
        return next(iter(self.managers.values()))

    @property
    def snapshotting(self) -> list[str]:
        """Names of the managers that offer ``snapshot()``."""
        return [name for name, m in self.managers.items() if callable(getattr(m, "snapshot", None))]

    def _take_snapshots(self) -> dict[str, Any]:
        previous = self.snapshots
        snapshots = {}
        for name in self.snapshotting:
            try:
                snapshots[name] = self.managers[name].snapshot()
            except Exception as error:  # noqa: BLE001 - a broken snapshot() is a finding, not a crash
                self.fail(f"{name}.snapshot() raised {type(error).__name__}: {error}")
        self.snapshots = snapshots
        return previous

    def fail(self, message: str) -> None:
        self.failed = True
        if self.on_failure is not None:
            self.on_failure(message)
        failure = Divergence(f"{message}{REPRO_HEADING}{self.script.render()}")
        failure.full_repro = self.script.render(quiet=True)
        raise failure

    def call(self, method: str, *args: Any, quiet: bool = False, **kwargs: Any) -> Outcome:
        """Make the call on every manager; return the yardstick's outcome.

        ``quiet`` calls (pure observations made after every step) are written
        to the script only if they diverge, to keep repros short."""
        line = self.script.call_line(method, args, kwargs)
        first = self._each_manager(method, line, lambda manager: getattr(manager, method)(*args, **kwargs), quiet)
        if (quiet or not self.every_call) and not first.raised:
            return first  # an observation (or a big pool): the next snapshots cover it
        previous = self._take_snapshots()
        if first.raised:
            for name, snap in self.snapshots.items():
                if snap != previous.get(name):
                    changes = "\n    ".join(diff(previous[name], snap)[:12])
                    self.fail(f"{method} raised {type(first.error).__name__} but changed {name}:\n    {changes}")
        self.compare_snapshots(method)
        return first

    def checkpoint(self, label: str) -> None:
        """Take and compare snapshots now (with ``every_call=False``)."""
        self._take_snapshots()
        self.compare_snapshots(label)

    def compare_snapshots(self, after: str) -> None:
        names = list(self.snapshots)
        for name in names[1:]:
            if self.snapshots[name] != self.snapshots[names[0]]:
                changes = "\n    ".join(diff(self.snapshots[names[0]], self.snapshots[name])[:12])
                self.fail(f"state differs after {after} ({names[0]} vs {name}):\n    {changes}")

    def row_step(
        self, groups: list[Any], num_lookahead_slots: int, access_time: float, guarded: bool = True, way: str = "rows"
    ) -> Outcome:
        """One decode step of ``groups`` ``way``: through the row API
        (``blockspace.interfaces.ROW_API``) as an array-level scheduler makes
        it, or through the batched calls (``BATCH_API``), where a manager
        offers that way (found by its methods), and as the per-sequence calls
        elsewhere (``conformance/steps.py``): every manager must give the same
        (appended, fits of each group, copy-on-write pairs, block tables,
        slots, computed blocks) and end in the same state. A guarded step
        appends only if every group fits; an unguarded one appends
        regardless, all or none. A manager that keeps a device block table in sync
        (``table_delta``; needs the ``[gpu]`` extra) must then have its
        deltas rebuild the step's tables exactly."""
        self.script.catch_up()
        options = ("" if guarded else ", guarded=False") + ("" if way == "rows" else f", way={way!r}")
        line = (
            f"lock.row_step({self.script.render_value(list(groups))}, "
            f"{num_lookahead_slots!r}, {access_time!r}{options})"
        )
        first = self._each_manager(
            "row_step",
            line,
            lambda manager: decode_step(manager, groups, num_lookahead_slots, access_time, guarded, way),
        )
        self._take_snapshots()
        self.compare_snapshots("row_step")
        self.check_device_tables(groups)
        return first

    def table_arrays(self, seqs: list[Any], quiet: bool = False) -> Outcome:
        """The sequences' block tables as one array (``steps.table_arrays``):
        the same width and rows from every manager. Changes nothing."""
        self.script.catch_up()
        line = f"lock.table_arrays({self.script.render_value(list(seqs))})"
        return self._each_manager("table_arrays", line, lambda manager: table_arrays(manager, seqs), quiet)

    def row_misuse(self, seqs: list[Any]) -> None:
        """``steps.row_misuse`` on every manager with the row API: the
        documented answers, and no change."""
        self.script.catch_up()
        self.script.add(f"lock.row_misuse({self.script.render_value(list(seqs))})")
        for name, manager in self.managers.items():
            if offers_rows(manager):
                self.require(row_misuse(manager, seqs), f"{name}'s row API")

    def _each_manager(self, what: str, line: str, run: Callable[[Any], Any], quiet: bool = False) -> Outcome:
        """``run(manager)`` on every manager, compared like a call."""
        outcomes: dict[str, Outcome] = {}
        for name, manager in self.managers.items():
            try:
                outcomes[name] = Outcome(value=run(manager))
            except Exception as error:  # noqa: BLE001 - every error is part of the comparison
                outcomes[name] = Outcome(error=error)
        self.num_calls += 1
        if excluded := {name for name, outcome in outcomes.items() if isinstance(outcome.error, Excluded)}:
            return self._exclude(what, line, outcomes, excluded)
        first_name, first = next(iter(outcomes.items()))
        self.script.add(line, comment="" if quiet else f"{first_name} {first.describe()}", quiet=quiet)
        problems = disagreements(outcomes)
        if problems:
            if quiet:
                self.script.add(line)
            self.fail(f"{what} disagrees:\n  " + "\n  ".join(problems))
        return first

    def _exclude(self, what: str, line: str, outcomes: Mapping[str, Outcome], excluded: set[str]) -> Outcome:
        """A call some managers refused to be compared on (module docstring):
        counted by its reason; after a call that may change state, those
        managers leave the lockstep (unless none would be left). The answer
        is that of the first manager that stays."""
        reason = str(next(outcomes[name].error for name in outcomes if name in excluded))
        EXCLUDED[reason] += 1
        self.script.add(line, comment=f"not compared: {reason}")
        if what not in PURE and len(excluded) < len(self.managers):
            self.managers = {name: m for name, m in self.managers.items() if name not in excluded}
            self.snapshots = {name: s for name, s in self.snapshots.items() if name not in excluded}
            self.script.add(f"# {', '.join(sorted(excluded))} left the lockstep here ({reason})")
        return next((o for name, o in outcomes.items() if name not in excluded), next(iter(outcomes.values())))

    def device_tables(self, groups: list[Any]) -> None:
        """``check_device_tables`` as a call of its own (the explorer's
        scheduler keeps a device table after every move, not only after row steps)."""
        self.script.catch_up()
        self.script.add(f"lock.device_tables({self.script.render_value(list(groups))})")
        self.check_device_tables(groups)

    def check_device_tables(self, groups: list[Any]) -> None:
        """Each manager with ``table_delta`` rebuilds the running tables of
        ``groups`` from its deltas alone (``DeviceMirror``)."""
        if problems := device_table_problems(self.managers, self.device_mirrors, groups):
            self.fail(problems)

    def value(self, method: str, *args: Any, quiet: bool = False, **kwargs: Any) -> Any:
        """``call`` for a call that must succeed: its (common) return value."""
        outcome = self.call(method, *args, quiet=quiet, **kwargs)
        if outcome.raised:
            self.fail(f"{method} raised {type(outcome.error).__name__} in every manager: {outcome.error}")
        return outcome.value

    def require(self, problems: list[str], where: str = "") -> None:
        """Fail with ``problems`` (an invariant broken in ``where``), if any."""
        if problems:
            self.fail(f"invariant broken{' in ' + where if where else ''}:\n  " + "\n  ".join(problems[:12]))

    def verify(self, world: Any, groups: Mapping[str, SequenceGroupLike]) -> None:
        """The invariants the state machine checks after every step, on the
        managers' state now (``world``: the scheduler's view; ``groups``:
        request id -> group, for the cross tables). A repro of a broken
        invariant ends with this call, so it fails as printed. The content
        ledger is not among them: it follows the whole run."""
        from blockspace.conformance import invariants

        num_free = (
            self.value("get_num_free_gpu_blocks", quiet=True),
            self.value("get_num_free_cpu_blocks", quiet=True),
        )
        tables = {seq_id: self.value("get_block_table", seq, quiet=True) for seq_id, seq in world.seqs.items()}
        cross = {
            request_id: self.value("get_cross_block_table", groups[request_id], quiet=True)
            for request_id in world.encoders
        }
        self.require(invariants.check_returns(tables, cross, *num_free, world), "the return values")
        for name, manager in self.managers.items():  # the manager's own self-check, where offered
            if callable(getattr(manager, "check_invariants", None)):
                try:
                    manager.check_invariants()
                except Exception as error:  # noqa: BLE001 - any failure of the self-check is a finding
                    self.require([f"check_invariants() raised {type(error).__name__}: {error}"], name)
        for name, snap in self.snapshots.items():
            self.require(invariants.check_snapshot(snap, world, num_free), name)

    def each(self, check: Callable[[str, Any], list[str]]) -> None:
        """Run ``check(name, snapshot)`` on every snapshot; fail on problems."""
        for name, snap in self.snapshots.items():
            problems = check(name, snap)
            if problems:
                self.fail(f"invariant broken in {name}:\n  " + "\n  ".join(problems[:12]))


@functools.cache
def _deltas_readable() -> bool:
    """Are the ``[gpu]`` extra's modules there? Asked once a process: the
    explorer asks after every move that changes a state, and looking for a
    module that is not imported searches the path each time."""
    return not missing_modules("gpu")


def device_table_problems(managers: Mapping[str, Any], mirrors: dict[str, DeviceMirror], groups: list[Any]) -> str:
    """Where a manager's ``table_delta()`` answers, applied to its mirror
    (made on the first call, which starts the deltas), do not rebuild the
    running tables of ``groups`` ('' where they all do, or without the
    ``[gpu]`` extra the deltas need)."""
    if not _deltas_readable():
        return ""
    for name, manager in managers.items():
        if callable(getattr(manager, "table_delta", None)):
            mirror = mirrors.setdefault(name, DeviceMirror())
            if problems := mirror.problems(manager, running(groups)):
                return f"{name}'s table deltas disagree with its tables:\n  " + "\n  ".join(problems)
    return ""
