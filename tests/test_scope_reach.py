"""Each scope made for one mechanism reaches it: a manager broken in that
mechanism alone, as a mutant of the sample was, fails there, with the
shortest path the scope's comment describes.

The fast side's breaks are kernels swapped for a wrong twin for the length
of a test (the explorer runs in this process with one worker); the
reference's are subclasses, which the explorer builds by name."""

import functools

import numpy as np

from blockspace.conformance.explore import explore
from blockspace.conformance.scope import SCOPES
from blockspace.fast import content, kernels
from blockspace.fast import table as T
from blockspace.reference import ReferenceBlockSpaceManager


def moves(report) -> list[str]:
    return [move[0] for move in report.path]


class PromotionGivesTwo(ReferenceBlockSpaceManager):
    """An append's fit check that counts the block a promotion gives back
    twice: it lets through an append one block short, which then runs dry
    half-way, after its promotion and one copy on write, a half-done call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gpu.promote_gain = functools.partial(_twice, self.gpu)  # pickles (the explorer saves it)


def _twice(gpu, key):
    return 2 * type(gpu).promote_gain(gpu, key)


def test_the_promoted_copies_scope_meets_a_promotion_before_two_copies():
    report = explore({"reference": "reference", "broken": PromotionGivesTwo}, SCOPES["promoted_copies"], workers=1)
    assert moves(report) == ["arrive", "admit", "append", "fork", "append", "append"], report.path
    assert report.path[-1][-1] == 3, report.path
    assert "append_slots raised NoFreeBlocksError but changed broken" in report.failure, report.failure[:300]


def _rehash_over_key_zero(keys):
    """``content._rehash`` that takes a slot holding key 0 for an empty one."""
    mask = keys.slots.shape[0] - 1
    for key in range(keys.count[0]):
        h = content._hash(keys.parent[key], keys.tokens[key], 0, keys.tokens.shape[1], keys.extra[key])
        slot = h & mask
        while keys.slots[slot] >= 0 and keys.slots[slot] & content.KEY_MASK > 0:
            slot = (slot + 1) & mask
        keys.slots[slot] = content._tag(h) << content.KEY_BITS | key


def test_the_key_room_scope_rehashes_two_keys_of_one_slot(monkeypatch):
    """A running request's blocks of zeros, keyed 0 and 1 in one slot; a
    prompt of five blocks grows the key table, and then misses its cached
    first block if the rehash lost key 0."""
    monkeypatch.setattr(content, "_rehash", _rehash_over_key_zero)
    report = explore({"fast": "fast", "reference": "reference"}, SCOPES["key_room"], workers=1)
    assert moves(report) == ["arrive", "arrive", "admit", "append", "append", "admit"], report.path
    assert "disagrees" in report.failure, report.failure[:300]


def _bound_of_the_last_row(tables, rows, seq_lens, num_lookahead, block_size, window, null_block, needs):
    """``batch_needs`` whose block bound counts the new tokens of the batch's last row alone."""
    T.batch_needs(tables, rows, seq_lens, num_lookahead, block_size, window, null_block, needs)
    last = T.batch_needs(
        tables, rows[-1:], seq_lens[-1:], num_lookahead, block_size, window, null_block, np.zeros(2, np.int64)
    )
    return last + 3 * (len(rows) - 1)


def test_the_big_steps_scope_steps_past_the_quick_bound_of_one_row(monkeypatch):
    monkeypatch.setattr(kernels, "batch_needs", _bound_of_the_last_row)
    report = explore({"fast": "fast", "reference": "reference"}, SCOPES["big_steps"], workers=1)
    assert moves(report) == ["arrive", "admit", "fork", "step"], report.path
    assert not report.passed, report.failure


class OneBucketAtMost(ReferenceBlockSpaceManager):
    """A hit rate that sets its count of completed buckets to one where it
    should add one: right until a second bucket of 1,000 lookups completes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gpu.stats.query = functools.partial(_query_one_bucket, self.gpu.stats)


def _query_one_bucket(stats, hit):
    type(stats).query(stats, hit)
    stats.num_buckets = min(stats.num_buckets, 1)


def test_the_two_buckets_scope_completes_a_second_bucket_of_lookups():
    """The second admission of a prompt of 1,000 blocks completes the
    second bucket (``long_prompt`` completes one at most, so it passes there)."""
    assert explore({"reference": "reference", "broken": OneBucketAtMost}, SCOPES["long_prompt"], workers=1).passed
    report = explore({"reference": "reference", "broken": OneBucketAtMost}, SCOPES["two_buckets"], workers=1)
    assert moves(report) == ["arrive", "arrive", "admit", "force"], report.path
    assert "hit_stats" in report.failure, report.failure[:300]
