"""The fast manager keeps a device block table in sync, step by step.

A scheduler walk (``blockspace.conformance.walk``: admissions, appends,
copy-on-write forks, swaps, preemptions, frees and row reuse) drives the
manager; after every step ``step_device`` drains the recorded changes, and
every live sequence's device row must equal ``get_block_table`` (swapped-out
sequences included: their rows hold the CPU block ids until swap-in rewrites
them), freed rows must be empty, and the slots must equal those computed in
plain Python from ``get_block_table``.

The same walk also runs under Numba's CUDA simulator in a fresh interpreter
(``NUMBA_ENABLE_CUDASIM=1``), with the caller's own ``DeviceBlockTable``
fed by ``table_delta()``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from blockspace import SequenceGroup, SequenceStatus
from blockspace.conformance.walk import Config, Solo, World, drain, step
from blockspace.fast.device_table import PAD_BLOCK_ID, PAD_SLOT_ID, DeviceBlockTable, gpu_available
from blockspace.fast.manager import FastBlockSpaceManager
from helpers import pytest_in_subprocess

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

CONFIGS = {
    "plain": Config(block_size=4, num_gpu_blocks=24, num_cpu_blocks=32),
    "caching": Config(block_size=4, num_gpu_blocks=24, num_cpu_blocks=32, enable_caching=True, lookahead=(0, 2)),
    "window": Config(block_size=2, num_gpu_blocks=40, num_cpu_blocks=40, sliding_window=8),
    "encoder": Config(block_size=4, num_gpu_blocks=32, num_cpu_blocks=32, encoder_decoder=True),
}


class Recording(Solo):
    """A ``Solo`` that remembers which calls succeeded."""

    def __init__(self, manager):
        super().__init__(manager)
        self.done: set[str] = set()

    def __call__(self, name, *args):
        result = super().__call__(name, *args)
        self.done.add(name)
        return result


def live(world: World):
    """Every sequence that holds a table: running ones and swapped-out ones."""
    for group in world.running:
        yield from group.get_seqs(status=SequenceStatus.RUNNING)
    for group in world.swapped:
        yield from group.get_seqs(status=SequenceStatus.SWAPPED)


def scheduled(manager, world: World, rng: random.Random):
    """The running sequences with a token range inside their tables, and the
    slots plain Python computes for them from ``get_block_table``."""
    seqs, starts, ends, slots = [], [], [], []
    bs = manager.block_size
    for group in world.running:
        for seq in group.get_seqs(status=SequenceStatus.RUNNING):
            table = manager.get_block_table(seq)
            end = min(seq.get_len(), len(table) * bs)
            start = max(0, end - rng.randint(0, 6))
            seqs.append(seq)
            starts.append(start)
            ends.append(end)
            slots += [table[pos // bs] * bs + pos % bs for pos in range(start, end)]
    return seqs, starts, ends, slots


def check_rows(manager, device_table: DeviceBlockTable, world: World, rows_seen: dict[int, set[int]]) -> None:
    table = device_table.table.cpu()
    lengths = device_table.lengths.cpu().tolist()
    live_rows = set()
    for seq in live(world):
        row = manager.row_of(seq)
        live_rows.add(row)
        rows_seen.setdefault(row, set()).add(seq.seq_id)
        expected = manager.get_block_table(seq)
        assert lengths[row] == len(expected), (seq.seq_id, row)
        assert table[row, : len(expected)].tolist() == expected, (seq.seq_id, row)
        assert (table[row, len(expected) :] == PAD_BLOCK_ID).all()
    # the other non-empty rows are exactly the live cross tables (encoder-decoder groups)
    cross_lengths = [
        len(manager.get_cross_block_table(group))
        for group in world.running + world.swapped
        if group.is_encoder_decoder()
    ]
    other_lengths = [length for row, length in enumerate(lengths) if row not in live_rows and length]
    assert sorted(other_lengths) == sorted(n for n in cross_lengths if n)
    for row, length in enumerate(lengths):
        if row not in live_rows and not length:
            assert (table[row] == PAD_BLOCK_ID).all(), row


def run_walk(name: str, seed: int, num_steps: int, start_at: int = 0, make_table=None) -> Recording:
    """Walk ``num_steps`` steps, syncing after each from step ``start_at`` on."""
    config = CONFIGS[name]
    args, kwargs = config.args()
    manager = FastBlockSpaceManager(*args, **kwargs, track_device_table=start_at == 0)
    driver = Recording(manager)
    world = World(random.Random(seed))
    rng = random.Random(seed + 1)
    own_table = make_table(config.block_size) if make_table else None
    rows_seen: dict[int, set[int]] = {}
    for number in range(num_steps + 1):
        if number < num_steps:
            step(driver, world, config)
        else:
            drain(driver, world)
        if number < start_at:
            continue
        seqs, starts, ends, expected = scheduled(manager, world, rng)
        pad_to = len(expected) + rng.choice([0, 0, 3])
        if own_table is None:
            device_table = manager.device_block_table(backend="cpu", max_seqs=4, max_blocks=2)
            slots = manager.step_device(seqs, starts, ends, pad_to=pad_to)
        else:
            device_table = own_table
            rows = [manager.row_of(seq) for seq in seqs]
            slots = own_table.step(manager.table_delta(), rows, starts, ends, pad_to=pad_to)
        assert slots.tolist() == expected + [PAD_SLOT_ID] * (pad_to - len(expected))
        check_rows(manager, device_table, world, rows_seen)
    manager.check_invariants()
    driver.rows_reused = any(len(ids) > 1 for ids in rows_seen.values())
    return driver


if not SIMULATED:

    @pytest.mark.parametrize("name", sorted(CONFIGS))
    def test_device_table_follows_a_scheduler_walk(name):
        done: set[str] = set()
        reused = False
        for seed in range(3):
            driver = run_walk(name, seed, num_steps=60)
            done |= driver.done
            reused |= driver.rows_reused
        assert {"allocate", "append_slots", "fork", "free"} <= done
        if name != "window":  # the walk never swaps a table the sliding window has touched
            assert {"swap_out", "swap_in"} <= done
        assert reused

    def test_tracking_can_start_late():
        """The first sync after a late start carries every live table in full."""
        run_walk("plain", seed=5, num_steps=40, start_at=20)

    def test_a_step_larger_than_the_write_log_resynchronises():
        manager = FastBlockSpaceManager(1, 6000, 10, track_device_table=True)
        group = SequenceGroup.from_prompt("big", list(range(5000)), n=2, first_seq_id=1)
        manager.allocate(group)
        first, second = group.seqs
        slots = manager.step_device([first, second], [0, 4990], [3, 5000])
        table = manager.get_block_table(first)
        assert slots.tolist() == table[:3] + manager.get_block_table(second)[4990:]
        device_table = manager.device_block_table()
        assert device_table.table[manager.row_of(second), :5000].tolist() == manager.get_block_table(second)
        first_row = manager.row_of(first)
        manager.free(first)
        manager.step_device([second], [0], [1])
        assert int(device_table.lengths[first_row]) == 0
        assert int(device_table.lengths[manager.row_of(second)]) == 5000

    @pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")
    def test_the_real_kernel_follows_a_walk():
        run_walk(
            "caching",
            seed=2,
            num_steps=40,
            make_table=lambda bs: DeviceBlockTable(bs, max_seqs=4, max_blocks=2, backend="cuda"),
        )

    def test_the_walk_under_the_cuda_simulator():
        done = pytest_in_subprocess(Path(__file__).resolve(), NUMBA_ENABLE_CUDASIM="1")
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
        assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]

else:

    def test_simulated_kernel_follows_a_short_walk():
        run_walk(
            "plain",
            seed=1,
            num_steps=12,
            make_table=lambda bs: DeviceBlockTable(bs, max_seqs=4, max_blocks=2, backend="cuda", threads_per_block=8),
        )


def test_a_delta_holds_the_row_of_an_empty_table() -> None:
    manager = FastBlockSpaceManager(block_size=2, num_gpu_blocks=3, num_cpu_blocks=1)
    first, empty = SequenceGroup.from_prompt("a", [1, 2, 3]), SequenceGroup.from_prompt("b", [])
    manager.allocate(first)
    manager.table_delta()  # tracking starts with the first table
    manager.allocate(empty)
    delta = manager.table_delta()
    assert manager.get_block_table(empty.seqs[0]) == []
    assert delta.num_rows > manager.row_of(empty.seqs[0]), "the device table would have no row for it"
