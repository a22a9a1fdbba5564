"""The fast rules seen through the reference rules' signatures.

``crosshair diffbehavior`` needs annotated functions with the same result
types to compare. ``blockspace.fast.rules`` holds Numba kernels without
annotations, and ``alloc_status``/``swap_status`` return the int value of
the ``AllocStatus`` member. Each function here calls the kernel of the same
name (a plain Python function under ``NUMBA_DISABLE_JIT=1``) and converts
nothing else.

Which rules are compared is not listed here: ``symbolic.rule_names`` reads
them off ``blockspace.reference.rules``. A rule there with no function here
(or no kernel in ``blockspace.fast.rules``) fails ``tests/test_kit_rules.py``
by name.
"""

from __future__ import annotations

from blockspace.enums import AllocStatus
from blockspace.fast import rules


def cdiv(a: int, b: int) -> int:
    return rules.cdiv(a, b)


def watermark_blocks(watermark: float, num_gpu_blocks: int) -> int:
    return rules.watermark_blocks(watermark, num_gpu_blocks)


def window_blocks(sliding_window: int | None, block_size: int) -> int | None:
    return rules.window_blocks(sliding_window, block_size)


def window_cap(num_blocks: int, max_window_blocks: int | None) -> int:
    return rules.window_cap(num_blocks, max_window_blocks)


def blocks_for_prompt(
    num_tokens: int, num_lookahead_slots: int, num_encoder_tokens: int, block_size: int, max_window_blocks: int | None
) -> int:
    return rules.blocks_for_prompt(num_tokens, num_lookahead_slots, num_encoder_tokens, block_size, max_window_blocks)


def alloc_status(num_total: int, num_free: int, num_needed: int, num_watermark: int) -> AllocStatus:
    return AllocStatus(rules.alloc_status(num_total, num_free, num_needed, num_watermark))


def swap_status(num_total: int, num_free: int, num_needed: int, num_watermark: int) -> AllocStatus:
    return AllocStatus(rules.swap_status(num_total, num_free, num_needed, num_watermark))


def blocks_touched(num_filled: int, num_new_tokens: int, num_lookahead_slots: int, block_size: int) -> int:
    return rules.blocks_touched(num_filled, num_new_tokens, num_lookahead_slots, block_size)


def blocks_to_add(num_blocks: int, num_filled: int, num_needed_slots: int, block_size: int) -> int:
    return rules.blocks_to_add(num_blocks, num_filled, num_needed_slots, block_size)


def num_blocks_to_drop(num_computed_tokens: int, block_size: int, max_window_blocks: int) -> int:
    return rules.num_blocks_to_drop(num_computed_tokens, block_size, max_window_blocks)
