"""What the simulator says per request and against an SLO: the request
records (``--requests-out``) and their schema, TPOT and ITL, and SLO
attainment and goodput (``simulator/slo.py``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from blockspace.errors import InvalidArgumentError
from blockspace.interfaces import load_manager_class
from blockspace.simulator import SchedulerConfig, SimulationConfig, load_trace, run_simulation
from blockspace.simulator.cli import main as simulate
from blockspace.simulator.metrics import REASONS, REQUEST_SCHEMA, TraceOutcome
from blockspace.simulator.slo import SLO, attainment, parse_slo
from blockspace.simulator.summary import summarize

JSON_TYPES = {
    "string": str, "integer": int, "number": (int, float), "null": type(None), "array": list, "boolean": bool,
}  # fmt: skip


def check_line(line: dict) -> None:
    """``line`` holds exactly the schema's fields, each of its type(s) (a
    bool is no integer or number here, though Python's is an int)."""
    assert set(line) == set(REQUEST_SCHEMA), set(line) ^ set(REQUEST_SCHEMA)
    for name, (types, _) in REQUEST_SCHEMA.items():
        allowed = tuple(JSON_TYPES[t] for t in types.split("|"))
        assert isinstance(line[name], allowed), (name, line[name])
        assert "boolean" in types or not isinstance(line[name], bool), (name, line[name])


@pytest.fixture(scope="module")
def tight():
    """A run with recompute preemptions (the bundled sample, a small pool)."""
    config = SimulationConfig(2400, 0, watermark=0.0, scheduler=SchedulerConfig())
    return run_simulation(load_trace(None, 60), load_manager_class("fast"), config)


def test_every_record_follows_the_schema_and_the_counts_add_up(tight):
    records = tight.metrics.request_records()
    assert len(records) == 60
    for record in records:
        check_line({"manager": "FastBlockSpaceManager", **record})
    counts = tight.metrics.counts
    assert sum(r["preemptions"] for r in records) == counts.recompute_preemptions > 0
    assert sum(len(r["readmissions_s"]) for r in records) == counts.recompute_preemptions  # all re-admitted
    assert summarize(tight).requests.ignored == sum(r["status"] == "ignored" for r in records) > 0
    assert sum(r["cached_tokens"] for r in records) == counts.cached_tokens_admitted
    preempted = next(r for r in records if r["preemptions"])
    assert preempted["admitted_s"] < preempted["readmissions_s"][0] < preempted["finish_s"]


def test_latencies_follow_their_definitions(tight):
    records = tight.metrics.request_records()
    finished = [r for r in records if r["status"] == "finished"]
    dropped = [r for r in records if r["status"] != "finished"]
    assert {r["status"] for r in dropped} == {"ignored", "aborted"}  # this run has both
    for r in dropped:  # why, and no latency
        assert r["reason"] == REASONS[r["status"]] and r["finish_s"] is None
        assert r["ttft_s"] is None and r["tpot_s"] is None and r["e2e_s"] is None
        assert r["status"] != "ignored" or (r["admitted_s"] is None and r["output_tokens"] == 0)
    for r in finished:
        assert r["reason"] is None
        assert r["arrival_s"] <= r["admitted_s"] < r["first_token_s"] <= r["finish_s"]
        assert r["ttft_s"] == pytest.approx(r["first_token_s"] - r["arrival_s"])
        assert r["e2e_s"] == pytest.approx(r["finish_s"] - r["arrival_s"])
        if r["output_tokens"] == 1:  # no gap: TPOT 0, as vLLM's benchmark has it
            assert r["tpot_s"] == 0.0 and r["first_token_s"] == r["finish_s"]
        else:
            assert r["tpot_s"] == pytest.approx((r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1))
    # one gap between each two tokens of a request (an aborted one's too), after a recompute as well
    itl = tight.metrics.itl_s
    assert (
        len(itl) == sum(max(r["output_tokens"] - 1, 0) for r in records) > sum(r["output_tokens"] - 1 for r in finished)
    )
    assert min(itl) > 0
    summary = summarize(tight)
    assert summary.itl_s.count == len(itl) and summary.tpot_s.count == len(finished)
    assert summary.tpot_s.p50 == pytest.approx(float(np.percentile([r["tpot_s"] for r in finished], 50)))


def test_slo_text_is_parsed_with_units():
    assert parse_slo("ttft=2s,tpot=100ms") == SLO(ttft_s=2.0, tpot_s=0.1)
    assert parse_slo("e2e=1.5e1s") == SLO(e2e_s=15.0)
    assert parse_slo(" TPOT = 250us ") == SLO(tpot_s=250e-6)
    assert str(parse_slo("tpot=100ms,ttft=2s")) == "ttft=2s,tpot=100ms"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("ttft=2", "with a unit"),
        ("ttft=2h", "with a unit"),
        ("latency=2s", "unknown bound 'latency'"),
        ("ttft=1s,ttft=2s", "given twice"),
        ("tpot=0ms", "above 0"),
        ("ttft=-1s", "ttft must be a time above 0, got 'ttft=-1s'"),  # issue #40: was "not NAME=VALUE"
        ("", "at least one bound"),
    ],
)
def test_a_bad_slo_is_refused_by_name(text, said):
    with pytest.raises(InvalidArgumentError, match=re.escape(said)):
        parse_slo(text)


