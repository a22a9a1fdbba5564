"""Exhaustive, breadth-first exploration of a scope, with every manager in lockstep.

TLC's way, on a block manager: from the start state, play every move the
scheduler may make (``protocol.py``), keep each state not seen before, and
go on a layer at a time until a layer brings no new state (the scope is
*exhausted*) or a budget runs out. After every call the managers must give
the same value of the same type, or raise the same error and change
nothing; after every move their ``snapshot()``s must be equal; every new
state is asked every side-effect-free question and must pass the
invariants. Because the search is breadth-first, the first failure found is
one of the shortest: its path is replayed through a ``Lockstep`` and
printed as the kit's runnable script, with no shrinking.

**States** are told apart by a canonical form (``canonical``): the
yardstick's snapshot and the scheduler's world (``World.state``), with one
abstraction: access times are replaced by their ranks. Managers only ever
compare times with each other (the evictor's order, the blocks' ages), so
two states whose times are in the same order behave the same; the moves
that use a time take it from the state (``moves``), never from the clock.
``tests/test_explore.py`` checks this on merged pairs. The seen set keeps
a 128-bit digest of each canonical form, as TLC keeps fingerprints: two
states merged by equal digests have a chance below n^2 / 2^129 among n
states (1.5 x 10^-27 for a million).

**Cloning**: a state is kept as the pickle of its world and of each
manager's ``save_state()``, compressed (``Keeper.blob``) (``blockspace/saved_state.py``; a manager
without one, vLLM's, is pickled whole). Each process explores with one
manager per implementation (``Keeper``), and before each move from a
state that an earlier move changed, the state is put back into it
(``restore_state``): for the fast manager a copy of bytes into the arrays
it has, where loading a pickle made every array and kernel handle anew. **Workers**: a layer's frontier is cut into
chunks of a fixed size, expanded by one forked process per core, or by
actors on a Ray cluster (``ray_layers.py``, the twin of ``expand_layer``);
their results are merged in frontier order, so the states, the counts and
the first failure are the same for any number and kind of workers.

**Forbidden moves at once** (``all_refused``): most of a state's moves are
forbidden calls (``illegal(kind)``), each of which must answer alike
(most raise) and change nothing. They are made one after another on the state's managers
and compared once, with one pair of snapshots where one by one each takes
its own, and their transitions are counted one by one. Where any of them
answers otherwise, each is made again on its own, as any move, so a
failure's path names the move that failed. ``tests/test_explore.py``
checks that the two ways give the same report.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from blockspace.conformance import invariants, situations
from blockspace.conformance.check import Check, CheckResult
from blockspace.conformance.lockstep import (
    PURE,
    REPRO_HEADING,
    Divergence,
    Lockstep,
    Outcome,
    config_problems,
    device_table_problems,
    disagreements,
)
from blockspace.conformance.protocol import Move, ScriptedWorld, World, keep_device_tables, make, moves, observe
from blockspace.conformance.scope import FAMILY_CAPABILITY, SCOPES, Scope
from blockspace.conformance.script import Script
from blockspace.conformance.situations import Transition
from blockspace.conformance.steps import DeviceMirror, decode_step, row_misuse, table_arrays
from blockspace.conformance.vllm_manager import Excluded
from blockspace.errors import ClusterError
from blockspace.extras import missing_modules
from blockspace.interfaces import load_manager_class, offers_rows
from blockspace.interrupts import worker_pool
from blockspace.reference.rules import window_blocks
from blockspace.saved_state import SavedState
from blockspace.snapshot import diff

CHUNK = 32  # frontier states a worker expands at a time (fixed, so results do not depend on the workers)


class Seen(Protocol):
    """The seen set as ``expand`` reads it: how many histories of a state
    (by its digest) earlier layers kept, 0 for none (a ``Counter``; a Ray
    worker's ``ray_layers.Digests``)."""

    def __getitem__(self, key: bytes, /) -> int: ...


class Finding(Exception):
    """The managers disagreed, or one broke an invariant, while exploring."""


class MoveAgain(Exception):  # noqa: N818 - not an error: a request to make the move again, call by call
    """A call raised after an earlier call of the same move had changed the
    state, so the state before it was never taken: make the move again with
    ``LeanLock(each_call=True)``."""


class LeanLock:
    """``Lockstep.call`` without the call log, for exploring: the same
    comparison of values, types and errors, and snapshots that must be
    equal. Why once a move and not after every call, as ``Lockstep``
    compares them: a move's calls that change the state (an append, the
    access, the common blocks and the marking that follow it) would take
    several pairs of snapshots where one tells the same; a difference that
    no later answer of the move shows and that has gone by its end is one
    no caller can see. Calls that raise must change nothing, so the state
    after them is compared with the state before; where a call of the move
    that did not raise comes between (the snapshots before a call that
    raised are then missing) or one of them changed the state,
    ``MoveAgain`` asks for the move to be made again, comparing after
    every call (``each_call``; rare, since a move's calls mostly all work or
    all raise). A failing path is replayed through a real ``Lockstep`` for
    its repro (``replay``), which compares after every call."""

    def __init__(
        self,
        managers: Mapping[str, Any],
        snapshots: dict[str, Any] | None = None,
        mirrors: dict[str, DeviceMirror] | None = None,
        each_call: bool = False,
    ) -> None:
        self.managers = dict(managers)
        self.mirrors = mirrors if mirrors is not None else {}  # the scheduler's device tables, once it keeps them
        self.snapshotting = [name for name, m in self.managers.items() if callable(getattr(m, "snapshot", None))]
        self._snapshots = snapshots if snapshots is not None else self._take()
        self.each_call = each_call
        self.at_once = False  # calls that raise and work, mixed: the state after must be the one before (all_refused)
        self.changed = False  # has a call changed the state since the snapshots were taken?
        self.raised = ""  # the first call that raised since then, if one did (it must change nothing)
        self.num_calls = 0
        self.log: list[tuple[str, Any, str]] = []  # the move's calls: (what, value, error class or ""), for situations

    def _take(self) -> dict[str, Any]:
        snapshots = {}
        for name in self.snapshotting:
            try:
                snapshots[name] = self.managers[name].snapshot()
            except Exception as error:  # noqa: BLE001 - a broken snapshot() is a finding, as in Lockstep
                raise Finding(f"{name}.snapshot() raised {type(error).__name__}: {error}") from None
        return snapshots

    @property
    def offers_rows(self) -> bool:
        return any(offers_rows(manager) for manager in self.managers.values())

    def call(self, method: str, *args: Any, quiet: bool = False) -> Outcome:
        return self.run(method, lambda manager: getattr(manager, method)(*args), quiet or method in PURE)

    def row_step(
        self, groups: list[Any], lookahead: int, access_time: float, guarded: bool = True, way: str = "rows"
    ) -> Outcome:
        """``Lockstep.row_step``: a decode step ``way`` (the row API or the
        batched calls) where a manager offers it, through the calls elsewhere."""
        return self.run("row_step", lambda manager: decode_step(manager, groups, lookahead, access_time, guarded, way))

    def table_arrays(self, seqs: list[Any], quiet: bool = False) -> Outcome:
        """``Lockstep.table_arrays``: the sequences' tables as one array."""
        return self.run("table_arrays", lambda manager: table_arrays(manager, seqs), pure=True)

    def row_misuse(self, seqs: list[Any]) -> None:
        """``Lockstep.row_misuse``: the row API's documented answers at its
        edges, on every manager that offers it, changing nothing."""
        for name, manager in self.managers.items():
            if offers_rows(manager) and (problems := row_misuse(manager, seqs)):
                raise Finding(f"invariant broken in {name}'s row API:\n  " + "\n  ".join(problems))

    def device_tables(self, groups: list[Any]) -> None:
        """``Lockstep.device_tables``: each manager's deltas rebuild its running tables."""
        if problems := device_table_problems(self.managers, self.mirrors, groups):
            raise Finding(problems)

    def run(self, what: str, run: Callable[[Any], Any], pure: bool = False) -> Outcome:
        """``run(manager)`` on every manager, compared; then (unless ``pure``)
        their snapshots, at once where it raised, else when the move settles."""
        outcomes = {}
        for name, manager in self.managers.items():
            try:
                outcomes[name] = Outcome(value=run(manager))
            except Exception as error:  # noqa: BLE001 - every error is part of the comparison
                outcomes[name] = Outcome(error=error)
        self.num_calls += 1
        first = next(iter(outcomes.values()))
        self.log.append((what, first.value, type(first.error).__name__ if first.raised else ""))
        if excluded := [o.error for o in outcomes.values() if isinstance(o.error, Excluded)]:
            if pure:  # a question vLLM cannot be asked here: not asked
                return next(iter(outcomes.values()))
            raise excluded[0]
        if problems := disagreements(outcomes):
            raise Finding(f"{what} disagrees:\n  " + "\n  ".join(problems))
        if pure:
            return first
        if first.raised:
            if self.changed and not self.at_once:
                raise MoveAgain
            self.raised = f"{what} raised {type(first.error).__name__}"
        elif self.raised and not self.at_once:
            raise MoveAgain  # the calls that raised are checked against the state before this one
        else:
            self.changed = True
        if self.each_call:
            self.settle(what)
        return first

    def settle(self, what: str = "the move") -> None:
        """Take the snapshots, if a call may have changed the state since
        they were last taken, and compare them: with each other, or, after
        calls that raised, with the state before them (several such calls
        are checked at once, and where they changed it, call by call)."""
        if self.raised:
            before, self._snapshots = self._snapshots, self._take()
            for name, snap in self._snapshots.items():
                if snap != before[name]:
                    if not self.each_call:
                        raise MoveAgain
                    changes = "\n    ".join(diff(before[name], snap)[:12])
                    raise Finding(f"{self.raised} but changed {name}:\n    {changes}")
            self.raised, self.changed = "", False  # (changed, too, only ``at_once``: the state is the one before)
        elif self.changed:
            self._snapshots, self.changed = self._take(), False
            first, *others = self.snapshotting
            for name in others:
                if self._snapshots[name] != self._snapshots[first]:
                    changes = "\n    ".join(diff(self._snapshots[first], self._snapshots[name])[:12])
                    raise Finding(f"state differs after {what} ({first} vs {name}):\n    {changes}")

    @property
    def snapshots(self) -> dict[str, Any]:
        """Each manager's snapshot now (equal, or ``Finding``)."""
        self.settle()
        return self._snapshots

    @property
    def yardstick(self) -> dict[str, Any]:
        return self.snapshots[self.snapshotting[0]]


# -- states -----------------------------------------------------------------------------------
def times_of(snap: dict[str, Any]) -> list[float]:
    """The access times a snapshot holds (-1 and None mean none), sorted."""
    times = {block[3] for block in snap["blocks"]}
    times.update(table["last_access"] for table in snap["tables"].values())
    return sorted(t for t in times if t is not None and t >= 0)


def canonical(snap: dict[str, Any], world: World) -> bytes:
    """A digest of what decides a state's future: the snapshot, times
    replaced by their ranks, and the world (module docstring)."""
    rank = {t: i for i, t in enumerate(times_of(snap))}
    tables = tuple(
        (seq_id, tuple(t["blocks"]), t["num_tokens"], t["device"], rank.get(t["last_access"], t["last_access"]))
        for seq_id, t in sorted(snap["tables"].items())
    )
    form = (
        tuple((refs, cached, computed, rank.get(at, at)) for refs, cached, computed, at in snap["blocks"]),
        tables,
        tuple(sorted((k, tuple(v)) for k, v in snap["cross_tables"].items())),
        tuple((device, tuple(snap["free"][device]), tuple(snap["evictable"][device])) for device in ("GPU", "CPU")),
        tuple(snap["touched"]),
        tuple(sorted(snap["hit_stats"].items())),
        tuple(sorted(snap["tracker"].items())),
        snap["null_block"],
        world.state(),
    )
    return hashlib.blake2b(repr(form).encode(), digest_size=16).digest()


def latest_time(snap: dict[str, Any]) -> float | None:
    times = times_of(snap)
    return times[-1] if times else None


def check_state(world: World, lock: LeanLock) -> None:
    """Every question that changes nothing, then the invariants: the
    configuration (``lockstep.config_problems``), each manager's own ``check_invariants()`` and
    the kit's, on each snapshot."""
    if problems := config_problems(lock.managers):
        raise Finding("the configuration differs:\n  " + "\n  ".join(problems))
    observe(world, lock)
    num_free = (lock.call("get_num_free_gpu_blocks").value, lock.call("get_num_free_cpu_blocks").value)
    for name, manager in lock.managers.items():
        if callable(getattr(manager, "check_invariants", None)):
            try:
                manager.check_invariants()
            except Exception as error:  # noqa: BLE001 - any failure of the self-check is a finding
                raise Finding(
                    f"invariant broken in {name}: check_invariants() raised {type(error).__name__}: {error}"
                ) from None
    view, checked = world.invariant_world(), []
    for name, snap in lock.snapshots.items():
        if snap in checked:  # equal snapshots break the same invariants
            continue
        checked.append(snap)
        if problems := invariants.check_snapshot(snap, view, num_free):
            raise Finding(f"invariant broken in {name}:\n  " + "\n  ".join(problems[:12]))


# -- one layer ----------------------------------------------------------------------------------
@dataclass
class Expansion:
    """What expanding a chunk of the frontier found."""

    new: list[tuple[bytes, bytes, tuple]] = field(default_factory=list)  # (key, state pickle, path)
    transitions: int = 0
    excluded: Counter[str] = field(default_factory=Counter)  # moves a manager cannot be compared on, by reason
    calls: int = 0
    failure: tuple[tuple, str] | None = None  # (path, message) of the first failure
    situations: dict[str, int] = field(default_factory=dict)  # situation -> depth, first reached in this chunk


class Keeper:
    """The managers a process explores with, one per implementation, and
    states put into them: ``restore_state`` where a manager offers it
    (the same objects, their state replaced), else a pickle loaded."""

    def __init__(self, impls: Mapping[str, Any], scope: Scope) -> None:
        self.scope = scope
        self.managers = build(impls, scope)

    def blob(self, world: World, managers: Mapping[str, Any], mirrors: dict[str, DeviceMirror]) -> bytes:
        """A state as the frontier keeps it: the world and mirrors (a pickle
        of their own, loaded again before each move), and each manager's
        state, compressed. Why compressed: a layer's states are what a large
        scope's memory holds (about 6 KB a state as pickles, 2.3 KB packed,
        for about 4 % of a scope's time: 85 microseconds a state to pack
        and unpack)."""
        saved = {name: m.save_state() if callable(getattr(m, "save_state", None))
                 else pickle.dumps(m, pickle.HIGHEST_PROTOCOL) for name, m in managers.items()}  # fmt: skip
        state = pickle.dumps((pickle.dumps((world, mirrors), pickle.HIGHEST_PROTOCOL), saved), pickle.HIGHEST_PROTOCOL)
        return zlib.compress(state, 1)

    @staticmethod
    def parts(blob: bytes) -> tuple[bytes, Mapping[str, Any]]:
        """``blob``'s parts, for ``load``."""
        return pickle.loads(zlib.decompress(blob))

    def load(self, places: bytes, saved: Mapping[str, Any]) -> tuple[World, dict[str, Any], dict[str, DeviceMirror]]:
        """A state's world, managers and mirrors, from ``blob``'s parts."""
        world, mirrors = pickle.loads(places)
        for name, state in saved.items():
            if isinstance(state, SavedState):
                self.managers[name].restore_state(state)
            else:
                self.managers[name] = pickle.loads(state)
        return world, dict(self.managers), mirrors


def expand(
    chunk: list[tuple[bytes, tuple]],
    seen: Seen,
    keeper: Keeper,
    successors: bool = True,
    histories: int = 1,
    found: Counter[bytes] | None = None,
    reached_before: Mapping[str, int] | None = None,
) -> Expansion:
    """Check each state of ``chunk`` and (``successors``) play every move
    enabled in it; keep the successors whose state ``seen`` and ``found``
    (the states this process kept from the layer's chunks so far) hold
    fewer than ``histories`` times. Stops at the first failure. Each
    transition is matched against the situations not reached before
    (``reached_before``) nor earlier in the chunk (``situations.py``).

    Why ``found`` may span chunks: the layer is merged in chunk order, so a
    state this process already kept ``histories`` times from earlier chunks
    can never be wanted from a later one; not pickling it again saves about
    a third of the pickles (``default`` to depth 9), for any number of workers."""
    expander = _Expander(keeper, seen, Counter() if found is None else found, histories, reached_before)
    for blob, path in chunk:
        if not expander.expand_state(blob, path, successors):
            break
    return expander.out


@dataclass
class _Parent:
    """A state of the frontier whose moves are being made: as loaded
    (``places``, ``saved``), to be put back into the managers before a move
    where an earlier one changed them, and what tells a successor from it."""

    places: bytes
    saved: Mapping[str, Any]
    path: tuple
    snapshots: dict[str, Any]  # each manager's
    yardstick: dict[str, Any]  # the first manager's snapshot
    key: bytes  # canonical()
    world: Any  # World.state()


class _Expander:
    """``expand``'s steps on one chunk: check a state (``expand_state``),
    then its moves (``make_moves``): the forbidden ones at once
    (``refuse_at_once``), each other from the state (``transition``), each
    transition counted and its state kept if new (``record``)."""

    def __init__(
        self,
        keeper: Keeper,
        seen: Seen,
        found: Counter[bytes],
        histories: int,
        reached_before: Mapping[str, int] | None,
    ) -> None:
        self.keeper, self.seen, self.found, self.histories = keeper, seen, found, histories
        self.out = Expansion()
        self.reached = dict(reached_before or {})  # situations reached so far: the shallowest depth is the first
        self.sought = situations.possible(keeper.scope)
        self.window = window_blocks(keeper.scope.sliding_window, keeper.scope.block_size)

    def expand_state(self, blob: bytes, path: tuple, successors: bool) -> bool:
        """Check the state ``blob`` that ``path`` reaches and (``successors``)
        make every move enabled in it; False at a failure (``out.failure``)."""
        places, saved = self.keeper.parts(blob)
        world, managers, mirrors = self.keeper.load(places, saved)
        lock = LeanLock(managers, mirrors=mirrors)
        try:
            check_state(world, lock)
        except Finding as failure:
            self.out.failure = (path, str(failure))
            return False
        self.out.calls += lock.num_calls
        if not successors:
            return True
        snapshots = lock.snapshots
        yardstick = snapshots[lock.snapshotting[0]]
        parent = _Parent(places, saved, path, snapshots, yardstick, canonical(yardstick, world), world.state())
        return self.make_moves(parent, world, lock)

    def make_moves(self, parent: _Parent, world: World, lock: LeanLock) -> bool:
        """Every move enabled in ``parent`` (its ``world`` and ``lock`` as
        checked): the forbidden ones at once where they can be, then each
        other from the parent's state; False at a failure (``out.failure``)."""
        enabled = moves(world, latest_time(parent.yardstick))
        forbidden = [move for move in enabled if move[0] == "illegal"]
        refused = self.refuse_at_once(parent, forbidden, world, lock)
        if refused is not None:  # each forbidden move checked; only the others are left to make
            enabled = [move for move in enabled if move[0] != "illegal"]
        dirty = bool(forbidden) and (refused is None or bool(refused))  # managers a try may have changed
        for move in enabled:
            if dirty:
                world, managers, mirrors = self.keeper.load(parent.places, parent.saved)
                lock = LeanLock(managers, parent.snapshots, mirrors)
            try:
                world, lock, key = self.transition(parent, move, world, lock)
            except Finding as failure:
                self.out.failure = (parent.path + (move,), str(failure))
                return False
            except Excluded as reason:  # not compared, and its state dropped (others may have changed)
                self.out.excluded[str(reason)] += 1
                dirty = True
                continue
            dirty = key != parent.key
            self.record(parent, move, key, world, lock)
        return True

    def refuse_at_once(
        self, parent: _Parent, forbidden: list[Move], world: World, lock: LeanLock
    ) -> dict[Move, str] | None:
        """``all_refused``, its transitions counted: the moves excluded, or None
        where each forbidden move must be made on its own."""
        refused = all_refused(forbidden, world, lock, (parent.yardstick, parent.world))
        if refused is not None:
            compared = [move for move in forbidden if move not in refused]
            self.out.transitions += len(compared)
            self.out.calls += lock.num_calls
            self.out.excluded.update(refused.values())
            self.note_situations(("illegal", *(move[1] for move in compared)), parent, lock)
        return refused

    def transition(self, parent: _Parent, move: Move, world: World, lock: LeanLock) -> tuple[World, LeanLock, bytes]:
        """``move`` made from ``parent`` and compared (made again call by call
        where ``MoveAgain`` asks): the world and lock it leaves, and the
        successor's digest. Raises ``Finding``, or ``Excluded``."""
        lock.num_calls, lock.log = 0, []
        try:
            make(move, world, lock)
            lock.settle()
        except MoveAgain:  # a call raised after another changed the state: again, call by call
            world, managers, mirrors = self.keeper.load(parent.places, parent.saved)
            lock = LeanLock(managers, parent.snapshots, mirrors, each_call=True)
            make(move, world, lock)
        unchanged = lock.yardstick == parent.yardstick and world.state() == parent.world
        key = parent.key if unchanged else canonical(lock.yardstick, world)  # the digest only where it may differ
        if key != parent.key:
            keep_device_tables(world, lock)
        return world, lock, key

    def record(self, parent: _Parent, move: Move, key: bytes, world: World, lock: LeanLock) -> None:
        """A transition counted and matched against the situations; its state
        kept where ``seen`` and ``found`` hold it fewer than ``histories`` times."""
        self.out.transitions += 1
        self.out.calls += lock.num_calls
        self.note_situations(move, parent, lock)
        if key != parent.key and self.seen[key] + self.found[key] < self.histories:
            self.found[key] += 1
            self.out.new.append((key, self.keeper.blob(world, lock.managers, lock.mirrors), parent.path + (move,)))

    def note_situations(self, move: Move, parent: _Parent, lock: LeanLock) -> None:
        """The situations the transition by ``move`` from ``parent`` reaches first."""
        if len(self.reached) < len(self.sought):
            scope = self.keeper.scope
            transition = Transition(move, parent.yardstick, lock.yardstick, tuple(lock.log), scope.block_size,
                                    self.window, scope.enable_caching)  # fmt: skip
            for name in situations.reached(transition, self.reached.keys(), self.sought):
                self.reached[name] = self.out.situations[name] = len(parent.path) + 1


def all_refused(forbidden: list[Move], world: World, lock: LeanLock, parent: tuple[Any, Any]) -> dict[Move, str] | None:
    """The forbidden moves of a state made one after another on its managers
    and compared once, where one by one each would take its own pair of
    snapshots (they are most of a state's moves). Sound because each must
    answer alike (most raise) and change nothing: then they commute, and a
    state left as it was after all of them was left so by each (but for a
    call that changed the state and a later one that changed it back).
    Returns the moves a manager cannot be compared on, with the reason
    (``Excluded``), their calls dropped from the log; or None where the
    managers disagreed or the state changed: the caller then makes each
    move on its own, as any move, and a failure's path names its move.
    ``parent``: the state's yardstick snapshot and world."""
    if not forbidden:
        return None
    excluded: dict[Move, str] = {}
    lock.num_calls, lock.log, lock.at_once = 0, [], True
    try:
        for move in forbidden:
            logged, calls = len(lock.log), lock.num_calls
            try:
                make(move, world, lock)
            except Excluded as reason:
                excluded[move] = str(reason)
                del lock.log[logged:]
                lock.num_calls = calls
        lock.changed = lock.changed or bool(excluded)  # a manager may have half-run an excluded call: look
        lock.settle()
    except (Finding, MoveAgain, Excluded):
        return None
    finally:
        lock.at_once = False
    return excluded if (lock.yardstick, world.state()) == parent else None


_SEEN: Counter[bytes] = Counter()  # the states of earlier layers (histories kept), as a forked worker inherits them
_FOUND: Counter[bytes] = Counter()  # the states this process kept from the layer's chunks so far (``expand``)
_KEEPER: Keeper | None = None  # the search's managers, as a forked worker inherits them
_REACHED: dict[str, int] = {}  # the situations earlier layers reached, as a forked worker inherits them


def _expand_chunk(job: tuple[list[tuple[bytes, tuple]], bool, int]) -> Expansion:
    assert _KEEPER is not None
    out = expand(job[0], _SEEN, _KEEPER, job[1], job[2], _FOUND, _REACHED)
    _REACHED.update(out.situations)  # one process's later chunks need not look for them again
    return out


def expand_layer(
    frontier: list[tuple[bytes, tuple]],
    seen: Counter[bytes],
    keeper: Keeper,
    workers: int,
    successors: bool,
    histories: int = 1,
    reached: Mapping[str, int] | None = None,
) -> list[Expansion]:
    """The frontier's chunks expanded, in order, by ``workers`` processes
    (forked, so each inherits ``seen``, the situations ``reached`` and the
    managers without copying them over)."""
    global _SEEN, _FOUND, _KEEPER, _REACHED
    jobs = [(frontier[i : i + CHUNK], successors, histories) for i in range(0, len(frontier), CHUNK)]
    _SEEN, _FOUND, _KEEPER, _REACHED = seen, Counter(), keeper, dict(reached or {})
    if workers <= 1 or len(jobs) <= 1:
        return [_expand_chunk(job) for job in jobs]
    # its workers deaf to Ctrl-C, which terminates the pool at once (blockspace/interrupts.py)
    with worker_pool(lambda: multiprocessing.get_context("fork").Pool(min(workers, len(jobs)))) as pool:
        return pool.map(_expand_chunk, jobs, chunksize=1)


# -- the search -------------------------------------------------------------------------------
@dataclass
class Report:
    """What an exploration found; ``theorem()`` says what it proves."""

    scope: Scope
    names: list[str]
    states: int = 0
    transitions: int = 0
    calls: int = 0
    depth: int = 0  # moves from the start to the deepest state reached
    exhausted: bool = False
    cut: str = ""  # why the search stopped early: "depth", "time", or a failure
    seconds: float = 0.0
    workers: int = 1
    executor: str = "process"  # where the workers ran: forked here, or on a Ray cluster
    layers: list[int] = field(default_factory=list)  # new states at each depth
    excluded: Counter[str] = field(default_factory=Counter)  # transitions not compared, by §14 item
    failure: str = ""  # the first failure, with its runnable repro
    path: tuple = ()
    histories: int = 0  # histories gone on from (the states, when the scope keeps one a state)
    situations: dict[str, int] = field(default_factory=dict)  # situation reached -> shallowest depth (situations.py)

    @property
    def passed(self) -> bool:
        return not self.failure

    def theorem(self) -> str:
        first, *others = self.names
        verbs = ("returns", "reaches", "disagrees") if len(others) == 1 else ("return", "reach", "disagree")
        if self.failure:
            return (
                f"scope {self.scope.name}: {' and '.join(others)} {verbs[2]} with {first} after {len(self.path)} moves"
            )
        figures = (f"{self.states:,} states, {self.transitions:,} transitions ({self.calls:,} calls), "
                   f"depth {self.depth}, {self.seconds:.1f} s on {self.workers} worker(s), "
                   f"{self.rate():,.0f} transitions/s per worker")  # fmt: skip
        if self.exhausted:
            claim = "for every call sequence within the scope (every depth: no new state after"
            claim += f" depth {self.depth})"
        else:
            claim = f"for every call sequence of at most {self.depth} moves within the scope (cut by {self.cut})"
        if self.histories > self.states:
            claim += (f" (each state gone on from as reached by its first {self.scope.histories} histories: "
                      f"{self.histories:,} in all)")  # fmt: skip
        if self.excluded:
            claim += (f", leaving out the {sum(self.excluded.values()):,} transitions that meet vLLM's crashes, "
                      f"half-done operations or nondeterminism "
                      f"({'; '.join(f'{k}: {v:,}' for k, v in self.excluded.most_common())})")  # fmt: skip
        return (f"scope {self.scope.name} [{self.scope.describe()}]: {claim}, {' and '.join(others)} {verbs[0]} the "
                f"values {first} returns and {verbs[1]} identical snapshots: {figures}, "
                f"{'exhausted' if self.exhausted else 'not exhausted'}")  # fmt: skip

    def rate(self) -> float:
        return self.transitions / max(self.seconds * self.workers, 1e-9)

    def as_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope.name, "settings": self.scope.describe(), "states": self.states,
            "transitions": self.transitions, "calls": self.calls, "depth": self.depth, "exhausted": self.exhausted,
            "cut": self.cut, "histories": self.histories, "seconds": round(self.seconds, 2), "workers": self.workers,
            "executor": self.executor,
            "layers": self.layers, "transitions_per_s_per_worker": round(self.rate()), "excluded": dict(self.excluded),
            "theorem": self.theorem(), "failure_moves": len(self.path) if self.failure else None,
            "situations": dict(sorted(self.situations.items(), key=lambda item: (item[1], item[0]))),
        }  # fmt: skip


