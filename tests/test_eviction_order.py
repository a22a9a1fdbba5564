"""The eviction order survives the evictor's housekeeping: among equally
old idle blocks the deepest goes first (spec §6.3), also after many cache
hits have left the evictor's heap mostly stale items and it has been
compacted (the reference keeps a lazy heap and rebuilds it once stale items
outnumber the current ones by more than 64)."""

from __future__ import annotations

import pytest

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
