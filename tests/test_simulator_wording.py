"""What ``blockspace simulate`` prints, word by word, where a newcomer found
it off (issue #51): counts without thousands separators, and a swept router
named twice in a search's header."""

from __future__ import annotations

from dataclasses import replace

from blockspace.reference import ReferenceBlockSpaceManager
from blockspace.simulator.cli import main as simulate
from blockspace.simulator.engines import replay
from blockspace.simulator.report import format_summary, warnings_for
from blockspace.simulator.simulation import SimulationConfig
from blockspace.simulator.summary import RequestCounts, summarize
from blockspace.workloads import parse_lines
from helpers import trace_lines


def test_every_count_of_the_summary_has_thousands_separators():
    trace = parse_lines(trace_lines(3).splitlines(), "three")
    summary = summarize(
        replay(trace, ReferenceBlockSpaceManager, SimulationConfig(num_gpu_blocks=64, num_cpu_blocks=0))
    )
    big = replace(summary, requests=RequestCounts(arrived=14_000, finished=1_200, ignored=12_031, aborted=1_500),
                  preemption=replace(summary.preemption, recompute=2_500, swap_out=3_100, swap_in=3_000))  # fmt: skip
    said = format_summary(big)
    assert "1,200 of 14,000 (12,031 ignored, 1,500 aborted)" in said
    assert "2,500 recompute, 3,100 swap out / 3,000 swap in" in said
    assert warnings_for(big) == ["most requests did not run (12,031 ignored, 1,500 aborted)"]
    big = replace(big, requests=replace(big.requests, finished=0))
    assert warnings_for(big)[0].startswith("no request finished (12,031 ignored as too large for the GPU, 1,500")


def test_a_swept_router_is_named_once_in_a_searchs_header(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text(trace_lines(4))
    argv = ["--trace", str(tmp_path / "t.jsonl"), "--manager", "reference", "--num-gpu-blocks", "64", "--workers", "1",
            "--find", "min-replicas", "--slo", "e2e=1000s", "--sweep", "router=round_robin,kv_aware", "--no-plot",
            "--quiet", "--out", str(tmp_path / "out")]  # fmt: skip
    assert simulate(argv) == 0
    headers = [line for line in capsys.readouterr().out.splitlines() if line.startswith("finding ")]
    assert len(headers) == 2
    for header, router in zip(headers, ("round_robin", "kv_aware")):
        assert header.count(router) == 1 and f"router={router}" in header, header
