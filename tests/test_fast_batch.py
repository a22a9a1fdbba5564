"""The fast manager's batched step API gives exactly what the per-sequence
calls give (on the reference), in order."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from blockspace import Sequence, SequenceGroup, SequenceStatus
from blockspace.errors import InvalidArgumentError, NoFreeBlocksError, UnknownSequenceError
from blockspace.fast import FastBlockSpaceManager
from blockspace.fast.row_api import BLOCK_TABLE_PAD
from blockspace.reference import ReferenceBlockSpaceManager

RUNNING = SequenceStatus.RUNNING


def _pair(*args, **kwargs):
    return ReferenceBlockSpaceManager(*args, **kwargs), FastBlockSpaceManager(*args, **kwargs)


def _admit(managers, rng, num_groups, block_size, caching):
    groups = []
    for i in range(num_groups):
        prompt = [7] * rng.randint(0, 3 * block_size) + [
            rng.randrange(3) for _ in range(rng.randint(1, 2 * block_size))
        ]
        group = SequenceGroup.from_prompt(f"g{i}", prompt, n=rng.choice([1, 1, 2]), first_seq_id=10 * i)
        for m in managers:
            if caching:
                m.get_num_cached_tokens(group.seqs[0])
            m.allocate(group)
        for seq in group.seqs:
            seq.status = RUNNING
        groups.append(group)
    return groups


CONFIGS = [
    dict(block_size=4, enable_caching=False),
    dict(block_size=4, enable_caching=True),
    dict(block_size=1, enable_caching=True),
    dict(block_size=16, enable_caching=False),
    dict(block_size=2, sliding_window=6),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("seed", range(6))
def test_batched_step_equals_per_sequence_calls(config, seed):
    rng = random.Random(seed)
    config = dict(config)
    block_size = config.pop("block_size")
    reference, fast = _pair(block_size, 400, 0, watermark=0.0, **config)
    caching = config.get("enable_caching", False)
    groups = _admit((reference, fast), rng, 12, block_size, caching)
    next_id = 1000
    num_steps = 0
    for _ in range(25):
        num_steps += 1
        lookahead = rng.choice([0, 0, 3])
        assert fast.can_append_slots_batch(groups, lookahead) == [
            reference.can_append_slots(g, lookahead) for g in groups
        ]
        seqs = [s for g in groups for s in g.get_seqs(status=RUNNING)]
        rng.shuffle(seqs)
        trial = copy.deepcopy(reference)  # do the per-sequence calls all fit?
        try:
            for s in seqs:
                trial.append_slots(s, lookahead)
        except NoFreeBlocksError:
            before = fast.snapshot()
            with pytest.raises(NoFreeBlocksError):
                fast.append_slots_batch(seqs, lookahead)
            assert fast.snapshot() == before
            break
        expected = [pair for s in seqs for pair in reference.append_slots(s, lookahead)]
        assert fast.append_slots_batch(seqs, lookahead) == expected
        assert fast.snapshot() == reference.snapshot()
        fast.check_invariants()

        tables = fast.block_tables(seqs)
        width = max(len(reference.get_block_table(s)) for s in seqs)
        assert tables.dtype == torch.int32 and tables.shape == (len(seqs), width)
        for s, row in zip(seqs, tables.tolist()):
            ids = reference.get_block_table(s)
            assert row == ids + [BLOCK_TABLE_PAD] * (width - len(ids))
        slots = fast.slot_mapping(seqs, 1).tolist()
        assert slots == [
            reference.get_block_table(s)[(s.get_len() - 1) // block_size] * block_size + (s.get_len() - 1) % block_size
            for s in seqs
        ]

        # the model step: computed tokens, one or a few new tokens, sometimes a fork or a finish
        for group in groups:
            for seq in group.get_seqs(status=RUNNING):
                seq.data.update_num_computed_tokens(seq.get_len() - seq.data.get_num_computed_tokens())
                for _ in range(rng.choice([1, 1, 1, 2, block_size + 1])):
                    seq.append_token_id(rng.randrange(3))
                if rng.random() < 0.08 and not config.get("sliding_window"):
                    child = seq.fork(next_id)
                    next_id += 1
                    group.add(child)
                    reference.fork(seq, child)
                    fast.fork(seq, child)
                elif rng.random() < 0.05:
                    reference.free(seq)
                    fast.free(seq)
                    seq.status = SequenceStatus.FINISHED_STOPPED
    assert num_steps > 3


def test_batch_that_runs_out_of_blocks_changes_nothing():
    reference, fast = _pair(4, 8, 0, watermark=0.0)
    groups = [SequenceGroup.from_prompt(f"g{i}", [1, 2, 3, 4], first_seq_id=i) for i in range(3)]
    for g in groups:
        reference.allocate(g)
        fast.allocate(g)
        g.seqs[0].status = RUNNING
    seqs = [g.seqs[0] for g in groups]
    for s in seqs:
        for t in range(5, 13):  # two more blocks each: 6 needed, 5 free
            s.append_token_id(t)
    before = fast.snapshot()
    with pytest.raises(NoFreeBlocksError):
        fast.append_slots_batch(seqs, 0)
    assert fast.snapshot() == before
    fast.check_invariants()
    reference.append_slots(seqs[0], 0)
    reference.append_slots(seqs[1], 0)
    with pytest.raises(NoFreeBlocksError):  # the per-sequence calls fail half way through
        reference.append_slots(seqs[2], 0)
    assert fast.append_slots_batch(seqs[:2], 0) == []
    assert fast.snapshot() == reference.snapshot()


def test_batch_arguments_are_checked_first():
    fast = FastBlockSpaceManager(4, 16, 0, watermark=0.0)
    group = SequenceGroup.from_prompt("g", [1, 2, 3], first_seq_id=1)
    fast.allocate(group)
    seq = group.seqs[0]
    seq.status = RUNNING
    seq.append_token_id(4)
    before = fast.snapshot()
    with pytest.raises(InvalidArgumentError):
        fast.append_slots_batch([seq, seq], 0)
    with pytest.raises(InvalidArgumentError):
        fast.append_slots_batch([seq], -1)
    with pytest.raises(UnknownSequenceError):
        fast.append_slots_batch([seq, Sequence(99, [1])], 0)
    with pytest.raises(UnknownSequenceError):
        fast.block_tables([Sequence(99, [1])])
    with pytest.raises(InvalidArgumentError):
        fast.slot_mapping([seq], 5)
    assert fast.snapshot() == before
    assert fast.block_tables([], pad=-1).shape == (0, 0)
    assert fast.block_tables([seq], pad=-1).tolist() == [fast.get_block_table(seq)]
    assert fast.slot_mapping([seq], 3).tolist() == [0, 1, 2]
    assert fast.slot_mapping_array([seq], [2]).tolist() == [1, 2]
    with pytest.raises(InvalidArgumentError):
        fast.slot_mapping_array([seq], [-1])
