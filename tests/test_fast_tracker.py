"""The computed-blocks tracker's parked rows (fast/manager.py): a sequence
dropped from the tracker and queried again must get exactly the reference's
answer, whether its tokens, salt or adapter stayed the same or not."""

from __future__ import annotations

from test_fast_lockstep import Twins

from blockspace import Sequence, SequenceGroup, SequenceStatus

PROMPT = list(range(100, 122))  # 5 full blocks of 4 and 2 tokens


def twins() -> Twins:
    return Twins(4, 64, 16, enable_caching=True)


def requery(m: Twins, seq: Sequence) -> int:
    m("remove_seq_from_computed_blocks_tracker", seq)
    return m("get_num_cached_tokens", seq)


def admit(m: Twins, request_id: str, prompt: list[int], seq_id: int, **kwargs: object) -> SequenceGroup:
    group = SequenceGroup.from_prompt(request_id, prompt, first_seq_id=seq_id, **kwargs)
    m("allocate", group)
    m("mark_blocks_as_computed", group, len(prompt))
    group.seqs[0].status = SequenceStatus.RUNNING
    return group


def test_same_tokens_come_back_and_see_new_hits():
    m = twins()
    waiting = Sequence(1, PROMPT)
    assert m("get_num_cached_tokens", waiting) == 0
    assert requery(m, waiting) == 0
    admit(m, "other", PROMPT[:12], 2)
    assert requery(m, waiting) == 12  # the parked keys meet the new cached blocks


def test_other_content_under_the_same_id_is_keyed_afresh():
    m = twins()
    admit(m, "other", PROMPT, 2)
    changed = PROMPT[:5] + [7] + PROMPT[6:]  # the second block differs
    for seq, expected in [
        (Sequence(1, PROMPT), 20),
        (Sequence(1, changed), 4),
        (Sequence(1, PROMPT, cache_salt="tenant"), 0),
        (Sequence(1, PROMPT, lora_int_id=3), 0),
        (Sequence(1, PROMPT[:9]), 8),  # shorter: no error after a removal
        (Sequence(1, PROMPT + [1, 2, 3]), 20),  # longer: keys one more block
    ]:
        assert m("get_num_cached_tokens", seq) == expected
        m("remove_seq_from_computed_blocks_tracker", seq)


def test_in_place_change_of_the_token_list_is_seen():
    m = twins()
    admit(m, "other", PROMPT, 2)
    seq = Sequence(1, PROMPT)
    assert m("get_num_cached_tokens", seq) == 20
    m("remove_seq_from_computed_blocks_tracker", seq)
    seq.get_token_ids()[2] = 9  # the same list object, another first block
    assert m("get_num_cached_tokens", seq) == 0


def test_many_parked_rows_and_frees():
    m = twins()
    admit(m, "other", PROMPT, 1000)
    seqs = [Sequence(i, PROMPT[: 4 + i % 18]) for i in range(150)]  # more than MAX_PARKED_ROWS
    for round_ in range(3):
        for seq in seqs:
            m("get_num_cached_tokens", seq)
            m("remove_seq_from_computed_blocks_tracker", seq)
        for seq in seqs[round_::7]:
            m("free", seq)  # not allocated: ignored, but the parked row may go
    for seq in seqs:
        assert m("get_num_cached_tokens", seq) == min(20, len(seq.get_token_ids()) // 4 * 4)
    m.fast.check_invariants()


def test_allocate_after_a_query_sees_changed_tokens():
    from blockspace.errors import InvalidArgumentError

    m = twins()
    admit(m, "other", PROMPT * 2, 2)
    for change in (None, 3, True, 2.0, -1):
        group = SequenceGroup.from_prompt(f"g{change}", PROMPT * 2, first_seq_id=10)
        seq = group.seqs[0]
        m("get_num_cached_tokens", seq)
        if change is not None:
            seq.get_token_ids()[37] = change  # the list the tracker keyed, changed in place
        try:
            m("allocate", group)
        except InvalidArgumentError:
            assert change in (True, 2.0, -1)
            m("remove_seq_from_computed_blocks_tracker", seq)
            continue
        assert change in (None, 3)
        m("free", seq)


def test_allocate_after_a_query_sees_a_changed_salt_or_adapter():
    """``allocate`` takes the keys the tracker made only if they were made
    under the same salt and adapters: else its blocks would be cached under
    content another tenant (or adapter) can hit."""
    m = twins()
    for index, (name, value) in enumerate([("cache_salt", "tenant"), ("lora_int_id", 3)]):
        group = SequenceGroup.from_prompt(f"g{index}", PROMPT, first_seq_id=10 + index)
        seq = group.seqs[0]
        assert m("get_num_cached_tokens", seq) == 0  # keyed with no salt, no adapter
        setattr(seq, name, value)
        m("allocate", group)
        m("mark_blocks_as_computed", group, len(PROMPT))
        plain = Sequence(20 + index, PROMPT)
        assert m("get_num_cached_tokens", plain) == 0  # the new blocks are not plain content
        m("remove_seq_from_computed_blocks_tracker", plain)
        m("free", seq)
