"""``save_state()`` / ``restore_state()`` (blockspace/saved_state.py), the
cloning the explorer does before each move: a restored manager goes on
exactly as the one it was saved from, on both implementations; bad input
is refused by name with nothing changed; and the explorer finds the same
states with it as with pickles."""

from __future__ import annotations

import pickle
import random

import pytest

from blockspace.conformance.explore import LeanLock, build, explore, latest_time
from blockspace.conformance.protocol import World, make, moves
from blockspace.conformance.scope import SCOPES, scope_from
from blockspace.errors import InvalidArgumentError, UnsupportedError
from blockspace.extras import missing_modules
from blockspace.fast import FastBlockSpaceManager
from blockspace.reference import ReferenceBlockSpaceManager
from blockspace.saved_state import SavedState
from blockspace.sequence import Sequence, SequenceGroup

PAIR = {"reference": "reference", "fast": "fast"}
IMPLS = {"reference": ReferenceBlockSpaceManager, "fast": FastBlockSpaceManager}


def _walk(world: World, lock: LeanLock, rng: random.Random, num_moves: int) -> None:
    """``num_moves`` moves picked at random among those enabled (the bad-input ones left out)."""
    for _ in range(num_moves):
        enabled = [m for m in moves(world, latest_time(lock.yardstick)) if m[0] != "illegal"]
        make(rng.choice(enabled), world, lock)
        lock.settle()


@pytest.mark.parametrize(
    "scope_name", ["swap", "shared_writes", "sliding_window", "encoder_decoder", "chains", "adapters"]
)
@pytest.mark.parametrize("seed", range(3))
def test_a_restored_manager_goes_on_in_lockstep_with_a_copy_pickled_when_it_was_saved(
    scope_name: str, seed: int
) -> None:
    """Walk, save, walk on (the state changes), restore; the restored
    managers then answer a third walk exactly as copies pickled at the
    save do, with equal snapshots after every move. The saved state also
    goes through a pickle, as the explorer's frontier keeps it, and is
    restored twice."""
    scope, rng = SCOPES[scope_name], random.Random(seed)
    world, lock = World(scope), LeanLock(build(PAIR, scope), each_call=True)
    _walk(world, lock, rng, 6)
    saved = pickle.loads(pickle.dumps({name: m.save_state() for name, m in lock.managers.items()}))
    at_save, copies = pickle.dumps(world), pickle.loads(pickle.dumps(lock.managers))
    snapshots = {name: m.snapshot() for name, m in lock.managers.items()}
    for _ in range(2):
        _walk(world, lock, rng, 6)
        for name, manager in lock.managers.items():
            manager.restore_state(saved[name])
            assert manager.snapshot() == snapshots[name]
            manager.check_invariants()
        world, lock = pickle.loads(at_save), LeanLock(lock.managers, each_call=True)
    together = LeanLock(lock.managers | {f"pickled {name}": m for name, m in copies.items()}, each_call=True)
    _walk(world, together, rng, 8)  # a disagreement or a different snapshot raises Finding


@pytest.mark.parametrize("impl", IMPLS)
def test_a_state_saved_before_the_tables_grew_comes_back_whole(impl: str) -> None:
    """The fast manager writes a saved state into the arrays it holds when
    their shapes are the same, and makes them anew when they grew since
    (more rows and columns than two of two): both ways give the state back."""
    manager = IMPLS[impl](1, 64, 0, watermark=0.0, enable_caching=True)
    group = SequenceGroup("a", [Sequence(1, [1, 2])])
    manager.allocate(group)
    small, small_snapshot = manager.save_state(), manager.snapshot()
    for i in range(2, 7):
        manager.allocate(SequenceGroup(f"r{i}", [Sequence(i, list(range(10 * i)))]))
    large, large_snapshot = manager.save_state(), manager.snapshot()
    for saved, snapshot in ((small, small_snapshot), (large, large_snapshot), (small, small_snapshot)):
        manager.restore_state(saved)
        assert manager.snapshot() == snapshot
        manager.check_invariants()
    manager.restore_state(small)
    manager.allocate(SequenceGroup("b", [Sequence(9, [1, 2, 3])]))  # it goes on from there
    assert manager.get_block_table(group.seqs[0]) == [0, 1] and len(manager.get_block_table(Sequence(9, []))) == 3


@pytest.mark.parametrize("impl", IMPLS)
def test_a_state_it_cannot_take_is_refused_by_name_with_nothing_changed(impl: str) -> None:
    manager = IMPLS[impl](2, 8, 2, watermark=0.0)
    manager.allocate(SequenceGroup("a", [Sequence(1, [1, 2, 3])]))
    before = manager.snapshot()
    other_impl = next(cls for name, cls in IMPLS.items() if name != impl)(2, 8, 2, watermark=0.0)
    other_config = IMPLS[impl](2, 9, 2, watermark=0.0)
    refused = {
        "not a SavedState": (None, "takes what save_state\\(\\) returned"),
        "a plain tuple": (tuple(manager.save_state()), "takes what save_state\\(\\) returned"),
        "another implementation's": (other_impl.save_state(), "cannot be restored into the"),
        "another configuration's": (other_config.save_state(), "saved with the configuration"),
    }
    for saved, message in refused.values():
        with pytest.raises(InvalidArgumentError, match=message):
            manager.restore_state(saved)
        assert manager.snapshot() == before
    assert isinstance(manager.save_state(), SavedState)


@pytest.mark.skipif(bool(missing_modules("gpu")), reason="the device block table needs the [gpu] extra")
def test_a_fast_manager_with_a_device_table_refuses_to_save_or_restore() -> None:
    manager = FastBlockSpaceManager(2, 8, 0)
    saved = manager.save_state()
    manager.device_block_table(backend="cpu")
    with pytest.raises(UnsupportedError, match="device block table"):
        manager.save_state()
    with pytest.raises(UnsupportedError, match="device block table"):
        manager.restore_state(saved)


class PickledReference(ReferenceBlockSpaceManager):
    save_state = None  # as a manager without the API: the explorer pickles it whole


class PickledFast(FastBlockSpaceManager):
    save_state = None


@pytest.mark.parametrize(("scope", "depth"), [("default", 7), ("sliding_window", 7), ("encoder_decoder", 5)])
def test_the_explorer_finds_the_same_states_restoring_as_loading_pickles(scope: str, depth: int) -> None:
    cut = scope_from(scope, [f"max_depth={depth}"])
    restored = explore(PAIR, cut, workers=1)
    pickled = explore({"reference": PickledReference, "fast": PickledFast}, cut, workers=1)
    assert restored.passed and pickled.passed
    figures = [(r.states, r.transitions, r.calls, r.layers) for r in (restored, pickled)]
    assert figures[0] == figures[1] and restored.states > 100, figures


@pytest.mark.parametrize("impl", IMPLS)
def test_a_subclass_s_own_fields_come_back_too(impl: str) -> None:
    """A subclass (a broken manager of the kit, a user's wrapper) may keep
    fields of its own: they are saved and restored with the rest, and
    one made after the save is gone again."""
    manager = type("WithNotes", (IMPLS[impl],), {})(2, 8, 0)
    manager.notes = [1]
    saved = manager.save_state()
    manager.notes.append(2)
    manager.later = True
    manager.restore_state(saved)
    assert manager.notes == [1] and not hasattr(manager, "later")
    manager.restore_state(saved)
    assert manager.notes == [1] and manager.notes is not saved  # a fresh copy each time
