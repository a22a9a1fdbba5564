"""The worked examples of spec §13, step by step."""

from blockspace import AllocStatus, Device, SequenceStatus
from helpers import decode_step, group, grow, run, seq


def free_list(m, device="GPU"):
    return m.snapshot()["free"][device]


def caching_state(m):
    snap = m.snapshot()
    return snap["free"]["GPU"], sorted(snap["evictable"]["GPU"])


def test_example_1_plain_lifo(make):
    m = make(4, 8, 4, watermark=0)
    s1, s2, s3 = seq(1, range(10)), seq(2, range(100, 104)), seq(3, range(200, 209))
    m.allocate(group("a", s1))
    assert m.get_block_table(s1) == [0, 1, 2]
    m.allocate(group("b", s2))
    assert m.get_block_table(s2) == [3]
    assert free_list(m) == [4, 5, 6, 7] and m.get_num_free_gpu_blocks() == 4
    m.free(s1)
    assert free_list(m) == [2, 1, 0, 4, 5, 6, 7]
    m.allocate(group("c", s3))
    assert m.get_block_table(s3) == [2, 1, 0]
    grow(s3, 1, 2, 3)
    assert m.append_slots(s3, 0) == [] and m.get_block_table(s3) == [2, 1, 0]
    grow(s3, 4)
    assert m.append_slots(s3, 0) == [] and m.get_block_table(s3) == [2, 1, 0, 4]
    assert free_list(m) == [5, 6, 7]
    assert m.append_slots(s3, 6) == [] and m.get_block_table(s3) == [2, 1, 0, 4, 5]


def test_example_2_plain_copy_on_write(make):
    m = make(4, 8, 0, watermark=0)
    a, b = seq(1, range(6)), seq(2, range(6))
    g = group("g", a, b)
    m.allocate(g)
    run(a, b)
    assert m.get_block_table(a) == m.get_block_table(b) == [0, 1]
    assert m.snapshot()["blocks"][0][0] == 2
    assert m.can_append_slots(g, 0)
    grow(a, 6, 7, 8)
    assert m.can_append_slots(g, 0)
    assert not m.can_append_slots(g, 10)
    assert m.append_slots(a, 0) == [(1, 3)]
    assert m.get_block_table(a) == [0, 3, 2] and m.get_block_table(b) == [0, 1]
    assert free_list(m) == [4, 5, 6, 7]


def test_example_3_caching(make):
    m = make(4, 6, 0, watermark=0, enable_caching=True)
    P = list(range(1, 11))
    s1 = seq(1, P)
    m.get_num_cached_tokens(s1)
    m.allocate(group("1", s1))
    assert m.get_block_table(s1) == [0, 1, 2]
    assert caching_state(m) == ([3, 4, 5], [])
    assert m.snapshot()["touched"] == [0, 1]
    assert m.get_num_cached_tokens(s1) == 0
    m.mark_blocks_as_computed(None, 0)
    s2 = seq(2, P[:8] + [50, 51])
    assert m.get_num_cached_tokens(s2) == 8
    m.allocate(group("2", s2))
    assert m.get_block_table(s2) == [0, 1, 3]
    assert m.get_prefix_cache_hit_rate(Device.GPU) == 0.5
    assert m.get_common_computed_block_ids([s2]) == [0, 1]
    m.access_all_blocks_in_seq(s1, 10.0)
    m.access_all_blocks_in_seq(s2, 20.0)
    m.free(s1)
    assert caching_state(m) == ([2, 4, 5], []) and m.get_num_free_gpu_blocks() == 3
    m.free(s2)
    assert caching_state(m) == ([3, 2, 4, 5], [0, 1]) and m.get_num_free_gpu_blocks() == 6
    assert m.snapshot()["evictable"]["GPU"] == [1, 0]  # equal times: deeper first
    s3 = seq(3, range(100, 117))
    m.allocate(group("3", s3))
    assert m.get_block_table(s3) == [3, 2, 4, 5, 1]
    assert caching_state(m) == ([], [0])
    s4 = seq(4, P[:4])
    assert m.get_num_cached_tokens(s4) == 4
    m.allocate(group("4", s4))
    assert m.get_block_table(s4) == [0]
    assert m.get_prefix_cache_hit_rate(Device.GPU) == 0.3333333333333333


def test_example_4_stale_copy_on_write_pair(make):
    m = make(4, 16, 0, watermark=0, enable_caching=True)
    x, y = seq(1, range(7)), seq(2, range(8))
    m.allocate(group("x", x))
    m.allocate(group("y", y))
    assert m.get_block_table(x) == [0, 1] and m.get_block_table(y) == [0, 2]
    x2 = seq(3, range(7))
    m.fork(x, x2)
    grow(x, 7)
    assert m.append_slots(x, 0) == [(1, 3)]
    assert m.get_block_table(x) == [0, 2]
    assert free_list(m)[:2] == [3, 4]
    grow(x2, 7)
    assert m.append_slots(x2, 0) == []
    assert m.get_block_table(x2) == [0, 2]
    assert free_list(m)[:3] == [1, 3, 4]
    assert m.snapshot()["blocks"][2][0] == 3


def _swap_group(m):
    a, b = seq(1, range(6)), seq(2, range(6))
    g = group("g", a, b)
    m.allocate(g)
    run(a, b)
    return g, a, b


