"""The array-level step (fast/row_api.py) against the reference's per-sequence
calls: same answers, same copy-on-write pairs, same tables, same state, and
clear errors that change nothing."""

from __future__ import annotations

import random

import numpy as np
import pytest

from blockspace import SequenceGroup, SequenceStatus
from blockspace.errors import (
    EmptyTableError,
    InvalidArgumentError,
    TrackerError,
    UnknownSequenceError,
    WrongDeviceError,
)
from blockspace.fast import FastBlockSpaceManager
from blockspace.reference import ReferenceBlockSpaceManager
from blockspace.snapshot import diff

CONFIGS = {
    "plain": {"block_size": 4, "num_gpu_blocks": 400, "num_cpu_blocks": 8},
    "caching": {"block_size": 4, "num_gpu_blocks": 400, "num_cpu_blocks": 8, "enable_caching": True},
    "window": {"block_size": 4, "num_gpu_blocks": 400, "num_cpu_blocks": 8, "sliding_window": 12},
    "bs1-tight": {"block_size": 1, "num_gpu_blocks": 1200, "num_cpu_blocks": 0},
}


def admitted(config: dict, seed: int) -> tuple[ReferenceBlockSpaceManager, FastBlockSpaceManager, list]:
    """Both managers with the same groups running (some of two sequences, some with an adapter)."""
    rng = random.Random(seed)
    reference, fast = ReferenceBlockSpaceManager(**config), FastBlockSpaceManager(**config)
    groups = []
    for index in range(12):
        prompt = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]  # small alphabet: shared blocks
        n = 2 if index % 4 == 0 else 1
        lora = 7 if index % 5 == 2 else 0
        pair = [
            SequenceGroup.from_prompt(f"r{index}", prompt, n=n, lora_int_id=lora, first_seq_id=10 * index)
            for _ in range(2)
        ]
        reference.allocate(pair[0])
        fast.allocate(pair[1])
        for group in pair:
            for seq in group.seqs:
                seq.status = SequenceStatus.RUNNING
        groups.append(pair)
    return reference, fast, groups


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_row_steps_equal_the_per_sequence_calls(name, seed):
    rng = random.Random(seed)
    reference, fast, groups = admitted(CONFIGS[name], seed)
    for step in range(30):
        lookahead = rng.choice([0, 0, 1, 3])
        for pair in groups:
            num_new = rng.choice([1, 1, 1, 2, 5])
            tokens = [rng.randrange(6) for _ in range(num_new)]
            for group in pair:
                for seq in group.seqs:
                    seq.data.update_num_computed_tokens(seq.get_len() - seq.data.get_num_computed_tokens())
                    for token in tokens:
                        seq.append_token_id(token)
        ref_groups = [pair[0] for pair in groups]
        fast_seqs = [seq for pair in groups for seq in pair[1].get_seqs(status=SequenceStatus.RUNNING)]
        ref_seqs = [seq for group in ref_groups for seq in group.get_seqs(status=SequenceStatus.RUNNING)]

        expected_fits = [reference.can_append_slots(group, lookahead) for group in ref_groups]
        expected_pairs = [pair for seq in ref_seqs for pair in reference.append_slots(seq, lookahead)]
        expected_tables = [reference.get_block_table(seq) for seq in ref_seqs]

        rows = fast.rows_of(fast_seqs)
        lengths = np.array([seq.get_len() for seq in fast_seqs])
        group_ends = np.cumsum([len(pair[1].get_seqs(status=SequenceStatus.RUNNING)) for pair in groups])
        fits = fast.can_append_slots_rows(rows, lengths, lookahead, group_ends)
        extra = {}
        if fast.enable_caching:
            extra["token_ids"] = [seq.get_token_ids() for seq in fast_seqs]
        if fast.sliding_window is not None:
            extra["num_computed_tokens"] = [seq.data.get_num_computed_tokens() for seq in fast_seqs]
        pairs = fast.append_slots_rows(rows, lengths, lookahead, **extra)
        tables = fast.block_tables(rows)
        array = fast.block_table_array(rows, pad=-1)
        for seq in ref_seqs:
            reference.access_all_blocks_in_seq(seq, float(step))
        fast.access_all_blocks_rows(rows, float(step))

        assert array.dtype == np.int32 and array.shape == tuple(tables.shape)
        assert [[b for b in row if b != -1] for row in array.tolist()] == expected_tables
        expected_computed = [reference.get_common_computed_block_ids([seq]) for seq in ref_seqs]
        computed = fast.num_computed_blocks_rows(rows, [seq.get_token_ids() for seq in fast_seqs])
        assert computed.dtype == np.int64
        assert [row[:count] for row, count in zip(array.tolist(), computed.tolist())] == expected_computed, step
        for manager in (reference, fast):
            manager.mark_blocks_as_computed(None, 0)
        assert fits.tolist() == expected_fits, step
        assert pairs.dtype == np.int64 and pairs.shape == (len(expected_pairs), 2)
        assert [tuple(p) for p in pairs.tolist()] == expected_pairs, step
        for table, expected in zip(tables.tolist(), expected_tables):
            assert table[: len(expected)] == expected and set(table[len(expected) :]) <= {0}
        assert fast.slot_mapping(rows, 1).tolist() == fast.slot_mapping(fast_seqs, 1).tolist()
        slots = fast.slot_mapping_array(rows, 2)  # the last two tokens' slots, from the reference's tables
        bs = fast.block_size
        assert slots.dtype == np.int64 and slots.tolist() == [
            table[t // bs] * bs + t % bs
            for seq, table in zip(ref_seqs, expected_tables)
            for t in (seq.get_len() - 2, seq.get_len() - 1)
        ]
        assert not diff(reference.snapshot(), fast.snapshot()), diff(reference.snapshot(), fast.snapshot())[:5]
        fast.check_invariants()
        if step == 7:  # a few leave the tracker, one of them parked with its tokens: the batch keys them afresh
            for index, pair in enumerate(groups[::4]):
                for manager, group in zip((reference, fast), pair):
                    for seq in group.get_seqs(status=SequenceStatus.RUNNING):
                        manager.remove_seq_from_computed_blocks_tracker(seq)
                        if index == 0:
                            manager.get_num_cached_tokens(seq)
                            manager.remove_seq_from_computed_blocks_tracker(seq)
        if step == 15:  # finish a few and start over on their rows
            for pair in groups[::3]:
                for group in pair:
                    for seq in group.seqs:
                        (reference if group is pair[0] else fast).free(seq)
                        seq.status = SequenceStatus.FINISHED_STOPPED
            groups = [pair for index, pair in enumerate(groups) if index % 3]
    # What the cache now holds, seen by new requests with and without the adapter.
    for index, pair in enumerate(groups):
        tokens = pair[0].seqs[0].get_token_ids()
        for lora in (0, 7):
            probe = SequenceGroup.from_prompt("probe", tokens, lora_int_id=lora, first_seq_id=9000 + 2 * index + lora)
            assert reference.get_num_cached_tokens(probe.seqs[0]) == fast.get_num_cached_tokens(probe.seqs[0])


def unchanged(fast: FastBlockSpaceManager, call, error: type[Exception], match: str) -> None:
    before = fast.snapshot()
    with pytest.raises(error, match=match):
        call()
    assert fast.snapshot() == before
    fast.check_invariants()


def test_bad_batches_raise_and_change_nothing():
    _, fast, groups = admitted(CONFIGS["plain"], 0)
    seqs = [pair[1].seqs[0] for pair in groups]
    for seq in seqs:
        seq.append_token_id(1)
    rows = fast.rows_of(seqs)
    lengths = np.array([seq.get_len() for seq in seqs])
    unchanged(fast, lambda: fast.append_slots_rows(rows, lengths, -1), InvalidArgumentError, "lookahead")
    unchanged(
        fast, lambda: fast.append_slots_rows(rows[[0, 1, 0]], lengths[[0, 1, 0]], 0), InvalidArgumentError, "twice"
    )
    unchanged(fast, lambda: fast.append_slots_rows(rows, lengths[:-1], 0), InvalidArgumentError, "entries")
    unchanged(fast, lambda: fast.append_slots_rows(rows.astype(float), lengths, 0), InvalidArgumentError, "integers")
    unchanged(fast, lambda: fast.append_slots_rows(rows, lengths - 5, 0), InvalidArgumentError, "below the tokens")
    unchanged(fast, lambda: fast.append_slots_rows(np.array([999]), np.array([3]), 0), UnknownSequenceError, "999")
    unchanged(fast, lambda: fast.can_append_slots_rows(rows, -lengths, 0), InvalidArgumentError, "negative")
    unchanged(fast, lambda: fast.can_append_slots_rows(rows, lengths, 0, [3, 2]), InvalidArgumentError, "group_ends")
    unchanged(fast, lambda: fast.block_tables(np.array([rows[0], -1])), UnknownSequenceError, "-1")
    unchanged(fast, lambda: fast.block_tables(rows, pad=0.5), InvalidArgumentError, "pad")
    assert (fast.block_tables(rows, pad=-1) == -1).any()  # tables of several lengths: padded with -1
    unchanged(fast, lambda: fast.slot_mapping(rows, -1), InvalidArgumentError, "num_step_tokens")
    unchanged(fast, lambda: fast.slot_mapping(rows, [1] * (len(rows) - 1) + [10**6]), InvalidArgumentError, "num_step")
    assert fast.slot_mapping(rows, 0).tolist() == []
    freed = seqs[0]
    fast.free(freed)
    unchanged(fast, lambda: fast.append_slots_rows(rows[:1], lengths[:1], 0), UnknownSequenceError, "live")
    swapped = groups[1][1]
    fast.swap_out(swapped)
    unchanged(fast, lambda: fast.append_slots_rows(rows[1:2], lengths[1:2], 0), WrongDeviceError, "swapped")
    caching = FastBlockSpaceManager(4, 40, 4, enable_caching=True)
    group = SequenceGroup.from_prompt("c", [1, 2, 3], first_seq_id=0)
    caching.allocate(group)
    row = caching.rows_of(group.seqs)
    unchanged(caching, lambda: caching.append_slots_rows(row, [4], 0), InvalidArgumentError, "token_ids")
    unchanged(caching, lambda: caching.access_all_blocks_rows([row[0], 77], 1.0), UnknownSequenceError, "77")
    unchanged(caching, lambda: caching.block_table_array(row, pad=None), InvalidArgumentError, "pad")
    unchanged(
        caching, lambda: caching.append_slots_rows(row, [4], 0, token_ids=[[1, 2, 3]]), InvalidArgumentError, "has 3"
    )
    for bad in ([1, 2, 3, -4], [1, 2, 3, True], [1, 2, 3, 4.0], np.array([1, 2, 3, 4.5])):
        unchanged(
            caching,
            lambda bad=bad: caching.append_slots_rows(row, [4], 0, token_ids=[bad]),
            InvalidArgumentError,
            "token id",
        )
    window = FastBlockSpaceManager(4, 40, 4, sliding_window=8)
    group = SequenceGroup.from_prompt("w", [1, 2, 3], first_seq_id=0)
    window.allocate(group)
    unchanged(
        window,
        lambda: window.append_slots_rows(window.rows_of(group.seqs), [4], 0),
        InvalidArgumentError,
        "num_computed",
    )
    empty = FastBlockSpaceManager(4, 40, 4)
    group = SequenceGroup.from_prompt("e", [], first_seq_id=0)
    empty.allocate(group)
    unchanged(empty, lambda: empty.append_slots_rows(empty.rows_of(group.seqs), [1], 0), EmptyTableError, "no blocks")


def test_computed_blocks_of_rows_in_prefill_keep_their_count():
    """vLLM keeps a prefilling sequence's last count of cached tokens; the
    ``prefill`` flags say which rows those are."""
    prompt = list(range(40))
    managers = [
        ReferenceBlockSpaceManager(4, 64, 0, enable_caching=True),
        FastBlockSpaceManager(4, 64, 0, enable_caching=True),
    ]
    answers = []
    for manager in managers:
        first = SequenceGroup.from_prompt("a", prompt, first_seq_id=0)
        manager.allocate(first)
        second = SequenceGroup.from_prompt("b", prompt, first_seq_id=1)
        assert manager.get_num_cached_tokens(second.seqs[0]) == 0  # counted before the first is computed
        manager.mark_blocks_as_computed(first, 40)
        manager.allocate(second)
        seqs = [first.seqs[0], second.seqs[0]]
        first.seqs[0].data.update_num_computed_tokens(40)  # decoding; the second is still in prefill
        if isinstance(manager, FastBlockSpaceManager):
            rows = manager.rows_of(seqs)
            counts = manager.num_computed_blocks_rows(
                rows, [seq.get_token_ids() for seq in seqs], prefill=[False, True]
            )
            answers.append(counts.tolist())
        else:
            answers.append([len(manager.get_common_computed_block_ids([seq])) for seq in seqs])
    assert answers[0] == answers[1] and answers[0][0] > 0 == answers[0][1]


def test_bad_computed_block_batches_raise_and_change_nothing():
    fast = FastBlockSpaceManager(4, 64, 0, enable_caching=True)
    groups = [SequenceGroup.from_prompt(f"g{i}", list(range(9)), first_seq_id=i) for i in range(2)]
    for group in groups:
        fast.allocate(group)
    seqs = [group.seqs[0] for group in groups]
    rows = fast.rows_of(seqs)
    tokens = [seq.get_token_ids() for seq in seqs]
    assert fast.num_computed_blocks_rows(rows, tokens).tolist() == [0, 0]
    unchanged(fast, lambda: fast.num_computed_blocks_rows(rows), InvalidArgumentError, "token_ids")
    unchanged(fast, lambda: fast.num_computed_blocks_rows(rows[[0, 0]], tokens), InvalidArgumentError, "twice")
    unchanged(fast, lambda: fast.num_computed_blocks_rows(rows, tokens, prefill=[1, 0]), InvalidArgumentError, "bools")
    unchanged(fast, lambda: fast.num_computed_blocks_rows(np.array([77]), tokens[:1]), UnknownSequenceError, "77")
    unchanged(fast, lambda: fast.num_computed_blocks_rows(rows, [tokens[0], tokens[1][:3]]), TrackerError, "fewer")
    plain = FastBlockSpaceManager(4, 64, 0)
    plain.allocate(SequenceGroup.from_prompt("p", list(range(9)), first_seq_id=0))
    assert plain.num_computed_blocks_rows(np.array([0])).tolist() == [0]


def test_a_batch_that_runs_out_changes_nothing():
    fast = FastBlockSpaceManager(4, 6, 0)
    groups = [SequenceGroup.from_prompt(f"g{i}", [1, 2, 3, 4], first_seq_id=i) for i in range(3)]
    for group in groups:
        fast.allocate(group)
    rows = fast.rows_of([group.seqs[0] for group in groups])
    assert fast.can_append_slots_rows(rows, [9, 9, 9], 0).tolist() == [True, True, True]  # each alone fits
    assert not fast.can_append_slots_rows(rows, [9, 9, 9], 0, [3]).item()  # not all three
    unchanged(fast, lambda: fast.append_slots_rows(rows, [9, 9, 9], 0), Exception, "row")
    assert fast.append_slots_rows(rows[:1], [9], 0).shape == (0, 2)


def test_block_table_answers_follow_every_change():
    fast = FastBlockSpaceManager(2, 40, 8, enable_caching=True)
    group = SequenceGroup.from_prompt("t", [1, 2, 3], n=2, first_seq_id=0)
    fast.allocate(group)
    first, second = group.seqs
    assert fast.get_block_table(first) == fast.get_block_table(second)
    first.status = second.status = SequenceStatus.RUNNING
    first.append_token_id(4)
    before = fast.get_block_table(first)
    cow = fast.append_slots(first, 0)  # the shared last block is copied
    after = fast.get_block_table(first)
    assert cow == [(before[-1], after[-1])] and after[:-1] == before[:-1]
    assert fast.get_common_computed_block_ids([first]) == []
    fast.mark_blocks_as_computed(group, 0)
    assert fast.get_common_computed_block_ids([first, second]) == after[:1]
    fast.swap_out(group)
    assert fast.get_block_table(first) != after
    fast.free(first)
    assert fast.get_block_table(second) != after
