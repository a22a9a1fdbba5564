"""The cache salt has one source of truth, the request: a salt set on the
group or on its sequences isolates the request, a group whose salts
disagree is refused before anything changes, and both managers agree."""

from __future__ import annotations

import pytest

from blockspace import Sequence, SequenceGroup, SequenceStatus
from blockspace.errors import SaltMismatchError
from blockspace.fast import FastBlockSpaceManager
from blockspace.reference import ReferenceBlockSpaceManager
from blockspace.sequence import SequenceData

PROMPT = list(range(100, 120))  # 5 full blocks of 4


class VllmLikeSequence:
    """What the managers read of vLLM 0.9.2's ``Sequence``: no ``cache_salt``
    attribute and no link to its group; the request's prompt and salt are in
    ``inputs`` (vLLM's ``token_inputs(..., cache_salt=...)``)."""

    def __init__(self, seq_id: int, prompt: list[int], salt: str | None = None) -> None:
        self.seq_id = seq_id
        self.inputs = {"type": "token", "prompt_token_ids": prompt}
        if salt is not None:
            self.inputs["cache_salt"] = salt
        self.data = SequenceData(prompt)
        self.status = SequenceStatus.WAITING
        self.lora_int_id = self.prompt_adapter_id = 0

    def get_token_ids(self) -> list[int]:
        return self.data.get_token_ids()

    def get_len(self) -> int:
        return self.data.get_len()

    def is_prefill(self) -> bool:
        return self.data.is_prefill()

    def is_finished(self) -> bool:
        return SequenceStatus.is_finished(self.status)

    def extra_hash(self) -> int | None:
        return None


class VllmLikeGroup:
    """vLLM's ``SequenceGroup`` with a ``cache_salt`` attribute added."""

    def __init__(self, request_id: str, seqs: list[VllmLikeSequence], cache_salt: str | None = None) -> None:
        self.request_id, self.seqs, self.cache_salt = request_id, seqs, cache_salt

    def get_seqs(self, status: SequenceStatus | None = None) -> list[VllmLikeSequence]:
        return [seq for seq in self.seqs if status is None or seq.status == status]

    def is_encoder_decoder(self) -> bool:
        return False

    def get_encoder_seq(self) -> None:
        return None


def managers() -> list:
    return [ReferenceBlockSpaceManager(4, 32, 0, watermark=0, enable_caching=True),
            FastBlockSpaceManager(4, 32, 0, watermark=0, enable_caching=True)]  # fmt: skip


def group_only(request_id: str, seq_id: int, salt: str | None) -> SequenceGroup:
    group = SequenceGroup(request_id, [Sequence(seq_id, PROMPT)])  # plain sequences, no salt of their own
    group.cache_salt = salt
    return group


def seqs_only(request_id: str, seq_id: int, salt: str | None) -> SequenceGroup:
    return SequenceGroup(request_id, [Sequence(seq_id, PROMPT, cache_salt=salt)])


def both(request_id: str, seq_id: int, salt: str | None) -> SequenceGroup:
    return SequenceGroup.from_prompt(request_id, PROMPT, first_seq_id=seq_id, cache_salt=salt)


def vllm_inputs(request_id: str, seq_id: int, salt: str | None) -> VllmLikeGroup:
    return VllmLikeGroup(request_id, [VllmLikeSequence(seq_id, PROMPT, salt)])


def vllm_both(request_id: str, seq_id: int, salt: str | None) -> VllmLikeGroup:
    return VllmLikeGroup(request_id, [VllmLikeSequence(seq_id, PROMPT, salt)], cache_salt=salt)


@pytest.mark.parametrize("build", [group_only, seqs_only, both, vllm_inputs, vllm_both])
def test_a_salt_wherever_the_request_carries_it_isolates_it(build):
    """Tenant a's prompt is cached; tenant a again hits it, tenant b and an
    unsalted request with the same prompt do not, in both managers alike."""
    answers = []
    for manager in managers():
        seen = []
        for request_id, seq_id, salt in (
            ("a1", 1, "tenant-a"),
            ("a2", 2, "tenant-a"),
            ("b", 3, "tenant-b"),
            ("u", 4, None),
        ):
            group = build(request_id, seq_id, salt)
            seq = group.get_seqs()[0]
            cached = manager.get_num_cached_tokens(seq)
            manager.allocate(group)
            manager.mark_blocks_as_computed(group, len(PROMPT))
            seen.append((cached, manager.get_block_table(seq)))
        manager.check_invariants()
        (cached_a1, a1), (cached_a2, a2), (cached_b, b), (cached_u, u) = seen
        assert cached_a1 == 0 and cached_a2 == len(PROMPT) and a2 == a1
        assert cached_b == cached_u == 0
        assert not set(a1) & set(b) and not set(a1) & set(u) and not set(b) & set(u)
        answers.append((seen, manager.snapshot()))
    assert answers[0] == answers[1]


