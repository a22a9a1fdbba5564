"""Trace loading: every bad line is rejected with its line number; token
ids follow the chunk ids."""

from __future__ import annotations

import json
import re

import pytest

from blockspace.errors import InvalidArgumentError
from blockspace.workloads import (
    MAX_TOKEN_ID,
    TraceError,
    load_trace,
    output_token_id,
    parse_lines,
    prompt_token_ids,
    scale_arrivals,
)

GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]}


def write_trace(tmp_path, lines):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def with_line(bad: str) -> list[str]:
    return [json.dumps(GOOD), json.dumps(GOOD), bad]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"timestamp": 0, "input_length": 600,', "not valid JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        ('{"timestamp": 0, "input_length": 600, "hash_ids": [7, 8]}', "missing field 'output_length'"),
        (json.dumps({**GOOD, "prompt": "hi"}), "unknown field 'prompt'"),
        (json.dumps({**GOOD, "input_length": -600}), "'input_length' must be >= 1"),
        (json.dumps({**GOOD, "output_length": 0}), "'output_length' must be >= 1"),
        (json.dumps({**GOOD, "output_length": "5"}), "'output_length' must be an integer"),
        (json.dumps({**GOOD, "input_length": 600.5}), "'input_length' must be an integer"),
        (json.dumps({**GOOD, "output_length": True}), "'output_length' must be an integer"),
        (json.dumps({**GOOD, "timestamp": "0"}), "'timestamp' must be a number"),
        (json.dumps({**GOOD, "timestamp": -1}), "'timestamp' must be >= 0"),
        (json.dumps({**GOOD, "hash_ids": "7,8"}), "'hash_ids' must be a list"),
        (json.dumps({**GOOD, "hash_ids": [7, "8"]}), "'hash_ids' holds '8'"),
        (json.dumps({**GOOD, "hash_ids": [7, -8]}), "'hash_ids' holds -8"),
        (json.dumps({**GOOD, "hash_ids": [7]}), "has 1 chunk ids, but input_length 600 needs 2"),
        (json.dumps({**GOOD, "hash_ids": [7, 8, 9]}), "has 3 chunk ids"),
    ],
)
def test_bad_line_names_the_file_and_line(tmp_path, bad, message):
    path = write_trace(tmp_path, with_line(bad))
    with pytest.raises(TraceError) as error:
        load_trace(path)
    assert f"{path}: line 3: " in str(error.value)
    assert message in str(error.value)
    assert isinstance(error.value, InvalidArgumentError) and isinstance(error.value, ValueError)


def test_arrivals_must_not_go_backwards(tmp_path):
    path = write_trace(tmp_path, [json.dumps({**GOOD, "timestamp": 10}), json.dumps({**GOOD, "timestamp": 9})])
    with pytest.raises(TraceError, match="line 2: timestamp 9 is earlier"):
        load_trace(path)


def test_missing_file_and_bad_limit(tmp_path):
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "nope.jsonl")
    with pytest.raises(InvalidArgumentError, match="max_requests"):
        load_trace(None, 0)


def test_blank_lines_are_skipped_and_max_requests_stops_early(tmp_path):
    path = write_trace(tmp_path, [json.dumps(GOOD), "", json.dumps({**GOOD, "timestamp": 1500}), "not json"])
    requests = load_trace(path, max_requests=2)
    assert [(r.index, r.arrival_s, r.input_length, r.hash_ids) for r in requests] == [
        (0, 0.0, 600, (7, 8)),
        (1, 1.5, 600, (7, 8)),
    ]


def test_bundled_sample_is_the_head_of_the_mooncake_trace():
    requests = load_trace()
    assert len(requests) >= 200
    assert (requests[0].input_length, requests[0].output_length, requests[0].hash_ids[:3]) == (6758, 500, (0, 1, 2))
    assert len(load_trace(None, 10)) == 10


def test_equal_chunk_ids_give_equal_tokens_and_different_ones_never_match():
    a = prompt_token_ids([0, 1, 2], 1300)
    b = prompt_token_ids([0, 1, 3], 1100)
    c = prompt_token_ids([5], 512)
    assert len(a) == 1300 and len(b) == 1100
    assert a[:1024] == b[:1024]  # chunks 0 and 1 shared: a real 1024-token prefix
    assert all(x != y for x, y in zip(a[1024:], b[1024:]))  # chunk 2 vs 3 differ at every offset
    assert not set(c) & set(a)
    assert all(isinstance(t, int) and 0 <= t <= MAX_TOKEN_ID for t in a + b + c)
    assert len(set(a)) == len(a)  # distinct (chunk, offset) -> distinct token


def test_generated_tokens_are_deterministic_and_apart_from_prompts():
    prompt = set(prompt_token_ids(list(range(40)), 40 * 512))
    outputs = [output_token_id(r, s, p) for r in range(3) for s in range(2) for p in range(50)]
    assert outputs == [output_token_id(r, s, p) for r in range(3) for s in range(2) for p in range(50)]
    assert not prompt & set(outputs)
    assert len(set(outputs)) == len(outputs)
    assert all(0 <= t <= MAX_TOKEN_ID for t in outputs)


def test_parse_lines_reports_its_source():
    with pytest.raises(TraceError, match="^inline: line 1: missing field 'hash_ids'"):
        parse_lines(['{"timestamp": 0, "input_length": 1, "output_length": 1}'], "inline")


@pytest.mark.parametrize("bad", [True, -1, 1.0, "3", 2**21, None])
def test_a_chunk_id_that_is_not_a_whole_number_in_range_is_named(bad):
    line = {"timestamp": 0, "input_length": 1030, "output_length": 1, "hash_ids": [7, bad, 9]}
    with pytest.raises(TraceError, match=rf"^inline: line 1: field 'hash_ids' holds {re.escape(repr(bad))}, not an"):
        parse_lines([json.dumps(line)], "inline")


def test_time_scale_spreads_arrivals():
    requests = parse_lines([json.dumps(GOOD), json.dumps({**GOOD, "timestamp": 1500})], "inline")
    assert [r.arrival_s for r in scale_arrivals(requests, 2.0)] == [0.0, 3.0]
    assert [r.hash_ids for r in scale_arrivals(requests, 2.0)] == [r.hash_ids for r in requests]
    with pytest.raises(InvalidArgumentError, match="scale"):
        scale_arrivals(requests, 0)
