"""``blockspace gpu-bench``: the CUDA kernels against vLLM v0's way, in one bounded run.

(a) Block table sync + slot mapping for a decode batch (default 1,024
    sequences, a token each per step, a few finishing and replaced each step):
    :class:`DeviceBlockTable` fed by recorded deltas, against rebuilding the
    padded table and the slot list from Python lists and copying them to the
    device as vLLM v0's model runner does (``make_tensor_with_pad``,
    ``async_tensor_h2d``). Target on an H200: <= 20 us per step.
(b) KV block copies (copy-on-write) and swaps (GPU <-> pinned CPU) with
    :class:`BlockMover` (one kernel launch for all layers), against torch's
    ``index_select``/``index_copy_`` and a ``copy_`` per block per tensor (vLLM
    v0's swap loop), and against the device's memory bandwidth (its peak from
    the memory clock and bus width, and a large contiguous ``copy_``). Target:
    >= 80% of the memory bandwidth for blocks of >= 1 MiB per layer tensor.

GPU times come from CUDA events, after a warm-up that includes compilation.
Without a GPU it says so and runs a tiny CPU-only version, labelled as such.
It prints a table and, with ``--json PATH``, writes every figure. Its own
checks (the table and slots equal vLLM v0's, each kernel moved the right
bytes) make the exit status 1 when one fails: figures of a wrong answer.
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import numpy as np
import torch

from blockspace.bench.gpu_options import RANGES, build_parser
from blockspace.errors import BlockSpaceError
from blockspace.fast.device_table import DeviceBlockTable, gpu_available
from blockspace.fast.kv_copy import BlockMover, move_blocks_torch
from blockspace.fast.table_deltas import TableDeltas
from blockspace.validation import check_output_file, check_ranges, refuse, write_output

TABLE_TARGET_US = 20.0
BANDWIDTH_TARGET = 0.80
MIB = 2**20


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Versions, and the GPU with its peak memory bandwidth when there is one."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "numpy": np.__version__,
        "numba": _version("numba"),
        "numba_cuda": _version("numba-cuda"),
        "gpu": None,
    }
    if not gpu_available():
        return info
    from numba import cuda

    props = torch.cuda.get_device_properties(0)
    gpu: dict[str, Any] = {
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
    }
    try:
        clock_khz = getattr(props, "memory_clock_rate", None)  # torch >= 2.6 reports them...
        bus_bits = getattr(props, "memory_bus_width", None)
        if not (clock_khz and bus_bits):  # ...else ask the driver through Numba
            device = cuda.get_current_device()
            clock_khz, bus_bits = device.MEMORY_CLOCK_RATE, device.GLOBAL_MEMORY_BUS_WIDTH
        gpu["memory_clock_mhz"] = clock_khz / 1000
        gpu["memory_bus_bits"] = bus_bits
        gpu["peak_bandwidth_gbs"] = round(2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, 1)  # double data rate
    except Exception as error:  # an attribute this driver does not report
        gpu["peak_bandwidth_error"] = repr(error)
    try:
        gpu["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        gpu["driver"] = None
    try:
        gpu["cuda_driver_api"] = ".".join(map(str, cuda.cudadrv.driver.driver.get_version()))
    except Exception:
        gpu["cuda_driver_api"] = None
    info["gpu"] = gpu
    return info


# ---------------------------------------------------------------------------
# (a) block tables and slot mapping
# ---------------------------------------------------------------------------


class DecodeWorkload:
    """``num_seqs`` sequences decoding one token per step. A sequence gets a
    new block when its last one is full; ``churn`` sequences a step finish and
    a new one (a 256..4,096-token prompt) takes the freed row. It keeps the
    Python lists vLLM v0 works from and records the same changes as deltas."""

    def __init__(self, num_seqs: int, block_size: int, churn: int = 2, seed: int = 0):
        self.block_size = block_size
        self.churn = churn
        self.rng = random.Random(seed)
        self.deltas = TableDeltas(num_rows=num_seqs, num_cols=64)
        self.blocks: list[list[int]] = []
        self.lens = np.zeros(num_seqs, np.int64)
        self.rows = np.arange(num_seqs, dtype=np.int64)
        self._next_block = 0
        for _ in range(num_seqs):
            self.blocks.append([])
            self._admit(self.deltas.acquire_row())

    def _new_block(self) -> int:
        self._next_block = self._next_block % 1_000_000 + 1
        return self._next_block

    def _admit(self, row: int) -> None:
        num_tokens = self.rng.randint(256, 4096)
        self.blocks[row] = [self._new_block() for _ in range(-(-num_tokens // self.block_size))]
        for block in self.blocks[row]:
            self.deltas.append(row, block)
        self.lens[row] = num_tokens

    def advance(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step's changes; returns the scheduled ``(rows, starts, ends)``."""
        for _ in range(self.churn):
            row = self.rng.randrange(len(self.blocks))
            self.deltas.release_row(row)
            self._admit(self.deltas.acquire_row())
        for row in np.flatnonzero(self.lens % self.block_size == 0).tolist():
            block = self._new_block()
            self.blocks[row].append(block)
            self.deltas.append(row, block)
        self.lens += 1
        return self.rows, self.lens - 1, self.lens.copy()


