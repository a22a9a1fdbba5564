"""Conversations found in a trace (``conversations_of``) and growth by copying them
(``scale_users``), through the public functions only."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest

from blockspace.errors import InvalidArgumentError
from blockspace.interfaces import load_manager_class
from blockspace.simulator.cli import main as simulate
from blockspace.simulator.engines import replay
from blockspace.simulator.runs import SchedulerConfig, SimulationConfig, SimulationResult
from blockspace.workloads import NUM_CHUNK_IDS, TraceRequest, conversations_of, load_trace, scale_users, synthetic

FAST = load_manager_class("fast")


def trace(*rows: tuple[float, tuple[int, ...]]) -> list[TraceRequest]:
    """Requests from (arrival, chunk ids): prompts fill their chunks but the
    last, which holds 100 tokens; outputs vary with the position."""
    return [
        TraceRequest(index, at, 512 * (len(ids) - 1) + 100, 10 + index, ids) for index, (at, ids) in enumerate(rows)
    ]


def owners(requests: list[TraceRequest]) -> dict[int, set[int]]:
    """Each chunk id's conversations."""
    found: dict[int, set[int]] = defaultdict(set)
    for request, conversation in zip(requests, conversations_of(requests)):
        for chunk in request.hash_ids:
            found[chunk].add(conversation)
    return found


def disjoint_conversations() -> list[TraceRequest]:
    """Three conversations (A: 3 turns, B: 2, C: 1), all starting with the shared
    chunk 0, otherwise private chunk ids."""
    return trace(
        (0.0, (0, 1, 2)),  # A
        (1.0, (0, 10, 11, 12)),  # B
        (2.0, (0, 1, 3, 4)),  # A: extends (0, 1)
        (3.5, (0, 20, 21)),  # C
        (5.0, (0, 10, 11, 13, 14)),  # B: extends (0, 10, 11)
        (7.0, (0, 1, 3, 5, 6)),  # A: extends (0, 1, 3)
    )


# -- conversations_of ------------------------------------------------------------------------
def test_a_chain_of_turns_is_one_conversation():
    requests = trace((0.0, (0, 1, 2)), (1.0, (0, 1, 3, 4)), (2.0, (0, 1, 3, 4, 5, 6)))
    assert conversations_of(requests) == [0, 0, 0]


def test_one_common_chunk_does_not_join():
    # each continues the one before by its first chunk only (0), and a one-chunk key (0,) of (0, 9) joins nothing
    requests = trace((0.0, (0, 1, 2)), (1.0, (0, 5, 6)), (2.0, (0, 9)), (3.0, (0, 9, 7)))
    assert conversations_of(requests) == [0, 1, 2, 3]


def test_the_last_chunk_is_not_part_of_the_key():
    # the second's chunk 2 became 7 as the next turn filled it: it extends the first less its last chunk
    assert conversations_of(trace((0.0, (0, 1, 2)), (1.0, (0, 1, 7, 8)))) == [0, 0]
    # the key must be a prefix: (0, 1) is not one of (0, 2, 1, 2)
    assert conversations_of(trace((0.0, (0, 1, 2)), (1.0, (0, 2, 1, 2)))) == [0, 1]


def test_the_latest_earlier_candidate_wins():
    requests = trace(
        (0.0, (0, 1, 2, 3)),  # conversation 0, key (0, 1, 2)
        (1.0, (0, 1, 9)),  # continues nothing ((0, 1, 2) is not its prefix): conversation 1, key (0, 1)
        (2.0, (0, 1, 2, 3, 4)),  # both keys are prefixes: the later request (1) wins, though (0)'s key is longer
    )
    assert conversations_of(requests) == [0, 1, 1]
    # a request continues only earlier ones: (0, 1, 9)'s key (0, 1) is a prefix of (0, 1, 2, 3) after it only
    assert conversations_of(trace((0.0, (0, 1, 9)), (1.0, (0, 1, 2, 3)))) == [0, 0]
    assert conversations_of(trace((0.0, (0, 1, 2, 3)), (1.0, (0, 1, 9)))) == [0, 1]


def test_conversations_are_numbered_by_first_request():
    assert conversations_of(disjoint_conversations()) == [0, 1, 0, 2, 1, 0]
    assert conversations_of([]) == []


# -- scale_users --------------------------------------------------------------------------
def test_factor_one_returns_the_requests():
    requests = disjoint_conversations()
    assert scale_users(requests, 1) == requests
    assert scale_users(requests, 1.0, seed=5) == requests
    tail = requests[2:]  # indexes from 2, as they are: not renumbered
    assert scale_users(tail, 1) == tail


