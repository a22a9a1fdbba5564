"""The CUDA kernels under Numba's CUDA simulator, byte for byte against the CPU path.

The simulator must be switched on before ``numba.cuda`` is first imported,
so the default test run starts this same file again in a fresh interpreter
with ``NUMBA_ENABLE_CUDASIM=1``; only there are the kernel tests defined.
Sizes are tiny: the simulator runs every GPU thread as a Python thread.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from helpers import pytest_in_subprocess

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

if not SIMULATED:

    def test_kernels_under_the_cuda_simulator():
        done = pytest_in_subprocess(Path(__file__).resolve(), NUMBA_ENABLE_CUDASIM="1")
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
        assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]

else:
    import numpy as np
    import torch
    from test_gpu_kv_copy import DTYPES, clone, make_caches, random_pairs, same_bytes
    from test_gpu_tables import BLOCK_SIZE, python_slots, random_steps

    from blockspace.fast.device_table import DeviceBlockTable
    from blockspace.fast.kv_copy import BlockMover

    @pytest.mark.parametrize("seed", range(2))
    def test_table_kernel_equals_cpu_path(seed):
        kernel = DeviceBlockTable(BLOCK_SIZE, max_seqs=1, max_blocks=1, backend="cuda", threads_per_block=8)
        cpu = DeviceBlockTable(BLOCK_SIZE, max_seqs=1, max_blocks=1, backend="cpu")
        for delta, rows, starts, ends, seqs in random_steps(seed, num_steps=12):
            pad_to = len(python_slots(seqs, rows, starts, ends)) + 2
            slots = kernel.step(delta, rows, starts, ends, pad_to=pad_to).clone()
            expected = cpu.step(delta, rows, starts, ends, pad_to=pad_to)
            assert torch.equal(slots, expected)
            assert torch.equal(kernel.table, cpu.table) and torch.equal(kernel.lengths, cpu.lengths)

    def test_table_kernel_with_more_tokens_than_threads():
        kernel = DeviceBlockTable(BLOCK_SIZE, backend="cuda", threads_per_block=4)
        cpu = DeviceBlockTable(BLOCK_SIZE, backend="cpu")
        from blockspace.fast.table_deltas import TableDeltas

        deltas = TableDeltas()
        for row in range(3):
            for block in range(5):
                deltas.append(row, 7 * row + block + 1)
        delta = deltas.drain()
        args = (delta, [2, 0, 1, 0], [3, 0, 19, 5], [17, 0, 20, 9])
        assert torch.equal(kernel.step(*args, pad_to=24).clone(), cpu.step(*args, pad_to=24))

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("stacked", [False, True])
    def test_copy_kernel_equals_torch_path(dtype, stacked):
        rng = random.Random(5)
        caches = make_caches(2, 6, (2, 1, 8), dtype, stacked, seed=1)
        expected = clone(caches)
        pairs = random_pairs(rng, 6, 6, same_cache=True)
        mover = BlockMover(caches, caches, backend="cuda", threads_per_block=1)  # full chunks of 4 words
        assert mover.word_bytes == 8
        mover.move(pairs)
        BlockMover(expected, expected, backend="torch").move(pairs)
        assert same_bytes(caches, expected)

    @pytest.mark.parametrize(
        "dtype, block_shape, word_bytes",
        [(torch.float16, (1, 1, 3), 2), (torch.uint8, (1, 1, 5), 1), (torch.float32, (1, 1, 3), 4)],
    )
    def test_swap_kernel_with_narrow_words_equals_torch_path(dtype, block_shape, word_bytes):
        rng = random.Random(6)
        if dtype == torch.uint8:
            gpu = [tuple(torch.randint(0, 256, (7, *block_shape), dtype=dtype) for _ in range(2))]
            cpu = [tuple(torch.randint(0, 256, (4, *block_shape), dtype=dtype) for _ in range(2))]
        else:
            gpu, cpu = make_caches(1, 7, block_shape, dtype, seed=2), make_caches(1, 4, block_shape, dtype, seed=3)
        expected_cpu = clone(cpu)
        pairs = random_pairs(rng, 7, 4, same_cache=False)
        mover = BlockMover(gpu, cpu, backend="cuda", threads_per_block=2)
        assert mover.word_bytes == word_bytes
        mover.move(pairs)
        BlockMover(gpu, expected_cpu, backend="torch").move(pairs)
        assert same_bytes(cpu, expected_cpu)

    def test_copy_kernel_covers_blocks_larger_than_one_chunk():
        caches = make_caches(1, 3, (8, 1, 8), torch.float32, seed=4)  # 64 words a block, chunks of 2 * 4 words
        expected = clone(caches)
        BlockMover(caches, caches, backend="cuda", threads_per_block=2).move([(0, 2)])
        BlockMover(expected, expected, backend="torch").move([(0, 2)])
        assert same_bytes(caches, expected)
        assert np.array_equal(caches[0][0][2].numpy(), caches[0][0][0].numpy())
