"""The roofline clock against published measurements: tune its knobs on
half of the points, report its error on the other half.

Why: a clock derived from datasheets and a model's shape is only as good
as its efficiencies and its host cost. They are tuned here on measurements
nobody here produced (``docs/measurements/published_points.json``, read in
docs/measurements/2026-12-06-roofline.md: vendors' tables, engines'
benchmarks, each cited), and the error that matters is the
one on the held-out half, which the tuning never sees.

What is predicted, with ``clock.step_seconds`` on the roofline's
coefficients (the very function both engines call):

* a lone request (batch 1): its TTFT is one prefill step of its prompt; its
  ITL the decode step at the middle of its output; its end-to-end latency
  the TTFT and every decode step after it;
* a fixed batch of B requests: one prefill step of all their prompts, then
  a decode step of B sequences per output token; the end-to-end latency is
  their sum, the throughput B x output tokens over it (per GPU where the
  source gives it per GPU).

Decode steps are evaluated at ``SAMPLES`` evenly spread output positions
and summed as the trapezoid rule does (the step time grows smoothly with the
context). Offline-throughput points give no batch size, and FP4 has no
datasheet peak here: both are listed as not predicted. Points are split by
their sorted ids, alternately: tune, held out.

    python scripts/roofline_check.py [--points FILE] [--markdown OUT.md] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockspace.outputs import write_text
from blockspace.simulator import clock
from blockspace.simulator.gpus import gpu_named
from blockspace.simulator.models import model_named
from blockspace.simulator.roofline import Roofline

POINTS = Path(__file__).resolve().parent.parent / "docs" / "measurements" / "published_points.json"
SAMPLES = 64  # decode positions evaluated per output
GRID = {  # the knobs tuned, and the values tried
    "compute_efficiency": (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    "bandwidth_efficiency": (0.5, 0.6, 0.7, 0.8, 0.9, 0.95),
    "host_overhead_ms": (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0),
}
# A point's model and GPU as the sources name them, to the built-in names (matched in order, case aside)
MODELS = (("405b", "llama-3.1-405b"), ("llama-2-70b", "llama-2-70b"), ("llama2-70b", "llama-2-70b"),
          ("llama 70b", "llama-2-70b"), ("llama_70b", "llama-2-70b"), ("llama-2-7b", "llama-2-7b"),
          ("llama 7b", "llama-2-7b"), ("70b", "llama-3.1-70b"), ("mixtral-8x7b", "mixtral-8x7b"),
          ("8b", "llama-3.1-8b"))  # fmt: skip
GPUS = (("h100", "H100-SXM"), ("h200", "H200"), ("a100", "A100-80GB-SXM"), ("l40s", "L40S"), ("mi300x", "MI300X"),
        ("b200", "B200"))  # fmt: skip


@dataclass(frozen=True)
class Prediction:
    """One published figure of a point, and the clock's."""

    point: str
    engine: str
    metric: str
    published: float
    predicted: float

    @property
    def error(self) -> float:
        """Relative: (predicted - published) / published."""
        return (self.predicted - self.published) / self.published


def named(text: str, table: tuple[tuple[str, str], ...]) -> str | None:
    lowered = text.lower()
    return next((name for key, name in table if key in lowered), None)


FAMILIES = ("vLLM", "TensorRT-LLM", "other")  # the engines whose points are reported apart


def family_of(engine: str) -> str:
    """vLLM's points (the engine the simulator follows) apart from TensorRT-LLM's and the rest."""
    return next((family for family in FAMILIES[:-1] if family.lower() in engine.lower()), FAMILIES[-1])


