"""The rules of every method, in both modes, beside the worked examples."""

import enum

import pytest

from blockspace import AllocStatus, BlockSpaceManager, Device, SequenceStatus
from blockspace.errors import ReadOnlyTableError
from blockspace.reference import PlaceholderBlockSpaceManager
from helpers import group, grow, run, seq


def free_list(m, device="GPU"):
    return m.snapshot()["free"][device]


def in_use(m):
    return sum(1 for block in m.snapshot()["blocks"] if block[0] > 0)


# -- interface -------------------------------------------------------------------
def test_version_lookup_is_case_insensitive_and_lists_known_names():
    get = BlockSpaceManager.get_block_space_manager_class
    assert get("REFERENCE").__name__ == "ReferenceBlockSpaceManager"
    assert get("Placeholder") is PlaceholderBlockSpaceManager
    assert issubclass(get("selfattn"), BlockSpaceManager)
    with pytest.raises(ValueError, match="reference.*selfattn"):
        get("v3")


class AllocStatusLike(enum.Enum):  # what vllm.core.interfaces.AllocStatus looks like
    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()


AllocStatusLike.__name__ = "AllocStatus"


def test_alloc_status_equals_and_hashes_like_vllms_members():
    for ours, theirs in zip(AllocStatus, AllocStatusLike):
        assert ours == theirs and theirs == ours and hash(ours) == hash(theirs)
    assert AllocStatus.OK != AllocStatusLike.LATER
    assert AllocStatus.OK != 1 and AllocStatus.OK != "OK"
    assert {AllocStatusLike.LATER: "x"}[AllocStatus.LATER] == "x"


def test_manager_accepts_vllm_keywords_and_attribute_patching(make):
    m = make(block_size=16, num_gpu_blocks=100, num_cpu_blocks=10, sliding_window=None, enable_caching=True)
    assert (m.block_size, m.num_total_gpu_blocks, m.num_total_cpu_blocks) == (16, 100, 10)
    assert (m.watermark, m.watermark_blocks, m.enable_caching, m.max_block_sliding_window) == (0.01, 1, True, None)
    m.can_allocate = lambda seq_group, num_lookahead_slots=0: AllocStatus.LATER  # tests patch methods
    assert m.can_allocate(None) == AllocStatus.LATER
    s = seq(1, range(20))
    m.allocate(group("a", s))
    run(s)
    grow(s, 5)
    assert m.can_append_slots(seq_group=group("a", s), num_lookahead_slots=0) is True
    assert m.append_slots(seq=s, num_lookahead_slots=2) == []


def test_watermark_truncates_like_ieee_double(make):
    assert make(4, 100, 0, watermark=0.29).watermark_blocks == 28
    assert make(4, 99, 0, watermark=0.01).watermark_blocks == 0
    assert make(4, 1000, 0).watermark_blocks == 10


# -- admission ----------------------------------------------------------------------
def test_can_allocate_never_later_ok_with_watermark(make):
    m = make(4, 10, 0, watermark=0.2)  # 2 watermark blocks
    assert m.can_allocate(group("a", seq(1, range(32)))) == AllocStatus.OK  # 8 blocks, 2 left
    assert m.can_allocate(group("a", seq(1, range(33)))) == AllocStatus.NEVER
    assert m.can_allocate(group("a", seq(1, range(28))), num_lookahead_slots=5) == AllocStatus.NEVER
    running = seq(2, range(8))
    m.allocate(group("b", running))
    assert m.can_allocate(group("a", seq(1, range(32)))) == AllocStatus.LATER
    assert m.can_allocate(group("a", seq(1, range(24)))) == AllocStatus.OK


def test_can_allocate_measures_first_waiting_sequence_and_encoder(make):
    m = make(4, 10, 0, watermark=0)
    g = group("a", seq(1, range(8)), encoder=seq(2, range(30)))
    assert m.can_allocate(g) == AllocStatus.OK  # 2 + 8 blocks
    g2 = group("b", seq(3, range(8)), encoder=seq(4, range(33)))
    assert m.can_allocate(g2) == AllocStatus.NEVER


