"""The explorer (conformance/explore.py): exhaustion, determinism across
workers, a broken manager's shortest repro run as printed, the soundness
of the time abstraction, and the pickling it clones managers with."""

from __future__ import annotations

import copy
import json
import os
import pickle
import random
import subprocess
import sys
from collections import Counter

import pytest

from blockspace.conformance import Divergence
from blockspace.conformance import explore as explore_module
from blockspace.conformance.explore import CHUNK, Finding, LeanLock, MoveAgain, Search, build, canonical, explore
from blockspace.conformance.protocol import ScriptedWorld, World, make, moves
from blockspace.conformance.ray_layers import Digests
from blockspace.conformance.scope import SCOPES, ScopeError, scope_from
from blockspace.conformance.script import Script
from blockspace.errors import NoFreeBlocksError
from blockspace.extras import missing_modules
from blockspace.fast import FastBlockSpaceManager
from blockspace.reference import ReferenceBlockSpaceManager
from helpers import explored

PAIR = {"reference": "reference", "fast": "fast"}


def test_the_default_scope_is_exhausted_and_the_theorem_says_so() -> None:
    report = explored("default")
    assert report.passed, report.failure
    assert report.states == sum(report.layers) and report.transitions > report.states
    assert report.exhausted and report.depth > 5
    assert "within the scope (every depth" in report.theorem() and report.theorem().endswith("exhausted")


def test_any_number_of_workers_finds_the_same_states() -> None:
    scope = scope_from("caching", ["max_depth=3"])
    one, two = (explore(PAIR, scope, workers=n) for n in (1, 2))
    figures = [(r.states, r.transitions, r.calls, r.layers, r.depth, r.situations) for r in (one, two)]
    assert figures[0] == figures[1] and figures[0][-1]  # the same situations, at the same depths


@pytest.mark.parametrize("name", ["swap", "plain"])  # plain: an access of an unknown sequence works, no error
def test_forbidden_moves_made_at_once_give_the_report_made_one_by_one(monkeypatch, name) -> None:
    """``all_refused`` compares a state's forbidden moves once; made one by
    one (as where one of them answers otherwise) the figures, the situations
    and their depths are the same."""
    scope = scope_from(name, ["max_depth=4"])
    at_once = explore(PAIR, scope, workers=1)
    monkeypatch.setattr(explore_module, "all_refused", lambda *args: None)
    one_by_one = explore(PAIR, scope, workers=1)
    figures = [(r.states, r.transitions, r.calls, r.layers, r.situations, r.excluded) for r in (at_once, one_by_one)]
    assert figures[0] == figures[1] and "refused_unchanged" in at_once.situations


def test_layers_of_many_chunks_keep_the_same_histories_for_any_number_of_workers() -> None:
    """A process keeps a state once (``histories`` times) over all the
    chunks of a layer it expands, not once a chunk; the layer is merged in
    chunk order, so the same histories are kept, with the same paths."""
    scope = scope_from("default", ["max_depth=7", "histories=2"])
    searches = [Search(PAIR, scope, workers=n) for n in (1, 2)]
    for search in searches:
        while not search.done and max(search.report.layers, default=0) <= CHUNK:
            search.advance()
        assert len(search.frontier) > 2 * CHUNK  # the next layer is expanded in several chunks
        search.advance()
    one, two = ([path for _, path in search.frontier] for search in searches)
    assert one == two and len(one) > 2 * CHUNK
    assert searches[0].report.layers == searches[1].report.layers


def test_a_broken_manager_fails_with_a_shortest_repro_that_runs_as_printed() -> None:
    broken = {"reference": "reference", "FifoFreeList": "blockspace.conformance.broken:FifoFreeList"}
    report = explore(broken, scope_from("plain", ["max_depth=4"]), workers=1)
    assert not report.passed
    # A FIFO free list shows at the second allocation after a free: arrive, admit,
    # arrive, admit, free would be five moves; breadth-first finds three.
    assert [move[0] for move in report.path] == ["arrive", "admit", "free"]
    message, _, repro = report.failure.partition("Repro (runnable):\n")
    assert "free" in message
    with pytest.raises(Divergence, match="free"):
        exec(compile(repro, "<repro>", "exec"), {})


def _play(path: list[tuple], scope_name: str = "caching") -> tuple[World, LeanLock]:
    scope = SCOPES[scope_name]
    world, lock = World(scope), LeanLock(build(PAIR, scope))
    for move in path:
        make(move, world, lock)
    return world, lock


