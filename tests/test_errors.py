"""The error matrix: every kind of bad input raises a precise error, whose
type is also the built-in type vLLM raises, and leaves the manager exactly as
it was (snapshot equal before and after)."""

import enum

import pytest

from blockspace import Device, SequenceStatus
from blockspace import errors as E
from helpers import decode_step, group, grow, run, seq

CASES = {}


def case(error, match=""):
    def register(build):
        CASES[build.__name__] = (build, error, match)
        return build

    return register


def plain(make, gpu=8, cpu=8, **kw):
    return make(4, gpu, cpu, watermark=0, **kw)


def caching(make, gpu=8, cpu=8):
    return make(4, gpu, cpu, watermark=0, enable_caching=True)


def running(m, seq_id, n_tokens, request=None):
    s = seq(seq_id, range(seq_id * 1000, seq_id * 1000 + n_tokens))
    m.allocate(group(request or f"r{seq_id}", s))
    run(s)
    return s


@case(E.DuplicateTableError, "already exists")
def allocate_twice(make):
    m = plain(make)
    s = seq(1, range(5))
    m.allocate(group("a", s))
    return m, lambda: m.allocate(group("a", s))


@case(E.NoWaitingSequenceError, "no WAITING")
def allocate_without_waiting(make):
    m = plain(make)
    s = running(m, 1, 5)
    return m, lambda: m.allocate(group("r1", s))


@case(E.NoWaitingSequenceError, "no WAITING")
def can_allocate_without_waiting(make):
    m = plain(make)
    s = running(m, 1, 5)
    return m, lambda: m.can_allocate(group("a", s))


@case(E.DuplicateTableError, "already exists")
def allocate_duplicate_seq_ids(make):
    m = plain(make)
    return m, lambda: m.allocate(group("a", seq(1, range(5)), seq(1, range(5))))


@case(E.EmptyTableError, "empty prompt")
def allocate_empty_prompt_for_several(make):
    m = plain(make)
    return m, lambda: m.allocate(group("a", seq(1, []), seq(2, [])))


@case(E.NoFreeBlocksError, "GPU blocks")
def allocate_out_of_blocks(make):
    m = plain(make, gpu=4)
    running(m, 1, 9)
    return m, lambda: m.allocate(group("b", seq(2, range(9))))


@case(E.NoFreeBlocksError, "GPU blocks")
def allocate_out_of_blocks_after_cache_hits(make):
    m = caching(make, gpu=5)
    s = running(m, 1, 8)
    m.get_num_cached_tokens(s)
    big = seq(2, list(range(1000, 1008)) + list(range(50, 70)))  # 2 hits, then 5 new blocks
    return m, lambda: m.allocate(group("b", big))


@case(E.NoFreeBlocksError, "GPU blocks")
def allocate_encoder_decoder_out_of_blocks(make):
    m = plain(make, gpu=4)
    return m, lambda: m.allocate(group("a", seq(1, range(8)), encoder=seq(2, range(12))))


@case(E.UnsupportedError, "Prefix caching for encoder/decoder")
def allocate_encoder_decoder_with_caching(make):
    m = caching(make)
    return m, lambda: m.allocate(group("a", seq(1, range(8)), encoder=seq(2, range(4))))


@case(E.UnsupportedError, "Sliding window attention for encoder/decoder")
def can_allocate_encoder_decoder_with_window(make):
    m = plain(make, sliding_window=8)
    return m, lambda: m.can_allocate(group("a", seq(1, range(8)), encoder=seq(2, range(4))))


@case(E.DuplicateTableError, "cross block table")
def allocate_cross_table_twice(make):
    m = plain(make)
    g = group("a", seq(1, range(8)), encoder=seq(2, range(4)))
    m.allocate(g)
    m.free(g.seqs[0])
    g.seqs[0].status = SequenceStatus.WAITING
    return m, lambda: m.allocate(g)


@case(E.InvalidArgumentError, "token id")
def allocate_negative_token(make):
    m = plain(make)
    return m, lambda: m.allocate(group("a", seq(1, [1, 2, -3])))


@case(E.InvalidArgumentError, "token id")
def allocate_non_integer_token(make):
    m = plain(make)
    return m, lambda: m.allocate(group("a", seq(1, [1, 2.5, 3])))


@case(E.InvalidArgumentError, "num_lookahead_slots")
def can_allocate_negative_lookahead(make):
    m = plain(make)
    return m, lambda: m.can_allocate(group("a", seq(1, range(3))), -1)


@case(E.UnknownSequenceError, "no block table")
def append_unknown_sequence(make):
    m = plain(make)
    return m, lambda: m.append_slots(seq(9, range(3)), 0)


