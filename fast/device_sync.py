"""Keeping a device-resident block table in step with the manager's tables.

Why deltas: copying every table to the GPU at every step costs a transfer
of the whole table; a decode step changes a few cells. So once tracking
starts, every block write of a kernel is logged (``tables.log``, see
``fast/table.py``), and at each step the log is folded into delta buffers
(``fast/table_deltas.py``) that the ``DeviceBlockTable``
(``fast/device_table.py``) applies. A log that overflows, and the start of
tracking, record every live row in full instead. Nothing here runs until a
caller asks for a device table or a delta, and each module is imported only
then (at the top, it would make every manager need the ``[gpu]`` extra):
``fast/table_deltas.py`` (NumPy and Numba, checks the extra, no CUDA) for
deltas, ``fast/device_table.py`` (torch and ``numba.cuda``) only for a device
table. Neither imports this module, so no import circle can form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from blockspace.fast.saving import Buffers, Packed, packed, unpacked
from blockspace.fast.store import Store
from blockspace.fast.table_rows import TableRows

if TYPE_CHECKING:  # both need the [gpu] extra: imported where used (see the module docstring)
    from blockspace.fast.device_table import DeviceBlockTable
    from blockspace.fast.table_deltas import TableDelta

# Writes the first log holds. Why small: it doubles on overflow, and small scopes then overflow it too.
FIRST_LOG_SIZE = 4


class DeviceSync:
    """The delta buffers and the device table they feed (docs/gpu.md)."""

    def __init__(self, store: Store, rows: TableRows) -> None:
        self.store = store
        self.rows = rows
        self.deltas: Any = None  # table_deltas.DeltaBuffers while tracking
        self.device_table: DeviceBlockTable | None = None
        self.buffers = Buffers()

    def __getstate__(self) -> dict[str, Any]:
        """The delta buffers as one buffer (``fast/saving.py``), without the
        restore's record (its buffers belong to this process's arrays)."""
        return {name: value for name, value in self.__dict__.items() if name != "buffers"} | {"deltas": self.save()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, deltas=unpacked(*state["deltas"]) if state["deltas"] is not None else None)
        self.buffers = Buffers()

    def save(self) -> Packed | None:
        """The delta buffers (``save_state``; a device table cannot be saved:
        the manager refuses first)."""
        return packed(self.deltas) if self.deltas is not None else None

    def restore(self, saved: Packed | None) -> None:
        self.deltas = None if saved is None else self.buffers.restored("deltas", self.deltas, saved)

    def device(
        self, block_size: int, backend: str = "auto", max_seqs: int = 256, max_blocks: int = 64
    ) -> DeviceBlockTable:
        """The ``DeviceBlockTable`` (made on the first call; the arguments only count then)."""
        if self.device_table is None:
            from blockspace.fast.device_table import DeviceBlockTable

            self.device_table = DeviceBlockTable(block_size, max_seqs, max_blocks, backend)
        return self.device_table

    def start(self) -> None:
        """Start logging block writes, with every live table as the first delta."""
        if self.deltas is not None:
            return
        from blockspace.fast.table_deltas import new_delta_buffers

        self.deltas = new_delta_buffers(max(self.rows.num_used, 1), self.store.tables.blocks.shape[1])
        self._resync(log_capacity=FIRST_LOG_SIZE)

    def _resync(self, log_capacity: int) -> None:
        """Record every row in use in full and clear the others (tracking starts,
        or the write log overflowed), with an empty log of ``log_capacity``."""
        from blockspace.fast.table_deltas import deltas_clear_row, deltas_copy_row

        tables, in_use, buffers = self.store.tables, self.rows.rows_in_use(), self.deltas
        for row in range(self.rows.num_used):
            if row in in_use:
                buffers = deltas_copy_row(buffers, row, tables.blocks[row, : tables.num_blocks[row]])
            elif row < len(buffers.lengths):
                buffers = deltas_clear_row(buffers, row)
        self.deltas = buffers
        self.store.tables = tables._replace(log=np.zeros((log_capacity, 2), np.int32), num_logged=np.zeros(1, np.int64))

    def _flush_log(self) -> None:
        from blockspace.fast.table_deltas import flush_table_log

        self.deltas, flushed = flush_table_log(self.store.tables_ref, self.deltas)
        if not flushed:
            self._resync(log_capacity=2 * len(self.store.tables.log))

    def forget_row(self, row: int) -> None:
        """A table is about to be freed: its row empties on the device too."""
        if self.deltas is not None:
            from blockspace.fast.table_deltas import deltas_clear_row

            self._flush_log()
            self.deltas = deltas_clear_row(self.deltas, row)

    def drain(self) -> TableDelta:
        """The changes since the last drain as a ``TableDelta`` (starts tracking)."""
        from blockspace.fast.table_deltas import TableDelta, deltas_drain

        self.start()
        self._flush_log()
        num_rows, num_cols = self.deltas.table.shape
        # Every row in use, written or not: an empty table (an empty prompt) writes no cell, yet
        # its sequence may be in a step, and the device table must hold its row (length 0).
        num_rows = max(num_rows, self.rows.num_used)
        changes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] = deltas_drain(self.deltas)
        return TableDelta(*changes, num_rows, num_cols)
