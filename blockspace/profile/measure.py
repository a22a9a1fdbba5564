"""Timing a step of the decoder stack, and a block swap, on one device.

Each figure is the median of ``repeats`` runs after ``warmup`` runs (the
first runs pick kernels, fill caches and grow the allocator). On a GPU a
run is timed with CUDA events around it, after a ``synchronize`` so that it
starts on an idle device: a step then takes as long as its kernels, or as
long as launching them when the launches are slower. On the CPU (``--device
cpu``, for development only) the wall clock times it, with torch on one
thread (``one_thread_on_cpu`` says why).
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from blockspace.errors import InvalidArgumentError
from blockspace.profile.model import DecoderStack
from blockspace.profile.plan import Step

SWAP_BLOCKS = 8  # blocks moved per timed swap, one copy each, so that a launch is not all that is timed


def check_device(name: str) -> torch.device:
    """The torch device ``--device`` names, when this machine has it."""
    if name == "cuda" and not torch.cuda.is_available():
        raise InvalidArgumentError(
            "--device cuda: torch finds no CUDA GPU here; --device cpu times the CPU instead (for development only)"
        )
    return torch.device(name)


def device_name(device: torch.device) -> str:
    """The device in words, for the file's provenance."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}), not a GPU"


@contextmanager
def one_thread_on_cpu(device: torch.device) -> Iterator[None]:
    """On the CPU, run torch on one thread while timing, then as it was.

    By default torch splits each op over a thread per core, and every op
    waits for the last of them. When another process holds one core, each op
    of a step then waits for that core's next time slice, for as long as the
    other process runs: on a 2-core machine, a 0.15 ms step of the tiny model
    measured 47 ms, in every one of its timed runs (so their median too), and
    the fit was 99.7% off on it. One thread only loses its core now and then,
    for a run or two, and the median leaves those out. A GPU's kernels do not
    run on these threads, so ``cuda`` is left as it is.
    """
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def median_ms(run: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Milliseconds ``run`` takes on ``device``: the median of ``repeats``, after ``warmup`` untimed runs."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            run()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def step_ms(stack: DecoderStack, step: Step, warmup: int, repeats: int) -> float:
    """Milliseconds one step of ``step``'s batch takes through ``stack``'s layers."""
    x = stack.inputs(step.prefill_tokens + step.decode_seqs)
    kv = stack.kv_cache(step.decode_seqs, step.context) if step.decode_seqs else None
    with torch.inference_mode():
        return median_ms(lambda: stack.step(x, step.prefill_tokens, kv), stack.device, warmup, repeats)


def swap_ms(block_bytes: int, device: torch.device, warmup: int, repeats: int) -> tuple[float, float]:
    """Milliseconds to move one block of ``block_bytes`` (in to the device, out
    to the host), each block one copy between the device and pinned host
    memory, as a swap moves it; on the CPU, between two host buffers."""
    pinned = device.type == "cuda"
    host = torch.empty(SWAP_BLOCKS, block_bytes, dtype=torch.uint8, pin_memory=pinned)
    on_device = torch.empty(SWAP_BLOCKS, block_bytes, dtype=torch.uint8, device=device)

    def swap_in() -> None:
        for block in range(SWAP_BLOCKS):
            on_device[block].copy_(host[block], non_blocking=pinned)

    def swap_out() -> None:
        for block in range(SWAP_BLOCKS):
            host[block].copy_(on_device[block], non_blocking=pinned)

    return (
        median_ms(swap_in, device, warmup, repeats) / SWAP_BLOCKS,
        median_ms(swap_out, device, warmup, repeats) / SWAP_BLOCKS,
    )


__all__ = ["SWAP_BLOCKS", "check_device", "device_name", "median_ms", "one_thread_on_cpu", "step_ms", "swap_ms"]
