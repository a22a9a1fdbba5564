"""``--find min-cost``, ``--gpu-cost`` per GPU and ``--seeds`` (issue #53): the cheapest
fleet on a tiny trace with a known answer, the ranking's ties and range ends, and a
search's answers over draws of the arrivals equal to each draw searched alone."""

from __future__ import annotations

import json

import pytest

from blockspace.simulator.cli import main as simulate
from blockspace.simulator.min_cost import CostAnswer, Option, cheapest, format_costs
from helpers import trace_lines

LOOSE = ["--slo", "e2e=1000s", "--target", "90"]  # every fleet of one replica keeps it


def option(gpu: str, tp: int, price: float, replicas: int | None, per_token: float | None = None,
           ends: tuple[int | None, int | None] = (None, None)) -> Option:  # fmt: skip
    return Option({"gpu": gpu, "tensor_parallel": tp}, gpu, tp, price, replicas, *ends, ends != (None, None), per_token)


def test_the_cheapest_fleet_is_replicas_times_gpus_times_the_price():
    options = [option("H100-SXM", 4, 3.0, 2), option("L40S", 4, 1.0, 5), option("L40S", 2, 1.0, None)]
    assert [o.dollars_per_hour(o.replicas) for o in options] == [24.0, 20.0, None]
    assert cheapest(options) is options[1]
    assert cheapest(options[2:]) is None  # none met the SLO


def test_a_tie_goes_to_the_fleet_that_drains_sooner_then_to_fewer_gpus():
    """Two fleets at $6 an hour: the one with the lower price a token (it finished the traffic sooner)."""
    one, two = option("H100-SXM", 1, 3.0, 2, per_token=3.57), option("H100-SXM", 2, 3.0, 1, per_token=3.07)
    assert cheapest([one, two]) is two
    assert cheapest([option("A", 1, 1.0, 4), option("B", 2, 1.0, 2)]).gpu == "A"  # no price a token: the first


def test_the_cheapest_at_each_end_of_the_clocks_range_is_named_where_it_differs():
    steady = option("H100-SXM", 4, 3.0, 2, ends=(2, 3))  # $24, $36 on the slower clock
    cheap_if_slow = option("L40S", 4, 1.0, 7, ends=(6, 8))  # $28, $32 on the slower clock
    answer = CostAnswer((steady, cheap_if_slow), (), steady, steady, cheap_if_slow, 0.115)
    said = format_costs(answer, "90% of requests within e2e=1000s")
    assert "min cost: H100-SXM x TP 4, 2 replica(s) (8 GPUs), $24.00 an hour" in said
    assert "with every step 11.5% longer (the clock's error), L40S x TP 4 is cheapest: 8 replica(s), $32.00" in said
    assert "shorter (the clock's error)" not in said  # the same configuration wins there
    assert "$24.00 to $36.00" in said and "$24.00 to $28.00" not in said


def test_min_cost_over_gpus_and_tensor_parallelism_on_a_tiny_trace(tmp_path, capsys):
    """Llama-3.1-70B fits neither GPU at TP 2 (65.7 GiB of weights a GPU); at TP 4 one replica
    keeps a loose SLO on either, and four L40S at $1 beat four H100s at $3."""
    (tmp_path / "trace.jsonl").write_text(trace_lines(4))
    argv = ["--trace", str(tmp_path / "trace.jsonl"), "--model", "llama-3.1-70b", "--sweep", "gpu=H100-SXM,L40S",
            "--sweep", "tensor_parallel=2,4", "--find", "min-cost", *LOOSE, "--gpu-cost", "H100-SXM=3,L40S=1",
            "--workers", "1", "--quiet", "--out", str(tmp_path / "out")]  # fmt: skip
    assert simulate(argv) == 0
    said = capsys.readouterr().out
    assert "min cost: L40S x TP 4, 1 replica(s) (4 GPUs), $4.00 an hour" in said
    document = json.loads((tmp_path / "out" / "capacity.json").read_text())
    found = document["min_cost"]
    assert [(o["gpu"], o["tensor_parallel"], o["replicas"]) for o in found["options"]] == [
        ("H100-SXM", 4, 1),
        ("L40S", 4, 1),
    ]
    assert found["cheapest"]["gpu"] == "L40S" and found["cheapest"]["dollars_per_gpu_hour"] == 1.0
    assert [s["values"]["tensor_parallel"] for s in found["skipped"]] == [2, 2]
    assert all("raise --tensor-parallel" in s["why"] for s in found["skipped"])
    assert [c["config"]["gpu_cost_per_hour"] for c in document["configurations"]] == [3.0, 1.0]
    assert (tmp_path / "out" / "cost.png").stat().st_size > 0


def test_seeds_range_over_the_answers_each_draw_gives_alone(tmp_path):
    """--seeds 3: the answer's range holds the fewest replicas of seeds 0, 1 and 2, each as a
    search of that seed alone finds it (this trace's draws need 3 to 6 replicas)."""
    (tmp_path / "trace.jsonl").write_text(trace_lines(16))
    argv = ["--trace", str(tmp_path / "trace.jsonl"), "--find", "min-replicas", "--slo", "ttft=25ms", "--target", "90",
            "--request-rate", "300", "--burstiness", "0.2", "--gpu", "H100-SXM", "--model", "llama-3.1-8b",
            "--workers", "1", "--no-plot", "--quiet"]  # fmt: skip

    def search(*more: str) -> dict:
        out = tmp_path / "-".join(more)
        assert simulate([*argv, *more, "--out", str(out)]) == 0
        return json.loads((out / "capacity.json").read_text())["configurations"][0]

    ranged = search("--seeds", "3")
    alone = [search("--seed", str(seed))["min_replicas"] for seed in range(3)]
    assert {key: ranged["seed_range"][key] for key in ("seeds", "answers")} == {"seeds": [0, 1, 2], "answers": alone}
    assert ranged["min_replicas"] == alone[0] and len(set(alone)) > 1


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--find", "min-cost", "--slo", "ttft=1s"], "--find min-cost needs --gpu-cost"),
        (["--gpu-cost", "H100-SXM=3", "--sweep", "gpu=H100-SXM,H200"], "has no price for --gpu H200"),
        (["--find", "min-cost", "--slo", "ttft=1s", "--gpu-cost", "3", "--gpu", "L40S", "--model", "llama-3.1-405b"],
         "--find min-cost: no configuration fits: --model llama-3.1-405b"),
        (["--seeds", "2", "--find", "max-rate", "--slo", "ttft=1s"], "--seeds goes with drawn arrivals"),
    ],
)  # fmt: skip
def test_what_min_cost_and_seeds_refuse(tmp_path, capsys, argv, said):
    assert simulate([*argv, "--no-plot", "--out", str(tmp_path / "out")]) == 2
    assert said in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_range_end_with_no_fleet_says_none_found_and_a_clock_without_a_range_says_nothing():
    slow_misses = option("H200", 4, 3.8, 31, ends=(17, None))
    said = format_costs(CostAnswer((slow_misses,), (), slow_misses, slow_misses, None, 0.115), "the SLO")
    assert "H200 x TP 4 31 124 $471.20 $258.40 to none found -" in " ".join(said.split())
    unranged = option("H200", 4, 3.8, 31)
    said = format_costs(CostAnswer((unranged,), (), unranged, None, None, None), "the SLO")
    assert "H200 x TP 4 31 124 $471.20 - -" in " ".join(said.split()) and "clock's error" not in said