def test_sliding_window_caps_can_allocate_but_not_allocate(make):
    m = make(4, 8, 0, watermark=0, sliding_window=5)
    huge = group("a", seq(1, range(40)))
    assert m.can_allocate(huge) == AllocStatus.OK
    with pytest.raises(ValueError):
        m.allocate(huge)
    assert in_use(m) == 0


def test_allocate_shares_prompt_between_waiting_sequences(make):
    m = make(4, 8, 0, watermark=0)
    a, b, c = seq(1, range(9)), seq(2, range(9)), seq(3, range(9))
    c.status = SequenceStatus.FINISHED_ABORTED  # not WAITING: ignored
    m.allocate(group("g", a, b, c))
    assert m.get_block_table(a) == m.get_block_table(b) == [0, 1, 2]
    assert [blk[0] for blk in m.snapshot()["blocks"][:3]] == [2, 2, 2]
    with pytest.raises(KeyError):
        m.get_block_table(c)


def test_empty_prompt_gets_an_empty_table(make):
    m = make(4, 8, 8, watermark=0)
    s = seq(1, [])
    g = group("e", s)
    assert m.can_allocate(g, num_lookahead_slots=5) == AllocStatus.OK
    m.allocate(g)
    run(s)
    assert m.get_block_table(s) == []
    grow(s, 1, 2)
    assert m.can_append_slots(g, 3)
    assert m.swap_out(g) == []
    m.free(s)
    assert in_use(m) == 0


def test_encoder_decoder_cross_table(make):
    m = make(4, 8, 8, watermark=0)
    dec, enc = seq(1, range(5)), seq(2, range(9))
    g = group("ed", dec, encoder=enc)
    m.allocate(g)
    run(dec)
    assert m.get_block_table(dec) == [0, 1]  # decoder before encoder
    assert m.get_cross_block_table(g) == [2, 3, 4]
    m.swap_out(g)  # cross blocks stay on the GPU, uncounted
    dec.status = SequenceStatus.SWAPPED
    assert m.get_cross_block_table(g) == [2, 3, 4]
    m.free(dec)
    m.free_cross(g)
    m.free_cross(g)  # no cross table: no-op
    assert in_use(m) == 0
    empty_encoder = group("e2", seq(3, range(4)), encoder=seq(4, []))
    m.allocate(empty_encoder)
    assert m.get_cross_block_table(empty_encoder) == []


# -- decode ---------------------------------------------------------------------
def test_lookahead_crossing_blocks(make):
    m = make(4, 8, 0, watermark=0)
    s = seq(1, range(6))
    m.allocate(group("a", s))
    run(s)
    grow(s, 6)
    assert m.append_slots(s, 5) == []
    assert m.get_block_table(s) == [0, 1, 2]
    assert m.snapshot()["tables"][1]["num_tokens"] == 7


def test_block_size_one(make):
    m = make(1, 16, 0, watermark=0)
    s = seq(1, range(3))
    g = group("a", s)
    m.allocate(g)
    run(s)
    grow(s, 3, 4)
    assert not m.can_append_slots(g, 12)  # 2 tokens + 12 lookahead = 14 > 13 free
    assert m.can_append_slots(g, 11)
    m.append_slots(s, 2)
    assert m.get_block_table(s) == [0, 1, 2, 3, 4, 5, 6]


def test_chunked_prefill_appends_reserve_lookahead_only(make):
    m = make(4, 8, 0, watermark=0)
    s = seq(1, range(8))
    m.allocate(group("a", s))
    run(s)
    assert m.append_slots(s, 0) == [] and m.get_block_table(s) == [0, 1]
    assert m.append_slots(s, 3) == [] and m.get_block_table(s) == [0, 1, 2]


def test_several_copy_on_writes_in_block_order(make):
    m = make(2, 16, 0, watermark=0)
    a = seq(1, range(3))
    m.allocate(group("a", a))
    run(a)
    m.append_slots(a, 5)  # lookahead blocks, then shared by the fork
    b = seq(2, range(3))
    m.fork(a, b)
    assert m.get_block_table(a) == m.get_block_table(b) == [0, 1, 2, 3]
    grow(a, 3, 4, 5)
    assert m.append_slots(a, 0) == [(1, 4), (2, 5)]


