"""The kit's content ledger (conformance/invariants.py): an idle cached
block that comes back with other content is a finding only when the call
could not have used up the uncached free blocks first."""

from __future__ import annotations

from blockspace.conformance.invariants import ContentLedger


class World:
    """What the ledger reads of the kit's model: block size 1; every owner's
    first token is 0 (block 0 is shared content), the others its own id."""

    block_size = 1
    dropped: dict = {}

    def __init__(self, owners) -> None:
        self.seqs = self.written = set(owners)

    def content(self, owner, index):
        return ((0,) + (owner,) * index,)

    def device_of(self, block_id):
        return "GPU"


def snap(tables: dict, free: list, evictable: list) -> dict:
    return {
        "tables": {owner: {"blocks": blocks} for owner, blocks in tables.items()},
        "cross_tables": {},
        "free": {"GPU": free, "CPU": []},
        "evictable": {"GPU": evictable, "CPU": []},
    }


def ledger_with_idle_block_1() -> ContentLedger:
    ledger, world = ContentLedger(), World([9])
    assert ledger.observe(snap({9: [0, 1]}, [5, 6], []), world) == []  # 9 holds block 1, full
    assert ledger.observe(snap({}, [5, 6], [0, 1]), world) == []  # 9 is freed: block 1 idle, cached
    return ledger


def test_reusing_an_idle_block_while_free_blocks_suffice_is_a_finding():
    ledger = ledger_with_idle_block_1()
    found = ledger.observe(snap({5: [0, 1]}, [5, 6], [0]), World([5]))  # one entry written, two blocks free
    assert found == [
        "idle cached block 1 came back with other content although uncached free blocks [5, 6] were never used"
    ]


def test_an_append_that_takes_more_blocks_than_are_free_may_evict():
    """vLLM takes a block for every new slot before it fills any; filled
    blocks whose content is cached are merged and freed again, so the free
    blocks are back after the call and the last slot got the evicted one."""
    ledger = ledger_with_idle_block_1()
    assert ledger.observe(snap({5: [0, 2, 3, 1], 7: [0, 2, 3]}, [5, 6], [0]), World([5, 7])) == []
