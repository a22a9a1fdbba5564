"""Appending to block tables: the checks and kernel arguments of one
sequence's append, and the all-or-nothing runner of a batch of appends.

Why one place: ``append_slots``, ``append_slots_batch`` and
``append_slots_rows`` must raise the same errors and make the same kernel
calls as each other, so the per-sequence checks (``check``), the kernel
arguments (``args``) and the batch runner (``run``) live here and the three
entry points only gather their input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from blockspace.enums import SequenceStatus
from blockspace.errors import EmptyTableError, InvalidArgumentError, NoFreeBlocksError, WrongDeviceError
from blockspace.fast import kernels
from blockspace.fast import pool as P
from blockspace.fast import table as T
from blockspace.fast.checks import check_new_tokens
from blockspace.fast.key_space import KeySpace
from blockspace.fast.store import Store
from blockspace.fast.table_rows import TableRows
from blockspace.protocols import SequenceGroupLike, SequenceLike
from blockspace.validation import MAX_TOKEN_ID, unknown_sequence

RUNNING = SequenceStatus.RUNNING

# The usual decode step only counts a token into a block the table alone
# holds: the kernel's own test for that case, run as Python on memoryviews
# (a kernel call costs more than the whole step).
writes_in_place = getattr(T.writes_in_place, "py_func", T.writes_in_place)


class Appends:
    """The append path of the fast manager (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        rows: TableRows,
        key_space: KeySpace,
        *,
        block_size: int,
        caching: bool,
        window_blocks: int | None,
    ) -> None:
        self.store, self.rows, self.key_space = store, rows, key_space
        self.block_size, self.caching, self.window_blocks = block_size, caching, window_blocks
        self.windowed = window_blocks is not None
        self.needs = np.zeros(2, np.int64)  # batch_needs: table columns, content keys
        self.status = np.zeros(2, np.int64)  # append_batch: failure code, index

    def can_append(self, seq_group: SequenceGroupLike, num_lookahead_slots: int) -> bool:
        """``can_append_slots`` (the lookahead already checked): do the free
        GPU blocks cover every block the group's RUNNING sequences touch?
        Python arithmetic per sequence: a kernel call costs more."""
        num_filled, of_seq, block_size = self.store.tables_view.num_filled, self.rows.of_seq, self.block_size
        touched = 0
        for seq in seq_group.get_seqs(status=RUNNING):
            row = of_seq.get(seq.seq_id)
            if row is None:
                raise unknown_sequence(seq.seq_id)
            filled = num_filled[row]
            unseen = max(0, len(seq.get_token_ids()) - filled)
            touched += kernels.blocks_touched(filled, unseen, num_lookahead_slots, block_size)
        return touched <= self.store.num_free_gpu()

    def check(self, seq: SequenceLike) -> tuple[int, int, list[int]]:
        """The reference's checks before an append; returns (row, num_filled, tokens)."""
        row = self.rows.require(seq)
        tables = self.store.tables_view
        if tables.num_blocks[row] == 0:
            raise EmptyTableError(f"sequence {seq.seq_id} has no blocks to append to")
        if tables.device[row] != T.GPU:
            raise WrongDeviceError(f"sequence {seq.seq_id} is swapped out; swap it in before appending")
        tokens = seq.get_token_ids()
        num_filled = tables.num_filled[row]
        if len(tokens) < num_filled:
            raise InvalidArgumentError(f"sequence {seq.seq_id} has fewer tokens than its block table holds")
        check_new_tokens(seq, tokens, num_filled)
        return row, num_filled, tokens

    def args(self, seq: SequenceLike, num_filled: int, tokens: list[int]) -> tuple[np.ndarray, int, int]:
        """What the append kernel needs besides the row: the token ids from the
        start of the last block (caching only), the drops, the extra id."""
        extra = self.key_space.extra_id(seq.extra_hash()) if self.caching else 0  # extras only key content
        num_drops = 0
        if self.windowed:
            computed = seq.data.get_num_computed_tokens()
            num_drops = kernels.num_blocks_to_drop(computed, self.block_size, self.window_blocks)
        start = num_filled - num_filled % self.block_size
        if self.caching and len(tokens) - start >= self.block_size:  # a block fills up: key it
            array = np.array(tokens[start:], np.int64)
        else:
            array = T.NO_TOKENS
        return array, num_drops, extra

    def one(self, seq: SequenceLike, num_lookahead_slots: int) -> list[tuple[int, int]]:
        """``append_slots`` of one sequence (lookahead already checked). A
        step that only counts tokens into the table's own last block is done
        here; everything else goes to the append kernel."""
        store = self.store
        tables, row, tokens = store.tables_view, self.rows.of_seq.get(seq.seq_id), seq.get_token_ids()
        if row is None or tables.num_blocks[row] == 0 or tables.device[row] != T.GPU:
            row, num_filled, tokens = self.check(seq)  # raises the reference's error
        num_filled = tables.num_filled[row]
        num_new = len(tokens) - num_filled
        if num_new != 1 or type(tokens[-1]) is not int or not 0 <= tokens[-1] <= MAX_TOKEN_ID:
            row, num_filled, tokens = self.check(seq)  # not one plain new token: every check, in order
        if not self.windowed:
            pool = store.gpu_view
            if writes_in_place(
                pool.refcount, pool.meta[P.FIRST_ID], tables.blocks, tables.num_blocks, tables.num_filled,
                row, num_new, num_lookahead_slots, self.block_size, self.caching,
            ):  # fmt: skip
                tables.num_filled[row] = num_filled + num_new  # all the kernel would do
                return []
        array, num_drops, extra = self.args(seq, num_filled, tokens)
        cow = store.pairs_buffer(2 * (num_new // self.block_size + 2))
        result = with_room(
            lambda: kernels.append(
                store.gpu_ref, store.keys_ref, store.tables_ref, row, array, num_new, num_lookahead_slots,
                num_drops, extra, self.windowed, store.null_block, cow, 0,
            ),
            store,
            self.key_space,
        )  # fmt: skip
        self.rows.refresh(seq.seq_id, row)
        if result in T.SHORTAGE:
            raise NoFreeBlocksError(f"append_slots needs a free GPU block for {T.SHORTAGE[result]}; none is left")
        return pairs(cow, result) if result else []

    def run(
        self,
        rows: np.ndarray,
        seq_lens: np.ndarray,
        num_lookahead_slots: int,
        tokens: np.ndarray,
        token_starts: np.ndarray,
        num_drops: np.ndarray,
        extras: np.ndarray,
        name: Callable[[int], str],
    ) -> tuple[np.ndarray, int]:
        """The checked appends of a batch (sequences now of ``seq_lens``
        tokens), all or none: when the free blocks might not cover them,
        they run on a trial copy of the state, kept only if every append
        fits (``name(i)`` names the one that did not). Returns the
        copy-on-write pairs, flat, and their number."""
        store, needs = self.store, self.needs
        args: tuple[Any, ...] = (rows, seq_lens, num_lookahead_slots, self.block_size, self.windowed, store.null_block)
        bound = kernels.batch_needs(store.tables_ref, *args, needs)
        if bound > store.num_free_gpu():
            bound = kernels.shared_bound(store.gpu_ref, store.tables_ref, *args)
        if needs[0] > store.tables.blocks.shape[1]:
            store.grow_columns(int(needs[0]))
        if self.caching and not kernels.has_room(store.keys_ref, int(needs[1])):
            self.key_space.make_room(int(needs[1]))
        cow = store.pairs_buffer(2 * int(bound) + 2)
        args = (rows, tokens, token_starts, seq_lens, num_lookahead_slots, num_drops, extras, self.windowed)
        status = self.status
        status[0] = 0
        if bound <= store.num_free_gpu():  # no append can fail
            count = kernels.append_batch(
                store.gpu_ref, store.keys_ref, store.tables_ref, *args, store.null_block, cow, status
            )
        else:  # it may fail: run it on a copy, keep it only if it all fits
            trial = store.trial()
            count = kernels.append_batch(
                trial.gpu_ref, trial.keys_ref, trial.tables_ref, *args, trial.null_block, cow, status
            )
            if status[0] in T.SHORTAGE:
                raise NoFreeBlocksError(
                    f"append_slots needs a free GPU block for {T.SHORTAGE[int(status[0])]}; none is left"
                    f" ({name(int(status[1]))} of the batch; nothing was changed)"
                )
            store.commit(trial)
        assert status[0] == 0, "append_slots_batch ran out of array room"
        self.rows.refresh_rows(rows)
        return cow, int(count)


def with_room(call: Callable[[], int], store: Store, key_space: KeySpace) -> int:
    """``call()``, a kernel call, again after growing the table columns or the
    key space it asked for (it asks before changing anything), until it has room."""
    while True:
        result = call()
        if result == T.NO_ROOM:
            store.grow_columns()
        elif result == T.NO_KEY_ROOM:
            key_space.make_room()
        else:
            return int(result)


def pairs(values: np.ndarray, count: int) -> list[tuple[int, int]]:
    """The first ``count`` pairs of a flat int64 buffer, as Python tuples."""
    flat = values[: 2 * count].tolist()
    return list(zip(flat[0::2], flat[1::2]))