def outcome(status: str, ttft: float | None = None, tpot: float | None = None) -> TraceOutcome:
    first = None if ttft is None else 10.0 + ttft
    finish = None if status != "finished" else (first or 10.0) + 5.0
    return TraceOutcome(0, 10.0, 100, 10, first, finish, status, tpot)


def test_attainment_counts_every_arrived_request():
    outcomes = [
        outcome("finished", ttft=1.0, tpot=0.05),  # meets both
        outcome("finished", ttft=3.0, tpot=0.05),  # TTFT too long
        outcome("finished", ttft=1.0, tpot=0.5),  # TPOT too long
        outcome("ignored"),
        outcome("aborted"),
    ]
    both = attainment(SLO(ttft_s=2.0, tpot_s=0.1), outcomes, span_s=10.0)
    assert (both.met, both.of, both.attainment, both.goodput_requests_per_s) == (1, 5, 0.2, 0.1)
    ttft_only = attainment(SLO(ttft_s=2.0), outcomes, span_s=10.0)
    assert ttft_only.met == 2 and ttft_only.bounds_s == {"ttft_s": 2.0}


def test_simulate_writes_the_request_lines_and_the_slo(tmp_path, capsys):
    out = tmp_path / "out"
    lines_file = tmp_path / "requests.jsonl"
    argv = ["--max-requests", "20", "--no-plot", "--quiet", "--out", str(out)]
    argv += ["--slo", "ttft=1000s,tpot=1000ms", "--requests-out", str(lines_file)]
    assert simulate(argv) == 0
    printed = capsys.readouterr().out
    assert "SLO ttft=1000s,tpot=1s" in printed and "met by 20 of 20 requests (100.0%" in printed
    lines = [json.loads(line) for line in lines_file.read_text().splitlines()]
    assert [line["request_id"] for line in lines] == [str(i) for i in range(20)]
    for line in lines:
        check_line(line)
        assert line["met_slo"] is True
    document = json.loads((out / "simulation.json").read_text())
    assert document["runs"][0]["slo"]["met"] == 20
    assert document["command"].startswith("blockspace simulate --max-requests 20")
    assert re.fullmatch(r"[0-9a-f]{64}", document["trace_file"]["sha256"])
    assert document["trace_file"]["requests_replayed"] == 20 and document["options"]["time_scale"] == 1.0
    assert document["version"] and document["options"]["num_layers"] == 32


def test_the_schema_is_the_documented_one():
    """docs/simulator.md shows every field of the request lines, and no other."""
    docs = (Path(__file__).parents[1] / "docs" / "simulator.md").read_text()
    table = docs[docs.index("| field | JSON type | meaning |") :].split("\n\n")[0]
    documented = re.findall(r"^\| `([a-z_0-9]+)` \| ([a-z|]+) \|", table, re.M)
    assert documented == [(name, types) for name, (types, _) in REQUEST_SCHEMA.items()]


def test_each_line_says_whether_its_request_met_the_slo(tight):
    """``met_slo`` is the SLO's verdict on the line's trace request, the
    verdict attainment counts; null without an SLO."""
    slo = SLO(ttft_s=float(np.median([o.ttft_s for o in tight.metrics.outcomes() if o.ttft_s is not None])))
    records = tight.metrics.request_records(slo)
    verdicts = {o.index: slo.met_by(o) for o in tight.metrics.outcomes()}
    assert [r["met_slo"] for r in records] == [verdicts[r["trace_index"]] for r in records]
    assert sum(r["met_slo"] for r in records) == summarize(tight, slo).slo.met
    assert {r["met_slo"] for r in records} == {True, False}
    assert {r["met_slo"] for r in tight.metrics.request_records()} == {None}


def test_times_are_written_to_the_nanosecond_in_a_folder_made_for_them(tmp_path, capsys):
    """The request lines go where --requests-out says, folders made first
    (they were checked as creatable before the run, issue #40), and no
    float carries noise below the step model's nanosecond."""
    lines_file = tmp_path / "nodir" / "sub" / "r.jsonl"
    argv = ["--max-requests", "20", "--no-plot", "--quiet", "--out", str(tmp_path / "out")]
    assert simulate([*argv, "--requests-out", str(lines_file), "--time-scale", "0.37"]) == 0
    capsys.readouterr()
    for line in lines_file.read_text().splitlines():
        for name, value in json.loads(line).items():
            for number in value if isinstance(value, list) else [value]:
                if isinstance(number, float):
                    assert number == round(number, 9) and len(repr(number).split(".")[-1]) <= 9, (name, number)


@pytest.mark.parametrize(
    ("requests_out", "out", "said"),
    [
        ("x", "x", "--requests-out x is also where --out goes"),
        ("out/simulation.json", "out", "is also where --out's simulation.json goes"),
        ("x", "x/out", "--requests-out x must be a folder for --out"),
    ],
)
def test_requests_out_and_out_cannot_take_each_others_place(tmp_path, monkeypatch, capsys, requests_out, out, said):
    monkeypatch.chdir(tmp_path)
    assert simulate(["--max-requests", "5", "--no-plot", "--quiet", "--requests-out", requests_out, "--out", out]) == 2
    assert said in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # refused before any work: nothing written