def _outcomes(world: World, lock: LeanLock, depth: int) -> list:
    """Every move sequence of ``depth`` moves from this state: what each
    call answered (values and error types) and the canonical state after
    each move, in order."""
    if depth == 0:
        return []
    blob = pickle.dumps((world, lock.managers))
    seen = []
    times = [block[3] for block in lock.yardstick["blocks"] if block[3] >= 0]
    for move in moves(world, max(times) if times else None):
        world2, managers = pickle.loads(blob)
        answers: list = []
        recorder = LeanLock(managers)
        original = recorder.call

        def call(method, *args, quiet=False, _record=answers, _call=original):  # noqa: ANN001, ANN202
            outcome = _call(method, *args, quiet=quiet)
            _record.append((method, type(outcome.error).__name__ if outcome.raised else repr(outcome.value)))
            return outcome

        recorder.call = call
        make(move, world2, recorder)
        seen.append((move[0], answers, canonical(recorder.yardstick, world2), _outcomes(world2, recorder, depth - 1)))
    return seen


def test_states_merged_by_their_time_ranks_behave_the_same() -> None:
    """Two states whose access times differ but keep their order get one
    canonical form; every sequence of two moves from each gives the same
    answers and the same canonical states."""
    prompt = [("arrive", 0, 1), ("arrive", 1, 1), ("admit", "g1", 0), ("admit", "g2", 0)]
    early = _play(prompt + [("append", 10, 1, 0, None), ("append", 20, 2, 0, None)])
    late_world, late_lock = _play(prompt + [("append", 10, 1, 0, None)])
    late_world.clock += 40.0  # the second access comes much later: other times, the same order
    make(("append", 20, 2, 0, None), late_world, late_lock)
    assert early[1].yardstick != late_lock.yardstick  # the raw times differ
    assert canonical(early[1].yardstick, early[0]) == canonical(late_lock.yardstick, late_world)
    a, b = _outcomes(*early, 2), _outcomes(late_world, late_lock, 2)
    strip = lambda tree: [(name, answers, key, strip(rest)) for name, answers, key, rest in tree]  # noqa: E731
    assert strip(a) == strip(b) and len(a) > 5


def test_pickled_and_deep_copied_managers_go_on_in_lockstep() -> None:
    """The explorer's clones: a manager pickled (or deep-copied) halfway
    answers every later call as the original does, with the same types."""
    path = [("arrive", 0, 1), ("admit", "g1", 0), ("fork", 10), ("append", 10, 1, 0, None), ("arrive", 0, 1),
            ("admit", "g2", 0), ("append", 11, 1, 0, None), ("swap_out", "g2")]  # fmt: skip
    scope = SCOPES["swap"]
    world, lock = World(scope), LeanLock(build(PAIR, scope))
    for move in path[:4]:
        make(move, world, lock)
    pickled = pickle.loads(pickle.dumps(lock.managers))
    copied = copy.deepcopy(lock.managers)
    everyone = {"reference": lock.managers["reference"], "fast": lock.managers["fast"],
                "pickled fast": pickled["fast"], "copied fast": copied["fast"],
                "pickled reference": pickled["reference"], "copied reference": copied["reference"]}  # fmt: skip
    together = LeanLock(everyone)  # each call goes to all six, with one world
    for move in path[4:]:
        make(move, world, together)
    assert type(together.call("get_block_table", world.seq(10)).value).__name__ == "BlockIds"
    assert len({repr(snap) for snap in together.snapshots.values()}) == 1


def test_scopes_refuse_bad_values_by_name() -> None:
    with pytest.raises(ScopeError, match="nosuch"):
        scope_from("nosuch")
    with pytest.raises(ScopeError, match="num_gpu_blocks"):
        scope_from("default", ["num_gpu_blocks=0"])
    with pytest.raises(ScopeError, match="max_depth"):
        scope_from("default", ["max_depth=x"])
    assert scope_from("default", ["alphabet=1,2,3"]).alphabet == (1, 2, 3)
    with pytest.raises(ScopeError, match="adapters"):
        scope_from("default", ["adapters=-1"])
    with pytest.raises(ScopeError, match="watermark"):
        scope_from("default", ["watermark=1.5"])
    assert "watermark" not in scope_from("plain", ["watermark=None"]).manager_kwargs()  # the constructor's default
    assert scope_from("default", ["new_tokens=0,2"]).new_tokens == (0, 2)  # none: a running prefill's later chunk


