"""The pure arithmetic rules of the block manager, one small function each.

Each carries a PEP 316 contract (``pre:``/``post:`` lines in its docstring)
that ``crosshair check blockspace.reference.rules`` verifies symbolically; the
fast kernels mirror these functions and are checked against them.
"""

from __future__ import annotations

from blockspace.enums import AllocStatus


def cdiv(a: int, b: int) -> int:
    """Ceiling division of a non-negative ``a`` by a positive ``b``.

    pre: a >= 0
    pre: b > 0
    post: __return__ * b >= a
    post: (__return__ - 1) * b < a or __return__ == 0
    """
    return -(-a // b)


def watermark_blocks(watermark: float, num_gpu_blocks: int) -> int:
    """Blocks kept free for decoding: ``watermark * G`` in IEEE double,
    truncated toward zero (so ``0.29 * 100`` gives 28, as in vLLM).

    pre: watermark >= 0.0 and watermark <= 1e6
    pre: 0 <= num_gpu_blocks <= 2**53
    post: __return__ >= 0
    post: __return__ <= watermark * num_gpu_blocks
    """
    return int(watermark * num_gpu_blocks)


def window_blocks(sliding_window: int | None, block_size: int) -> int | None:
    """The most blocks a sliding-window sequence needs: ``window // bs + 2``.

    pre: sliding_window is None or sliding_window >= 0
    pre: block_size > 0
    post: (__return__ is None) == (sliding_window is None)
    post: __return__ is None or __return__ >= 2
    """
    if sliding_window is None:
        return None
    return sliding_window // block_size + 2


def window_cap(num_blocks: int, max_window_blocks: int | None) -> int:
    """``can_allocate`` never asks for more than the window's blocks.

    pre: num_blocks >= 0
    pre: max_window_blocks is None or max_window_blocks >= 0
    post: 0 <= __return__ <= num_blocks
    post: max_window_blocks is None or __return__ <= max_window_blocks
    """
    if max_window_blocks is None:
        return num_blocks
    return min(num_blocks, max_window_blocks)


def blocks_for_prompt(
    num_tokens: int,
    num_lookahead_slots: int,
    num_encoder_tokens: int,
    block_size: int,
    max_window_blocks: int | None,
) -> int:
    """Blocks ``can_allocate`` asks for: the decoder prompt plus lookahead,
    plus the encoder prompt, capped by the sliding window. Cache hits are
    ignored (worst case).

    pre: num_tokens >= 0 and num_lookahead_slots >= 0 and num_encoder_tokens >= 0
    pre: block_size > 0
    pre: max_window_blocks is None or max_window_blocks >= 0
    post: __return__ >= 0
    post: __return__ * block_size <= num_tokens + num_lookahead_slots + num_encoder_tokens + 2 * block_size
    """
    need = cdiv(num_tokens + num_lookahead_slots, block_size) + cdiv(num_encoder_tokens, block_size)
    return window_cap(need, max_window_blocks)


def alloc_status(num_total: int, num_free: int, num_needed: int, num_watermark: int) -> AllocStatus:
    """Admission: NEVER if even an empty device could not keep the watermark
    free after the allocation, OK if the free blocks can, LATER otherwise.

    pre: 0 <= num_free <= num_total
    pre: num_needed >= 0 and num_watermark >= 0
    post: (__return__ == AllocStatus.NEVER) == (num_total - num_needed < num_watermark)
    post: __return__ != AllocStatus.OK or num_free - num_needed >= num_watermark
    """
    if num_total - num_needed < num_watermark:
        return AllocStatus.NEVER
    if num_free - num_needed >= num_watermark:
        return AllocStatus.OK
    return AllocStatus.LATER


def swap_status(num_total: int, num_free: int, num_needed: int, num_watermark: int) -> AllocStatus:
    """Swap check: NEVER if the device is smaller than the need (the
    watermark is not part of that test, unlike admission), OK if the free
    blocks keep the watermark, LATER otherwise.

    pre: 0 <= num_free <= num_total
    pre: num_needed >= 0 and num_watermark >= 0
    post: (__return__ == AllocStatus.NEVER) == (num_total < num_needed)
    post: __return__ != AllocStatus.OK or num_free - num_needed >= num_watermark
    """
    if num_total < num_needed:
        return AllocStatus.NEVER
    if num_free - num_needed >= num_watermark:
        return AllocStatus.OK
    return AllocStatus.LATER


def blocks_touched(num_filled: int, num_new_tokens: int, num_lookahead_slots: int, block_size: int) -> int:
    """Blocks an append writes or reserves, counted from the start of the
    table's current (possibly partial) last block; blocks already allocated
    past it and sharing are ignored (the estimate ``can_append_slots`` and the
    swap checks use).

    pre: num_filled >= 0 and num_new_tokens >= 0 and num_lookahead_slots >= 0
    pre: block_size > 0
    post: __return__ >= 0
    post: (__return__ == 0) == (num_filled % block_size == 0 and num_new_tokens + num_lookahead_slots == 0)
    post: __return__ <= num_new_tokens + num_lookahead_slots + 1
    """
    return cdiv(num_filled % block_size + num_new_tokens + num_lookahead_slots, block_size)


def blocks_to_add(num_blocks: int, num_filled: int, num_needed_slots: int, block_size: int) -> int:
    """New (empty) blocks an append takes: enough to give ``num_needed_slots``
    free slots past the ``num_filled`` written ones.

    pre: num_blocks >= 0 and num_needed_slots >= 0 and block_size > 0
    pre: 0 <= num_filled <= num_blocks * block_size
    post: __return__ >= 0
    post: (num_blocks + __return__) * block_size - num_filled >= num_needed_slots
    post: __return__ == 0 or (num_blocks + __return__ - 1) * block_size - num_filled < num_needed_slots
    """
    num_empty = num_blocks * block_size - num_filled
    if num_empty >= num_needed_slots:
        return 0
    return cdiv(num_needed_slots - num_empty, block_size)


def num_blocks_to_drop(num_computed_tokens: int, block_size: int, max_window_blocks: int) -> int:
    """Leading blocks a sliding-window table no longer needs: everything
    before ``computed // bs - W``.

    pre: num_computed_tokens >= 0 and block_size > 0 and max_window_blocks >= 0
    post: __return__ >= 0
    post: (__return__ + max_window_blocks) * block_size <= max(num_computed_tokens, 0) + max_window_blocks * block_size
    """
    return max(0, num_computed_tokens // block_size - max_window_blocks)
