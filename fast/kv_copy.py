"""Block copies on KV caches: copy-on-write in the GPU cache, swaps to and from the CPU.

The caches are laid out as vLLM's: one entry per layer, either a ``(key,
value)`` pair of tensors ``[num_blocks, block_size, num_kv_heads, head_size]``
or one tensor ``[2, num_blocks, ...]`` holding both. A move is a list of
``(src, dst)`` physical block ids; every layer's key and value move alike.

Two paths give the same bytes:

* ``"torch"``: per tensor, ``index_select`` the source blocks, bring them to
  the destination's device, ``index_copy_`` them in. Works for any devices;
  it is also the baseline the GPU benchmark compares against.
* ``"cuda"``: ONE Numba-CUDA kernel launch per move for all layers, in the
  manner of vLLM's ``copy_blocks`` kernel: a device table holds every
  tensor's base address and block stride, the kernel reads and writes memory
  through those addresses in 8-byte words (narrower only when the block's
  bytes or addresses demand it). A kernel can reach CPU memory only when it is
  pinned (page-locked memory is mapped into the GPU's address space under
  unified addressing), which is how vLLM allocates its CPU cache; so swaps
  with pinned CPU caches also take one launch, and a pageable CPU cache falls
  back to the torch path. Under Numba's CUDA simulator the same kernel runs
  on CPU tensors, its loads and stores done through ``ctypes``: that is how
  the tests prove the kernel equal to the torch path.

The copies are asynchronous on a GPU, ordered on torch's current stream: as
with vLLM's swaps, synchronize before the host reads a swapped-out block.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch  # noqa: E402, I001  (after device_table has checked the [gpu] extra)
from numba import cuda  # noqa: E402

from blockspace.errors import InvalidArgumentError
from blockspace.fast.device_table import gpu_available, simulator_enabled  # checks the [gpu] extra first

UNROLL = 4  # words each thread loads before it stores: keeps enough bytes in flight
WORD_TYPES = {8: "int64", 4: "int32", 2: "int16", 1: "int8"}


def block_tensors(caches: Sequence) -> list[torch.Tensor]:
    """Every tensor of the caches whose first dimension is the block id, in
    order (layer 0 key, layer 0 value, layer 1 key, ...)."""
    tensors: list[torch.Tensor] = []
    for layer in caches:
        if isinstance(layer, torch.Tensor):
            if layer.dim() < 2 or layer.shape[0] != 2:
                raise InvalidArgumentError("a one-tensor layer must be [2, num_blocks, ...] (key, value)")
            tensors.extend((layer[0], layer[1]))
        else:
            tensors.extend(layer)
    if not tensors:
        raise InvalidArgumentError("no cache tensors")
    first = tensors[0]
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor) or tensor.dim() < 2:
            raise InvalidArgumentError("cache tensors must be torch tensors [num_blocks, ...]")
        if tensor.shape != first.shape or tensor.dtype != first.dtype or tensor.device != first.device:
            raise InvalidArgumentError("every cache tensor must have the same shape, dtype and device")
        if not tensor[0].is_contiguous():
            raise InvalidArgumentError("each block of a cache tensor must be contiguous")
    return tensors


def block_bytes(tensor: torch.Tensor) -> int:
    return tensor[0].numel() * tensor.element_size()


def check_pairs(pairs: Any, num_src_blocks: int, num_dst_blocks: int, same_cache: bool) -> np.ndarray:
    """The pairs as an int64 array ``[n, 2]``, or a clear error: ids in
    range, each destination written once, and within one cache no block both
    read and written (the copies run in parallel, so their order is not defined)."""
    array = np.asarray(pairs, dtype=np.int64).reshape(-1, 2) if len(pairs) else np.zeros((0, 2), np.int64)
    if not len(array):
        return array
    src, dst = array[:, 0], array[:, 1]
    if src.min() < 0 or src.max() >= num_src_blocks:
        raise InvalidArgumentError(f"a source block id is outside 0..{num_src_blocks - 1}")
    if dst.min() < 0 or dst.max() >= num_dst_blocks:
        raise InvalidArgumentError(f"a destination block id is outside 0..{num_dst_blocks - 1}")
    if len(np.unique(dst)) != len(dst):
        raise InvalidArgumentError("a destination block appears twice")
    if same_cache and np.intersect1d(src, dst).size:
        raise InvalidArgumentError("a block is both a source and a destination of one copy")
    return array


def move_blocks_torch(src: list[torch.Tensor], dst: list[torch.Tensor], pairs: np.ndarray) -> None:
    """The torch path: gather, move across devices, scatter, per tensor."""
    if not len(pairs):
        return
    src_ids = torch.from_numpy(pairs[:, 0]).to(src[0].device)
    dst_ids = torch.from_numpy(pairs[:, 1]).to(dst[0].device)
    to_gpu = dst[0].device.type == "cuda"  # a copy to the host must be complete before the host reads it
    for source, target in zip(src, dst):
        blocks = source.index_select(0, src_ids).to(target.device, non_blocking=to_gpu)
        target.index_copy_(0, dst_ids, blocks)


# ---------------------------------------------------------------------------
# The kernel: loads and stores by address
# ---------------------------------------------------------------------------


def _address_ops(word_bytes: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``load(address)`` and ``store(address, word)`` of one signed word."""
    if simulator_enabled():
        ctype = {8: ctypes.c_int64, 4: ctypes.c_int32, 2: ctypes.c_int16, 1: ctypes.c_int8}[word_bytes]

        def load_at(address: int) -> int:
            return ctype.from_address(int(address)).value

        def store_at(address: int, word: int) -> None:
            ctype.from_address(int(address)).value = int(word)

        return load_at, store_at

    from llvmlite import ir
    from numba import types

    try:
        from numba.cuda.extending import intrinsic
    except ImportError:  # numba-cuda releases before it had its own
        from numba.core.extending import intrinsic

    word_type = getattr(types, WORD_TYPES[word_bytes])
    llvm_pointer = ir.IntType(8 * word_bytes).as_pointer()

    @intrinsic
    def load(typingctx: Any, address: Any) -> tuple[Any, Callable[..., Any]]:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.load(builder.inttoptr(args[0], llvm_pointer), align=word_bytes)

        return word_type(types.int64), codegen

    @intrinsic
    def store(typingctx: Any, address: Any, word: Any) -> tuple[Any, Callable[..., Any]]:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            builder.store(args[1], builder.inttoptr(args[0], llvm_pointer), align=word_bytes)
            return context.get_dummy_value()

        return types.void(types.int64, word_type), codegen

    return load, store