def test_arrivals_carry_adapters_and_the_state_tells_them_apart() -> None:
    """A request with a LoRA id keys its prompt apart: two arrivals that
    differ only by adapter are two states, and the printed repro builds
    the sequence with its adapter."""
    scope = scope_from("adapters", ["max_requests=1"])
    arrivals = [move for move in moves(World(scope), None) if move[0] == "arrive"]
    assert arrivals == [("arrive", 0, 1), ("arrive", 0, 1, None, 1)]
    states = set()
    for move in arrivals:
        world = World(scope)
        make(move, world, lock=None)
        states.add(world.state())
    assert len(states) == 2
    script = Script()
    make(arrivals[1], ScriptedWorld(scope, script), lock=None)
    assert "s10 = Sequence(10, [1, 1], lora_int_id=1)" in script.render()


def test_the_command_prints_the_theorem(tmp_path) -> None:
    command = [sys.executable, "-m", "blockspace", "conformance", "--impl", "fast", "--against", "reference",
               "--profile", "exhaustive", "--scope", "plain", "--workers", "1", "--only", "explore",
               "--scope-set", "max_depth=2"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "explore[plain]: scope plain [" in done.stdout and "at most 2 moves" in done.stdout
    # A bad option is refused before any work, even the compiling a cold cache
    # would do to build the managers (then a notice came first).
    cold = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    bad = subprocess.run(command[:-1] + ["lookaheads=x"], capture_output=True, text=True, timeout=600,
                         env=cold)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("error: --scope/--scope-set"), bad.stderr


class PoisonedByAForcedFree(ReferenceBlockSpaceManager):
    """A private flag: once a sequence allocated without being asked first
    (``get_num_cached_tokens``) is freed, every later count is one too
    many. The state after that free equals the one after freeing an asked
    sequence, which the explorer reaches first."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked, self.forced, self.poisoned = set(), set(), False

    def get_num_cached_tokens(self, seq):
        self.asked.add(seq.seq_id)
        return super().get_num_cached_tokens(seq) + self.poisoned

    def allocate(self, seq_group):
        super().allocate(seq_group)
        self.forced |= {s.seq_id for s in seq_group.get_seqs()} - self.asked

    def free(self, seq):
        self.poisoned |= seq.seq_id in self.forced
        super().free(seq)


def test_a_second_history_of_each_state_meets_a_private_flag() -> None:
    broken = {"reference": "reference", "broken": PoisonedByAForcedFree}
    one = explore(broken, scope_from("default", ["max_depth=6"]), workers=1)
    assert one.passed and one.histories == one.states
    two = explore(broken, scope_from("default", ["max_depth=6", "histories=2"]), workers=1)
    assert not two.passed and "get_num_cached_tokens disagrees" in two.failure, two.failure[:300]
    assert ("force", "g1") in two.path and two.path[-1][0] in ("admit", "fork"), two.path


class DeltasOnlyOnce(FastBlockSpaceManager):
    """Its first ``table_delta`` holds every live table; the later ones lose
    their cells, so a device table kept from them misses every new block."""

    def table_delta(self):
        delta = super().table_delta()
        if getattr(self, "drained", False):
            delta = delta._replace(rows=delta.rows[:0], cols=delta.cols[:0], values=delta.values[:0])
        self.drained = True
        return delta


def test_the_scheduler_keeps_a_device_table_from_any_state() -> None:
    if missing_modules("gpu"):
        pytest.skip("table_delta needs the [gpu] extra (torch, numba-cuda)")
    broken = {"reference": "reference", "broken": DeltasOnlyOnce}
    report = explore(broken, scope_from("plain", ["max_depth=4"]), workers=1)
    # Tracking that starts on a live table is right (the first delta copies it), and a lost
    # write of block 0 is no error (it is the padding): the first wrong delta is a later
    # one, carrying a new block.
    names = [move[0] for move in report.path]
    assert names == ["arrive", "admit", "track", "append"], report.path
    message, _, repro = report.failure.partition("Repro (runnable):\n")
    assert "broken's table deltas disagree" in message
    with pytest.raises(Divergence, match="table deltas disagree"):
        exec(compile(repro, "<repro>", "exec"), {})
    assert explore(PAIR, scope_from("plain", ["max_depth=4"]), workers=1).passed


class RefusesToAllocate(ReferenceBlockSpaceManager):
    """Every allocation that would work raises instead, changing nothing."""

    def allocate(self, seq_group):
        ReferenceBlockSpaceManager.allocate(copy.deepcopy(self), seq_group)  # bad input raises as it should
        raise NoFreeBlocksError("no")


class AllocatesThenRefuses(ReferenceBlockSpaceManager):
    """Raises as ``RefusesToAllocate`` does, but after allocating: half done."""

    def allocate(self, seq_group):
        super().allocate(seq_group)
        raise NoFreeBlocksError("no")


def test_a_call_that_raises_after_the_move_changed_the_state_is_checked_call_by_call() -> None:
    """The explorer compares snapshots once a move. With caching, admission
    counts cached tokens (which changes the tracker) before it allocates, so
    the state before ``allocate`` was never taken: when it raises, the move
    is made again comparing after every call, and the half-done allocation
    shows as a change made by a call that raised (so does one that raised
    first, when the move ends)."""
    pair = {"clean": RefusesToAllocate, "half": AllocatesThenRefuses}
    scope = SCOPES["default"]
    world, lock = World(scope), LeanLock(build(pair, scope))
    make(("arrive", 0, 1), world, lock)
    parent = pickle.dumps((world, lock.managers))
    with pytest.raises(MoveAgain):
        make(("admit", "g1", 0), world, lock)
    world, managers = pickle.loads(parent)
    with pytest.raises(Finding, match="allocate raised NoFreeBlocksError but changed half"):
        make(("admit", "g1", 0), world, LeanLock(managers, each_call=True))
    # Without asking first, the call that raised is the move's first: checked when the move settles.
    world, managers = pickle.loads(parent)
    lock = LeanLock(managers)
    make(("force", "g1"), world, lock)
    with pytest.raises(MoveAgain):
        lock.settle()
    report = explore(pair, scope, workers=1)
    assert report.path == (("arrive", 0, 1), ("admit", "g1", 0)), report.path


def test_every_arrival_of_an_encoder_decoder_scope_brings_its_encoder_prompt() -> None:
    """A move prints with its defaults left off (no LoRA id, no salt), but
    an encoder prompt of index 0 is no default: it must stay in the move."""
    world = World(SCOPES["encoder_decoder"])
    arrivals = [move for move in moves(world, None) if move[0] == "arrive"]
    assert arrivals and all(len(move) == 4 for move in arrivals), arrivals
    make(arrivals[0], world, LeanLock(build(PAIR, SCOPES["encoder_decoder"])))
    assert all(group.is_encoder_decoder() for group in world.groups.values())


def test_a_ray_workers_digests_count_as_the_drivers_counter() -> None:
    """``ray_layers.Digests`` (17 bytes a state) answers every lookup as the
    ``Counter`` it stands in for: digests added over several layers, some
    more than once (histories), some ending in zero bytes, which NumPy's
    byte strings drop when they hand an item out."""
    rng = random.Random(7)
    digests, counter = Digests(), Counter()
    keys = [bytes(rng.randrange(1, 256) for _ in range(16 - i % 4)) + b"\x00" * (i % 4) for i in range(300)]
    for layer in range(4):
        added = [rng.choice(keys) for _ in range(100)]
        digests.add(b"".join(added))
        counter.update(added)
        assert all(digests[key] == counter[key] for key in keys), layer
    assert len(digests) == len(counter) and digests[b"\xff" * 16] == 0


def test_a_long_search_says_where_it_is_after_each_layer(monkeypatch, capsys, tmp_path) -> None:
    """Lines written as the search goes (here after every layer), with the
    figures its report ends with: a search stopped by hand keeps them."""
    from blockspace.conformance import cli

    monkeypatch.setattr(cli, "PROGRESS_SECONDS", 0.0)
    command = ["--impl", "fast", "--against", "reference", "--profile", "exhaustive", "--only", "explore",
               "--scope", "plain_single", "--workers", "1", "--json", str(tmp_path / "report.json")]  # fmt: skip
    assert cli.main(command) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("explore[plain_single]: depth")]
    found = json.loads((tmp_path / "report.json").read_text())["checks"][0]
    layers = found["layers"]
    assert len(said) == found["depth"] == len(layers) - 1
    for depth, line in enumerate(said, start=1):
        assert line.startswith(f"explore[plain_single]: depth {depth} reached ({layers[depth]:,} states at it), "
                               f"{sum(layers[: depth + 1]):,} states and "), line  # fmt: skip