def roofline_for(point: dict[str, Any], knobs: dict[str, float]) -> Roofline | None:
    """The point's configuration as a roofline, or None where it cannot be one."""
    gpu, model = named(point["gpu"], GPUS), named(point["model"], MODELS)
    dtype = point["dtype"].split()[0].lower()
    dtype = {"auto": "bf16", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8"}.get(dtype)
    if gpu is None or model is None or dtype is None:
        return None
    return Roofline(gpu_named(gpu), model_named(model), point["tensor_parallel"], dtype, **knobs)


def step(c: tuple[float, ...], prefill: int = 0, decodes: int = 0, seqs: int = 0, context: int = 0,
         pairs: int = 0) -> float:  # fmt: skip
    """One step of the clock: ``prefill`` tokens in ``seqs`` chunks with ``pairs`` attention pairs, ``decodes``."""
    return clock.step_seconds(clock.ROOFLINE, c, prefill, decodes, seqs, context, 0, pairs, 0)


def decoding(c: tuple[float, ...], batch: int, prompt: int, outputs: int) -> float:
    """Seconds of the decode steps after the first token: ``outputs - 1`` steps of ``batch`` sequences."""
    steps = outputs - 1
    if steps <= 0:
        return 0.0
    positions = sorted({round(1 + k * (steps - 1) / (SAMPLES - 1)) for k in range(SAMPLES)}) if steps > 1 else [1]
    times = [step(c, decodes=batch, context=batch * (prompt + i)) for i in positions]
    if len(positions) == 1:
        return times[0] * steps
    area = sum((b - a) * (ta + tb) / 2 for a, b, ta, tb in zip(positions, positions[1:], times, times[1:]))
    return area + (times[0] + times[-1]) / 2  # the trapezoid's ends: one step each


def predict(point: dict[str, Any], roof: Roofline) -> dict[str, float]:
    """The point's published metrics as the clock predicts them, in its units."""
    scenario = point["scenario"]
    prompt, outputs, batch = scenario["input_tokens"], scenario["output_tokens"], scenario["batch_or_concurrency"]
    c = roof.coefficients(16)
    prefill = step(c, prefill=batch * prompt, seqs=batch, pairs=batch * clock.chunk_attention(0, prompt))
    e2e = prefill + decoding(c, batch, prompt, outputs)
    per = point["num_gpus"] if point.get("throughput_per") == "gpu" else 1
    return {
        "ttft_ms": 1e3 * prefill,
        "itl_ms": 1e3 * step(c, decodes=batch, context=batch * (prompt + outputs // 2)),
        "tpot_ms": 1e3 * (e2e - prefill) / max(outputs - 1, 1),
        "e2e_ms": 1e3 * e2e,
        "output_tokens_per_s": batch * outputs / e2e / per,
    }


def predictable(point: dict[str, Any]) -> bool:
    scenario = point["scenario"]
    return (
        scenario["kind"] in ("lone_request", "fixed_batch")
        and scenario["batch_or_concurrency"] is not None
        and scenario["input_tokens"] is not None
        and roofline_for(point, {}) is not None
    )


def predictions(points: list[dict[str, Any]], knobs: dict[str, float]) -> list[Prediction]:
    made = []
    for point in points:
        roof = roofline_for(point, knobs)
        assert roof is not None  # predictable
        guessed = predict(point, roof)
        for metric, value in point["published"].items():
            if value is not None and metric in guessed:
                made.append(Prediction(point["id"], point["engine"], metric, float(value), guessed[metric]))
    return made


def median_error(made: list[Prediction]) -> float:
    return statistics.median(abs(p.error) for p in made)


def log_error(made: list[Prediction]) -> float:
    """The mean of |log(predicted / published)|: every figure counts, an
    over- and an under-prediction by the same factor alike."""
    return statistics.fmean(abs(math.log(p.predicted / p.published)) for p in made)


def tune(points: list[dict[str, Any]]) -> dict[str, float]:
    """The grid's knobs with the least mean log error on ``points`` (not
    the median: one figure decides a median, and a fine grid then fits the
    tuning half's middle figure rather than the clock)."""
    best: tuple[float, dict[str, float]] | None = None
    for values in itertools.product(*GRID.values()):
        knobs = dict(zip(GRID, values))
        error = log_error(predictions(points, knobs))
        if best is None or error < best[0]:
            best = (error, knobs)
    assert best is not None
    return best[1]


def report(points: list[dict[str, Any]]) -> dict[str, Any]:
    usable = sorted((p for p in points if predictable(p)), key=lambda p: p["id"])
    tuning, held_out = usable[0::2], usable[1::2]
    knobs = tune(tuning)
    sets = {"tune": predictions(tuning, knobs), "held_out": predictions(held_out, knobs)}
    summary = {
        name: {"points": len({p.point for p in made}), "figures": len(made), "median_error": median_error(made),
               "worst_error": max((abs(p.error) for p in made), default=0.0)}
        for name, made in sets.items()
    }  # fmt: skip
    families = {family: [p for p in sets["held_out"] if family_of(p.engine) == family] for family in FAMILIES}
    families = {family: made for family, made in families.items() if made}
    return {
        "knobs": knobs,
        "summary": summary,
        "held_out_by_engine": {
            family: {"figures": len(made), "median_error": median_error(made)} for family, made in families.items()
        },
        "predictions": {name: [{**p.__dict__, "error": p.error} for p in made] for name, made in sets.items()},
        "not_predicted": [p["id"] for p in points if not predictable(p)],
    }


def markdown(result: dict[str, Any]) -> str:
    lines = ["| set | point | engine | metric | published | predicted | error |", "|---|---|---|---|---:|---:|---:|"]
    for name, made in result["predictions"].items():
        for p in made:
            lines.append(f"| {name} | {p['point']} | {p['engine']} | {p['metric']} | {p['published']:,.4g} | "
                         f"{p['predicted']:,.4g} | {p['error']:+.0%} |")  # fmt: skip
    for name, figures in result["summary"].items():
        lines.append(f"\n{name}: {figures['points']} points, {figures['figures']} figures, median error "
                     f"{figures['median_error']:.1%}, worst {figures['worst_error']:.1%}")  # fmt: skip
    for family, figures in result["held_out_by_engine"].items():
        lines.append(f"held out, {family}: {figures['figures']} figures, median error {figures['median_error']:.1%}")
    lines.append(f"\nknobs tuned: {result['knobs']}; not predicted: {', '.join(result['not_predicted'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=Path, default=POINTS)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    try:
        points = json.loads(args.points.read_text())["points"]
    except (OSError, ValueError, KeyError) as error:
        print(f"error: --points {args.points}: {error}", file=sys.stderr)
        return 2
    result = report(points)
    text = markdown(result)
    print(text)
    if args.markdown:
        write_text(args.markdown, text + "\n")
    if args.json:
        write_text(args.json, json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
