"""KV block copies and swaps on the CPU (torch) path, against a naive loop.

The simulator and GPU tests run the kernel on the same cases.
"""

from __future__ import annotations

import random

import pytest
import torch

from blockspace.errors import InvalidArgumentError
from blockspace.fast.device_table import simulator_enabled
from blockspace.fast.kv_copy import BlockMover, block_tensors, copy_blocks, swap_blocks

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def make_caches(num_layers: int, num_blocks: int, block_shape, dtype, stacked: bool = False, seed: int = 0):
    """vLLM's layout, random contents: per layer (key, value) tensors
    ``[num_blocks, *block_shape]``, or one ``[2, num_blocks, ...]`` tensor."""
    generator = torch.Generator().manual_seed(seed)

    def tensor(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    if stacked:
        return [tensor(2, num_blocks, *block_shape) for _ in range(num_layers)]
    return [(tensor(num_blocks, *block_shape), tensor(num_blocks, *block_shape)) for _ in range(num_layers)]


def random_pairs(rng: random.Random, num_src: int, num_dst: int, same_cache: bool) -> list[tuple[int, int]]:
    """Legal pairs: each destination once, and within one cache no block both read and written."""
    dst = rng.sample(range(num_dst), rng.randint(1, num_dst // 2))
    sources = [b for b in range(num_src) if not (same_cache and b in dst)]
    return [(rng.choice(sources), d) for d in dst]


def clone(caches):
    return [layer.clone() if isinstance(layer, torch.Tensor) else tuple(t.clone() for t in layer) for layer in caches]


def naive_move(src_caches, dst_caches, pairs) -> None:
    """One block at a time: the obvious meaning of a move."""
    for source, target in zip(block_tensors(src_caches), block_tensors(dst_caches)):
        for src, dst in pairs:
            target[dst] = source[src].clone()


def same_bytes(a_caches, b_caches) -> bool:
    return all(
        torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
        for a, b in zip(block_tensors(a_caches), block_tensors(b_caches))
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stacked", [False, True])
def test_copy_on_write_equals_naive_loop(dtype, stacked):
    rng = random.Random(1)
    for seed in range(5):
        caches = make_caches(3, 12, (4, 2, 8), dtype, stacked, seed)
        expected = clone(caches)
        pairs = random_pairs(rng, 12, 12, same_cache=True)
        copy_blocks(caches, pairs, backend="torch")
        naive_move(expected, expected, pairs)
        assert same_bytes(caches, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swaps_between_caches_of_different_sizes_equal_naive_loop(dtype):
    rng = random.Random(2)
    gpu = make_caches(2, 10, (4, 2, 8), dtype, seed=3)
    cpu = make_caches(2, 6, (4, 2, 8), dtype, seed=4)
    swap_out, swap_in = BlockMover(gpu, cpu, backend="torch"), BlockMover(cpu, gpu, backend="torch")
    expected_gpu, expected_cpu = clone(gpu), clone(cpu)
    for step in range(5):
        out_pairs = random_pairs(rng, 10, 6, same_cache=False)
        if step % 2:
            swap_out.move(out_pairs)
        else:  # the one-off form
            swap_blocks(gpu, cpu, out_pairs, backend="torch")
        naive_move(expected_gpu, expected_cpu, out_pairs)
        in_pairs = random_pairs(rng, 6, 10, same_cache=False)
        swap_in.move(in_pairs)
        naive_move(expected_cpu, expected_gpu, in_pairs)
        assert same_bytes(gpu, expected_gpu) and same_bytes(cpu, expected_cpu)


def test_auto_backend_without_gpu_is_torch_and_cuda_is_refused():
    caches = make_caches(1, 4, (2, 1, 4), torch.float16)
    assert BlockMover(caches, caches).backend == "torch"  # auto never picks the simulator
    if not torch.cuda.is_available() and not simulator_enabled():  # the simulator runs the CUDA kernel
        with pytest.raises(InvalidArgumentError):
            BlockMover(caches, caches, backend="cuda")


def test_bad_moves_raise_and_change_nothing():
    caches = make_caches(2, 6, (2, 1, 4), torch.float32)
    before = clone(caches)
    mover = BlockMover(caches, caches, backend="torch")
    for pairs in (
        [(0, 6)],  # destination out of range
        [(-1, 2)],  # source out of range
        [(0, 2), (1, 2)],  # one destination twice
        [(0, 1), (1, 2)],  # block 1 read and written
    ):
        with pytest.raises(InvalidArgumentError):
            mover.move(pairs)
        assert same_bytes(caches, before)
    mover.move([])
    assert same_bytes(caches, before)


def test_mismatched_caches_are_refused():
    caches = make_caches(2, 6, (2, 1, 4), torch.float32)
    with pytest.raises(InvalidArgumentError):
        BlockMover(caches, make_caches(1, 6, (2, 1, 4), torch.float32))
    with pytest.raises(InvalidArgumentError):
        BlockMover(caches, make_caches(2, 6, (2, 1, 4), torch.float16))
    with pytest.raises(InvalidArgumentError):
        BlockMover(caches, make_caches(2, 6, (2, 2, 4), torch.float32))
    with pytest.raises(InvalidArgumentError):
        BlockMover([torch.zeros(3, 4, 2)], [torch.zeros(3, 4, 2)])  # a one-tensor layer needs dim 0 == 2
