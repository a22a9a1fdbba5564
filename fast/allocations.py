"""A table's life outside the decode step: admission, allocation, fork and release.

Why one part: these are the calls that take table rows and bind them to
sequences, or unbind and give them back, and each runs one kernel over
those rows. The per-step calls (``fast/appends.py``, ``fast/row_api.py``)
only find rows this part bound. The checks run in the reference's order
(``reference/manager.py``), so the same bad input raises the same error,
and all of them run before the kernel: a failure changes nothing. The one
failure found by the kernel itself, a pool without room, gives the rows
back before raising.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from blockspace.enums import AllocStatus
from blockspace.errors import (
    ChildExistsError,
    DuplicateTableError,
    EmptyTableError,
    NoFreeBlocksError,
    UnsupportedError,
)
from blockspace.fast import kernels
from blockspace.fast import pool as P
from blockspace.fast import table as T
from blockspace.fast.appends import with_room
from blockspace.fast.checks import checked_token_array
from blockspace.fast.device_sync import DeviceSync
from blockspace.fast.key_space import KeySpace
from blockspace.fast.store import DEVICE_OF_CODE, Store
from blockspace.fast.table_rows import TableRows
from blockspace.fast.tracker_rows import TrackerRows
from blockspace.protocols import SequenceGroupLike, SequenceLike
from blockspace.validation import check_encoder_decoder, group_salt, waiting_seqs

ALLOC_STATUS = {status.value: status for status in AllocStatus}
NO_WINDOW_CAP = 2**62  # blocks_for_prompt's cap without a sliding window: larger than any prompt


class Allocations:
    """``can_allocate``, ``allocate``, ``fork``, ``free`` and ``free_cross``."""

    def __init__(
        self,
        store: Store,
        rows: TableRows,
        key_space: KeySpace,
        tracker: TrackerRows,
        sync: DeviceSync,
        *,
        block_size: int,
        num_gpu_blocks: int,
        sliding_window: int | None,
        window_blocks: int | None,
        watermark_blocks: int,
        caching: bool,
    ) -> None:
        self.store, self.rows, self.key_space, self.tracker, self.sync = store, rows, key_space, tracker, sync
        self.block_size, self.sliding_window, self.caching = block_size, sliding_window, caching
        # no window caps no prompt: an int either way, so the rule is one compiled overload
        self.window_cap = NO_WINDOW_CAP if window_blocks is None else window_blocks
        self.num_gpu_blocks, self.watermark_blocks = num_gpu_blocks, watermark_blocks

    # -- admission ----------------------------------------------------------------------
    def status(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> AllocStatus:
        """``can_allocate`` (the lookahead already checked)."""
        check_encoder_decoder(seq_group, self.sliding_window, self.caching)
        seq = waiting_seqs(seq_group)[0]
        encoder = seq_group.get_encoder_seq() if seq_group.is_encoder_decoder() else None
        num_encoder_tokens = len(encoder.get_token_ids()) if encoder is not None else 0
        need = kernels.blocks_for_prompt(
            len(seq.get_token_ids()), num_lookahead_slots, num_encoder_tokens, self.block_size, self.window_cap
        )
        status = kernels.alloc_status(self.num_gpu_blocks, self.store.num_free_gpu(), need, self.watermark_blocks)
        return ALLOC_STATUS[status]

    def allocate(self, seq_group: SequenceGroupLike) -> None:
        """One table for the first WAITING sequence; the others share it."""
        waiting = waiting_seqs(seq_group)
        seq_ids = [seq.seq_id for seq in waiting]
        if len(set(seq_ids)) != len(seq_ids) or any(i in self.rows.of_seq for i in seq_ids):
            raise DuplicateTableError(f"block table already exists for a sequence of group {seq_group.request_id!r}")
        tokens, keyed, extra, root = self._prompt(seq_group, waiting)
        encoder, encoder_tokens, encoder_extra = self._encoder(seq_group)
        rows = [self.rows.take() for _ in range(len(waiting) + (encoder is not None))]
        cross_row = rows.pop() if encoder is not None else -1
        store, info = self.store, np.zeros(1, np.int64)
        result = with_room(
            lambda: kernels.allocate(
                store.gpu_ref, store.keys_ref, store.tables_ref, rows[0], tokens, extra, root, keyed,
                np.array(rows[1:], np.int64), cross_row, encoder_tokens, encoder_extra, info,
            ),
            store,
            self.key_space,
        )  # fmt: skip
        if result == T.NO_BLOCKS:
            self.rows.give_back(rows + ([cross_row] if cross_row >= 0 else []))
            raise NoFreeBlocksError(f"allocate needs {int(info[0])} GPU blocks, {store.num_free_gpu()} are free")
        for seq, row in zip(waiting, rows):
            self.rows.bind(seq.seq_id, row)
            self.rows.block_ids(seq)  # the table's first answer, built now: the scheduler asks at once
        if encoder is not None:
            self.rows.of_cross[seq_group.request_id] = cross_row

    def _prompt(
        self, seq_group: SequenceGroupLike, waiting: Sequence[SequenceLike]
    ) -> tuple[np.ndarray, np.ndarray, int, int]:
        """The checked prompt of the first WAITING sequence, its block keys
        if the tracker made them from the same content (else none), and its
        adapter and salt ids; the cross table's checks come between, as in
        the reference."""
        first = waiting[0]
        token_list = first.get_token_ids()
        memo = self.tracker.prompt_memo(first, token_list)
        tokens = checked_token_array(first, token_list, known=memo.array if memo is not None else None)
        if not len(tokens) and len(waiting) > 1:
            raise EmptyTableError("an empty prompt cannot be shared by several WAITING sequences")
        if seq_group.is_encoder_decoder() and seq_group.request_id in self.rows.of_cross:
            raise DuplicateTableError(f"cross block table already exists for group {seq_group.request_id!r}")
        if seq_group.is_encoder_decoder():
            check_encoder_decoder(seq_group, self.sliding_window, self.caching)
        extra = self.key_space.extra_id(first.extra_hash())
        root = self.key_space.root_id(group_salt(seq_group, self.tracker.tracks))
        keyed = T.NO_TOKENS
        if memo is not None and memo.root == root and memo.extra == extra:
            keyed = self.tracker.prompt_keys(first, len(tokens) // self.block_size)
        return tokens, keyed, extra, root

    def _encoder(self, seq_group: SequenceGroupLike) -> tuple[SequenceLike | None, np.ndarray, int]:
        """The encoder sequence of an encoder-decoder group, its checked
        tokens and its adapter id (None, no tokens, 0 for the others)."""
        if not seq_group.is_encoder_decoder():
            return None, T.NO_TOKENS, 0
        encoder = cast("SequenceLike", seq_group.get_encoder_seq())  # an encoder-decoder group has one
        tokens = checked_token_array(encoder, encoder.get_token_ids())
        return encoder, tokens, self.key_space.extra_id(encoder.extra_hash())

    # -- fork ---------------------------------------------------------------------------
    def fork(self, parent_seq: SequenceLike, child_seq: SequenceLike) -> None:
        """The child shares every block of the parent (copy-on-write later)."""
        parent = self.rows.of_seq.get(parent_seq.seq_id)
        if parent is None:
            return
        tables = self.store.tables_view
        if tables.num_blocks[parent] == 0:
            raise EmptyTableError(f"sequence {parent_seq.seq_id} has no blocks to fork")
        if child_seq.seq_id in self.rows.of_seq:
            raise ChildExistsError(f"fork onto sequence {child_seq.seq_id}, which already has a block table")
        if tables.num_null[parent] > 0:
            raise UnsupportedError("fork of a sliding-window table after blocks were dropped")
        child = self.rows.take()
        pool = self.store.pool_ref(DEVICE_OF_CODE[tables.device[parent]])
        kernels.fork(pool, self.store.tables_ref, parent, child)
        self.rows.bind(child_seq.seq_id, child)
        self.rows.block_ids(child_seq)

    # -- release ------------------------------------------------------------------------
    def free(self, seq: SequenceLike) -> None:
        """Release the sequence's blocks, stamped with its last access time
        (``TableRows.touch``); unknown sequences are ignored."""
        access_time = self.rows.access_times.pop(seq.seq_id, None)
        row = self.rows.unbind(seq.seq_id)
        if row is None:
            return
        self.tracker.forget(seq.seq_id)
        self._free_row(row, access_time)

    def free_cross(self, seq_group: SequenceGroupLike) -> None:
        row = self.rows.unbind_cross(seq_group.request_id)
        if row is not None:
            self._free_row(row)

    def _free_row(self, row: int, access_time: float | None = None) -> None:
        self.sync.forget_row(row)
        store = self.store
        accessed, stamp = (False, P.NEVER_ACCESSED) if access_time is None else (True, float(access_time))
        kernels.free_table(store.gpu_ref, store.cpu_ref, store.tables_ref, row, self.block_size, accessed, stamp)
        self.rows.recycle(row)