def build(impls: Mapping[str, Any], scope: Scope) -> dict[str, Any]:
    """Fresh managers, one per implementation (name -> class or version name)."""
    classes = {name: load_manager_class(impl) if isinstance(impl, str) else impl for name, impl in impls.items()}
    return {name: cls(**scope.manager_kwargs()) for name, cls in classes.items()}


PICKLE_DEPTH = 10_000  # pickle recurses once per link: vLLM's blocks link each to the one before (1,000-block tables)


class Search:
    """One scope's breadth-first search, a layer at a time: ``advance``
    expands the frontier once and returns the report so far. ``explore``
    runs one to its end; the mutation campaign runs several side by side,
    a layer of each in turn, so the shallowest failure of any scope comes
    first."""

    def __init__(
        self,
        impls: Mapping[str, Any],
        scope: Scope,
        workers: int | None = None,
        max_seconds: float | None = None,
        layers: Callable[..., Any] | None = None,
    ) -> None:
        started = time.perf_counter()
        self.impls, self.scope, self.max_seconds = impls, scope, max_seconds
        sys.setrecursionlimit(max(sys.getrecursionlimit(), PICKLE_DEPTH))
        # ``layers``: its workers elsewhere (``ray_layers.RayLayers``: on a Ray cluster), else forked here
        self.ray = layers(impls, scope, workers) if layers is not None else None
        executor = "process" if layers is None else "ray"
        self.workers = self.ray.workers if self.ray is not None else workers or os.cpu_count() or 1
        self.report = Report(scope, list(impls), workers=self.workers, executor=executor)
        self.keeper = Keeper(impls, scope)
        managers = dict(self.keeper.managers)
        if not callable(getattr(next(iter(managers.values())), "snapshot", None)):
            raise TypeError(
                f"the yardstick {next(iter(impls))!r} offers no snapshot(): the explorer needs one to tell states apart"
            )
        world = World(scope, offers_device=any(callable(getattr(m, "table_delta", None)) for m in managers.values())
                      and not missing_modules("gpu"))  # fmt: skip
        lock = LeanLock(managers)
        self.seen = Counter({canonical(lock.yardstick, world): 1})  # state -> histories gone on from
        self.added = list(self.seen)  # what the last layer added to seen (for Ray's workers, which keep a copy)
        try:
            self.frontier = [(self.keeper.blob(world, managers, lock.mirrors), ())]
        except Exception as error:  # noqa: BLE001 - any reason a manager does not pickle
            raise TypeError(f"the explorer keeps states as pickles, and a manager does not pickle: {error}") from None
        self.report.layers.append(1)
        self.report.seconds = time.perf_counter() - started

    @property
    def done(self) -> bool:
        return not self.frontier

    def advance(self) -> Report:
        """Check the frontier's states and (unless the depth bound or the
        time is reached) make the next layer of new states the frontier."""
        started, report, scope = time.perf_counter(), self.report, self.scope
        at_bound = scope.max_depth is not None and report.depth >= scope.max_depth
        out_of_time = self.max_seconds is not None and report.seconds > self.max_seconds
        successors = not (at_bound or out_of_time)
        if self.ray is not None:
            results = self.ray.expand_layer(self.frontier, self.added, successors, scope.histories, report.situations)
        else:
            results = expand_layer(
                self.frontier, self.seen, self.keeper, self.workers, successors, scope.histories, report.situations
            )
        new, self.added = [], []
        for result in results:
            for name, depth in result.situations.items():
                report.situations[name] = min(depth, report.situations.get(name, depth))
            report.transitions += result.transitions
            report.calls += result.calls
            report.excluded.update(result.excluded)
            if result.failure is not None:
                report.path, message = result.failure
                report.failure = replay(self.impls, scope, report.path, message)
                report.cut = "a failure"
                break
            for key, blob, path in result.new:
                if self.seen[key] < scope.histories:
                    self.seen[key] += 1
                    self.added.append(key)
                    new.append((blob, path))
        if not report.failure and (at_bound or out_of_time):
            report.cut = "depth" if at_bound else "time"
        self.frontier = [] if report.cut else new
        if self.frontier:
            report.depth += 1
            report.layers.append(len(new))
        report.states, report.histories = len(self.seen), self.seen.total()
        report.exhausted = self.done and not report.cut
        report.seconds += time.perf_counter() - started
        return report


