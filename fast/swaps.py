"""Swapping: whether a group's tables fit on the other device, and moving
them there.

Why a part of its own: a swap reads and writes every block of every table
of a group at once, so it runs as one kernel over the group's rows; what
is left in Python is gathering the rows, the reference's checks in its
order, and turning a shortage into the reference's error. The estimate
(``status``) follows vLLM's: empty lookahead blocks are not counted and a
shared block counts once per sharer (spec §14.6).
"""

from __future__ import annotations

import numpy as np

from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.errors import NoFreeBlocksError, UnsupportedError, WrongDeviceError
from blockspace.fast import kernels
from blockspace.fast import table as T
from blockspace.fast.allocations import ALLOC_STATUS
from blockspace.fast.appends import pairs
from blockspace.fast.store import CODE_OF_DEVICE, Store
from blockspace.fast.table_rows import TableRows
from blockspace.protocols import SequenceGroupLike


class Swaps:
    """The swap checks and moves of a manager's tables."""

    def __init__(
        self, store: Store, rows: TableRows, *, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int,
        watermark_blocks: int,
    ) -> None:  # fmt: skip
        self.store, self.rows, self.block_size = store, rows, block_size
        self.num_total = {Device.GPU: num_gpu_blocks, Device.CPU: num_cpu_blocks}
        self.watermark = {Device.GPU: watermark_blocks, Device.CPU: 0}  # kept free only on the GPU

    def status(
        self, seq_group: SequenceGroupLike, device: Device, status: SequenceStatus, num_lookahead_slots: int
    ) -> AllocStatus:
        """Would the group's ``status`` sequences fit on ``device``?"""
        seqs = seq_group.get_seqs(status=status)
        rows = np.array([self.rows.require(seq) for seq in seqs], np.int64)
        num_tokens = np.array([len(seq.get_token_ids()) for seq in seqs], np.int64)
        need = kernels.swap_need(
            self.store.pool_ref(device), self.store.tables_ref, rows, num_tokens, num_lookahead_slots, self.block_size
        )
        num_free = self.store.num_free(device)
        return ALLOC_STATUS[kernels.swap_status(self.num_total[device], num_free, need, self.watermark[device])]

    def move(
        self, seq_group: SequenceGroupLike, status: SequenceStatus, source: Device, destination: Device
    ) -> list[tuple[int, int]]:
        """Move the tables of the group's ``status`` sequences; returns the
        ``(source, destination)`` physical-id pairs, sequence by sequence."""
        tables = self.store.tables
        rows = [self.rows.require(seq) for seq in seq_group.get_seqs(status=status)]
        rows = [row for row in rows if tables.num_blocks[row] > 0]
        source_code = CODE_OF_DEVICE[source]
        for row in rows:
            if tables.device[row] != source_code:
                raise WrongDeviceError(
                    f"a {status.name} sequence of group {seq_group.request_id!r} is not on the {source.name}"
                )
            if tables.num_null[row] > 0:
                raise UnsupportedError("swap of a sliding-window table after blocks were dropped")
        store, rows_array = self.store, np.array(rows, np.int64)
        mapping = store.pairs_buffer(2 * int(tables.num_blocks[rows_array].sum()))
        to = store.pool_ref(destination)
        count = kernels.swap(
            store.pool_ref(source), to, store.tables_ref, rows_array, CODE_OF_DEVICE[destination], self.block_size,
            mapping,
        )  # fmt: skip
        if count == T.NO_BLOCKS:
            need = kernels.swap_cost(to, store.tables_ref, rows_array, self.block_size)
            num_free = store.num_free(destination)
            raise NoFreeBlocksError(f"swap needs {need} {destination.name} blocks, {num_free} are free")
        self.rows.refresh_rows(rows_array)
        return pairs(mapping, count)
