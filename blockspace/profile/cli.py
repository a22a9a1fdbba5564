"""``blockspace gpu-profile``: measure the simulator's step-time model on
this machine's GPU and write it to a file for ``blockspace simulate
--step-model``.

It builds a Llama-shaped decoder stack with random weights (by default
Llama-3-8B's 32 layers in BF16), times prefill, decode and mixed steps of
growing sizes and the swap of one KV block, fits the simulator's five
coefficients to the timings by least squares, and writes them with where
they came from. docs/simulator.md describes the file, docs/gpu.md the method.

A fit that misses a timed step by more than ``--max-fit-error`` is not
written: the steps are timed again (``--attempts`` times in all, each step
keeping its fastest median, since noise only ever adds time), and if the
fit is still that far off the command prints the steps and exits 1.

Every option and the output path are checked before anything is built or
timed; torch (the [gpu] extra) is needed only to run, not for ``--help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blockspace.errors import BlockSpaceError, InvalidArgumentError, InvalidConfigError
from blockspace.extras import require
from blockspace.profile.fit import StepFit, fit_steps, relative_errors
from blockspace.profile.plan import DTYPE_BYTES, ModelShape, Step, plan_steps
from blockspace.simulator.gpu import StepTimeModel
from blockspace.simulator.step_model import save_step_model
from blockspace.validation import Range, check_output_file, check_ranges, command_parser, refuse

if TYPE_CHECKING:
    import torch

RANGES = {
    "num_layers": Range(least=1),
    "hidden_size": Range(least=1),
    "num_heads": Range(least=1),
    "num_kv_heads": Range(least=1),
    "intermediate_size": Range(least=1),
    "block_size": Range(least=1),
    "layers_to_time": Range(least=1),
    "max_prefill_tokens": Range(least=1),
    "max_batch": Range(least=1),
    "max_context": Range(least=1),
    "repeats": Range(least=1),
    "warmup": Range(least=0),
    "max_fit_error": Range(above=0),
    "attempts": Range(least=1),
}
CPU_NOTE = "--device cpu: timed on the CPU on one thread, for development and tests only; not a GPU's step times"
# A fit that misses a step by more is refused. Noise misses by 90% and more (a step timed ten times too slow);
# the linear model misses the tiny CPU model of the docs and tests by up to 25%, which is no reason to refuse it.
MAX_FIT_ERROR = 0.5


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("blockspace gpu-profile", __doc__)
    parser.add_argument("--out", metavar="FILE", default="step_model.json", help="the step-model file to write")
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="where to time; cpu is for development only"
    )
    model = parser.add_argument_group("the model (default: Llama-3-8B)")
    model.add_argument("--num-layers", type=int, default=ModelShape.num_layers, help="decoder layers")
    model.add_argument("--hidden-size", type=int, default=ModelShape.hidden_size, help="model width")
    model.add_argument("--num-heads", type=int, default=ModelShape.num_heads, help="query heads")
    model.add_argument("--num-kv-heads", type=int, default=ModelShape.num_kv_heads, help="key/value heads")
    model.add_argument("--intermediate-size", type=int, default=ModelShape.intermediate_size, help="width of the MLP")
    model.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default=ModelShape.dtype, help="weights and KV cache")
    model.add_argument("--block-size", type=int, default=16, help="tokens per KV block (what one swap moves)")
    timing = parser.add_argument_group("what is timed")
    timing.add_argument(
        "--layers-to-time",
        type=int,
        metavar="K",
        help="build and time K layers, and scale their times to --num-layers (default: all of them)",
    )
    timing.add_argument("--max-prefill-tokens", type=int, default=2048, help="the largest prompt of a prefill step")
    timing.add_argument("--max-batch", type=int, default=256, help="the most decoding sequences in a step")
    timing.add_argument("--max-context", type=int, default=4096, help="the longest context of a decoding sequence")
    timing.add_argument("--repeats", type=int, default=10, help="timed runs of each step; the median is kept")
    timing.add_argument("--warmup", type=int, default=3, help="untimed runs before them")
    timing.add_argument(
        "--max-fit-error",
        type=float,
        default=MAX_FIT_ERROR,
        metavar="SHARE",
        help="the most the fit may miss any timed step by, as a share of its time (0.5: 50%%);"
        " beyond it the steps are timed again, and nothing is written if it stays beyond",
    )
    timing.add_argument(
        "--attempts", type=int, default=3, help="times to time every step, at most, while the fit misses by more"
    )
    return parser


def checked_shape(args: argparse.Namespace) -> ModelShape:
    """The model the options describe, when its dimensions fit together."""
    if args.hidden_size % args.num_heads:
        raise InvalidArgumentError(
            f"--hidden-size {args.hidden_size} must be a multiple of --num-heads ({args.num_heads})"
        )
    if args.num_heads % args.num_kv_heads:
        raise InvalidArgumentError(
            f"--num-heads {args.num_heads} must be a multiple of --num-kv-heads ({args.num_kv_heads})"
        )
    if args.layers_to_time is not None and args.layers_to_time > args.num_layers:
        raise InvalidArgumentError(
            f"--layers-to-time {args.layers_to_time} must be <= --num-layers ({args.num_layers})"
        )
    return ModelShape(
        args.num_layers, args.hidden_size, args.num_heads, args.num_kv_heads, args.intermediate_size, args.dtype
    )


def profile(args: argparse.Namespace, shape: ModelShape, layers: int, device: torch.device) -> dict[str, Any]:
    """Time the planned steps through ``layers`` layers, and a block swap, on
    ``device``; the figures (each step's time scaled to ``shape.num_layers``)
    and the fit to them.

    While the fit misses a step by more than ``--max-fit-error``, every step
    is timed again, up to ``--attempts`` times in all, and keeps the fastest
    of its medians: a disturbance (another process, a clock that has not
    ramped up yet) only ever makes a run slower, and seldom hits the same
    step twice, so the minimum is the step's own time.
    """
    from blockspace.profile.measure import one_thread_on_cpu, step_ms, swap_ms
    from blockspace.profile.model import DecoderStack

    steps = plan_steps(args.max_prefill_tokens, args.max_batch, args.max_context)
    with one_thread_on_cpu(device):
        stack = DecoderStack(shape, layers, device)
        times = [math.inf] * len(steps)
        attempt = 1
        while True:
            again = [step_ms(stack, step, args.warmup, args.repeats) * shape.num_layers / layers for step in steps]
            times = [min(before, now) for before, now in zip(times, again)]
            fit = fit_steps(steps, times)
            worst = max(relative_errors(fit, steps, times))
            if worst <= args.max_fit_error or attempt == args.attempts:
                break
            attempt += 1
            print(
                f"the fit misses a step by {worst:.1%} (over --max-fit-error {args.max_fit_error:g}):"
                f" timing every step again ({attempt} of {args.attempts})",
                flush=True,
            )
        swap_in, swap_out = swap_ms(shape.block_bytes(args.block_size), device, args.warmup, args.repeats)
    return {
        "layers_timed": layers,
        "steps": steps,
        "times_ms": times,
        "fit": fit,
        "attempts": attempt,
        "swap_in_ms": swap_in,
        "swap_out_ms": swap_out,
    }


def provenance(
    args: argparse.Namespace, shape: ModelShape, measured_on: str, figures: dict[str, Any]
) -> dict[str, Any]:
    """Where the coefficients come from, as the file keeps it."""
    fit = figures["fit"]
    source = f"blockspace gpu-profile {version('blockspace')}, torch {version('torch')}"
    errors = relative_errors(fit, figures["steps"], figures["times_ms"])
    points = [
        {**step._asdict(), "measured_ms": round(time, 4), "fitted_ms": round(fit.predict_ms(step), 4)}
        for step, time in zip(figures["steps"], figures["times_ms"])
    ]
    return {
        "source": source + (f"; {CPU_NOTE}" if args.device == "cpu" else ""),
        "measured_on": measured_on,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": {
            **dataclasses.asdict(shape),
            "head_dim": shape.head_dim,
            "block_size": args.block_size,
            "block_bytes": shape.block_bytes(args.block_size),
            "layers_timed": figures["layers_timed"],
        },
        "fit": {
            "method": "least squares of relative errors, coefficients >= 0",
            "repeats": args.repeats,
            "warmup": args.warmup,
            "attempts": figures["attempts"],
            "max_fit_error": args.max_fit_error,
            "max_relative_error": round(max(errors), 4),
            "points": points,
            "swap_in_ms": round(figures["swap_in_ms"], 6),
            "swap_out_ms": round(figures["swap_out_ms"], 6),
        },
    }


def report(model: StepTimeModel, steps: list[Step], times: list[float], fit: StepFit) -> str:
    """The table of timed steps against the fit, and the coefficients."""
    lines = [f"{'prefill':>8} {'decode':>7} {'context':>8} {'measured ms':>12} {'fitted ms':>10} {'error':>7}"]
    for step, time, error in zip(steps, times, relative_errors(fit, steps, times)):
        lines.append(
            f"{step.prefill_tokens:>8} {step.decode_seqs:>7} {step.context:>8} {time:>12.3f}"
            f" {fit.predict_ms(step):>10.3f} {error:>7.1%}"
        )
    lines.append("")
    lines += [f"{name:<18} {value:10.3f}" for name, value in dataclasses.asdict(model).items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; 2 for a bad option, an unwritable --out, no torch or no
    such device (said before anything is built or timed); 1 when the
    measurement fails."""
    try:
        args = build_parser().parse_args(argv)
        check_ranges(args, RANGES)
        shape = checked_shape(args)
        check_output_file(args.out, "--out")
        require("gpu", "blockspace gpu-profile", "torch")
        from blockspace.profile.measure import check_device, device_name

        device = check_device(args.device)
    except BlockSpaceError as error:
        return refuse(error)
    measured_on = device_name(device)
    layers = args.layers_to_time or shape.num_layers
    print(
        f"blockspace gpu-profile: {measured_on}, {layers} of {shape.num_layers} layers timed, {shape.dtype};"
        f" median of {args.repeats} runs after {args.warmup}",
        flush=True,
    )
    try:
        figures = profile(args, shape, layers, device)
        fit, steps, times = figures["fit"], figures["steps"], figures["times_ms"]
        model = fit.step_time_model((figures["swap_in_ms"] + figures["swap_out_ms"]) / 2)
    except (RuntimeError, InvalidConfigError) as error:  # torch's errors (out of memory among them), an empty fit
        said = str(error).strip().splitlines() or [type(error).__name__]
        return refuse(f"the measurement failed: {said[0]}", 1)
    except KeyboardInterrupt:
        return refuse("interrupted", 130)
    print(report(model, steps, times, fit))
    errors = relative_errors(fit, steps, times)
    if max(errors) > args.max_fit_error:
        return refuse(fit_too_far(args, steps[errors.index(max(errors))], max(errors), figures["attempts"]), 1)
    Path(args.out).absolute().parent.mkdir(parents=True, exist_ok=True)  # checked to be possible before the work
    save_step_model(model, args.out, provenance(args, shape, measured_on, figures))
    print(f"wrote {args.out}" + (f" ({CPU_NOTE})" if args.device == "cpu" else ""))
    return 0


def fit_too_far(args: argparse.Namespace, step: Step, error: float, attempts: int) -> str:
    """Why no file is written: the step the fit misses most, by how much, and what to try."""
    timed = "once" if attempts == 1 else f"{attempts} times"
    return (
        f"the fit misses the step of prefill {step.prefill_tokens}, decode {step.decode_seqs}, context"
        f" {step.context} by {error:.1%}, over --max-fit-error {args.max_fit_error:g}, with every step timed {timed}:"
        f" {args.out} not written. Time again on an idle machine, or with more --repeats or --attempts; if the"
        " same steps are off every time, the linear step model does not describe this device at these sizes,"
        " and a larger --max-fit-error accepts the fit as it is"
    )


if __name__ == "__main__":
    sys.exit(main())
