"""Unit tests of the conformance kit: the lockstep comparison, the
invariants, the call log and the command line."""

import json
import sys

import numpy as np
import pytest

from blockspace import AllocStatus, Sequence, SequenceGroup, SequenceStatus
from blockspace.conformance import Divergence, Lockstep, Script, invariants
from blockspace.conformance.cli import main
from blockspace.conformance.lockstep import mismatch
from blockspace.errors import UnknownSequenceError
from blockspace.reference import ReferenceBlockSpaceManager


class BoolCanAllocate(ReferenceBlockSpaceManager):
    """Answers ``can_allocate`` with a bool instead of an AllocStatus."""

    def can_allocate(self, seq_group, num_lookahead_slots=0):
        return super().can_allocate(seq_group, num_lookahead_slots) == AllocStatus.OK


class ListPairs(ReferenceBlockSpaceManager):
    """Returns copy-on-write pairs as lists instead of tuples."""

    def append_slots(self, seq, num_lookahead_slots):
        return [list(pair) for pair in super().append_slots(seq, num_lookahead_slots)]


class WrongError(ReferenceBlockSpaceManager):
    def get_block_table(self, seq):
        if seq.seq_id not in self.block_tables:
            raise KeyError(seq.seq_id)  # not UnknownSequenceError
        return super().get_block_table(seq)


class ChangesThenRaises(ReferenceBlockSpaceManager):
    """Allocates, then fails: an error that leaves state behind."""

    def append_slots(self, seq, num_lookahead_slots):
        super().append_slots(seq, num_lookahead_slots)
        raise UnknownSequenceError("late failure")


class OffByOneFreeCount(ReferenceBlockSpaceManager):
    def get_num_free_gpu_blocks(self):
        return super().get_num_free_gpu_blocks() - 1


CONFIG = dict(block_size=2, num_gpu_blocks=6, num_cpu_blocks=2, watermark=0.0)


def lockstep(other):
    return Lockstep.build({"reference": ReferenceBlockSpaceManager, "other": other}, **CONFIG)


def running_group(lock, request_id="a", seq_id=1, tokens=(1, 2, 3), n=1):
    seqs = [Sequence(seq_id + i, list(tokens)) for i in range(n)]
    group = SequenceGroup(request_id, seqs)
    lock.call("allocate", group)
    for s in seqs:
        s.status = SequenceStatus.RUNNING
    return group


def test_mismatch_compares_types_all_the_way_down():
    assert mismatch([(1, 2)], [(1, 2)]) is None
    assert "type" in mismatch([(1, 2)], [[1, 2]])
    assert "type" in mismatch(AllocStatus.OK, True)
    assert "type" in mismatch([1], [np.int64(1)])
    assert "length" in mismatch([1], [1, 2])
    assert mismatch(float("nan"), float("nan")) is None
    assert mismatch({"a": 1}, {"a": 2}) is not None


def test_return_types_must_match():
    lock = lockstep(BoolCanAllocate)
    with pytest.raises(Divergence, match="can_allocate disagrees"):
        lock.call("can_allocate", SequenceGroup("a", [Sequence(1, [1, 2])]))


def test_cow_pairs_must_be_tuples():
    lock = lockstep(ListPairs)
    group = running_group(lock, n=2)
    parent = group.get_seqs()[0]
    parent.append_token_id(4)
    with pytest.raises(Divergence, match="append_slots disagrees"):
        lock.call("append_slots", parent, 0)


def test_error_types_must_match():
    lock = lockstep(WrongError)
    with pytest.raises(Divergence, match="UnknownSequenceError"):
        lock.call("get_block_table", Sequence(9, [1]))


def test_agreed_error_is_returned_not_raised():
    lock = lockstep(ReferenceBlockSpaceManager)
    outcome = lock.call("get_block_table", Sequence(9, [1]))
    assert isinstance(outcome.error, UnknownSequenceError)


def test_an_error_must_leave_the_state_unchanged():
    lock = Lockstep.build({"only": ChangesThenRaises}, **CONFIG)
    group = running_group(lock)
    seq = group.get_seqs()[0]
    for token in (4, 5, 6):
        seq.append_token_id(token)
    with pytest.raises(Divergence, match="raised UnknownSequenceError but changed only"):
        lock.call("append_slots", seq, 0)