def test_fork_from_unknown_parent_is_a_no_op(make):
    m = make(4, 8, 0)
    m.fork(seq(1, range(3)), seq(2, range(3)))
    assert m.snapshot()["tables"] == {}


def test_get_block_table_cannot_be_changed_by_the_caller(make):
    m = make(4, 8, 0)
    s = seq(1, range(5))
    m.allocate(group("a", s))
    table = m.get_block_table(s)
    with pytest.raises(ReadOnlyTableError):
        table.append(99)
    mine = list(table)
    mine.append(99)
    assert m.get_block_table(s) == [0, 1]


# -- swapping ---------------------------------------------------------------------
def test_can_swap_statuses(make):
    m = make(4, 8, 2, watermark=0)
    s = seq(1, range(12))
    g = group("a", s)
    m.allocate(g)
    run(s)
    assert m.can_swap_out(g) is False  # 3 full blocks + 0 touched > 2
    m2 = make(4, 8, 8, watermark=0.5)  # 4 watermark blocks on the GPU only
    s2 = seq(1, range(12))
    g2 = group("a", s2)
    m2.allocate(g2)
    run(s2)
    assert m2.can_swap_out(g2) is True
    m2.swap_out(g2)
    s2.status = SequenceStatus.SWAPPED
    assert m2.can_swap_in(g2, 0) == AllocStatus.OK  # 3 + touched 0 = 3, 8 - 3 >= 4
    assert m2.can_swap_in(g2, 2) == AllocStatus.OK  # 3 full + 1 touched: 8 - 4 >= 4
    assert m2.can_swap_in(g2, 5) == AllocStatus.LATER  # 3 full + 2 touched: 8 - 5 < 4
    assert m2.can_swap_in(g2, 30) == AllocStatus.NEVER


def test_swap_mappings_use_per_device_ids(make):
    m = make(4, 8, 8, watermark=0)
    s = seq(1, range(5))
    g = group("a", s)
    m.allocate(g)
    run(s)
    assert m.swap_out(g) == [(0, 0), (1, 1)]
    assert m.get_block_table(s) == [8, 9]


# -- finishing ---------------------------------------------------------------------
def test_free_is_forgiving(make):
    m = make(4, 8, 8, watermark=0, enable_caching=True)
    m.free(seq(42, range(3)))  # unknown: no-op
    s = seq(1, range(8))
    g = group("a", s)
    m.allocate(g)  # never queried by the tracker: free still works (§14.12)
    run(s)
    m.access_all_blocks_in_seq(s, 1.0)
    m.swap_out(g)
    s.status = SequenceStatus.SWAPPED
    m.free(s)  # swapped with an access time: still freed (§14.11)
    assert m.get_num_free_gpu_blocks() == 8 and m.get_num_free_cpu_blocks() == 8


def test_access_time_reaches_blocks_at_free(make):
    m = make(4, 8, 0, watermark=0, enable_caching=True)
    a, b = seq(1, range(8)), seq(2, range(100, 108))
    for s in (a, b):
        m.get_num_cached_tokens(s)
        m.allocate(group(str(s.seq_id), s))
    m.access_all_blocks_in_seq(a, 5.0)
    m.access_all_blocks_in_seq(b, 3.0)
    m.free(a)
    m.free(b)
    assert m.snapshot()["evictable"]["GPU"] == [3, 2, 1, 0]  # b older; deeper first


# -- prefix caching ------------------------------------------------------------------
def test_common_computed_ids_drop_empty_lists(make):
    m = make(4, 16, 0, watermark=0, enable_caching=True)
    a = seq(1, range(8))
    m.get_num_cached_tokens(a)
    m.allocate(group("a", a))
    m.mark_blocks_as_computed(None, 0)
    b, c = seq(2, range(8)), seq(3, range(50, 58))
    for s in (b, c):
        m.get_num_cached_tokens(s)
        m.allocate(group(str(s.seq_id), s))
    assert m.get_common_computed_block_ids([b]) == [0, 1]
    assert m.get_common_computed_block_ids([c]) == []
    assert m.get_common_computed_block_ids([b, c]) == [0, 1]  # c's empty list is dropped
    assert m.get_common_computed_block_ids([c, c]) == []  # vLLM returns ''
    assert m.get_common_computed_block_ids([]) == []