@case(E.InvalidArgumentError, "num_lookahead_slots")
def append_negative_lookahead(make):
    m = plain(make)
    s = running(m, 1, 5)
    return m, lambda: m.append_slots(s, -1)


@case(E.InvalidArgumentError, "num_lookahead_slots")
def append_fractional_lookahead(make):
    m = plain(make)
    s = running(m, 1, 5)
    return m, lambda: m.append_slots(s, 1.5)


@case(E.EmptyTableError, "no blocks")
def append_to_empty_table(make):
    m = plain(make)
    s = seq(1, [])
    m.allocate(group("a", s))
    grow(s, 5)
    return m, lambda: m.append_slots(s, 0)


@case(E.WrongDeviceError, "swapped out")
def append_to_swapped_sequence(make):
    m = plain(make)
    s = running(m, 1, 5)
    m.swap_out(group("r1", s))
    s.status = SequenceStatus.SWAPPED
    grow(s, 7)
    return m, lambda: m.append_slots(s, 0)


@case(E.InvalidArgumentError, "token id")
def append_token_out_of_range(make):
    m = plain(make)
    s = running(m, 1, 5)
    grow(s, 2**40)
    return m, lambda: m.append_slots(s, 0)


@case(E.InvalidArgumentError, "token id")
def append_string_token(make):
    m = plain(make)
    s = running(m, 1, 5)
    grow(s, "7")
    return m, lambda: m.append_slots(s, 0)


@case(E.InvalidArgumentError, "fewer tokens")
def append_after_tokens_vanished(make):
    m = plain(make)
    s = running(m, 1, 5)
    s.data._token_ids.pop()
    return m, lambda: m.append_slots(s, 0)


@case(E.NoFreeBlocksError, "copy-on-write")
def append_out_of_blocks_for_copy_on_write(make):
    m = plain(make, gpu=3)
    a, b = seq(1, range(6)), seq(2, range(6))
    m.allocate(group("g", a, b))  # [0, 1] shared
    run(a, b)
    running(m, 3, 1)  # takes the last free block
    grow(a, 6)  # writes into the shared partial block: needs a CoW
    return m, lambda: m.append_slots(a, 0)


@case(E.NoFreeBlocksError, "new block")
def append_out_of_blocks_mid_call(make):
    m = plain(make, gpu=3)
    s = running(m, 1, 4)
    running(m, 2, 5)
    grow(s, 4)
    return m, lambda: m.append_slots(s, 8)  # needs 3 new blocks, 1 is free


@case(E.NoFreeBlocksError, "null block")
def append_without_room_for_the_null_block(make):
    m = plain(make, gpu=2, sliding_window=4)
    s = running(m, 1, 8)
    decode_step(s, 3)
    return m, lambda: m.append_slots(s, 0)


@case(E.UnknownSequenceError, "no block table")
def can_append_unknown_sequence(make):
    m = plain(make)
    s = seq(1, range(3))
    run(s)
    return m, lambda: m.can_append_slots(group("a", s), 0)


@case(E.ChildExistsError, "already has a block table")
def fork_onto_live_child(make):
    m = plain(make)
    a, b = running(m, 1, 5), running(m, 2, 5)
    return m, lambda: m.fork(a, b)


@case(E.EmptyTableError, "no blocks")
def fork_from_empty_table(make):
    m = plain(make)
    s = seq(1, [])
    m.allocate(group("a", s))
    return m, lambda: m.fork(s, seq(2, []))


@case(E.UnsupportedError, "sliding-window")
def fork_after_window_drop(make):
    m = plain(make, gpu=16, sliding_window=4)
    s = running(m, 1, 16)
    decode_step(s, 1)
    m.append_slots(s, 0)
    return m, lambda: m.fork(s, seq(2, s.get_token_ids()))


@case(E.UnsupportedError, "sliding-window")
def swap_after_window_drop(make):
    m = plain(make, gpu=16, sliding_window=4)
    s = running(m, 1, 16)
    decode_step(s, 1)
    m.append_slots(s, 0)
    return m, lambda: m.swap_out(group("r1", s))


@case(E.UnknownSequenceError, "no block table")
def swap_out_unknown_sequence(make):
    m = plain(make)
    s = seq(1, range(3))
    run(s)
    return m, lambda: m.swap_out(group("a", s))


@case(E.NoFreeBlocksError, "CPU blocks")
def swap_out_out_of_cpu_blocks(make):
    m = plain(make, cpu=2)
    a, b = seq(1, range(6)), seq(2, range(6))
    g = group("g", a, b)
    m.allocate(g)  # shared blocks are un-shared on the CPU: 4 needed
    run(a, b)
    return m, lambda: m.swap_out(g)


