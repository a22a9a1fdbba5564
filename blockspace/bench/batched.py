"""One batched decode step at 256, 1,024 and 4,096 running sequences: the
fast manager's batched API and its array-level API against the
per-sequence calls a v0 scheduler and model runner make on the reference."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from blockspace.bench.methods import running_manager
from blockspace.bench.timing import implementations


def _reference_step(manager: Any, groups: list[Any], seqs: list[Any], tensors: bool) -> Any:
    """What a v0 scheduler and model runner do per decode step, call by call."""
    import torch

    for group in groups:
        manager.can_append_slots(group, 0)
    cows = [manager.append_slots(seq, 0) for seq in seqs]
    tables = [manager.get_block_table(seq) for seq in seqs]
    if tensors:
        bs = manager.block_size
        width = max(len(t) for t in tables)
        torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        positions = [seq.get_len() - 1 for seq in seqs]
        torch.tensor([t[p // bs] * bs + p % bs for t, p in zip(tables, positions)], dtype=torch.long)
    return cows


def _fast_step(manager: Any, groups: list[Any], seqs: list[Any], tensors: bool) -> Any:
    manager.can_append_slots_batch(groups, 0)
    cows = manager.append_slots_batch(seqs, 0)
    manager.block_tables(seqs)
    if tensors:
        manager.slot_mapping(seqs, 1)
    return cows


def batched_step(quick: bool) -> list[dict[str, Any]]:
    """The step at each size, with and without tensors. The three ways are
    measured in turns, a few passes each: a slow spell of the shared machine
    then slows every way alike instead of one, and the best of each is kept."""
    sizes = [256, 1024] if quick else [256, 1024, 4096]
    num_passes = 1 if quick else 3
    classes = implementations()
    results = []
    for num_seqs in sizes:
        row: dict[str, Any] = {"num_seqs": num_seqs}
        for tensors in (False, True):
            num_rounds = 3 if quick else 6
            ways = {
                "reference": _sequence_rounds(classes["reference"], _reference_step, num_seqs, tensors, num_rounds),
                "fast": _sequence_rounds(classes["fast"], _fast_step, num_seqs, tensors, num_rounds),
                "array": _array_rounds(num_seqs, tensors, 10 if quick else 40),
            }
            best = dict.fromkeys(ways, float("inf"))
            for _ in range(num_passes):
                for name, rounds in ways.items():
                    best[name] = min(best[name], rounds())
            reference, fast, array = (best[name] * 1e3 for name in ("reference", "fast", "array"))
            row["with_tensors" if tensors else "manager_only"] = {
                "reference_ms": reference,
                "fast_ms": fast,
                "ratio": reference / fast,
                "array_ms": array,
                "array_ratio": reference / array,
            }
        results.append(row)
    return results


def _sequence_rounds(
    cls: type, step: Callable[..., Any], num_seqs: int, tensors: bool, num_rounds: int
) -> Callable[[], float]:
    """A running manager, and a function timing ``num_rounds`` decode
    ``step``s on it through Sequence objects: the best round's seconds."""
    manager, groups = running_manager(cls, num_seqs, 1024, caching=False)
    seqs = [g.seqs[0] for g in groups]

    def rounds() -> float:
        best = float("inf")
        for i in range(num_rounds):
            for seq in seqs:
                seq.data.update_num_computed_tokens(seq.get_len() - seq.data.get_num_computed_tokens())
                seq.append_token_id(i)
            start = time.perf_counter()
            step(manager, groups, seqs, tensors)
            best = min(best, time.perf_counter() - start)
        return best

    return rounds


def _array_rounds(num_seqs: int, tensors: bool, num_rounds: int) -> Callable[[], float]:
    """The same step through the array-level API (fast/row_api.py): the
    scheduler keeps the rows and lengths as arrays and adds each step's new
    token to the lengths itself (inside the timing). More rounds than the
    others: each is some 300 times shorter, so more of them are disturbed by
    the other jobs on the machine."""
    import numpy as np

    from blockspace.fast import FastBlockSpaceManager

    manager, groups = running_manager(FastBlockSpaceManager, num_seqs, 1024, caching=False)
    seqs = [g.seqs[0] for g in groups]
    rows = manager.rows_of(seqs)
    lengths = np.array([seq.get_len() for seq in seqs], np.int64)

    def rounds() -> float:
        best = float("inf")
        for _ in range(num_rounds):
            start = time.perf_counter()
            lengths[:] += 1
            manager.can_append_slots_rows(rows, lengths, 0)
            manager.append_slots_rows(rows, lengths, 0)
            manager.block_tables(rows)
            if tensors:
                manager.slot_mapping(rows, 1)
            best = min(best, time.perf_counter() - start)
        return best

    return rounds
