"""Per-method latency: each interface method on a running manager, in microseconds per call."""

from __future__ import annotations

from typing import Any

from blockspace.bench.timing import best_time, implementations
from blockspace.enums import Device, SequenceStatus
from blockspace.sequence import Sequence, SequenceGroup


def running_manager(cls: type, num_seqs: int, prompt_len: int, caching: bool) -> tuple[Any, list[Any]]:
    manager = cls(
        16,
        num_seqs * (prompt_len // 16 + 8) + 64,
        num_seqs * (prompt_len // 16 + 8),
        watermark=0.0,
        enable_caching=caching,
    )
    groups = []
    shared = list(range(prompt_len // 2))
    for i in range(num_seqs):
        group = SequenceGroup.from_prompt(f"g{i}", shared + [i + 1000] * (prompt_len - len(shared)), first_seq_id=i)
        if caching:
            manager.get_num_cached_tokens(group.seqs[0])
        manager.allocate(group)
        group.seqs[0].status = SequenceStatus.RUNNING
        groups.append(group)
    manager.mark_blocks_as_computed(None, 0)
    return manager, groups


def _method_timings(cls: type, num_seqs: int, repeats: int) -> dict[str, float]:
    manager, groups = running_manager(cls, num_seqs, 512, caching=True)
    seqs = [g.seqs[0] for g in groups]
    step = [0]

    def decode() -> None:
        for seq in seqs:
            seq.append_token_id(step[0] % 50)
            manager.append_slots(seq, 0)
        step[0] += 1

    fresh = [SequenceGroup.from_prompt(f"new{i}", list(range(512)), first_seq_id=10**6 + i) for i in range(num_seqs)]

    def allocate_free() -> None:
        for group in fresh:
            manager.allocate(group)
        for group in fresh:
            manager.free(group.seqs[0])

    children = [Sequence(2 * 10**6 + i, []) for i in range(num_seqs)]

    def fork_free() -> None:
        for seq, child in zip(seqs, children):
            manager.fork(seq, child)
        for child in children:
            manager.free(child)

    def swap_out_in() -> None:
        for group in groups:
            manager.swap_out(group)
            group.seqs[0].status = SequenceStatus.SWAPPED
        for group in groups:
            manager.swap_in(group)
            group.seqs[0].status = SequenceStatus.RUNNING

    per_seq = {
        "can_allocate": lambda: [manager.can_allocate(g) for g in fresh],
        "allocate + free": allocate_free,
        "can_append_slots": lambda: [manager.can_append_slots(g, 0) for g in groups],
        "append_slots (decode)": decode,
        "get_block_table": lambda: [manager.get_block_table(s) for s in seqs],
        "access_all_blocks_in_seq": lambda: [manager.access_all_blocks_in_seq(s, 1.0) for s in seqs],
        "get_num_cached_tokens": lambda: [manager.get_num_cached_tokens(s) for s in seqs],
        "get_common_computed_block_ids": lambda: [manager.get_common_computed_block_ids([s]) for s in seqs],
        "mark_blocks_as_computed": lambda: [manager.mark_blocks_as_computed(g, 1) for g in groups],
        "fork + free": fork_free,
        "can_swap_out": lambda: [manager.can_swap_out(g) for g in groups],
        "swap_out + swap_in": swap_out_in,
        "get_num_free_gpu_blocks": lambda: [manager.get_num_free_gpu_blocks() for _ in seqs],
        "get_prefix_cache_hit_rate": lambda: [manager.get_prefix_cache_hit_rate(Device.GPU) for _ in seqs],
    }
    timings = {}
    for method, run in per_seq.items():
        run()  # warm up (compiles or loads the kernels)
        calls = num_seqs * (2 if "+" in method else 1)
        timings[method] = best_time(run, repeats) / calls * 1e6
    return timings


def method_latency(quick: bool) -> dict[str, dict[str, float]]:
    """Microseconds per call of each method, on 128 running sequences of 512 tokens, caching on."""
    results: dict[str, dict[str, float]] = {}
    for name, cls in implementations().items():
        for method, micros in _method_timings(cls, 128, 3 if quick else 7).items():
            results.setdefault(method, {})[name] = micros
    return results