def test_state_is_compared_after_every_call():
    class ForgetsTheClock(ReferenceBlockSpaceManager):
        def access_all_blocks_in_seq(self, seq, access_time):
            pass

    lock = Lockstep.build(
        {"reference": ReferenceBlockSpaceManager, "other": ForgetsTheClock}, enable_caching=True, **CONFIG
    )
    seq = running_group(lock).get_seqs()[0]
    with pytest.raises(Divergence, match="state differs after access_all_blocks_in_seq"):
        lock.call("access_all_blocks_in_seq", seq, 3.0)


def test_the_repro_replays_the_log():
    script = Script({"reference": "reference", "other": "reference"}, CONFIG)
    lock = Lockstep.build(script.impls, script, **CONFIG)
    script.do("s1 = Sequence(1, [1, 2, 3])")
    script.do("g1 = SequenceGroup('g1', [s1])")
    lock.call("allocate", script.get("g1"))
    text = script.render()
    assert "lock.call('allocate', g1)" in text
    namespace = {}
    exec(text, namespace)
    assert namespace["lock"].reference.get_block_table(namespace["s1"]) == [0, 1]


# -- invariants -----------------------------------------------------------------------
def world_of(manager, *seqs):
    world = invariants.World(CONFIG["block_size"], CONFIG["num_gpu_blocks"], CONFIG["num_cpu_blocks"])
    for s in seqs:
        world.seqs[s.seq_id] = s
        world.written[s.seq_id] = len(s.get_token_ids())
    return world


def two_sharing_sequences():
    manager = ReferenceBlockSpaceManager(**CONFIG)
    a, b = Sequence(1, [1, 2, 3]), Sequence(2, [1, 2, 3])
    manager.allocate(SequenceGroup("g", [a, b]))
    for s in (a, b):
        s.status = SequenceStatus.RUNNING
    return manager, a, b


def test_invariants_hold_on_a_consistent_state():
    manager, a, b = two_sharing_sequences()
    world = world_of(manager, a, b)
    free = (manager.get_num_free_gpu_blocks(), manager.get_num_free_cpu_blocks())
    assert invariants.check_snapshot(manager.snapshot(), world, free) == []
    tables = {s.seq_id: manager.get_block_table(s) for s in (a, b)}
    assert invariants.check_returns(tables, {}, *free, world) == []


def test_invariants_catch_a_refcount_a_partition_and_a_count():
    manager, a, b = two_sharing_sequences()
    snap = manager.snapshot()
    snap["blocks"][0] = (1,) + tuple(snap["blocks"][0][1:])  # one reference lost
    snap["free"]["GPU"].append(1)  # in use and free
    problems = invariants.check_snapshot(snap, world_of(manager, a, b), (3, 2))
    assert any("refcount 1, but 2 references" in p for p in problems)
    assert any("block 1 is in 2 of" in p for p in problems)
    assert any("3 free reported" in p for p in problems)


def test_invariants_catch_shared_blocks_with_different_content():
    manager, a, b = two_sharing_sequences()
    b.get_token_ids()[0] = 7  # b's content changes behind the manager's back
    problems = invariants.check_snapshot(manager.snapshot(), world_of(manager, a, b))
    assert any("different content" in p for p in problems)


def test_invariants_catch_a_running_sequence_on_the_cpu():
    manager = ReferenceBlockSpaceManager(**CONFIG)
    a = Sequence(1, [1, 2, 3])
    manager.allocate(SequenceGroup("g", [a]))
    a.status = SequenceStatus.RUNNING
    manager.swap_out(SequenceGroup("g", [a]))  # the status is left RUNNING
    problems = invariants.check_snapshot(manager.snapshot(), world_of(manager, a))
    assert any("is RUNNING but its table is on the CPU" in p for p in problems)


def test_swap_mapping_checks():
    world = invariants.World(2, 4, 4)
    good = invariants.check_swap([(0, 0), (1, 1)], {1: [0, 1]}, {1: [4, 5]}, True, world)
    assert good == []
    twice = invariants.check_swap([(0, 0), (1, 0)], {1: [0, 1]}, {1: [4, 4]}, True, world)
    assert any("receives two sources" in p for p in twice)
    outside = invariants.check_swap([(0, 9)], {1: [0]}, {1: [13]}, True, world)
    assert any("leaves the device ranges" in p for p in outside)