def vllm_v0_step(workload: DecodeWorkload, device: torch.device, pin: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The block tables and slot mapping as vLLM v0 builds them each step:
    padded rows from the lists (``make_tensor_with_pad``), slots in a Python
    loop, both copied to the device (``async_tensor_h2d``)."""
    block_size = workload.block_size
    tables = workload.blocks
    width = max(len(blocks) for blocks in tables)
    padded = np.zeros((len(tables), width), dtype=np.int32)
    for i, blocks in enumerate(tables):
        padded[i, : len(blocks)] = blocks
    slots = []
    for blocks, length in zip(tables, workload.lens.tolist()):
        pos = length - 1
        slots.append(blocks[pos // block_size] * block_size + pos % block_size)
    table = torch.from_numpy(padded)
    slot_tensor = torch.tensor(slots, dtype=torch.long, pin_memory=pin)
    if pin:
        table = table.pin_memory()
    return table.to(device, non_blocking=True), slot_tensor.to(device, non_blocking=True)


def device_work_per_step(table: DeviceBlockTable, steps: list) -> dict | None:
    """The GPU's own time per step (the upload and the kernel, gaps left out),
    from torch's profiler, which sees Numba's kernels too; None where it fails."""
    try:
        from torch.profiler import DeviceType, ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for delta, rows, starts, ends in steps:
                table.step(delta, rows, starts, ends)
            torch.cuda.synchronize()
        by_name: dict[str, float] = {}
        for event in prof.events():
            if event.device_type == DeviceType.CUDA:
                by_name[event.name] = by_name.get(event.name, 0.0) + event.time_range.elapsed_us()
        total = sum(by_name.values())
        top = sorted(by_name.items(), key=lambda item: -item[1])[:5]
        return {
            "us_per_step": round(total / len(steps), 2),
            "steps": len(steps),
            "top": {name[:80]: round(us / len(steps), 2) for name, us in top},
        }
    except Exception as error:
        print(f"    (profiler unavailable: {error!r})")
        return None


def bench_tables(num_seqs: int, num_steps: int, block_size: int, on_gpu: bool) -> dict:
    device = torch.device("cuda" if on_gpu else "cpu")
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)

    ours = DecodeWorkload(num_seqs, block_size)
    table = DeviceBlockTable(block_size, max_seqs=num_seqs, max_blocks=512, backend="cuda" if on_gpu else "cpu")
    table.sync(ours.deltas.drain())  # the initial tables
    for _ in range(5):  # warm-up, compilation included
        schedule = ours.advance()
        table.step(ours.deltas.drain(), *schedule)
    sync()
    steps = []  # recorded up front: the manager records deltas as it works, that is not timed here
    for _ in range(2 * num_steps):
        schedule = ours.advance()
        steps.append((ours.deltas.drain(), *schedule))
    num_entries = [delta.num_entries for delta, *_ in steps]

    events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if on_gpu else None
    if events is not None:
        events[0].record()
    begin = time.perf_counter()
    for delta, rows, starts, ends in steps[:num_steps]:  # pipelined, as a serving loop runs
        table.step(delta, rows, starts, ends)
    if events is not None:
        events[1].record()
    sync()
    pipelined_us = (time.perf_counter() - begin) / num_steps * 1e6
    device_us = events[0].elapsed_time(events[1]) * 1e3 / num_steps if events is not None else None

    profiled = device_work_per_step(table, steps[num_steps : num_steps + 50]) if on_gpu else None

    latencies = []
    for delta, rows, starts, ends in steps[num_steps + (50 if on_gpu else 0) :]:  # each step waited for
        begin = time.perf_counter()
        slots = table.step(delta, rows, starts, ends)
        sync()
        latencies.append((time.perf_counter() - begin) * 1e6)

    baseline = DecodeWorkload(num_seqs, block_size)  # same seed: the same sequences, step by step
    for _ in range(5 + num_steps):
        baseline.advance()
    baseline_latencies = []
    for _ in range(num_steps):
        baseline.advance()
        begin = time.perf_counter()
        _, baseline_slots = vllm_v0_step(baseline, device, pin=on_gpu)
        sync()
        baseline_latencies.append((time.perf_counter() - begin) * 1e6)

    rows_now = np.arange(num_seqs)
    rebuilt = np.zeros(tuple(table.table.shape), np.int32)
    for row, blocks in enumerate(baseline.blocks):
        rebuilt[row, : len(blocks)] = blocks
    return {
        "num_seqs": num_seqs,
        "num_steps": num_steps,
        "block_size": block_size,
        "mean_changed_cells_per_step": round(statistics.mean(num_entries), 1),
        "ours_pipelined_us_per_step": round(pipelined_us, 2),
        "ours_device_us_per_step": None if device_us is None else round(device_us, 2),
        "ours_device_work_us_per_step": None if profiled is None else profiled["us_per_step"],
        "ours_device_work": profiled,
        "ours_latency_us_median": round(statistics.median(latencies), 2),
        "vllm_v0_latency_us_median": round(statistics.median(baseline_latencies), 2),
        "speedup_latency": round(statistics.median(baseline_latencies) / statistics.median(latencies), 1),
        "slots_equal": bool(torch.equal(slots.cpu(), baseline_slots.cpu())),
        "table_equal": bool(np.array_equal(table.table.cpu().numpy()[rows_now], rebuilt[rows_now])),
        "target_us": TABLE_TARGET_US,
        "meets_target": on_gpu and pipelined_us <= TABLE_TARGET_US,
    }


# ---------------------------------------------------------------------------
# (b) KV block copies and swaps
# ---------------------------------------------------------------------------


def _caches(
    num_layers: int, num_blocks: int, block_shape: tuple[int, ...], dtype: torch.dtype, device: str, pin: bool = False
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    def tensor() -> torch.Tensor:
        made = torch.empty((num_blocks, *block_shape), dtype=dtype, device=device, pin_memory=pin)
        return made.view(torch.uint8).random_().view(dtype) if made.element_size() == 1 else made.normal_()

    return [(tensor(), tensor()) for _ in range(num_layers)]


def _time(fn: Callable[[], object], repeats: int, on_gpu: bool) -> float:
    """Seconds per call, after one untimed call."""
    fn()
    if on_gpu:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / repeats
    begin = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - begin) / repeats


def _per_block_copies(src: list[torch.Tensor], dst: list[torch.Tensor], pairs: list[tuple[int, int]]) -> None:
    """vLLM v0's swap: one ``copy_`` (a ``cudaMemcpyAsync``) per block per tensor."""
    for source, target in zip(src, dst):
        for s, d in pairs:
            target[d].copy_(source[s], non_blocking=True)


def measured_copy_bandwidth(on_gpu: bool, num_bytes: int) -> float:
    """GB/s (bytes read + written) of one large contiguous ``copy_``."""
    device = "cuda" if on_gpu else "cpu"
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _time(lambda: dst.copy_(src), 10, on_gpu)
    return 2 * num_bytes / seconds / 1e9


def measure_move(
    src_caches: list[tuple[torch.Tensor, torch.Tensor]],
    dst_caches: list[tuple[torch.Tensor, torch.Tensor]],
    pairs: list[tuple[int, int]],
    repeats: int,
    on_gpu: bool,
    counted_bytes: int,
) -> dict[str, Any]:
    """One move three ways (our kernel, torch indexing, a copy_ per block), each
    in GB/s of ``counted_bytes`` per move; the kernel checked first, on
    contents that differ."""
    from blockspace.fast.kv_copy import block_tensors

    src, dst = block_tensors(src_caches), block_tensors(dst_caches)
    mover = BlockMover(src_caches, dst_caches, backend="cuda" if on_gpu else "torch")
    mover.move(pairs)
    if on_gpu:
        torch.cuda.synchronize()
    correct = all(torch.equal(d_t[d], s_t[s].to(d_t.device)) for s_t, d_t in zip(src, dst) for s, d in pairs)
    pair_array = np.array(pairs, dtype=np.int64)
    seconds = {
        "kernel": _time(lambda: mover.move(pairs), repeats, on_gpu),
        "torch_index": _time(lambda: move_blocks_torch(src, dst, pair_array), repeats, on_gpu),
        "copy_per_block": _time(lambda: _per_block_copies(src, dst, pairs), 2, on_gpu),
    }
    row: dict[str, Any] = {"backend": mover.backend, "kernel_correct": correct}
    for name, value in seconds.items():
        row[f"{name}_ms"] = round(value * 1e3, 3)
        row[f"{name}_gbs"] = round(counted_bytes / value / 1e9, 1)
    return row


def bench_copy_config(config: dict, on_gpu: bool, peak_gbs: float | None) -> dict:
    """Copy-on-write within the GPU cache (bytes read + written), and, with
    ``num_cpu_blocks``, swaps out to and in from a pinned CPU cache (bytes
    across the bus)."""
    rng = random.Random(0)
    device = "cuda" if on_gpu else "cpu"
    block_shape = (config["block_size"], config["num_kv_heads"], config["head_size"])
    dtype = getattr(torch, config["dtype"])
    gpu = _caches(config["num_layers"], config["num_gpu_blocks"], block_shape, dtype, device)
    block_bytes = gpu[0][0][0].numel() * gpu[0][0].element_size()
    num_tensors = 2 * config["num_layers"]
    num_pairs = config["num_pairs"]
    chosen = rng.sample(range(config["num_gpu_blocks"]), 2 * num_pairs)
    pairs = list(zip(chosen[:num_pairs], chosen[num_pairs:]))
    moved = num_pairs * num_tensors * block_bytes
    row = {**config, "block_bytes_per_tensor": block_bytes, "bytes_per_copy": moved}
    row["copy"] = measure_move(gpu, gpu, pairs, config["repeats"], on_gpu, 2 * moved)
    if peak_gbs:
        row["copy_fraction_of_peak"] = round(row["copy"]["kernel_gbs"] / peak_gbs, 3)
        row["meets_target"] = block_bytes >= MIB and row["copy_fraction_of_peak"] >= BANDWIDTH_TARGET
    num_cpu = config.get("num_cpu_blocks", 0)
    if num_cpu:
        cpu = _caches(config["num_layers"], num_cpu, block_shape, dtype, "cpu", pin=on_gpu)
        swap_pairs = list(zip(chosen[: num_cpu // 2], range(num_cpu // 2)))
        swapped = len(swap_pairs) * num_tensors * block_bytes
        row["bytes_per_swap"] = swapped
        row["swap_out"] = measure_move(gpu, cpu, swap_pairs, 3, on_gpu, swapped)
        row["swap_in"] = measure_move(cpu, gpu, [(d, s) for s, d in swap_pairs], 3, on_gpu, swapped)
    return row


def copy_configs(on_gpu: bool) -> list[dict]:
    if not on_gpu:
        return [
            dict(name="cpu-tiny", dtype="float16", block_size=16, num_kv_heads=4, head_size=64, num_layers=2,
                 num_gpu_blocks=64, num_cpu_blocks=16, num_pairs=16, repeats=5),
        ]  # fmt: skip
    return [  # per layer tensor: 32 KiB (vLLM's usual 16-token block), 2 MiB, 1 MiB; swaps last
        dict(name="32KiB-fp16", dtype="float16", block_size=16, num_kv_heads=8, head_size=128, num_layers=32,
             num_gpu_blocks=4096, num_cpu_blocks=0, num_pairs=1024, repeats=20),
        dict(name="2MiB-fp16", dtype="float16", block_size=512, num_kv_heads=16, head_size=128, num_layers=8,
             num_gpu_blocks=256, num_cpu_blocks=0, num_pairs=64, repeats=20),
        dict(name="1MiB-fp32", dtype="float32", block_size=128, num_kv_heads=16, head_size=128, num_layers=16,
             num_gpu_blocks=256, num_cpu_blocks=0, num_pairs=64, repeats=20),
        dict(name="1MiB-bf16", dtype="bfloat16", block_size=256, num_kv_heads=16, head_size=128, num_layers=16,
             num_gpu_blocks=256, num_cpu_blocks=32, num_pairs=64, repeats=20),
    ]  # fmt: skip


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def print_header(info: dict, bandwidth: dict) -> None:
    gpu = info["gpu"]
    print(f"python {info['python']}  torch {info['torch']} (CUDA {info['torch_cuda']})  numpy {info['numpy']}  "
          f"numba {info['numba']}  numba-cuda {info['numba_cuda']}")  # fmt: skip
    print(f"platform {info['platform']}")
    if gpu:
        print(
            f"GPU {gpu['name']}  sm_{gpu['compute_capability'].replace('.', '')}  {gpu['multiprocessors']} SMs  "
            f"{gpu['memory_gib']} GiB  driver {gpu.get('driver')}  CUDA driver API {gpu.get('cuda_driver_api')}"
        )
    else:
        print("NO CUDA GPU: tiny CPU-only run. These are NOT the GPU figures the targets refer to.")
    print(f"memory bandwidth: peak {bandwidth.get('peak_gbs')} GB/s, large copy_ {bandwidth.get('copy_gbs')} GB/s\n")


def print_tables(tables: dict) -> None:
    print(f"(a) block table sync + slot mapping, {tables['num_seqs']} sequences, block size {tables['block_size']}, "
          f"{tables['num_steps']} steps, {tables['mean_changed_cells_per_step']} changed cells/step")  # fmt: skip
    print(
        f"    ours, pipelined (wall)     {tables['ours_pipelined_us_per_step']:>10} us/step   "
        f"target <= {TABLE_TARGET_US} us"
    )
    if tables["ours_device_us_per_step"] is not None:
        print(f"    ours, CUDA events          {tables['ours_device_us_per_step']:>10} us/step")
    if tables.get("ours_device_work_us_per_step") is not None:
        print(f"    ours, GPU work (profiler)  {tables['ours_device_work_us_per_step']:>10} us/step   "
              f"{tables['ours_device_work']['top']}")  # fmt: skip
    print(f"    ours, each step waited for {tables['ours_latency_us_median']:>10} us (median)")
    print(f"    vLLM v0 rebuild + copy     {tables['vllm_v0_latency_us_median']:>10} us (median)   "
          f"x{tables['speedup_latency']} slower")  # fmt: skip
    print(f"    same slots as vLLM v0: {tables['slots_equal']}   same table: {tables['table_equal']}   "
          f"meets target: {tables['meets_target']}\n")  # fmt: skip
    print("(b) KV block moves, GB/s (copy: bytes read + written; swaps: bytes across the bus, one way)")
    print(
        f"    {'config':<12} {'move':<9} {'block/tensor':>12} {'kernel':>9} {'index':>9} {'per-block':>9} "
        f"{'of peak':>8}  target"
    )


def print_copies(row: dict) -> None:
    if "skipped" in row or "error" in row:
        print(
            f"    {row['name']:<12} "
            + (f"skipped ({row['skipped']})" if "skipped" in row else f"FAILED: {row['error']}")
        )
        return
    for move in ("copy", "swap_out", "swap_in"):
        if move not in row:
            continue
        figures = row[move]
        fraction = row.get("copy_fraction_of_peak") if move == "copy" else None
        target = row.get("meets_target", "-") if move == "copy" else "-"
        print(f"    {row['name']:<12} {move:<9} {row['block_bytes_per_tensor'] / 1024:>9.0f}KiB "
              f"{figures['kernel_gbs']:>9} {figures['torch_index_gbs']:>9} {figures['copy_per_block_gbs']:>9} "
              f"{'' if fraction is None else f'{fraction:.0%}':>8}  {target}"
              f"{'' if figures['kernel_correct'] else '  KERNEL WRONG'}", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; 1 when an answer is wrong (the table or the slots are not
    vLLM v0's, a kernel moved the wrong bytes) or a copy config failed: the
    figures of a wrong answer are not what was asked for; 2 for a bad option
    (said before anything runs)."""
    try:
        args = build_parser().parse_args(argv)
        check_ranges(args, RANGES)
        if args.json:
            check_output_file(args.json, "--json")
    except BlockSpaceError as error:
        return refuse(error)

    began = time.perf_counter()
    on_gpu = gpu_available()
    if not on_gpu:
        print("blockspace gpu-bench: no CUDA GPU here; running a tiny CPU-only version (labelled below).\n")
    info = environment()
    bandwidth = {"peak_gbs": info["gpu"].get("peak_bandwidth_gbs") if on_gpu else None}
    bandwidth["copy_gbs"] = round(measured_copy_bandwidth(on_gpu, 2**31 if on_gpu else 2**24), 1)
    report: dict[str, Any] = {
        "mode": "gpu" if on_gpu else "cpu-only",
        "environment": info,
        "bandwidth": bandwidth,
        "copies": [],
        "failures": [],  # what came out wrong, in words: the exit status is 1 when there is any
    }
    print_header(info, bandwidth)

    def save() -> None:  # after each part: a crash later keeps what was measured
        report["seconds"] = round(time.perf_counter() - began, 1)
        if args.json:
            write_output(args.json, json.dumps(report, indent=2))

    num_seqs = args.seqs or (1024 if on_gpu else 64)
    num_steps = args.steps or (300 if on_gpu else 20)
    report["tables"] = bench_tables(num_seqs, num_steps, args.block_size, on_gpu)
    save()
    print_tables(report["tables"])
    if not (report["tables"]["slots_equal"] and report["tables"]["table_equal"]):
        report["failures"].append("(a): the synced table or slots differ from vLLM v0's")
    for config in copy_configs(on_gpu):
        if time.perf_counter() > began + args.budget_s:
            row = {**config, "skipped": "time budget"}
        else:
            try:
                row = bench_copy_config(config, on_gpu, bandwidth["peak_gbs"])
                if on_gpu:
                    torch.cuda.empty_cache()
                moves = [move for move in ("copy", "swap_out", "swap_in") if move in row]
                report["failures"] += [
                    f"(b) {config['name']}: the kernel's {move} moved the wrong bytes"
                    for move in moves
                    if not row[move]["kernel_correct"]
                ]
            except Exception as error:  # recorded, so that the figures before it still come out
                row = {**config, "error": repr(error)}
                report["failures"].append(f"(b) {config['name']}: {row['error']}")
        report["copies"].append(row)
        save()
        print_copies(row)
    save()
    print(f"\nran in {report['seconds']} s" + (f", wrote {args.json}" if args.json else ""))
    for failure in report["failures"]:
        print(f"FAILED: {failure}")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