def test_the_counted_hits_are_the_hits_allocate_takes():
    """For every way of carrying the salt, the count before allocate equals
    the blocks allocate then finds in the cache."""
    for build in (group_only, seqs_only, both, vllm_inputs, vllm_both):
        for manager in managers():
            warm = build("w", 1, "tenant-a")
            manager.allocate(warm)
            manager.mark_blocks_as_computed(warm, len(PROMPT))
            for seq_id, salt in ((2, "tenant-a"), (3, "tenant-b"), (4, None)):
                group = build(f"r{seq_id}", seq_id, salt)
                seq = group.get_seqs()[0]
                cached = manager.get_num_cached_tokens(seq)
                manager.allocate(group)
                shared = [
                    i for i in manager.get_block_table(seq) if i in set(manager.get_block_table(warm.get_seqs()[0]))
                ]
                assert cached == 4 * len(shared), (build.__name__, salt)


def disagreeing_groups() -> list:
    group_and_seq = SequenceGroup("g", [Sequence(1, PROMPT, cache_salt="tenant-a")])
    group_and_seq.cache_salt = "tenant-b"
    two_seqs = SequenceGroup(
        "s", [Sequence(2, PROMPT, cache_salt="tenant-a"), Sequence(3, PROMPT, cache_salt="tenant-b")]
    )
    salted_and_plain = SequenceGroup("p", [Sequence(4, PROMPT, cache_salt="tenant-a"), Sequence(5, PROMPT)])
    vllm = VllmLikeGroup("v", [VllmLikeSequence(6, PROMPT, "tenant-a")], cache_salt="tenant-b")
    return [group_and_seq, two_seqs, salted_and_plain, vllm]


@pytest.mark.parametrize("index", range(4))
def test_a_group_whose_salts_disagree_is_refused_and_nothing_changes(index):
    messages = []
    for manager in managers():
        group = disagreeing_groups()[index]
        before = manager.snapshot()
        with pytest.raises(SaltMismatchError, match="different cache salts") as error:
            manager.allocate(group)
        assert manager.snapshot() == before
        manager.check_invariants()
        messages.append(str(error.value))
    assert messages[0] == messages[1]


def test_our_sequences_see_the_salt_their_group_gets_later():
    group = SequenceGroup("late", [Sequence(1, PROMPT)])
    assert group.seqs[0].cache_salt is None
    group.cache_salt = "tenant-a"
    child = group.seqs[0].fork(2)
    group.add(child)
    assert group.seqs[0].cache_salt == child.cache_salt == "tenant-a"
    group.seqs[0].cache_salt = "own"  # a sequence's own salt wins over its group's
    assert group.seqs[0].cache_salt == "own"


def vllm_group_only(request_id: str, seq_id: int, salt: str | None) -> VllmLikeGroup:
    return VllmLikeGroup(request_id, [VllmLikeSequence(seq_id, PROMPT)], cache_salt=salt)


def test_a_salt_only_a_vllm_group_carries_is_refused_after_a_count_made_without_it():
    """vLLM's scheduler counts a sequence's cached tokens before it hands the
    manager the group: a salt set only on a vLLM group cannot be seen then,
    so allocate refuses the group instead of silently taking fewer hits than
    were counted; without a count first, the salt isolates the request."""
    outcomes = []
    for manager in managers():
        warm = vllm_group_only("w", 1, None)
        manager.allocate(warm)
        manager.mark_blocks_as_computed(warm, len(PROMPT))
        counted = vllm_group_only("c", 2, "tenant-a")
        assert manager.get_num_cached_tokens(counted.get_seqs()[0]) == len(PROMPT)  # counted unsalted: all hits
        before = manager.snapshot()
        with pytest.raises(SaltMismatchError, match="counted without the group's cache salt") as error:
            manager.allocate(counted)
        assert manager.snapshot() == before
        uncounted = vllm_group_only("u", 3, "tenant-a")
        manager.allocate(uncounted)
        shared = set(manager.get_block_table(uncounted.get_seqs()[0])) & set(
            manager.get_block_table(warm.get_seqs()[0])
        )
        assert not shared
        manager.check_invariants()
        outcomes.append((str(error.value), manager.snapshot()))
    assert outcomes[0] == outcomes[1]


def test_without_prefix_caching_a_group_only_salt_is_not_refused():
    """Without caching nothing is counted, so nothing can be dishonoured."""
    for manager in (ReferenceBlockSpaceManager(4, 32, 0), FastBlockSpaceManager(4, 32, 0)):
        group = vllm_group_only("n", 1, "tenant-a")
        assert manager.get_num_cached_tokens(group.get_seqs()[0]) == 0
        manager.allocate(group)
        assert len(manager.get_block_table(group.get_seqs()[0])) == 5