def _make_move_kernel(word_bytes: int) -> Any:
    load, store = _address_ops(word_bytes)

    @cuda.jit
    def move(table, pairs, num_tensors, words_per_block):  # type: ignore[no-untyped-def]  # a kernel: unannotated
        """Thread block (x, y) copies chunk y of one block of one tensor:
        x = pair * num_tensors + tensor. ``table[t]`` = (source base, source
        block stride, destination base, destination block stride) in bytes;
        ``pairs`` = src0, dst0, src1, dst1, ..."""
        job = cuda.blockIdx.x
        pair = job // num_tensors
        tensor = job - pair * num_tensors
        src = table[tensor, 0] + pairs[2 * pair] * table[tensor, 1]
        dst = table[tensor, 2] + pairs[2 * pair + 1] * table[tensor, 3]
        step = cuda.blockDim.x
        word = cuda.blockIdx.y * step * UNROLL + cuda.threadIdx.x
        if word + (UNROLL - 1) * step < words_per_block:  # a full chunk: all loads, then all stores
            w0 = load(src + word * word_bytes)
            w1 = load(src + (word + step) * word_bytes)
            w2 = load(src + (word + 2 * step) * word_bytes)
            w3 = load(src + (word + 3 * step) * word_bytes)
            store(dst + word * word_bytes, w0)
            store(dst + (word + step) * word_bytes, w1)
            store(dst + (word + 2 * step) * word_bytes, w2)
            store(dst + (word + 3 * step) * word_bytes, w3)
        else:  # the block's last, partial chunk
            while word < words_per_block:
                store(dst + word * word_bytes, load(src + word * word_bytes))
                word += step

    return move


_KERNELS: dict[int, object] = {}


def move_kernel(word_bytes: int) -> Any:
    """The compiled-on-first-use kernel that copies ``word_bytes`` at a time."""
    if word_bytes not in _KERNELS:
        _KERNELS[word_bytes] = _make_move_kernel(word_bytes)
    return _KERNELS[word_bytes]


def _kernel_reachable(tensor: torch.Tensor) -> bool:
    if simulator_enabled():
        return tensor.device.type == "cpu"
    return tensor.device.type == "cuda" or (tensor.device.type == "cpu" and tensor.is_pinned())