def test_cow_checks():
    world = invariants.World(2, 4, 0)
    assert invariants.check_cow([(0, 1)], [1], [0, 1, 0, 0], world) == []
    assert invariants.check_cow([(0, 0)], [0], None, world)
    assert any("refcount 2" in p for p in invariants.check_cow([(0, 1)], [1], [1, 2, 0, 0], world))
    assert any("not in the writer's table" in p for p in invariants.check_cow([(0, 1)], [2], None, world))


# -- command line ------------------------------------------------------------------------
def test_cli_writes_a_json_report(tmp_path, capsys):
    report_path = tmp_path / "report.json"
    code = main(["--impl", "reference", "--only", "machine[plain]", "--examples", "5", "--json", str(report_path)])
    assert code == 0
    report = json.loads(report_path.read_text())
    assert report["passed"] is True
    assert [c["name"] for c in report["checks"]] == ["machine[plain]"]
    assert report["checks"][0]["examples"] >= 5
    assert "machine[plain]" in capsys.readouterr().out


def test_cli_reports_a_failure_with_exit_status_1(tmp_path):
    report_path = tmp_path / "report.json"
    impl = f"{__name__}:OffByOneFreeCount"
    code = main(["--impl", impl, "--only", "plain", "--examples", "30", "--json", str(report_path)])
    assert code == 1
    check = json.loads(report_path.read_text())["checks"][0]
    assert check["status"] == "failed" and "Repro (runnable)" in check["detail"]


def test_cli_rejects_an_unknown_implementation(capsys):
    assert main(["--impl", "no.such.module:Manager"]) == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--only", "nosuchcheck"], "error: --only 'nosuchcheck' names no check of the quick profile (machine[plain]"),
        (["--only", "plain", "--only", "nosuchcheck"], "error: --only 'nosuchcheck' names no check"),
        (["--examples", "-3"], "error: --examples must be >= 1, got -3"),
        (["--examples", "0"], "error: --examples must be >= 1, got 0"),
        (["--shrink-budget", "0"], "error: --shrink-budget must be > 0, got 0.0"),
    ],
)
def test_cli_rejects_bad_arguments_before_running_anything(capsys, argv, message):
    assert main(["--impl", "reference", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""  # one line, no check run


def test_blockspace_command_finds_a_manager_module_in_the_current_folder(tmp_path, monkeypatch, capsys):
    """``--impl mymodule:Class`` as the README documents it, run from the module's folder."""
    (tmp_path / "my_manager_module.py").write_text(
        "from blockspace.reference import ReferenceBlockSpaceManager as MyManager\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    from blockspace.cli import main as blockspace_main

    code = blockspace_main(["conformance", "--impl", "my_manager_module:MyManager", "--only", "machine[plain]",
                            "--examples", "3"])  # fmt: skip
    assert code == 0 and "machine[plain]" in capsys.readouterr().out


def test_sliding_window_null_entries_are_not_shared_content():
    world = invariants.World(2, 8, 0, sliding_window=0)
    for seq in (Sequence(1, [1] * 8), Sequence(2, [2] * 8)):
        world.seqs[seq.seq_id] = seq
        world.written[seq.seq_id] = 8
    tables = {1: [7, 1, 2, 3], 2: [7, 4, 5, 6]}  # block 7 is the null block, once in each table
    assert any("different content" in p for p in invariants.check_returns(tables, {}, 1, 0, world))
    world.dropped.update({1: 1, 2: 1})
    assert invariants.check_returns(tables, {}, 1, 0, world) == []


def test_cli_fail_fast_stops_at_the_first_failing_check(tmp_path, capsys):
    report_path = tmp_path / "report.json"
    impl = "blockspace.conformance.broken:WatermarkOffByOne"
    code = main(["--impl", impl, "--fail-fast", "--shrink-budget", "3", "--examples", "60", "--json", str(report_path)])
    assert code == 1
    report = json.loads(report_path.read_text())
    assert [c["name"] for c in report["checks"]] == ["machine[plain]"]  # the other eighteen never ran
    assert report["checks"][0]["shrink_budget_s"] == 3.0
    out = capsys.readouterr().out
    assert (
        "machine[plain]: a failure after" in out
        and "--fail-fast: stopping after machine[plain]; 18 check(s) not run" in out
    )
