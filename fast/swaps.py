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

from typing import Any

import numpy as np

from blockspace.enums import Device, SequenceStatus
from blockspace.errors import NoFreeBlocksError, UnsupportedError, WrongDeviceError
from blockspace.fast import kernels
from blockspace.fast import table as T
from blockspace.fast.appends import Appends, pairs


class Swaps:
    """The swap checks and moves of a manager's tables."""

    def __init__(self, appends: Appends, num_gpu_blocks: int, num_cpu_blocks: int, watermark_blocks: int) -> None:
        self.store, self.rows, self.appends = appends.store, appends.rows, appends
        self.block_size = appends.block_size
        self.num_total = {Device.GPU: num_gpu_blocks, Device.CPU: num_cpu_blocks}
        self.watermark = {Device.GPU: watermark_blocks, Device.CPU: 0}  # kept free only on the GPU

    def _handle(self, device: Device) -> Any:
        return self.store.gpu_ref if device == Device.GPU else self.store.cpu_ref

    def _num_free(self, device: Device) -> int:
        return self.store.num_free_gpu() if device == Device.GPU else self.store.num_free_cpu()

    def status(self, seq_group: Any, device: Device, status: SequenceStatus, num_lookahead_slots: int) -> int:
        """Would the group's ``status`` sequences fit on ``device``? The ``AllocStatus`` value."""
        seqs = seq_group.get_seqs(status=status)
        rows = np.array([self.rows.row(seq) for seq in seqs], np.int64)
        num_tokens = np.array([len(seq.get_token_ids()) for seq in seqs], np.int64)
        need = kernels.swap_need(
            self._handle(device), self.store.tables_ref, rows, num_tokens, num_lookahead_slots, self.block_size
        )
        return kernels.swap_status(self.num_total[device], self._num_free(device), need, self.watermark[device])

    def move(
        self, seq_group: Any, status: SequenceStatus, source: Device, destination: Device
    ) -> list[tuple[int, int]]:
        """Move the tables of the group's ``status`` sequences; returns the
        ``(source, destination)`` physical-id pairs, sequence by sequence."""
        tables = self.store.tables
        rows = [self.rows.row(seq) for seq in seq_group.get_seqs(status=status)]
        rows = [row for row in rows if tables.num_blocks[row] > 0]
        source_code = T.GPU if source == Device.GPU else T.CPU
        for row in rows:
            if tables.device[row] != source_code:
                raise WrongDeviceError(
                    f"a {status.name} sequence of group {seq_group.request_id!r} is not on the {source.name}"
                )
            if tables.num_null[row] > 0:
                raise UnsupportedError("swap of a sliding-window table after blocks were dropped")
        rows_array = np.array(rows, np.int64)
        mapping = self.appends.scratch(2 * int(tables.num_blocks[rows_array].sum()))
        count = kernels.swap(
            self._handle(source), self._handle(destination), self.store.tables_ref, rows_array, 1 - source_code,
            self.block_size, mapping,
        )  # fmt: skip
        if count == T.NO_BLOCKS:
            need = kernels.swap_cost(self._handle(destination), self.store.tables_ref, rows_array, self.block_size)
            raise NoFreeBlocksError(
                f"swap needs {need} {destination.name} blocks, {self._num_free(destination)} are free"
            )
        self.rows.refresh_rows(rows_array)
        return pairs(mapping, count)