def test_example_5_plain_swaps_unshare(make):
    m = make(4, 8, 8, watermark=0)
    g, a, b = _swap_group(m)
    assert m.can_swap_out(g)
    assert m.swap_out(g) == [(0, 0), (1, 1), (0, 2), (1, 3)]
    for s in (a, b):
        s.status = SequenceStatus.SWAPPED
    assert m.get_block_table(a) == [8, 9] and m.get_block_table(b) == [10, 11]
    assert free_list(m)[:3] == [1, 0, 2] and free_list(m, "CPU")[0] == 12
    assert m.can_swap_in(g, 0) == AllocStatus.OK
    assert m.swap_in(g) == [(0, 1), (1, 0), (2, 2), (3, 3)]
    assert m.get_block_table(a) == [1, 0] and m.get_block_table(b) == [2, 3]
    assert free_list(m, "CPU")[:5] == [11, 10, 9, 8, 12]


def test_example_5_caching_swaps_reshare_by_content(make):
    m = make(4, 8, 8, watermark=0, enable_caching=True)
    a, b = seq(1, range(6)), seq(2, range(6))
    m.get_num_cached_tokens(a)
    m.get_num_cached_tokens(b)
    g = group("g", a, b)
    m.allocate(g)
    run(a, b)
    assert m.swap_out(g) == [(0, 0), (1, 1), (0, 0), (1, 2)]
    for s in (a, b):
        s.status = SequenceStatus.SWAPPED
    assert m.get_block_table(a) == [8, 9] and m.get_block_table(b) == [8, 10]
    assert caching_state(m)[1] == [0] and free_list(m)[:2] == [1, 2]
    assert m.swap_in(g) == [(0, 0), (1, 1), (0, 0), (2, 2)]
    assert m.get_block_table(a) == [0, 1] and m.get_block_table(b) == [0, 2]
    assert m.get_prefix_cache_hit_rate(Device.GPU) == 2 / 3
    assert m.get_prefix_cache_hit_rate(Device.CPU) == 0.5


def test_example_6_sliding_window(make):
    m = make(4, 8, 0, watermark=0, sliding_window=5)
    assert m.max_block_sliding_window == 3
    s = seq(1, range(10))
    m.allocate(group("s", s))
    run(s)
    assert m.get_block_table(s) == [0, 1, 2] and free_list(m) == [3, 4, 5, 6, 7]
    expected = {
        11: ([0, 1, 2], [4, 5, 6, 7]),
        13: ([0, 1, 2, 4], [5, 6, 7]),
        17: ([3, 1, 2, 4, 0], [5, 6, 7]),
        21: ([3, 3, 2, 4, 0, 1], [5, 6, 7]),
    }
    for length in range(11, 22):
        decode_step(s, 1000 + length)
        assert m.append_slots(s, 0) == []
        if length in expected:
            assert (m.get_block_table(s), free_list(m)) == expected[length]
        m.check_invariants()
    assert m.can_allocate(group("big", seq(9, range(30)))) == AllocStatus.OK
    m.free(s)
    assert free_list(m) == [1, 0, 4, 2, 5, 6, 7]


def test_example_7_reset_order(make):
    m = make(4, 8, 8, watermark=0, enable_caching=True)
    a, b = seq(1, range(8)), seq(2, range(50, 58))
    for s in (a, b):
        m.get_num_cached_tokens(s)
        m.allocate(group(str(s.seq_id), s))
        run(s)
    assert m.get_block_table(a) == [0, 1] and m.get_block_table(b) == [2, 3]
    m.free(b)
    assert caching_state(m) == ([4, 5, 6, 7], [2, 3])
    m.swap_out(group("a", a))
    a.status = SequenceStatus.SWAPPED
    assert caching_state(m) == ([4, 5, 6, 7], [0, 1, 2, 3])
    # vLLM stops at the failing CPU reset; blockspace still resets the GPU (§14.13)
    assert m.reset_prefix_cache() is False
    assert free_list(m) == [2, 0, 3, 1, 4, 5, 6, 7]
    assert m.reset_prefix_cache(Device.GPU) is True


def test_example_7_reset_gpu_only(make):
    m = make(4, 8, 8, watermark=0, enable_caching=True)
    a, b = seq(1, range(8)), seq(2, range(50, 58))
    for s in (a, b):
        m.get_num_cached_tokens(s)
        m.allocate(group(str(s.seq_id), s))
        run(s)
    m.free(b)
    m.swap_out(group("a", a))
    assert m.reset_prefix_cache(Device.GPU) is True
    assert free_list(m) == [2, 0, 3, 1, 4, 5, 6, 7]


def test_example_8_non_monotone_cached_prefix(make):
    m = make(4, 5, 0, watermark=0, enable_caching=True)
    P = list(range(1, 13))
    s1, s2 = seq(1, P[:4]), seq(2, P)
    for s in (s1, s2):
        m.get_num_cached_tokens(s)
        m.allocate(group(str(s.seq_id), s))
    assert m.get_block_table(s1) == [0] and m.get_block_table(s2) == [0, 1, 2]
    m.access_all_blocks_in_seq(s1, 1.0)
    m.access_all_blocks_in_seq(s2, 2.0)
    m.free(s2)
    m.free(s1)
    assert m.snapshot()["evictable"]["GPU"] == [0, 2, 1]
    s_new = seq(5, range(500, 508))
    m.allocate(group("5", s_new))
    assert m.get_block_table(s_new) == [3, 4]
    s3 = seq(3, P[:4] + [77])
    m.allocate(group("3", s3))
    assert m.get_block_table(s3) == [0, 2]
    probe = seq(4, P + [1])
    assert m.get_num_cached_tokens(probe) == 8