def explore(
    impls: Mapping[str, Any],
    scope: Scope,
    workers: int | None = None,
    max_seconds: float | None = None,
    layers: Callable[..., Any] | None = None,
    on_layer: Callable[[Report], None] | None = None,
) -> Report:
    """Breadth-first search of ``scope`` with ``impls`` in lockstep (the
    first is the yardstick and must offer ``snapshot()``), to its end, by
    ``workers`` processes here or elsewhere (``layers``: ``ray_layers.RayLayers``);
    ``on_layer`` hears the report after every layer (a long search's progress)."""
    search = Search(impls, scope, workers, max_seconds, layers)
    while not search.done:
        report = search.advance()
        if on_layer is not None:
            on_layer(report)
    return search.report


# -- a failure's repro --------------------------------------------------------------------------
def replay(impls: Mapping[str, Any], scope: Scope, path: tuple, message: str) -> str:
    """Play ``path`` through a ``Lockstep`` whose script logs every world
    change and call: the failure with its runnable repro. A path found by
    the explorer fails there too (the ``Lockstep`` compares snapshots after
    every call, the explorer once a move and around the calls that raise)."""
    kwargs = scope.manager_kwargs()
    script = Script(impls, kwargs)
    try:
        lock = Lockstep.build(impls, script, **kwargs)
        world = ScriptedWorld(scope, script)
        for move in path:
            script.add(f"# move {describe(move)}")
            make(move, world, lock)
            keep_device_tables(world, lock)
        observe(world, lock)
        script.add(f"lock.verify({invariants.world_source(world.invariant_world(), script.render_value)}, "
                   f"{script.render_value(dict(world.groups))})")  # fmt: skip
        lock.verify(world.invariant_world(), world.groups)
    except Divergence as failure:
        return str(failure)
    return f"{message}{REPRO_HEADING}(the replay through a Lockstep did not fail; the path was {list(path)!r})\n"


