"""The pure arithmetic rules, compiled: one njit function per rule of
``blockspace.reference.rules``, with the same name, arguments and result.

The kernels call these instead of repeating the arithmetic, so each rule is
written once for the per-call and the batched paths. The only difference
from the reference: ``alloc_status`` and ``swap_status`` return the int value
of the ``AllocStatus`` member (1 OK, 2 LATER, 3 NEVER), because compiled code
cannot return an Enum. ``crosshair diffbehavior`` compares the two modules
(under ``NUMBA_DISABLE_JIT=1``, where these are plain Python functions).
"""

from __future__ import annotations

from blockspace.fast.borrowing import counting

OK = 1
LATER = 2
NEVER = 3


@counting
def cdiv(a, b):
    """Ceiling division of a non-negative ``a`` by a positive ``b``."""
    return -(-a // b)


@counting
def watermark_blocks(watermark, num_gpu_blocks):
    """``watermark * G`` in IEEE double, truncated toward zero."""
    return int(watermark * num_gpu_blocks)


@counting
def window_blocks(sliding_window, block_size):
    """``window // bs + 2`` blocks, or None without a sliding window."""
    if sliding_window is None:
        return None
    return sliding_window // block_size + 2


@counting
def window_cap(num_blocks, max_window_blocks):
    if max_window_blocks is None:
        return num_blocks
    return min(num_blocks, max_window_blocks)


@counting
def blocks_for_prompt(num_tokens, num_lookahead_slots, num_encoder_tokens, block_size, max_window_blocks):
    need = cdiv(num_tokens + num_lookahead_slots, block_size) + cdiv(num_encoder_tokens, block_size)
    return window_cap(need, max_window_blocks)


@counting
def alloc_status(num_total, num_free, num_needed, num_watermark):
    """Admission: NEVER, OK or LATER as the ``AllocStatus`` int value."""
    if num_total - num_needed < num_watermark:
        return NEVER
    if num_free - num_needed >= num_watermark:
        return OK
    return LATER


@counting
def swap_status(num_total, num_free, num_needed, num_watermark):
    """Swap check: NEVER only when the device is smaller than the need."""
    if num_total < num_needed:
        return NEVER
    if num_free - num_needed >= num_watermark:
        return OK
    return LATER


@counting
def blocks_touched(num_filled, num_new_tokens, num_lookahead_slots, block_size):
    # cdiv written out: the Python layer calls this rule's plain-Python form (fast/kernels.py)
    return -(-(num_filled % block_size + num_new_tokens + num_lookahead_slots) // block_size)


@counting
def blocks_to_add(num_blocks, num_filled, num_needed_slots, block_size):
    num_empty = num_blocks * block_size - num_filled
    if num_empty >= num_needed_slots:
        return 0
    return cdiv(num_needed_slots - num_empty, block_size)


@counting
def num_blocks_to_drop(num_computed_tokens, block_size, max_window_blocks):
    return max(0, num_computed_tokens // block_size - max_window_blocks)
