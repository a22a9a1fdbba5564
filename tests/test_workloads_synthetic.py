"""``workloads.synthetic`` and ``blockspace simulate --workload synthetic``
(issue #43): lengths from normals, prefix groups as the Dynamo mocker makes
them, conversations whose turns resend the prompt so far, seeded; every
option checked before any work; and a fleet whose kv_aware router finds the
groups' prefixes where round robin cannot."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import blockspace.simulator.capacity as capacity
import blockspace.simulator.cli as simulate
import blockspace.simulator.sweep as sweep
from blockspace.errors import InvalidArgumentError
from blockspace.workloads import (
    CHUNK_TOKENS,
    NUM_CHUNK_IDS,
    TraceRequest,
    describe,
    gamma_arrivals,
    parse_lines,
    synthetic,
)


def conversations(requests: list[TraceRequest]) -> list[list[TraceRequest]]:
    """The requests by conversation, in order of arrival. With no shared
    prefix a conversation's first chunk id is its own, and every later turn
    begins with it."""
    by_first: dict[int, list[TraceRequest]] = {}
    for request in requests:
        by_first.setdefault(request.hash_ids[0], []).append(request)
    return list(by_first.values())


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    return shared


# -- the generator ------------------------------------------------------------------------------
def test_the_same_seed_makes_the_same_requests_and_another_seed_others():
    shape = {"input_len": 900, "input_len_std": 200, "output_len_std": 30, "shared_prefix_ratio": 0.5,
             "prefix_groups": 3, "turns": 3, "rate": 4.0, "burstiness": 0.5}  # fmt: skip
    first, again, other = synthetic(60, **shape, seed=7), synthetic(60, **shape, seed=7), synthetic(60, **shape, seed=8)
    assert first == again
    assert [r.input_length for r in first] != [r.input_length for r in other]
    assert [r.arrival_s for r in first] != [r.arrival_s for r in other]


def test_requests_are_in_arrival_order_and_indexed_so():
    requests = synthetic(50, turns=4, turn_gap=0.7, rate=9.0, input_len_std=50)
    assert [r.index for r in requests] == list(range(50))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(requests, requests[1:]))


def test_lengths_have_the_mean_and_spread_asked_for():
    """4,000 draws: a sample mean is within 4 standard errors of the mean
    (sigma / sqrt(n)), a sample deviation within 4 of sigma (about
    sigma / sqrt(2n) for a normal). Both lengths far above 1, so rounding
    and the floor at 1 move neither measurably."""
    n = 4_000
    requests = synthetic(n, input_len=1_000, input_len_std=100, output_len=300, output_len_std=30, seed=3)
    for lengths, mean, sigma in (
        (np.array([r.input_length for r in requests]), 1_000, 100),
        (np.array([r.output_length for r in requests]), 300, 30),
    ):
        assert abs(lengths.mean() - mean) < 4 * sigma / math.sqrt(n)
        assert abs(lengths.std(ddof=1) - sigma) < 4 * sigma / math.sqrt(2 * n)


def test_a_deviation_of_zero_fixes_every_length_and_none_falls_below_one():
    fixed = synthetic(100, input_len=777, output_len=33)
    assert {(r.input_length, r.output_length) for r in fixed} == {(777, 33)}
    wide = synthetic(500, input_len=2, input_len_std=50, output_len=2, output_len_std=50)
    assert min(min(r.input_length, r.output_length) for r in wide) == 1
    assert max(r.input_length for r in wide) > 50  # the draws did spread


@pytest.mark.parametrize(
    ("input_len", "ratio", "shared"),
    [
        (1_024, 0.5, 1),  # 2 chunks
        (1_500, 0.25, 1),  # 3 chunks x 0.25 = 0.75
        (1_024, 0.25, 1),  # 2 x 0.25 = 0.5: a half rounds up, as the mocker's Rust round (Python's round gives 0)
        (5_000, 0.7, 7),  # 10 chunks
        (5_000, 1.0, 10),
        (5_000, 0.0, 0),
    ],
)
def test_a_group_shares_round_chunks_times_ratio_and_groups_share_nothing(input_len, ratio, shared):
    """The mocker's rule: round(ceil(isl / 512) x shared_prefix_ratio)
    chunks of a prompt are its group's. Prompts of one group share exactly
    that many leading chunks; prompts of two groups no chunk at all."""
    requests = synthetic(120, input_len=input_len, shared_prefix_ratio=ratio, prefix_groups=4, seed=2)
    assert shared == math.floor(math.ceil(input_len / CHUNK_TOKENS) * ratio + 0.5)
    group_of: dict[tuple[int, ...], int] = {}
    for request in requests:
        group_of.setdefault(request.hash_ids[:shared], len(group_of))
    if shared:
        assert len(group_of) == 4  # each group was drawn, and has one prefix
    pairs = [(a, b) for i, a in enumerate(requests) for b in requests[i + 1 :]]
    for a, b in pairs:
        if shared and a.hash_ids[:shared] == b.hash_ids[:shared]:
            assert common_prefix(a.hash_ids, b.hash_ids) == shared
        else:
            assert not set(a.hash_ids) & set(b.hash_ids)


def test_members_of_a_group_of_varied_lengths_share_the_shorter_prefix():
    requests = synthetic(300, input_len=3_000, input_len_std=1_500, shared_prefix_ratio=0.6, prefix_groups=2, seed=5)
    prefixes = {r.index: math.floor(math.ceil(r.input_length / CHUNK_TOKENS) * 0.6 + 0.5) for r in requests}
    assert len(set(prefixes.values())) > 3  # the lengths did vary
    for a in requests:
        for b in requests[a.index + 1 :]:
            common = common_prefix(a.hash_ids, b.hash_ids)
            assert common in (0, min(prefixes[a.index], prefixes[b.index]))
            assert len(set(a.hash_ids) & set(b.hash_ids)) == common


def test_a_conversation_resends_its_prompt_so_far_at_each_turn():
    """Turn k+1: turn k's chunk ids then fresh ones, so its tokens begin with
    turn k's prompt; its length adds turn k's output and a new message;
    it arrives turn_gap after turn k. Conversations share nothing."""
    requests = synthetic(40, input_len=700, output_len=90, turns=4, turn_gap=2.5, rate=3.0, seed=4)
    talks = conversations(requests)
    assert [len(talk) for talk in talks] == [4] * 10
    for talk in talks:
        for before, after in zip(talk, talk[1:]):
            assert after.hash_ids[: len(before.hash_ids)] == before.hash_ids
            tokens = after.prompt_token_ids()
            assert tokens[: before.input_length] == before.prompt_token_ids()
            assert after.input_length == before.input_length + before.output_length + 700
            assert after.arrival_s - before.arrival_s == pytest.approx(2.5)
    for talk, other in zip(talks, talks[1:]):
        assert not set(talk[-1].hash_ids) & set(other[-1].hash_ids)


def test_a_conversations_later_turns_keep_its_group_prefix():
    requests = synthetic(60, input_len=2_048, shared_prefix_ratio=0.5, prefix_groups=3, turns=3)
    prefixes = {r.hash_ids[:2] for r in requests}
    assert len(prefixes) == 3
    for request in requests:  # each prompt, whatever its turn, begins with one of the group prefixes
        assert request.hash_ids[:2] in prefixes


def test_the_requests_are_the_first_to_arrive_when_turns_do_not_divide_them():
    """10 requests of 3 turns: 4 conversations, and the 10 earliest turns."""
    requests = synthetic(10, turns=3, turn_gap=1.5)  # starts 0, 1, 2, 3; turns 1.5 s apart
    assert [r.arrival_s for r in requests] == [0.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.0, 3.5, 4.0, 4.5]
    assert len(requests) == 10 and sorted(len(talk) for talk in conversations(requests)) == [2, 2, 3, 3]
    assert synthetic(3, turns=5, turn_gap=1.0)[-1].arrival_s == 2.0  # one conversation of 3 turns


def test_a_rate_draws_the_conversation_starts_and_changes_no_prompt():
    """With one turn, the starts are requests at ``rate``: their mean gap is
    1 / rate within 4 standard errors (a gamma gap of shape B has standard
    deviation 1 / (rate sqrt(B))); the prompts are those of no rate."""
    n, rate, burstiness = 4_000, 5.0, 2.0
    paced = synthetic(n, input_len_std=300, shared_prefix_ratio=0.5, prefix_groups=6, rate=rate, burstiness=burstiness)
    gaps = np.diff([r.arrival_s for r in paced])
    assert abs(gaps.mean() - 1 / rate) < 4 * (1 / (rate * math.sqrt(burstiness))) / math.sqrt(n)
    plain = synthetic(n, input_len_std=300, shared_prefix_ratio=0.5, prefix_groups=6)
    assert [r.arrival_s for r in plain[:3]] == [0.0, 1.0, 2.0]  # one a second by default
    assert [(r.input_length, r.hash_ids) for r in paced] == [(r.input_length, r.hash_ids) for r in plain]
    assert gamma_arrivals(plain, rate, burstiness, seed=0) != paced  # a stream apart from the prompts'


def test_a_start_rate_is_a_rate_of_conversations():
    requests = synthetic(3_000, turns=3, turn_gap=0.5, rate=4.0)
    starts = sorted(talk[0].arrival_s for talk in conversations(requests))
    assert len(starts) == 1_000
    assert abs((len(starts) - 1) / starts[-1] - 4.0) < 4 * 4.0 / math.sqrt(1_000)


def test_every_request_is_a_valid_trace_line():
    """Written as Mooncake JSONL, the requests read back the same through
    the trace parser, whose checks every line passes."""
    requests = synthetic(80, input_len=1_300, input_len_std=700, output_len_std=20, shared_prefix_ratio=0.3,
                         prefix_groups=5, turns=3, rate=7.0)  # fmt: skip
    fields = [(r.arrival_s * 1000, r.input_length, r.output_length, list(r.hash_ids)) for r in requests]
    lines = [json.dumps(dict(zip(("timestamp", "input_length", "output_length", "hash_ids"), f))) for f in fields]
    again = parse_lines(lines, "synthetic")
    assert [(r.input_length, r.output_length, r.hash_ids) for r in again] == [
        (r.input_length, r.output_length, r.hash_ids) for r in requests
    ]
    assert [r.arrival_s for r in again] == pytest.approx([r.arrival_s for r in requests])


def test_chunk_ids_are_numbered_as_they_first_appear():
    requests = synthetic(30, input_len=1_600, shared_prefix_ratio=0.5, prefix_groups=4, turns=2)
    seen: list[int] = []
    for request in requests:
        seen += [chunk for chunk in request.hash_ids if chunk not in seen]
    assert seen == list(range(len(seen)))


def test_a_workload_needing_more_chunk_ids_than_there_are_is_refused_before_it_is_made():
    """One prompt of every chunk id is the most there can be; a second turn
    of half that, one token of answer and half again needs one chunk more,
    and is refused, as is a length no chunk ids could hold."""
    (largest,) = synthetic(1, input_len=NUM_CHUNK_IDS * CHUNK_TOKENS, output_len=1)
    assert largest.hash_ids[-1] == NUM_CHUNK_IDS - 1
    with pytest.raises(InvalidArgumentError, match="need 2,097,153 chunk ids of 512 tokens, more than the 2,097,152"):
        synthetic(2, input_len=NUM_CHUNK_IDS * CHUNK_TOKENS // 2, output_len=1, turns=2)
    with pytest.raises(InvalidArgumentError, match="more than the 1,073,741,824 a prompt's chunk ids hold"):
        synthetic(1, input_len=10**30)


@pytest.mark.parametrize(
    ("argument", "value", "said"),
    [
        ("input_len", 0, "input_len must be >= 1, got 0"),
        ("output_len", -3, "output_len must be >= 1"),
        ("input_len_std", -1.0, "input_len_std must be >= 0"),
        ("output_len_std", math.inf, "output_len_std must be a finite number"),
        ("shared_prefix_ratio", 1.5, "shared_prefix_ratio must be <= 1"),
        ("prefix_groups", 0, "prefix_groups must be >= 1"),
        ("prefix_groups", 10**30, "prefix_groups must be <= 1e"),
        ("turns", 0, "turns must be >= 1"),
        ("turn_gap", 0.0, "turn_gap must be > 0"),
        ("rate", 0.0, "the request rate must be > 0"),
    ],
)
def test_a_parameter_out_of_range_is_refused_by_name(argument, value, said):
    with pytest.raises(InvalidArgumentError, match=said):
        synthetic(5, **{argument: value})
    for count in (0, 10**6 + 1):
        with pytest.raises(InvalidArgumentError, match="a synthetic workload has 1 to 1,000,000 requests"):
            synthetic(count)


def test_the_description_counts_repeated_chunks():
    requests = [TraceRequest(0, 0.0, 1_024, 5, (0, 1)), TraceRequest(1, 1.0, 1_500, 7, (0, 1, 2))]
    assert describe(requests) == {"requests": 2, "mean_input_length": 1_262.0, "mean_output_length": 6.0,
                                  "repeated_chunk_share": 0.4}  # fmt: skip
    assert describe([])["requests"] == 0


# -- blockspace simulate --workload synthetic: refusals ------------------------------------------
@pytest.fixture
def no_work(tmp_path, monkeypatch):
    """A folder to run in, where whatever starts a command's work fails."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BLOCKSPACE_TRACE", raising=False)
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1]}\n')

    def work(*args, **kwargs):
        raise AssertionError("the work started before every option was checked")

    monkeypatch.setattr(simulate, "execute", work)
    monkeypatch.setattr(sweep, "map_unordered", work)
    monkeypatch.setattr(capacity, "find_max_rate", work)
    return tmp_path


