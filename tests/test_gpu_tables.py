"""The device block table and slot mapping, on the CPU path.

The device table, kept in sync by deltas only, must equal the table rebuilt
from scratch from Python lists after every step of random workloads
(appends, copy-on-write replacements, truncations, frees, row reuse,
growth), and the slots must equal a plain Python computation. The
simulator and GPU tests replay the same workloads through the kernel.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from numba import njit

from blockspace.errors import InvalidArgumentError
from blockspace.fast.device_table import PAD_SLOT_ID, DeviceBlockTable
from blockspace.fast.table_deltas import (
    PAD_BLOCK_ID,
    TableDeltas,
    deltas_append,
    deltas_clear_row,
    deltas_drain,
    deltas_record,
    deltas_set_length,
    new_delta_buffers,
)

BLOCK_SIZE = 4


def random_steps(seed: int, num_steps: int, block_size: int = BLOCK_SIZE):
    """A random workload: per step, the drained delta, the scheduled token
    ranges, and the sequences' block lists as plain Python (the truth)."""
    rng = random.Random(seed)
    deltas = TableDeltas(num_rows=2, num_cols=2)  # tiny, so that both dimensions grow
    seqs: dict[int, list[int]] = {}
    for _ in range(num_steps):
        for _ in range(rng.randint(0, 5)):
            op = rng.random()
            if op < 0.25 or not seqs:
                row = deltas.acquire_row()
                num_blocks = rng.choice([1, 2, 3, rng.randint(4, 24)])
                seqs[row] = [rng.randrange(1000) for _ in range(num_blocks)]
                for block in seqs[row]:
                    deltas.append(row, block)
                continue
            row = rng.choice(sorted(seqs))
            blocks = seqs[row]
            if op < 0.55:
                blocks.append(rng.randrange(1000))
                deltas.append(row, blocks[-1])
            elif op < 0.7:  # copy-on-write: a new block replaces one
                col = rng.randrange(len(blocks))
                blocks[col] = rng.randrange(1000)
                deltas.record(row, col, blocks[col])
            elif op < 0.8:
                del blocks[rng.randint(1, len(blocks)) :]
                deltas.set_length(row, len(blocks))
            else:
                deltas.release_row(row)
                del seqs[row]
        rows = [row for row in sorted(seqs) if rng.random() < 0.7]
        starts, ends = [], []
        for row in rows:
            capacity = len(seqs[row]) * block_size
            start = rng.randrange(capacity)
            starts.append(start)
            ends.append(rng.choice([start, start + 1, rng.randint(start, capacity)]))
        yield deltas.drain(), rows, starts, ends, {row: list(blocks) for row, blocks in seqs.items()}


def rebuilt_table(seqs: dict[int, list[int]], shape) -> tuple[np.ndarray, np.ndarray]:
    """vLLM v0's way: the padded table and lengths, from the lists."""
    table = np.full(shape, PAD_BLOCK_ID, np.int32)
    lengths = np.zeros(shape[0], np.int32)
    for row, blocks in seqs.items():
        table[row, : len(blocks)] = blocks
        lengths[row] = len(blocks)
    return table, lengths