def describe(move: Move) -> str:
    name, *args = move
    return f"{name}({', '.join(repr(a) for a in args)})"


# -- as a check of the kit ----------------------------------------------------------------------
LayerDone = Callable[[str, Report], None]  # (check name, the report so far): a layer was expanded


class Budget:
    """The explorer's wall time over several scopes (``--budget``), counted
    from when the first of them begins."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started: float | None = None

    def left(self) -> float:
        if self.started is None:
            self.started = time.monotonic()
        return self.seconds - (time.monotonic() - self.started)


def explore_check(
    impls: Mapping[str, Any],
    scope: Scope | str,
    capabilities: Mapping[str, bool],
    workers: int | None = None,
    budget: Budget | None = None,
    layers: Callable[..., Any] | None = None,
    on_layer: LayerDone | None = None,
) -> Check:
    """``explore[<scope>]``: the scope exhausted (or cut by its ``max_depth``,
    or by what is left of ``budget``: its theorem then holds to the depth
    reached); passed with its theorem, failed with the first failure's
    repro; skipped when the implementation lacks the family's capability,
    or when the budget was spent before it began."""
    scope = SCOPES[scope] if isinstance(scope, str) else scope
    name = f"explore[{scope.name}]"

    def run() -> CheckResult:
        needed = FAMILY_CAPABILITY[scope.family]
        if needed is not None and not capabilities.get(needed, True):
            return CheckResult(name, "skipped", detail=f"{needed} is False")
        left = budget.left() if budget is not None else None
        if budget is not None and left is not None and left <= 0:
            return CheckResult(name, "skipped", detail=f"not begun: the --budget of {budget.seconds:g} s was spent")
        try:
            report = explore(impls, scope, workers, left, layers, on_layer and partial(on_layer, name))
        except (TypeError, RecursionError, pickle.PicklingError, ClusterError) as error:  # no snapshot(); no pickle
            return CheckResult(name, "failed", detail=f"cannot explore: {type(error).__name__}: {error}")
        detail = report.theorem() + ("\n" + report.failure if report.failure else "")
        return CheckResult(
            name, "passed" if report.passed else "failed", report.states, report.seconds, detail, report.as_dict()
        )

    return Check(name, run, FAMILY_CAPABILITY[scope.family])