def test_cached_tokens_frozen_during_prefill(make):
    m = make(4, 16, 0, watermark=0, enable_caching=True)
    a = seq(1, range(8))
    m.get_num_cached_tokens(a)
    m.allocate(group("a", a))
    probe = seq(2, range(8))
    assert m.get_num_cached_tokens(probe) == 0  # registered, not yet computed
    m.mark_blocks_as_computed(None, 0)
    assert m.get_num_cached_tokens(probe) == 0  # frozen while in prefill
    probe.data.update_num_computed_tokens(8)
    assert m.get_num_cached_tokens(probe) == 8
    m.remove_seq_from_computed_blocks_tracker(probe)
    assert 2 not in m.snapshot()["tracker"]


def test_hit_rate_uses_vllms_bucket_arithmetic(make):
    m = make(1, 32, 0, watermark=0, enable_caching=True)
    first = seq(1, range(1))
    m.allocate(group("1", first))  # 1 miss
    for i in range(8):
        m.allocate(group(f"x{i}", seq(10 + i, [100 + i])))  # 8 misses
    m.allocate(group("hit", seq(30, range(1))))  # 10 queries, 1 hit
    assert m.get_prefix_cache_hit_rate(Device.GPU) == 0.1


def test_hit_rate_differs_from_plain_division_like_vllm(make):
    m = make(1, 32, 0, watermark=0, enable_caching=True)
    m.allocate(group("a", seq(1, [7])))
    for i in range(7):
        m.allocate(group(f"m{i}", seq(10 + i, [100 + i])))
    m.allocate(group("h", seq(20, [7])))  # 9 queries, 1 hit
    assert m.get_prefix_cache_hit_rate(Device.GPU) == 0.11111111111111109 != 1 / 9


def test_plain_mode_prefix_cache_answers(make):
    m = make(4, 8, 8)
    s = seq(1, range(8))
    m.allocate(group("a", s))
    assert m.get_prefix_cache_hit_rate(Device.GPU) == -1
    assert m.reset_prefix_cache() is True
    assert m.get_num_cached_tokens(s) == 0
    assert m.get_common_computed_block_ids([s]) == []
    m.remove_seq_from_computed_blocks_tracker(s)
    m.access_all_blocks_in_seq(seq(9, []), 1.0)  # no checks without caching


def test_reset_fails_while_blocks_are_in_use(make):
    m = make(4, 8, 8, watermark=0, enable_caching=True)
    s = seq(1, range(8))
    m.allocate(group("a", s))
    assert m.reset_prefix_cache(Device.GPU) is False
    assert m.reset_prefix_cache(Device.CPU) is True
    m.free(s)
    assert m.reset_prefix_cache() is True
    assert m.snapshot()["evictable"]["GPU"] == []


def test_promotion_merges_into_cached_block(make):
    m = make(4, 16, 0, watermark=0, enable_caching=True)
    a = seq(1, range(8))
    m.allocate(group("a", a))
    b = seq(2, range(6))
    m.allocate(group("b", b))  # [0, 2]: block 2 partial
    run(b)
    grow(b, 6, 7)
    assert m.append_slots(b, 0) == []
    assert m.get_block_table(b) == [0, 1]  # de-duplicated into a's block 1
    assert free_list(m)[0] == 2


# -- sliding window ----------------------------------------------------------------
def test_null_block_is_taken_at_the_first_append(make):
    m = make(4, 8, 0, watermark=0, sliding_window=16)
    s = seq(1, range(5))
    m.allocate(group("a", s))
    run(s)
    assert m.get_num_free_gpu_blocks() == 6
    m.append_slots(s, 0)
    assert m.get_num_free_gpu_blocks() == 5
    assert m.snapshot()["null_block"] == 2
    m.free(s)
    assert m.get_num_free_gpu_blocks() == 7


