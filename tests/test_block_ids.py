"""Block table answers (``blockspace/block_ids.py``): a read-only list per
table version, the same type from both managers, kept until the table
changes, and a plain list to every caller that copies, slices or
serialises it."""

from __future__ import annotations

import copy
import pickle

import msgspec
import pytest

from blockspace import SequenceGroup, SequenceStatus
from blockspace.block_ids import BlockIds
from blockspace.errors import ReadOnlyTableError
from blockspace.fast import FastBlockSpaceManager
from helpers import decode_step

MUTATIONS = {
    "append": lambda ids: ids.append(99),
    "extend": lambda ids: ids.extend([99]),
    "insert": lambda ids: ids.insert(0, 99),
    "pop": lambda ids: ids.pop(),
    "remove": lambda ids: ids.remove(ids[0]),
    "clear": lambda ids: ids.clear(),
    "sort": lambda ids: ids.sort(),
    "reverse": lambda ids: ids.reverse(),
    "setitem": lambda ids: ids.__setitem__(0, 99),
    "setslice": lambda ids: ids.__setitem__(slice(0, 1), [99]),
    "delitem": lambda ids: ids.__delitem__(0),
    "iadd": lambda ids: ids.__iadd__([99]),
    "imul": lambda ids: ids.__imul__(2),
}


def test_a_block_ids_is_a_list_to_every_reader():
    ids = BlockIds([3, 1, 2])
    assert isinstance(ids, list) and ids == [3, 1, 2] and [3, 1, 2] == ids and repr(ids) == "[3, 1, 2]"
    assert (len(ids), ids[0], ids[-1], list(reversed(ids)), 1 in ids) == (3, 3, 2, [2, 1, 3], True)
    for made in (ids[:2], ids[::-1], ids + [4], ids * 2, list(ids), copy.copy(ids), copy.deepcopy(ids)):
        assert type(made) is list
    made = ids[:]
    made.append(4)  # a copy is an ordinary, writable list
    assert made == [3, 1, 2, 4] and ids == [3, 1, 2]


def test_a_block_ids_serialises_as_a_plain_list():
    ids = BlockIds([7, 8])
    restored = pickle.loads(pickle.dumps({"tables": {0: ids}}))["tables"][0]
    assert type(restored) is list and restored == [7, 8]

    class Metadata(msgspec.Struct, array_like=True):  # the shape of vLLM's SequenceGroupMetadata field
        block_tables: dict[int, list[int]]

    encoded = msgspec.msgpack.encode(Metadata({5: ids}))
    assert msgspec.msgpack.decode(encoded, type=Metadata).block_tables == {5: [7, 8]}
    assert msgspec.json.encode(ids) == b"[7,8]"


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_every_in_place_change_is_refused(mutation):
    ids = BlockIds([3, 1, 2])
    with pytest.raises(ReadOnlyTableError, match="read-only") as caught:
        MUTATIONS[mutation](ids)
    assert isinstance(caught.value, TypeError) and ids == [3, 1, 2]


def running_pair(make, **config):
    manager = make(2, 40, 8, **config)
    group = SequenceGroup.from_prompt("t", [1, 2, 3], n=2, first_seq_id=0)
    manager.get_num_cached_tokens(group.seqs[0])
    manager.allocate(group)
    for seq in group.seqs:
        seq.status = SequenceStatus.RUNNING
    return manager, group


@pytest.mark.parametrize("caching", [False, True])
def test_table_answers_are_read_only_snapshots(make, caching):
    manager, group = running_pair(make, enable_caching=caching)
    first, second = group.seqs
    table = manager.get_block_table(first)
    assert type(table) is BlockIds and table == manager.get_block_table(second)
    for mutation in MUTATIONS.values():
        with pytest.raises(ReadOnlyTableError):
            mutation(table)
    manager.check_invariants()  # nothing reached the manager
    assert manager.get_block_table(first) == table == [0, 1]

    first.append_token_id(4)
    cow = manager.append_slots(first, 0)  # the shared last block is copied
    after = manager.get_block_table(first)
    assert cow == [(table[-1], after[-1])] and after[:-1] == table[:-1]
    assert table == [0, 1], "a kept answer is the table as it was when asked"
    manager.swap_out(group)
    assert manager.get_block_table(first) != after and after == [0, 2]


def test_the_fast_manager_hands_out_one_object_per_table_version():
    """The reference builds its answer at every call; fast keeps it (same type and values)."""
    manager, group = running_pair(lambda *a, **k: FastBlockSpaceManager(*a, **k), enable_caching=True)
    first, second = group.seqs
    table, other = manager.get_block_table(first), manager.get_block_table(second)
    assert manager.get_block_table(first) is table  # unchanged: the same object
    decode_step(first, 4)
    manager.append_slots(first, 0)  # a copy on write: a new version
    assert manager.get_block_table(first) is not table and manager.get_block_table(second) is other
    decode_step(first, 5)
    manager.append_slots(first, 0)  # a new block: a new version
    grown = manager.get_block_table(first)
    assert grown is not table and len(grown) == 3
    decode_step(second, 6)
    manager.append_slots(second, 0)  # fills the table's own last block (keyed in place): unchanged
    assert manager.get_block_table(second) is other
    manager.mark_blocks_as_computed(group, 0)
    prefix = manager.get_common_computed_block_ids([first])
    assert type(prefix) is BlockIds and prefix == grown[:2] and manager.get_common_computed_block_ids([first]) is prefix
    assert manager.get_common_computed_block_ids([first, second]) == grown[:1]
    manager.check_invariants()


@pytest.mark.parametrize("caching", [False, True])
def test_common_computed_and_cross_answers_are_block_ids(make, caching):
    manager, group = running_pair(make, enable_caching=caching)
    for seqs in ([], group.seqs[:1], group.seqs):
        answer = manager.get_common_computed_block_ids(seqs)
        assert type(answer) is BlockIds
        with pytest.raises(ReadOnlyTableError):
            answer.append(1)
