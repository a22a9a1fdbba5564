"""The eviction order survives the evictor's housekeeping: among equally
old idle blocks the deepest goes first (spec §6.3), also after many cache
hits have left the evictor's heap mostly stale items and it has been
compacted (the reference keeps a lazy heap and rebuilds it once stale items
outnumber the current ones by more than 64)."""

from __future__ import annotations

import pytest

from blockspace import AllocStatus
from blockspace.fast import FastBlockSpaceManager
from blockspace.reference import ReferenceBlockSpaceManager
from tests.helpers import decode_step, group, run, seq

LONG = 68  # one-token blocks: enough hits on idle blocks for the reference to compact its heap


@pytest.mark.parametrize("manager_class", [ReferenceBlockSpaceManager, FastBlockSpaceManager])
def test_the_deepest_of_equally_old_idle_blocks_goes_first_after_many_hits(manager_class) -> None:
    manager = manager_class(block_size=1, num_gpu_blocks=LONG, num_cpu_blocks=0, enable_caching=True)
    first = seq(1, [7] * LONG)
    manager.allocate(group("first", first))
    chain = list(manager.get_block_table(first))  # chain[d - 1]: the block of depth d
    manager.free(first)
    # A prompt one block shorter revives all but the deepest block, then leaves them idle again: no
    # access time is ever stamped, so every idle block is equally old and only depth orders them.
    second = seq(2, [7] * (LONG - 1))
    manager.allocate(group("second", second))
    manager.free(second)
    # A one-token prompt hits the first block; its next token needs a fresh block, and the pool has
    # none free: the victim must be the deepest idle block, not the deepest of the second prompt's.
    third = seq(3, [7])
    manager.allocate(group("third", third))
    run(third)
    decode_step(third, 7)
    manager.append_slots(third, 0)
    cached = {block_id: entry[1] for block_id, entry in enumerate(manager.snapshot()["blocks"])}
    assert not cached[chain[LONG - 1]], "the deepest idle block was not the one evicted"
    assert cached[chain[LONG - 2]], "a shallower idle block was evicted before the deepest"
    assert manager.get_block_table(third) == chain[:2]  # the second token's block is found cached
    manager.check_invariants()


TIMES = {1: 1.0, 2: 1.0, 3: 0.5, 4: 1.0}  # each prompt's last access; 3 is the oldest
REVIVED = {(1, 0), (1, 1), (2, 0)}  # (prompt, block index) hit later, idle again at time 2.0


def _blocks_handed_out(manager_class) -> tuple[list[int], dict[int, list[int]]]:
    """Tables go idle at two times, in an order that splits them into
    several of fast's runs; cache hits revive blocks from a run's middle
    and from its end; then fresh prompts take every block the pool has.
    Returns the blocks handed out, in order, and each prompt's table."""
    manager = manager_class(block_size=2, num_gpu_blocks=16, num_cpu_blocks=0, enable_caching=True)
    prompts = {seq_id: seq(seq_id, [100 * seq_id + t for t in range(length)]) for seq_id, length in
               ((1, 10), (2, 6), (3, 8), (4, 4))}  # fmt: skip
    tables = {}
    for seq_id, prompt in prompts.items():
        manager.allocate(group(f"p{seq_id}", prompt))
        manager.access_all_blocks_in_seq(prompt, TIMES[seq_id])
        tables[seq_id] = list(manager.get_block_table(prompt))
    for seq_id in (2, 4, 1, 3):  # 4's shallowest block ends 2's run; its deeper one starts a run of its own
        manager.free(prompts[seq_id])
        manager.check_invariants()
    for seq_id, tokens in ((5, [100, 101, 102, 103, 999]), (6, [200, 201, 998])):  # 1's end, 2's middle
        hit = seq(seq_id, tokens)
        manager.allocate(group(f"hit{seq_id}", hit))
        manager.access_all_blocks_in_seq(hit, 2.0)
        manager.free(hit)
        manager.check_invariants()
    handed_out = []
    for index in range(8):
        fresh = group(f"f{index}", seq(10 + index, [10_000 * (index + 1) + t for t in range(4)]))
        assert manager.can_allocate(fresh) == AllocStatus.OK
        manager.allocate(fresh)
        manager.check_invariants()
        handed_out += manager.get_block_table(fresh.seqs[0])
    return handed_out, tables


@pytest.mark.parametrize("manager_class", [ReferenceBlockSpaceManager, FastBlockSpaceManager])
def test_idle_blocks_are_evicted_oldest_then_deepest_then_lowest_id_whatever_the_runs(manager_class) -> None:
    """fast keeps idle blocks in runs merged by a heap (fast/pool.py): the
    blocks it hands out must follow (time, -depth, id) one by one, across
    equally old tables interleaved by depth, after hits in a run's middle."""
    handed_out, tables = _blocks_handed_out(manager_class)
    idle = sorted(
        (2.0 if (seq_id, index) in REVIVED else TIMES[seq_id], -2 * (index + 1), block_id)
        for seq_id, table in tables.items()
        for index, block_id in enumerate(table)
    )
    assert len(handed_out) == 16 == len(set(handed_out))
    assert handed_out[2:] == [block_id for _, _, block_id in idle]  # the hits' partial blocks were free: first
