"""Prefix-cache safety: no false hit from a hash collision, and tenants with
different cache salts never share a block (spec §7; GHSA-rm76-4mrf-v9r8,
CVE-2025-46570, vLLM #44701)."""

import pytest

from blockspace import Device, Sequence, SequenceGroup
from blockspace.errors import InvalidArgumentError

PROMPT = list(range(100, 120))  # 5 full blocks of 4


def admit(m, request_id, seq_id, tokens=PROMPT, **kw):
    g = SequenceGroup.from_prompt(request_id, tokens, first_seq_id=seq_id, **kw)
    s = g.seqs[0]
    cached = m.get_num_cached_tokens(s)
    m.allocate(g)
    m.mark_blocks_as_computed(g, len(tokens))
    return s, cached


def caching(make):
    return make(4, 32, 0, watermark=0, enable_caching=True)


def test_same_salt_shares_different_salt_never(make):
    m = caching(make)
    a, _ = admit(m, "a", 1, cache_salt="tenant-1")
    b, cached_b = admit(m, "b", 10, cache_salt="tenant-1")
    c, cached_c = admit(m, "c", 20, cache_salt="tenant-2")
    d, cached_d = admit(m, "d", 30)  # unsalted
    assert cached_b == 20 and m.get_block_table(b) == m.get_block_table(a)
    assert cached_c == 0 and cached_d == 0
    tables = [set(m.get_block_table(s)) for s in (a, c, d)]
    assert not (tables[0] & tables[1]) and not (tables[0] & tables[2]) and not (tables[1] & tables[2])
    assert m.get_prefix_cache_hit_rate(Device.GPU) == 5 / 20


def test_salt_is_kept_apart_from_adapter_ids(make):
    m = caching(make)
    lora = Sequence(1, PROMPT, lora_int_id=7)
    salt = lora.extra_hash()  # a salt equal to the adapter's extra key value
    admit(m, "lora", 1, lora_int_id=7)
    s, cached = admit(m, "salted", 10, cache_salt=salt)
    assert cached == 0
    assert not set(m.get_block_table(s)) & set(m.get_block_table(lora))


def test_salt_survives_decode_and_fork(make):
    m = caching(make)
    short = list(range(100, 106))
    a, _ = admit(m, "a", 1, tokens=short, cache_salt="t1")
    b, _ = admit(m, "b", 10, tokens=short, cache_salt="t2")
    for s in (a, b):
        s.status = s.status.RUNNING
        s.append_token_id(106)
        s.append_token_id(107)
        m.append_slots(s, 0)  # the second block fills up and gets a salted key
    child = Sequence(2, a.get_token_ids(), cache_salt="t1")
    m.fork(a, child)
    assert m.get_block_table(a)[1] != m.get_block_table(b)[1]
    m.mark_blocks_as_computed(None, 0)
    probe = Sequence(3, list(range(100, 108)), cache_salt="t1")
    assert m.get_num_cached_tokens(probe) == 8
    assert m.get_num_cached_tokens(Sequence(4, list(range(100, 108)), cache_salt="t3")) == 0


def test_bad_salt_is_rejected(make):
    m = caching(make)
    g = SequenceGroup.from_prompt("x", PROMPT, first_seq_id=1, cache_salt=["not", "hashable"])
    before = m.snapshot()
    with pytest.raises(InvalidArgumentError, match="cache_salt"):
        m.allocate(g)
    assert m.snapshot() == before


class CollidingExtra:
    """Adapter identities that all hash alike but are different."""

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return 42

    def __eq__(self, other):
        return isinstance(other, CollidingExtra) and other.name == self.name


class Adapted(Sequence):
    def __init__(self, seq_id, tokens, extra):
        super().__init__(seq_id, tokens)
        self._extra = extra

    def extra_hash(self):
        return self._extra


def test_forged_hash_collision_of_extra_keys_gives_no_false_hit(make):
    m = caching(make)
    first = Adapted(1, PROMPT, CollidingExtra("adapter-a"))
    second = Adapted(2, PROMPT, CollidingExtra("adapter-b"))
    same = Adapted(3, PROMPT, CollidingExtra("adapter-a"))
    for i, s in enumerate((first, second, same)):
        m.get_num_cached_tokens(s)
        m.allocate(SequenceGroup(str(i), [s]))
    assert not set(m.get_block_table(first)) & set(m.get_block_table(second))
    assert m.get_block_table(same) == m.get_block_table(first)