SYNTHETIC = ["--workload", "synthetic"]
SHAPES = {
    "--input-len": "64",
    "--output-len": "8",
    "--input-len-std": "5",
    "--output-len-std": "5",
    "--shared-prefix-ratio": "0.5",
    "--prefix-groups": "2",
    "--turns": "2",
    "--turn-gap": "1",
}
REFUSED = [
    *(([option, value], f"{option} goes with --workload synthetic") for option, value in SHAPES.items()),
    *(
        (["--sweep", f"{option[2:].replace('-', '_')}={value},{value}0"], f"{option} goes with --workload synthetic")
        for option, value in SHAPES.items()
    ),
    ([*SYNTHETIC, "--trace", "t.jsonl"], "--trace cannot go with --workload synthetic"),
    ([*SYNTHETIC, "--time-scale", "2"], "--time-scale cannot go with --workload synthetic"),
    ([*SYNTHETIC, "--sweep", "time_scale=1,2"], "--time-scale cannot go with --workload synthetic"),
    ([*SYNTHETIC, "--sweep", "workload=trace,synthetic"], "--sweep: workload cannot be swept"),
    ([*SYNTHETIC, "--turn-gap", "5"], "--turn-gap goes with --turns above 1"),
    ([*SYNTHETIC, "--sweep", "turn_gap=1,2"], "--turn-gap goes with --turns above 1"),
    ([*SYNTHETIC, "--prefix-groups", "4"], "--prefix-groups goes with --shared-prefix-ratio above 0"),
    ([*SYNTHETIC, "--shared-prefix-ratio", "1.5"], "--shared-prefix-ratio must be <= 1, got 1.5"),
    ([*SYNTHETIC, "--shared-prefix-ratio", "-0.1"], "--shared-prefix-ratio must be >= 0"),
    ([*SYNTHETIC, "--sweep", "shared_prefix_ratio=0.5,2"], "--shared-prefix-ratio must be <= 1"),
    ([*SYNTHETIC, "--input-len", "0"], "--input-len must be >= 1"),
    ([*SYNTHETIC, "--input-len", "1.5"], "--input-len: invalid int value"),
    ([*SYNTHETIC, "--output-len-std", "nan"], "--output-len-std must be"),
    ([*SYNTHETIC, "--turns", "0"], "--turns must be >= 1"),
    ([*SYNTHETIC, "--sweep", "turns=1,0"], "--turns must be >= 1"),
    ([*SYNTHETIC, "--turns", "2", "--turn-gap", "0"], "--turn-gap must be > 0"),
    ([*SYNTHETIC, "--turns", "2", "--turn-gap", "inf"], "--turn-gap must be a finite number"),
    ([*SYNTHETIC, "--shared-prefix-ratio", "0.5", "--prefix-groups", "0"], "--prefix-groups must be >= 1"),
    ([*SYNTHETIC, "--seed", "-1"], "--seed must be >= 0"),
    ([*SYNTHETIC, "--max-requests", "0"], "--max-requests must be >= 1"),
    ([*SYNTHETIC, "--max-requests", str(10**12)], "--workload synthetic: a synthetic workload has 1 to 1,000,000"),
    ([*SYNTHETIC, "--shared-prefix-ratio", "0.5", "--prefix-groups", str(10**30)], "--prefix-groups must be <= 1e"),
    (["--workload", "files"], "--workload: invalid choice"),
    ([*SYNTHETIC, "--max-requests", "3", "--input-len", str(NUM_CHUNK_IDS * 256)], "--workload synthetic: 3 requests"),
    ([*SYNTHETIC, "--input-len", str(2**31)], "--workload synthetic: a drawn length of 2,147,483,648 tokens"),
    ([*SYNTHETIC, "--find", "max-rate", "--slo", "ttft=1s", "--input-len", str(2**31)], "a drawn length"),
    ([*SYNTHETIC, "--sweep", "n=1,2", "--input-len", str(2**31)], "a drawn length"),
]


