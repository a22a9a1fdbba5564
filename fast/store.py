"""The arrays every kernel reads and writes, in one place.

- ``gpu``, ``cpu``: the blocks of each device (``fast/pool.py``);
- ``keys``: content keys (``fast/content.py``), shared by both devices;
- ``tables``: one row per sequence table and per cross table (``fast/table.py``);
- ``tracker``: one row per sequence the computed-blocks tracker knows (``fast/tracker.py``);
- ``null_block``: the sliding window's null block (-1 until the first append).

Why one object: a kernel call takes several of these at once, and a state
that grows is replaced whole (a NamedTuple of larger arrays). The parts of
the manager (table rows, tracker rows, key space, device sync, the batched
steps) each own their Python-side bookkeeping and share this store, so a
replacement made by one is seen by all. Each state is kept twice, as the
NamedTuple (what Python reads) and as a one-pointer handle on the very same
arrays (what kernels get, ``<name>_ref``; ``fast/handles.py``), and
``<name>_view`` gives the same arrays as memoryviews, for single reads.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from blockspace.enums import Device
from blockspace.fast import pool as P
from blockspace.fast import table as T
from blockspace.fast import tracker as K
from blockspace.fast.content import Keys, new_keys
from blockspace.fast.handles import Derived, State
from blockspace.fast.saving import Buffers, Packed, packed, unpacked


class Store(Derived):
    """The kernels' state (see the module docstring)."""

    gpu: State[P.Pool] = State()
    cpu: State[P.Pool] = State()
    keys: State[Keys] = State()
    tables: State[T.Tables] = State()
    tracker: State[K.Tracker] = State()

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, caching: bool) -> None:
        self.keys = new_keys(
            block_size, key_capacity(block_size, num_gpu_blocks + num_cpu_blocks) if caching else FIRST_SIZE
        )
        self.gpu = P.new_pool(0, num_gpu_blocks, caching, len(self.keys.parent))
        self.cpu = P.new_pool(num_gpu_blocks, num_cpu_blocks, caching, len(self.keys.parent))
        self.tables = T.new_tables()  # two rows of two blocks, doubled as they fill, so small worlds grow them too
        self.tracker = K.new_tracker()
        self.null_block = np.full(1, -1, np.int64)
        self.buffers = Buffers()
        self.pairs = np.zeros(64, np.int64)

    # -- the one place a device picks its pool ---------------------------------------
    def pool_ref(self, device: Device) -> Any:
        """The kernels' handle on ``device``'s pool."""
        return self.gpu_ref if device == Device.GPU else self.cpu_ref

    def num_free(self, device: Device) -> int:
        return self.num_free_gpu() if device == Device.GPU else self.num_free_cpu()

    def num_free_gpu(self) -> int:
        """Free GPU blocks, uncached plus idle cached (two reads, no kernel call)."""
        meta = self.gpu_view.meta
        return meta[P.NUM_FREE_IDS] + meta[P.NUM_IDLE]

    def num_free_cpu(self) -> int:
        meta = self.cpu_view.meta
        return meta[P.NUM_FREE_IDS] + meta[P.NUM_IDLE]

    def pairs_buffer(self, num_values: int) -> np.ndarray:
        """A buffer of at least ``num_values`` int64 for the pairs a kernel
        writes (copy-on-write or swap mappings), kept between calls: the
        caller turns the pairs into Python tuples before the next kernel call."""
        if len(self.pairs) < num_values:
            self.pairs = np.zeros(2 * num_values, np.int64)
        return self.pairs

    def grow_columns(self, num_cols: int = 0) -> None:
        """At least ``num_cols`` table columns (default: twice as many)."""
        self.tables = T.grow_tables(self.tables, num_cols=num_cols or 2 * self.tables.blocks.shape[1])

    def trial(self) -> Store:
        """A copy of the GPU pool, keys, tables and null block, for a batch
        that may fail halfway: it runs on the copy, kept by ``commit``."""
        trial = object.__new__(Store)
        trial.gpu, trial.keys, trial.tables = _copy(self.gpu), _copy(self.keys), _copy(self.tables)
        trial.null_block = self.null_block.copy()
        return trial

    def __getstate__(self) -> tuple[tuple[Packed, ...], int]:
        """Pickling and ``copy.deepcopy`` take each state as one buffer and
        its layout (``fast/saving.py``), and the null block; the kernels'
        handles and the memoryviews are made anew on the way back
        (``__setstate__``): a handle is a pointer into this process, and a
        copied view would still look at the old arrays."""
        return self.save()

    def __setstate__(self, state: tuple[tuple[Packed, ...], int]) -> None:
        states, null = state
        for name, packed_state in zip(STATE_NAMES, states):
            setattr(self, name, unpacked(*packed_state))  # through ``State``: handles and views made when first read
        self.null_block = np.full(1, null, np.int64)
        self.buffers = Buffers()
        self.pairs = np.zeros(64, np.int64)

    def save(self) -> tuple[tuple[Packed, ...], int]:
        """Every state as one buffer, and the null block (``save_state``)."""
        return tuple(packed(getattr(self, name)) for name in STATE_NAMES), self.null_block.item(0)

    def restore(self, saved: tuple[tuple[Packed, ...], int]) -> None:
        """``save``'s states back, into the arrays held now where their
        layout is the same: then the handles and views stay as they are."""
        states, null = saved
        held = self.__dict__
        for name, state in zip(STATE_NAMES, states):
            restored = self.buffers.restored(name, held[name], state)
            if restored is not held[name]:
                setattr(self, name, restored)  # through ``State``: the handle and view made anew
        self.null_block[0] = null

    def commit(self, trial: Store) -> None:
        self.gpu, self.keys, self.tables = trial.gpu, trial.keys, trial.tables
        self.null_block[:] = trial.null_block


STATE_NAMES = ("gpu", "cpu", "keys", "tables", "tracker")
DEVICE_OF_CODE = {T.GPU: Device.GPU, T.CPU: Device.CPU}  # a table row's device code (``fast/table.py``)
CODE_OF_DEVICE = {device: code for code, device in DEVICE_OF_CODE.items()}
FIRST_KEY_TOKENS = 1 << 14  # the key table's token cells made at the start (128 KiB); past that it grows
FIRST_SIZE = 4  # the key table's least first size (and its size without prefix caching, where it stays empty)


def key_capacity(block_size: int, num_blocks: int) -> int:
    """The key table's first size with prefix caching: twice the blocks
    (every cached block names a key, and tracker rows name more), a power
    of two, at most ``FIRST_KEY_TOKENS`` token cells; it grows, doubling,
    as keys are made (``KeySpace.make_room``, between kernel calls).

    Why not the pool's size at once: a manager holds its key table before
    it gets any work, and at 49,152 blocks of 16 tokens that table was
    21 MB, most of a fleet replica's idle bytes (a fleet of 1,024 held
    21 GB doing nothing). A pool's blocks fill with keys only as requests
    come; the doublings rehash each key about once more in all (the sizes
    sum to twice the last), between kernel calls. Why no more than twice
    the blocks: a small pool then fills its key table and runs the
    collector (``fast/key_space.py``), as the small worlds of the
    conformance explorer must for it to be checked."""
    capacity = FIRST_SIZE
    while capacity < 2 * num_blocks and 2 * capacity * block_size <= FIRST_KEY_TOKENS:
        capacity *= 2
    return capacity


_Arrays = TypeVar("_Arrays", P.Pool, Keys, T.Tables)


def _copy(state: _Arrays) -> _Arrays:
    """A deep copy of a NamedTuple of arrays."""
    return type(state)(*(array.copy() for array in state))