@pytest.mark.parametrize("factor", [0, -1, -0.5, math.nan, math.inf])
def test_a_factor_not_above_zero_is_refused(factor):
    with pytest.raises(InvalidArgumentError, match=r"user scale must be a finite number > 0, got"):
        scale_users(disjoint_conversations(), factor)


def shapes(requests: list[TraceRequest]) -> list[list[tuple[float, int, int, int]]]:
    """Each conversation's requests as (time since the conversation's start, prompt
    length, output length, chunk ids shared with the request before it in
    the conversation), in conversation order."""
    by_conversation: dict[int, list[TraceRequest]] = defaultdict(list)
    for request, conversation in zip(requests, conversations_of(requests)):
        by_conversation[conversation].append(request)
    found = []
    for members in by_conversation.values():
        start = members[0].arrival_s
        rows = []
        for before, request in zip([None, *members], members):
            common = 0
            if before is not None:
                while common < len(before.hash_ids) and before.hash_ids[common] == request.hash_ids[common]:
                    common += 1
            rows.append((round(request.arrival_s - start, 9), request.input_length, request.output_length, common))
        found.append(rows)
    return found


def test_two_users_for_one_copy_every_conversation_with_its_shape():
    requests = disjoint_conversations()
    doubled = scale_users(requests, 2, seed=3)
    assert len(doubled) == 2 * len(requests)
    assert [request.index for request in doubled] == list(range(len(doubled)))
    assert [request.arrival_s for request in doubled] == sorted(request.arrival_s for request in doubled)
    assert len(set(conversations_of(doubled))) == 6

    original_shapes = sorted(shapes(requests))
    assert sorted(shapes(doubled)) == sorted(original_shapes * 2)
    # the originals are all there, untouched but for their indexes
    strip = {(r.arrival_s, r.input_length, r.output_length, r.hash_ids) for r in requests}
    assert strip <= {(r.arrival_s, r.input_length, r.output_length, r.hash_ids) for r in doubled}

    found = owners(doubled)
    assert len(found[0]) == 6  # the shared chunk stays shared by every conversation, copies too
    private = {chunk for chunk, conversations in found.items() if len(conversations) == 1}
    assert len(private) == 2 * 13  # every id but 0 is private: each copy's are its own
    fresh = private - {chunk for r in requests for chunk in r.hash_ids}
    assert sorted(fresh) == list(range(22, 22 + 13))  # numbered upward from the largest id, 21


def test_the_copies_of_a_conversation_are_apart_from_each_other():
    requests = disjoint_conversations()
    tripled = scale_users(requests, 3, seed=1)
    assert len(tripled) == 18
    assert len(set(conversations_of(tripled))) == 9
    found = owners(tripled)
    assert all(len(conversations) == 1 for chunk, conversations in found.items() if chunk != 0)
    assert len(found) == 1 + 3 * 13


def test_copies_start_when_some_conversation_of_the_trace_started():
    requests = disjoint_conversations()
    starts = {0.0, 1.0, 3.5}  # the conversations' first arrivals
    for seed in range(5):
        scaled = scale_users(requests, 4, seed=seed)
        by_conversation: dict[int, float] = {}
        for request, conversation in zip(scaled, conversations_of(scaled)):
            by_conversation.setdefault(conversation, request.arrival_s)
        assert set(by_conversation.values()) <= starts
        assert len(by_conversation) == 12


def test_ids_shared_between_conversations_are_kept():
    requests = trace(
        (0.0, (0, 1, 2, 3)),  # key (0, 1, 2)
        (1.0, (0, 1, 5, 6)),  # (0, 1, 2) is no prefix of it: a conversation of its own, sharing chunks 0 and 1
        (2.0, (0, 1, 2, 3, 4)),  # continues the first: (0, 1, 5) is no prefix of it
    )
    assert conversations_of(requests) == [0, 1, 0]
    scaled = scale_users(requests, 2)
    for request in scaled:
        assert request.hash_ids[:2] == (0, 1)
    assert len({r.hash_ids[2] for r in scaled}) == 4  # 2 and 5, and a fresh id for each in the copy


@pytest.mark.parametrize(("factor", "conversations"), [(2.4, 12), (0.6, 3), (0.2, 1), (1.8, 9), (0.01, 1), (3, 15)])
def test_partial_factors_count_conversations(factor, conversations):
    requests = trace(*[(float(i), (0, 100 + i, 200 + i)) for i in range(5)])  # 5 one-request conversations
    scaled = scale_users(requests, factor, seed=7)
    assert len(scaled) == conversations
    assert len(set(conversations_of(scaled))) == conversations


