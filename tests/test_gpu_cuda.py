"""The real CUDA kernels against the CPU path: only on a machine with a GPU.

Skipped elsewhere (the simulator tests cover the same kernels there). On the
GPU machine: ``python3 -m pytest -q tests/test_gpu_cuda.py tests/test_gpu_ptx.py``.
"""

from __future__ import annotations

import random

import pytest
import torch
from test_gpu_kv_copy import DTYPES, clone, make_caches, random_pairs
from test_gpu_tables import BLOCK_SIZE, python_slots, random_steps

from blockspace.errors import InvalidArgumentError
from blockspace.fast.device_table import DeviceBlockTable, gpu_available
from blockspace.fast.kv_copy import BlockMover, block_tensors
from blockspace.fast.table_deltas import TableDeltas

pytestmark = pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU (the simulator tests cover the kernels)")


def to_cuda(caches):
    return [layer.cuda() if isinstance(layer, torch.Tensor) else tuple(t.cuda() for t in layer) for layer in caches]


def pinned(caches):
    return [tuple(t.pin_memory() for t in layer) for layer in caches]


def same_bytes(a_caches, b_caches) -> bool:
    return all(
        torch.equal(a.cpu().contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8))
        for a, b in zip(block_tensors(a_caches), block_tensors(b_caches))
    )


@pytest.mark.parametrize("seed", range(3))
def test_table_kernel_equals_cpu_path(seed):
    kernel = DeviceBlockTable(BLOCK_SIZE, max_seqs=1, max_blocks=1, backend="cuda")
    cpu = DeviceBlockTable(BLOCK_SIZE, max_seqs=1, max_blocks=1, backend="cpu")
    assert kernel.table.is_cuda
    for delta, rows, starts, ends, seqs in random_steps(seed, num_steps=40):
        pad_to = len(python_slots(seqs, rows, starts, ends)) + 3
        slots = kernel.step(delta, rows, starts, ends, pad_to=pad_to).cpu()
        assert torch.equal(slots, cpu.step(delta, rows, starts, ends, pad_to=pad_to))
        assert torch.equal(kernel.table.cpu(), cpu.table) and torch.equal(kernel.lengths.cpu(), cpu.lengths)


def test_table_kernel_maps_a_full_decode_batch_and_a_long_prefill():
    rng = random.Random(0)
    deltas = TableDeltas(1024, 64)
    seqs = {}
    for row in range(1024):
        seqs[row] = [rng.randrange(10**6) for _ in range(rng.randint(1, 40))]
        for block in seqs[row]:
            deltas.append(row, block)
    kernel, cpu = DeviceBlockTable(BLOCK_SIZE, backend="cuda"), DeviceBlockTable(BLOCK_SIZE, backend="cpu")
    delta = deltas.drain()
    rows = list(range(1024))
    ends = [len(seqs[row]) * BLOCK_SIZE for row in rows]
    decode = (rows, [end - 1 for end in ends], ends)
    assert torch.equal(kernel.step(delta, *decode).cpu(), cpu.step(delta, *decode))
    prefill = (rows[:300], [0] * 300, ends[:300])  # thousands of tokens: many passes of the one thread block
    expected = python_slots(seqs, *prefill)
    assert kernel.slot_mapping(*prefill, pad_to=len(expected) + 5).cpu().tolist() == expected + [-1] * 5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stacked", [False, True])
def test_copy_kernel_equals_torch_path(dtype, stacked):
    rng = random.Random(3)
    for seed in range(3):
        caches = to_cuda(make_caches(3, 32, (16, 2, 64), dtype, stacked, seed))
        expected = clone(caches)
        pairs = random_pairs(rng, 32, 32, same_cache=True)
        mover = BlockMover(caches, caches)
        assert mover.backend == "cuda"
        mover.move(pairs)
        BlockMover(expected, expected, backend="torch").move(pairs)
        assert same_bytes(caches, expected)


def test_pageable_cpu_cache_falls_back_to_torch():
    gpu = to_cuda(make_caches(1, 8, (4, 1, 8), torch.float16))
    cpu = make_caches(1, 8, (4, 1, 8), torch.float16)  # not pinned: no kernel can reach it
    assert BlockMover(gpu, cpu).backend == "torch"
    with pytest.raises(InvalidArgumentError):
        BlockMover(gpu, cpu, backend="cuda")


# last: a kernel that faults on host memory would spoil the CUDA context for what follows
@pytest.mark.parametrize("dtype", DTYPES)
def test_swap_kernel_with_pinned_cpu_cache_equals_torch_path(dtype):
    rng = random.Random(4)
    gpu = to_cuda(make_caches(2, 24, (16, 2, 64), dtype, seed=1))
    cpu = pinned(make_caches(2, 12, (16, 2, 64), dtype, seed=2))
    expected_gpu, expected_cpu = clone(gpu), clone(cpu)
    swap_out, swap_in = BlockMover(gpu, cpu), BlockMover(cpu, gpu)
    assert swap_out.backend == swap_in.backend == "cuda"
    for _ in range(3):
        out_pairs = random_pairs(rng, 24, 12, same_cache=False)
        swap_out.move(out_pairs)
        BlockMover(expected_gpu, expected_cpu, backend="torch").move(out_pairs)
        in_pairs = random_pairs(rng, 12, 24, same_cache=False)
        swap_in.move(in_pairs)
        BlockMover(expected_cpu, expected_gpu, backend="torch").move(in_pairs)
        torch.cuda.synchronize()
        assert same_bytes(gpu, expected_gpu) and same_bytes(cpu, expected_cpu)