@pytest.mark.parametrize(("argv", "said"), REFUSED, ids=[" ".join(argv) for argv, _ in REFUSED])
def test_a_bad_or_misplaced_option_is_one_error_line_before_any_work(no_work, capsys, argv, said):
    before = sorted(no_work.rglob("*"))
    assert simulate.main([*argv, "--no-plot", "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert said in captured.err and "Traceback" not in captured.err and captured.out == ""
    assert sorted(no_work.rglob("*")) == before


def test_seed_goes_with_the_synthetic_workload_alone(no_work):
    """--seed seeds the synthetic requests, so it needs no --request-rate there."""
    args = simulate.parse([*SYNTHETIC, "--seed", "4", "--input-len-std", "9", "--max-requests", "20"])[1]
    assert simulate.load_requests(args) == synthetic(20, input_len_std=9, seed=4)
    args = simulate.parse([*SYNTHETIC, "--turns", "3", "--request-rate", "2", "--burstiness", "3"])[1]
    assert simulate.load_requests(args) == synthetic(1_000, turns=3, rate=2.0, burstiness=3.0)  # 1,000 by default


# -- blockspace simulate --workload synthetic: runs ----------------------------------------------
def hit_rates(tmp_path, router: str, *shape: str) -> tuple[float, dict]:
    """A fleet of replicas behind ``router`` replaying the synthetic
    workload of ``shape``, through the command: its hit rate (full-block
    lookups) and its simulation.json."""
    out = tmp_path / router
    argv = [*SYNTHETIC, "--input-len", "2048", "--output-len", "8", "--request-rate", "20", *shape, "--router", router,
            "--engine", "python", "--manager", "reference", "--no-plot", "--quiet", "--out", str(out)]  # fmt: skip
    assert simulate.main(argv) == 0
    document = json.loads((out / "simulation.json").read_text())
    return document["runs"][0]["prefix_cache"]["gpu_block_hit_rate"], document


def test_kv_aware_finds_the_groups_prefixes_and_nothing_when_nothing_is_shared(tmp_path, capsys):
    """120 prompts in 8 groups sharing 3 of their 4 chunks, 2 replicas:
    round robin computes each group's prefix on both, kv_aware on one.
    Nothing shared and one turn: neither router finds anything."""
    groups = ("--max-requests", "120", "--shared-prefix-ratio", "0.75", "--prefix-groups", "8", "--replicas", "2")
    kv, document = hit_rates(tmp_path, "kv_aware", *groups)
    rr, _ = hit_rates(tmp_path, "round_robin", *groups)
    assert kv > rr > 0.6  # 65.6 % and 65.0 %
    assert document["trace"] == "a synthetic workload" and document["trace_file"] is None
    assert document["workload"] == describe(synthetic(120, input_len=2_048, output_len=8, shared_prefix_ratio=0.75,
                                                      prefix_groups=8, rate=20.0))  # fmt: skip
    assert "replaying 120 requests from a synthetic workload" in capsys.readouterr().out
    alone = ("--max-requests", "120", "--shared-prefix-ratio", "0", "--turns", "1", "--replicas", "2")
    assert hit_rates(tmp_path, "kv_aware", *alone)[0] == hit_rates(tmp_path, "round_robin", *alone)[0] == 0.0


def test_kv_aware_sends_a_conversations_next_turn_where_its_prompt_is(tmp_path):
    """300 requests of 3 turns, 2 s apart, on 4 replicas: round robin sends
    a turn to the replica its earlier prompt is on about one time in four,
    kv_aware most times (32.0 % of full blocks found against 18.1 %)."""
    talks = ("--max-requests", "300", "--turns", "3", "--turn-gap", "2", "--replicas", "4")
    kv, _ = hit_rates(tmp_path, "kv_aware", *talks)
    rr, _ = hit_rates(tmp_path, "round_robin", *talks)
    assert kv > 1.5 * rr and rr > 0.1