def test_fewer_users_keeps_whole_conversations_untouched():
    requests = disjoint_conversations()
    for seed in range(6):
        kept = scale_users(requests, 0.5, seed=seed)  # round(1.5) = 2 of the 3 conversations
        assert len(set(conversations_of(kept))) == 2
        originals = {(r.arrival_s, r.hash_ids) for r in requests}
        assert {(r.arrival_s, r.hash_ids) for r in kept} <= originals
        assert len(kept) in (3 + 2, 3 + 1, 2 + 1)  # two of the conversations, each whole
        assert [r.index for r in kept] == list(range(len(kept)))


def test_the_seed_decides():
    requests = trace(*[(float(10 * i), (0, 100 + i, 200 + i)) for i in range(20)])
    assert scale_users(requests, 2.5, seed=4) == scale_users(requests, 2.5, seed=4)
    arrivals = {tuple(r.arrival_s for r in scale_users(requests, 3, seed=seed)) for seed in range(4)}
    assert len(arrivals) > 1
    picked = {tuple(r.hash_ids for r in scale_users(requests, 0.5, seed=seed)) for seed in range(4)}
    assert len(picked) > 1


def test_ties_keep_originals_then_copies_in_order():
    requests = trace((0.0, (0, 1, 2)), (0.0, (0, 3, 4)))  # two conversations starting together
    scaled = scale_users(requests, 3)
    assert all(r.arrival_s == 0.0 for r in scaled)
    assert [r.hash_ids for r in scaled[:2]] == [(0, 1, 2), (0, 3, 4)]
    assert [r.hash_ids[1:] for r in scaled[2:]] == [(5, 6), (7, 8), (9, 10), (11, 12)]


def test_running_out_of_chunk_ids_is_refused():
    top = NUM_CHUNK_IDS - 1
    requests = trace((0.0, (0, top - 2)), (1.0, (0, 5)))  # two conversations, one private id each
    assert max(max(r.hash_ids) for r in scale_users(requests, 2)) == top  # fresh ids top - 1 and top: they fit
    with pytest.raises(InvalidArgumentError, match=r"needs 3 fresh chunk ids .* below 2,097,152"):
        scale_users(requests, 2.5, seed=0)


def test_the_bundled_sample_grows_by_whole_conversations():
    sample = load_trace()
    conversations = len(set(conversations_of(sample)))
    tripled = scale_users(sample, 3)
    assert len(tripled) == 3 * len(sample)
    # private ids are renamed and shared ones kept: the rule finds each copy's conversations as it found the trace's
    assert len(set(conversations_of(tripled))) == 3 * conversations


# -- the replay of a grown trace (issue #55's known answers) -----------------------------------
def conversation_hit_rates(requests: list[TraceRequest], result: SimulationResult) -> list[float]:
    """Each conversation's prompt tokens found in the prefix cache, as a share of its prompt tokens."""
    cached, prompt = defaultdict(int), defaultdict(int)
    for request, conversation in zip(requests, conversations_of(requests), strict=True):
        cached[conversation] += result.metrics.cached_tokens.get(str(request.index), 0)
        prompt[conversation] += request.input_length
    return [cached[conversation] / prompt[conversation] for conversation in sorted(prompt)]


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_twice_the_users_doubles_the_requests_and_keeps_each_conversations_hit_rate(engine):
    """Conversations of 3 turns that share nothing, on a pool that never
    evicts: each conversation finds its own earlier turns in the cache, so the
    copies' conversations hit as often as the originals', within noise (a turn's
    admission may come before or after its previous turn is done)."""
    plain = synthetic(30, input_len=1100, output_len=16, turns=3, turn_gap=1.0, rate=4.0, seed=5)
    grown = scale_users(plain, 2, seed=1)
    assert len(grown) == 2 * len(plain) and len(set(conversations_of(grown))) == 2 * len(set(conversations_of(plain)))
    config = SimulationConfig(20_000, 0, scheduler=SchedulerConfig(max_num_seqs=64), engine=engine)
    alone = conversation_hit_rates(plain, replay(plain, FAST, config))
    together = conversation_hit_rates(grown, replay(grown, FAST, config))
    assert sum(alone) / len(alone) > 0.3  # later turns find the earlier ones
    assert sum(together) / len(together) == pytest.approx(sum(alone) / len(alone), abs=0.02)


def test_one_times_the_users_is_the_plain_run(tmp_path):
    """``--scale-users 1`` replays the trace as it is: the same figures."""
    argv = ["--max-requests", "30", "--manager", "reference", "--no-plot", "--quiet"]
    assert simulate([*argv, "--out", str(tmp_path / "a")]) == 0
    assert simulate([*argv, "--scale-users", "1", "--out", str(tmp_path / "b")]) == 0
    (a,), (b,) = (json.loads((tmp_path / k / "simulation.json").read_text())["runs"] for k in "ab")
    dropped = ("wall_s", "manager_startup_s", "manager_time")
    assert {k: v for k, v in a.items() if k not in dropped} == {k: v for k, v in b.items() if k not in dropped}