# -- placeholder ---------------------------------------------------------------------
def test_placeholder_answers_the_same_regardless_of_input():
    p = PlaceholderBlockSpaceManager(anything=1)
    with pytest.raises(TypeError):
        PlaceholderBlockSpaceManager(4)
    assert p.can_allocate(None) == AllocStatus.OK and p.can_swap_in(None, 3) == AllocStatus.OK
    assert p.can_append_slots(None, 1) is True and p.can_swap_out(None) is True
    assert p.append_slots(None, 1) == [] and p.append_slots(None, 1) is not p.append_slots(None, 1)
    assert p.swap_in(None) is None and p.swap_out(None) is None and p.get_block_table(None) is None
    assert p.get_num_free_gpu_blocks() == 1 and p.get_num_free_cpu_blocks() == 1
    assert p.get_common_computed_block_ids([]) == [] and p.get_num_cached_tokens(None) == 0
    assert p.get_prefix_cache_hit_rate("nonsense") == -1 and p.reset_prefix_cache("x") is True
    assert p.allocate(None) is None and p.free(None) is None and p.fork(None, None) is None
    assert p.mark_blocks_as_computed(None, 0) is None and p.access_all_blocks_in_seq(None, 0.0) is None
    assert p.remove_seq_from_computed_blocks_tracker(None) is None
    assert not hasattr(p, "free_cross") and not hasattr(p, "get_cross_block_table")
    assert p.get_block_space_manager_class("placeholder") is PlaceholderBlockSpaceManager


def test_placeholder_offers_snapshot_and_check_invariants():
    """Its snapshot has the common form (a manager holding nothing) and stays
    so whatever is called; its invariant fails once state is put on it."""
    from blockspace.errors import InvariantError
    from blockspace.snapshot import SNAPSHOT_KEYS

    p = PlaceholderBlockSpaceManager(block_size=16, num_gpu_blocks=8, num_cpu_blocks=4)
    empty = p.snapshot()
    assert tuple(empty) == SNAPSHOT_KEYS and empty["tables"] == {} and empty["blocks"] == []
    p.allocate(None)
    p.append_slots(None, 1)
    assert p.snapshot() == empty and p.snapshot() is not empty
    p.check_invariants()
    p.stray = 1
    with pytest.raises(InvariantError, match="stray"):
        p.check_invariants()


def test_hit_rate_averages_completed_buckets_of_a_thousand(make):
    m = make(1, 1300, 0, watermark=0, enable_caching=True)
    for t in range(750):
        m.allocate(group(f"miss{t}", seq(t, [t])))
    for i in range(250):
        m.allocate(group(f"hit{i}", seq(1000 + i, [0])))
    assert m.snapshot()["hit_stats"]["GPU"] == (1, 0.25, 0, 0)
    for t in range(500):
        m.allocate(group(f"late{t}", seq(2000 + t, [5000 + t])))
    assert m.get_prefix_cache_hit_rate(Device.GPU) == (0.25 * 1 + 0.0) / 1.5


def test_sequence_stays_in_decode_after_sampling_like_vllm():
    from blockspace import Sequence

    s = Sequence(1, range(5))
    assert s.is_prefill()
    s.data.update_num_computed_tokens(3)
    assert s.is_prefill()
    s.data.update_num_computed_tokens(2)
    s.append_token_id(9)  # sampled, not yet computed: still decoding
    assert not s.is_prefill() and not s.fork(2).is_prefill()
    s.data.reset_state_for_recompute()
    assert s.is_prefill()


def test_decoding_sequence_counts_newly_cached_blocks(make):
    m = make(2, 8, 0, watermark=0, enable_caching=True)
    s = seq(1, [1, 2, 3, 4, 5])
    assert m.get_num_cached_tokens(s) == 0
    g = group("a", s)
    m.allocate(g)
    run(s)
    m.mark_blocks_as_computed(g, 5)
    s.data.update_num_computed_tokens(5)
    s.append_token_id(6)
    assert m.get_num_cached_tokens(s) == 4  # recomputed in decode, not frozen