def python_slots(seqs, rows, starts, ends, block_size: int = BLOCK_SIZE) -> list[int]:
    return [
        seqs[row][pos // block_size] * block_size + pos % block_size
        for row, start, end in zip(rows, starts, ends)
        for pos in range(start, end)
    ]


@pytest.mark.parametrize("seed", range(6))
def test_synced_table_equals_table_rebuilt_from_lists(seed):
    device = DeviceBlockTable(BLOCK_SIZE, max_seqs=1, max_blocks=1, backend="cpu")
    for delta, rows, starts, ends, seqs in random_steps(seed, num_steps=40):
        pad_to = len(python_slots(seqs, rows, starts, ends)) + seed
        slots = device.step(delta, rows, starts, ends, pad_to=pad_to)
        table, lengths = rebuilt_table(seqs, tuple(device.table.shape))
        assert np.array_equal(device.table.numpy(), table)
        assert np.array_equal(device.lengths.numpy(), lengths)
        expected = python_slots(seqs, rows, starts, ends)
        assert slots.dtype == torch.int64
        assert slots.tolist() == expected + [PAD_SLOT_ID] * seed


def test_each_changed_cell_travels_once_with_its_final_value():
    deltas = TableDeltas()
    deltas.append(3, 7)
    deltas.record(3, 0, 8)
    deltas.append(3, 9)
    deltas.clear_row(3)
    deltas.append(3, 5)
    delta = deltas.drain()
    cells = sorted(zip(delta.rows.tolist(), delta.cols.tolist(), delta.values.tolist()))
    assert cells == [(3, 0, 5), (3, 1, PAD_BLOCK_ID)]
    assert (delta.length_rows.tolist(), delta.length_values.tolist()) == ([3], [1])
    empty = deltas.drain()
    assert empty.num_entries == 0 and len(empty.length_rows) == 0


def test_rows_are_reused_lowest_first():
    deltas = TableDeltas()
    rows = [deltas.acquire_row() for _ in range(4)]
    deltas.append(rows[1], 4)
    deltas.release_row(rows[1])
    deltas.release_row(rows[3])
    assert deltas.acquire_row() == 1 and deltas.length(1) == 0
    assert deltas.acquire_row() == 3
    with pytest.raises(InvalidArgumentError):
        deltas.release_row(7)


@njit(cache=True)
def _compiled_mutations(buf):
    """What a host kernel of the fast manager does: thread the buffers through."""
    for row in range(3):
        for block in range(row + 2):
            buf = deltas_append(buf, row, 10 * row + block)
    buf = deltas_record(buf, 1, 0, 99)
    buf = deltas_set_length(buf, 2, 1)
    buf = deltas_clear_row(buf, 0)
    buf = deltas_append(buf, 40, 1)  # grows the rows
    return buf


def test_recorder_works_inside_njit_code_and_equals_python_use():
    compiled = _compiled_mutations(new_delta_buffers(2, 2))
    deltas = TableDeltas(2, 2)
    for row in range(3):
        for block in range(row + 2):
            deltas.append(row, 10 * row + block)
    deltas.record(1, 0, 99)
    deltas.set_length(2, 1)
    deltas.clear_row(0)
    deltas.append(40, 1)
    assert np.array_equal(compiled.table, deltas.buffers.table)
    drained = deltas.drain()
    assert [a.tolist() for a in deltas_drain(compiled)] == [
        getattr(drained, name).tolist() for name in ("rows", "cols", "values", "length_rows", "length_values")
    ]


def test_device_table_grows_keeping_its_contents():
    deltas = TableDeltas(1, 1)
    device = DeviceBlockTable(BLOCK_SIZE, max_seqs=1, max_blocks=1, backend="cpu")
    deltas.append(0, 5)
    device.sync(deltas.drain())
    deltas.record(9, 30, 6)
    device.sync(deltas.drain())
    assert device.table.shape[0] >= 10 and device.table.shape[1] >= 31
    assert device.table[0, 0] == 5 and device.table[9, 30] == 6 and device.lengths[9] == 31
    assert int(device.table.count_nonzero()) == 2


def test_bad_input_raises_and_changes_nothing():
    deltas = TableDeltas()
    device = DeviceBlockTable(BLOCK_SIZE, backend="cpu")
    deltas.append(0, 5)
    device.sync(deltas.drain())
    before = (device.table.clone(), device.lengths.clone())
    deltas.append(0, 6)
    pending = deltas.drain()
    for rows, starts, ends, pad_to in (
        ([0], [0], [9], None),  # past the row's 2 blocks
        ([0], [3], [2], None),  # end before start
        ([1000], [0], [1], None),  # outside the table
        ([0], [0], [4], 2),  # pad_to below the number of tokens
    ):
        with pytest.raises(InvalidArgumentError):
            device.step(pending, rows, starts, ends, pad_to=pad_to)
        assert torch.equal(device.table, before[0]) and torch.equal(device.lengths, before[1])
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidArgumentError):
            deltas.record(bad, 0, 1)
    with pytest.raises(InvalidArgumentError):
        DeviceBlockTable(0)
    with pytest.raises(InvalidArgumentError):
        DeviceBlockTable(BLOCK_SIZE, backend="tpu")


def test_slot_mapping_without_tokens_is_all_padding():
    device = DeviceBlockTable(BLOCK_SIZE, backend="cpu")
    assert device.slot_mapping([], [], []).tolist() == []
    assert device.slot_mapping([], [], [], pad_to=3).tolist() == [PAD_SLOT_ID] * 3
