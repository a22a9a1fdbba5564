"""A GPU's measured steps (``blockspace gpu-profile``'s file) against the
roofline of the same GPU and model: the difference the published points
cannot show, entered in docs/gpu.md when a GPU is lent.

Each step ``gpu-profile`` timed (its ``fit.points``: prefill tokens, decoding
sequences and their context) is predicted with ``clock.step_seconds`` on the
roofline of ``--gpu`` and ``--model`` at tensor parallelism 1, with the host
cost left out (``gpu-profile`` times the forward pass alone) and with the
tuned efficiencies. Prints a table, the median and worst error, and with
``--json`` writes them.

    python scripts/measured_vs_roofline.py --step-model step_model.json --gpu H200 --model llama-3.1-8b
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from blockspace.errors import BlockSpaceError
from blockspace.outputs import write_text
from blockspace.simulator import clock
from blockspace.simulator.gpus import gpu_named
from blockspace.simulator.models import model_named
from blockspace.simulator.roofline import Roofline
from blockspace.validation import read_json_object


def compared(points: list[dict[str, Any]], roof: Roofline) -> list[dict[str, Any]]:
    """Each measured step beside the roofline's time for it."""
    c = roof.coefficients(16)
    rows = []
    for point in points:
        prefill, decodes, context = point["prefill_tokens"], point["decode_seqs"], point["context"]
        pairs = clock.chunk_attention(0, prefill)
        predicted_ms = 1e3 * clock.step_seconds(
            clock.ROOFLINE, c, prefill, decodes, 1 if prefill else 0, decodes * context, 0, pairs, 0
        )
        measured_ms = point["measured_ms"]
        rows.append({**point, "roofline_ms": predicted_ms, "error": (predicted_ms - measured_ms) / measured_ms})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-model", type=Path, required=True, help="the file gpu-profile wrote")
    parser.add_argument("--gpu", required=True, help="the GPU it was measured on, as --gpu names it")
    parser.add_argument("--model", required=True, help="the model it timed, as --model names it")
    parser.add_argument("--json", type=Path, help="write the rows and the errors here")
    args = parser.parse_args(argv)
    try:
        document = read_json_object(args.step_model, "--step-model")
        points = document.get("fit", {}).get("points")
        if not points:
            raise BlockSpaceError(f"--step-model {args.step_model}: no fit.points (write it with gpu-profile)")
        roof = Roofline(gpu_named(args.gpu), model_named(args.model), host_overhead_ms=0.0)
    except BlockSpaceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = compared(points, roof)
    print(f"{'prefill':>8} {'decodes':>8} {'context':>8} {'measured ms':>12} {'roofline ms':>12} {'error':>7}")
    for row in rows:
        print(f"{row['prefill_tokens']:>8} {row['decode_seqs']:>8} {row['context']:>8} {row['measured_ms']:>12.3f}"
              f" {row['roofline_ms']:>12.3f} {row['error']:>+7.0%}")  # fmt: skip
    errors = [abs(row["error"]) for row in rows]
    figures = {"gpu": args.gpu, "model": args.model, "measured_on": document.get("measured_on"), "rows": rows,
               "median_error": statistics.median(errors), "worst_error": max(errors)}  # fmt: skip
    print(f"median error {figures['median_error']:.1%}, worst {figures['worst_error']:.1%} ({len(rows)} steps)")
    if args.json:
        write_text(args.json, json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