class BlockMover:
    """Moves blocks from one set of caches to another (or within one), many
    times: the address table is built once. ``move(pairs)`` is one step's
    copy or swap: ``BlockMover(gpu, gpu)`` for copy-on-write,
    ``BlockMover(gpu, cpu)`` to swap out, ``BlockMover(cpu, gpu)`` to swap in.
    """

    def __init__(self, src_caches: Sequence, dst_caches: Sequence, backend: str = "auto", threads_per_block: int = 256):
        self.src = block_tensors(src_caches)
        self.dst = block_tensors(dst_caches)
        if len(self.src) != len(self.dst):
            raise InvalidArgumentError("source and destination caches have different numbers of layers")
        if self.src[0].shape[1:] != self.dst[0].shape[1:] or self.src[0].dtype != self.dst[0].dtype:
            raise InvalidArgumentError("source and destination blocks differ in shape or dtype")
        if not 1 <= threads_per_block <= 1024:
            raise InvalidArgumentError(f"threads_per_block must be in 1..1024, got {threads_per_block}")
        self.same_cache = [t.data_ptr() for t in self.src] == [t.data_ptr() for t in self.dst]
        self.threads_per_block = threads_per_block
        self.backend = self._resolve(backend)
        if self.backend == "cuda":
            self._prepare_kernel()

    def _resolve(self, backend: str) -> str:
        reachable = all(_kernel_reachable(t) for t in self.src + self.dst)
        kernel_possible = (gpu_available() or simulator_enabled()) and reachable
        if backend == "auto":
            return "cuda" if kernel_possible and not simulator_enabled() else "torch"
        if backend == "torch":
            return "torch"
        if backend == "cuda":
            if not kernel_possible:
                raise InvalidArgumentError(
                    "backend 'cuda' needs a GPU (or NUMBA_ENABLE_CUDASIM=1) and caches on it or in pinned CPU memory"
                )
            return "cuda"
        raise InvalidArgumentError(f"backend must be 'auto', 'torch' or 'cuda', got {backend!r}")

    def _prepare_kernel(self) -> None:
        size = block_bytes(self.src[0])
        rows = [
            (s.data_ptr(), s.stride(0) * s.element_size(), d.data_ptr(), d.stride(0) * d.element_size())
            for s, d in zip(self.src, self.dst)
        ]
        table = np.array(rows, dtype=np.int64).reshape(-1, 4)
        self.word_bytes = next(w for w in (8, 4, 2, 1) if size % w == 0 and not np.any(table % w))
        self.words_per_block = size // self.word_bytes
        self._on_gpu = not simulator_enabled()
        if self._on_gpu:
            self._table = cuda.to_device(table)
            self._host_pairs = torch.empty(0, dtype=torch.int64, pin_memory=True)
            self._upload_done = torch.cuda.Event()
        else:
            self._table = table

    def move(self, pairs: Any) -> None:
        """Copy block ``src`` to block ``dst`` for every ``(src, dst)`` pair,
        in every layer's key and value."""
        array = check_pairs(pairs, self.src[0].shape[0], self.dst[0].shape[0], self.same_cache)
        if not len(array):
            return
        if self.backend == "torch":
            move_blocks_torch(self.src, self.dst, array)
            return
        flat = array.reshape(-1)
        if self._on_gpu:
            device_pairs = self._upload(flat)
            stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
        else:
            device_pairs, stream = flat, 0
        chunk_words = self.threads_per_block * UNROLL
        grid = (len(array) * len(self.src), -(-self.words_per_block // chunk_words))
        move_kernel(self.word_bytes)[grid, self.threads_per_block, stream](
            self._table, device_pairs, len(self.src), self.words_per_block
        )

    def _upload(self, flat: np.ndarray) -> Any:
        """The pairs on the device, through a pinned buffer: one copy."""
        self._upload_done.synchronize()  # the last upload has left the pinned buffer
        if len(self._host_pairs) < len(flat):
            self._host_pairs = torch.empty(
                max(len(flat), 2 * len(self._host_pairs)), dtype=torch.int64, pin_memory=True
            )
        self._host_pairs.numpy()[: len(flat)] = flat
        device = self._host_pairs[: len(flat)].to("cuda", non_blocking=True)
        self._upload_done.record()
        return cuda.as_cuda_array(device, sync=False)


def move_blocks(src_caches: Sequence, dst_caches: Sequence, pairs: Any, backend: str = "auto") -> None:
    """One-off move (see :class:`BlockMover`, which to prefer when repeated)."""
    BlockMover(src_caches, dst_caches, backend).move(pairs)


def copy_blocks(caches: Sequence, pairs: Any, backend: str = "auto") -> None:
    """Copy-on-write copies within one cache (vLLM's ``blocks_to_copy``)."""
    move_blocks(caches, caches, pairs, backend)


def swap_blocks(src_caches: Sequence, dst_caches: Sequence, pairs: Any, backend: str = "auto") -> None:
    """Swap blocks out (GPU to CPU) or in (CPU to GPU): vLLM's ``blocks_to_swap_*``."""
    move_blocks(src_caches, dst_caches, pairs, backend)


__all__ = [
    "BlockMover",
    "block_bytes",
    "block_tensors",
    "check_pairs",
    "copy_blocks",
    "move_blocks",
    "move_blocks_torch",
    "move_kernel",
    "swap_blocks",
]
