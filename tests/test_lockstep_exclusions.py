"""A call a manager refuses to be compared on (``vllm_manager.Excluded``), in
a ``Lockstep``: counted by reason; a question is not compared, and after
any other call the refusing manager leaves the lockstep."""

from __future__ import annotations

from blockspace.conformance import lockstep
from blockspace.conformance.check import Check, CheckResult
from blockspace.conformance.lockstep import Lockstep
from blockspace.conformance.vllm_manager import Excluded
from blockspace.reference import ReferenceBlockSpaceManager
from blockspace.sequence import Sequence, SequenceGroup


class RefusesOdd(ReferenceBlockSpaceManager):
    """The reference, refusing prompts of an odd length (before any change), and hit rates of the CPU."""

    def allocate(self, seq_group):
        if len(seq_group.get_seqs()[0].get_token_ids()) % 2:
            raise Excluded("an odd prompt")
        return super().allocate(seq_group)

    def get_prefix_cache_hit_rate(self, device):
        if str(device).endswith("CPU"):
            raise Excluded("the CPU's hit rate")
        return super().get_prefix_cache_hit_rate(device)


def group(name: str, seq_id: int, tokens: list[int]) -> SequenceGroup:
    return SequenceGroup(name, [Sequence(seq_id, tokens)])


def lock() -> Lockstep:
    config = {"block_size": 2, "num_gpu_blocks": 4, "num_cpu_blocks": 1, "enable_caching": True}
    return Lockstep({"reference": ReferenceBlockSpaceManager(**config), "refuses": RefusesOdd(**config)})


def test_a_refused_question_is_not_compared_and_the_run_goes_on_with_both():
    pair = lock()
    before = lockstep.EXCLUDED["the CPU's hit rate"]
    assert pair.call("get_prefix_cache_hit_rate", "CPU").value == 0.0  # the reference's answer, not compared
    assert lockstep.EXCLUDED["the CPU's hit rate"] == before + 1
    assert set(pair.managers) == {"reference", "refuses"}


def test_after_a_refused_change_the_manager_leaves_and_the_rest_is_compared_without_it():
    pair = lock()
    pair.call("allocate", group("a", 1, [1, 2]))  # compared
    pair.call("allocate", group("b", 2, [1, 2, 3]))  # refused: the reference made the table, the other did not
    assert set(pair.managers) == {"reference"} and set(pair.snapshots) == {"reference"}
    assert pair.call("get_block_table", Sequence(2, [1, 2, 3])).value == [0, 1]  # a hit on a's block, and a new one
    assert "# refuses left the lockstep here (an odd prompt)" in pair.script.render()


def test_a_check_names_what_was_not_compared_while_it_ran():
    def run() -> CheckResult:
        lock().call("allocate", group("b", 2, [1]))
        return CheckResult("odd", "passed")

    assert Check("odd", run).run().extra["not_compared"] == {"an odd prompt": 1}
    assert "not_compared" not in Check("none", lambda: CheckResult("none", "passed")).run().extra