@case(E.NoFreeBlocksError, "GPU blocks")
def swap_in_out_of_gpu_blocks(make):
    m = plain(make, gpu=4)
    s = running(m, 1, 12)
    m.swap_out(group("r1", s))
    s.status = SequenceStatus.SWAPPED
    running(m, 2, 8)
    return m, lambda: m.swap_in(group("r1", s))


@case(E.WrongDeviceError, "not on the CPU")
def swap_in_of_a_running_table(make):
    m = plain(make)
    s = running(m, 1, 5)
    s.status = SequenceStatus.SWAPPED
    return m, lambda: m.swap_in(group("r1", s))


@case(E.UnknownSequenceError, "no block table")
def get_block_table_of_unknown(make):
    m = plain(make)
    return m, lambda: m.get_block_table(seq(5, []))


@case(E.NoCrossTableError, "no cross block table")
def get_missing_cross_table(make):
    m = plain(make)
    running(m, 1, 5)
    return m, lambda: m.get_cross_block_table(group("r1", seq(1, [])))


@case(E.UnknownDeviceError, "unknown device")
def hit_rate_of_unknown_device(make):
    m = caching(make)
    return m, lambda: m.get_prefix_cache_hit_rate("TPU")


@case(E.UnknownDeviceError, "unknown device")
def reset_of_unknown_device(make):
    m = caching(make)
    return m, lambda: m.reset_prefix_cache(3)


@case(E.TrackerError, "tracker")
def remove_unqueried_from_tracker(make):
    m = caching(make)
    return m, lambda: m.remove_seq_from_computed_blocks_tracker(seq(1, range(4)))


@case(E.UnknownSequenceError, "no block table")
def access_unknown_sequence(make):
    m = caching(make)
    return m, lambda: m.access_all_blocks_in_seq(seq(1, range(4)), 1.0)


@case(E.UnknownSequenceError, "no block table")
def common_computed_with_one_unknown(make):
    m = caching(make)
    s = running(m, 1, 8)
    return m, lambda: m.get_common_computed_block_ids([s, seq(2, range(8))])


@case(E.TrackerError, "tracker already keyed")
def cached_tokens_after_tokens_vanished(make):
    m = caching(make)
    s = seq(1, range(8))
    m.get_num_cached_tokens(s)
    del s.data._token_ids[2:]
    return m, lambda: m.get_num_cached_tokens(s)


@pytest.mark.parametrize("name", sorted(CASES))
def test_error_leaves_manager_unchanged(make, name):
    build, error, match = CASES[name]
    manager, call = build(make)
    before = manager.snapshot()
    with pytest.raises(error, match=match) as raised:
        call()
    assert isinstance(raised.value, E.BlockSpaceError)
    assert manager.snapshot() == before
    manager.check_invariants()


def test_error_matrix_is_large_enough():
    assert len(CASES) >= 30


CONFIG_ERRORS = [
    ((0, 8, 8), {}, "block_size"),
    ((-4, 8, 8), {}, "block_size"),
    (("16", 8, 8), {}, "block_size"),
    ((4, 0, 8), {}, "num_gpu_blocks"),
    ((4, 8, -1), {}, "num_cpu_blocks"),
    ((4, 8, 8), {"watermark": -0.01}, "watermark"),
    ((4, 8, 8), {"sliding_window": -1}, "sliding_window"),
]


@pytest.mark.parametrize("args, kwargs, match", CONFIG_ERRORS)
def test_constructor_rejects_out_of_range(make, args, kwargs, match):
    with pytest.raises(E.InvalidConfigError, match=match):
        make(*args, **kwargs)


def test_constructor_watermark_error_is_an_assertion_error_like_vllm(make):
    with pytest.raises(AssertionError):
        make(4, 8, 8, watermark=-1.0)


def test_caching_with_sliding_window_is_unsupported(make):
    with pytest.raises(E.UnsupportedError):
        make(4, 8, 8, sliding_window=8, enable_caching=True)


def test_builtin_types_match_vllm():
    assert issubclass(E.NoFreeBlocksError, ValueError)
    assert issubclass(E.UnknownSequenceError, KeyError)
    assert issubclass(E.NoWaitingSequenceError, IndexError)
    assert issubclass(E.DuplicateTableError, AssertionError)
    assert issubclass(E.UnsupportedError, NotImplementedError)


class ForeignDevice(enum.Enum):  # stands in for vllm.utils.Device
    GPU = enum.auto()
    CPU = enum.auto()


@pytest.mark.parametrize("device", [Device.GPU, "GPU", "gpu", ForeignDevice.GPU])
def test_device_accepted_by_member_name_or_string(make, device):
    m = caching(make)
    assert m.get_prefix_cache_hit_rate(device) == 0.0
    assert m.reset_prefix_cache(device) is True
