"""The batched scheduler step on Sequence objects: one kernel call for all
running sequences instead of one Python call per sequence.

Each method gives exactly what the per-sequence calls give, in the same
order (tests prove it), because it runs the same kernels: ``append_slots_batch``
is ``table.append`` per sequence inside one kernel, ``can_append_slots_batch``
the same ``touched`` rule as ``can_append_slots``. The one difference is
failure: a batch that runs out of blocks raises before changing anything,
where the per-sequence calls would have done the first appends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from blockspace.enums import SequenceStatus
from blockspace.errors import InvalidArgumentError
from blockspace.fast import kernels
from blockspace.fast import table as T
from blockspace.fast.appends import Appends, pairs
from blockspace.fast.checks import check_new_tokens, checked_lookahead
from blockspace.fast.store import Store
from blockspace.fast.table_rows import TableRows
from blockspace.protocols import SequenceGroupLike, SequenceLike
from blockspace.validation import MAX_TOKEN_ID, check_lookahead, unknown_sequence


class BatchSteps:
    """``can_append_slots_batch`` and ``append_slots_batch``."""

    def __init__(
        self, store: Store, rows: TableRows, appends: Appends, *, block_size: int, caching: bool, windowed: bool
    ) -> None:
        self.store, self.rows, self.appends = store, rows, appends
        self.block_size, self.caching, self.windowed = block_size, caching, windowed

    def can_append_slots_batch(self, seq_groups: Sequence[SequenceGroupLike], num_lookahead_slots: int) -> list[bool]:
        """``[can_append_slots(group, num_lookahead_slots) for group in seq_groups]``."""
        check_lookahead(num_lookahead_slots)
        rows: list[int] = []
        num_tokens: list[int] = []
        group_ends: list[int] = []
        of_seq = self.rows.of_seq
        for group in seq_groups:
            for seq in group.get_seqs(status=SequenceStatus.RUNNING):
                row = of_seq.get(seq.seq_id)
                if row is None:
                    raise unknown_sequence(seq.seq_id)
                rows.append(row)
                num_tokens.append(len(seq.get_token_ids()))
            group_ends.append(len(rows))
        result = np.zeros(len(seq_groups), np.bool_)
        kernels.can_append_batch(
            self.store.gpu_ref, self.store.tables_ref, np.array(rows, np.int64), np.array(num_tokens, np.int64),
            np.array(group_ends, np.int64), num_lookahead_slots, self.block_size, result,
        )  # fmt: skip
        return result.tolist()

    def append_slots_batch(self, seqs: Sequence[SequenceLike], num_lookahead_slots: int) -> list[tuple[int, int]]:
        """``append_slots(seq, num_lookahead_slots)`` for each sequence in
        order; returns all copy-on-write pairs of the step, in order. Raises
        ``NoFreeBlocksError`` before any change if the blocks run out."""
        checked_lookahead(num_lookahead_slots)
        if len({seq.seq_id for seq in seqs}) != len(seqs):
            raise InvalidArgumentError("append_slots_batch got the same sequence twice")
        rows, seq_lens, num_drops, extras, token_parts = self._check(seqs)
        token_starts = np.zeros(len(seqs) + 1, np.int64)
        np.cumsum([len(part) for part in token_parts], out=token_starts[1:])
        tokens = np.concatenate(token_parts) if self.caching and seqs else T.NO_TOKENS
        cow, count = self.appends.run(
            rows, seq_lens, num_lookahead_slots, tokens, token_starts, np.array(num_drops, np.int64),
            np.array(extras, np.int64), lambda index: f"sequence {seqs[index].seq_id}",
        )  # fmt: skip
        return pairs(cow, count)

    def _check(self, seqs: Sequence[SequenceLike]) -> tuple[np.ndarray, np.ndarray, list[int], list[int], list[Any]]:
        """``append_slots``'s checks for every sequence, raising the error the
        per-sequence calls would raise first; returns the rows, the sequence
        lengths, drops, extra ids and token arrays of the appends. The checks
        run vectorised; any failure reruns them sequence by sequence, in order,
        to raise the same error as the per-sequence calls."""
        of_seq, tables, appends = self.rows.of_seq, self.store.tables, self.appends
        rows: list[int] = []
        token_lists = []
        for seq in seqs:
            row = of_seq.get(seq.seq_id)
            if row is None:
                break
            rows.append(row)
            token_lists.append(seq.get_token_ids())
        rows_array = np.array(rows, np.int64)
        num_filled = tables.num_filled[rows_array]
        num_tokens = np.array([len(tokens) for tokens in token_lists], np.int64)
        broken = (tables.num_blocks[rows_array] == 0) | (tables.device[rows_array] != T.GPU)
        if len(rows) < len(seqs) or (broken | (num_tokens < num_filled)).any():
            for seq in seqs:  # one of them fails: find which, as the per-sequence calls would
                appends.check(seq)
        filled = num_filled.tolist()
        for seq, tokens, start in zip(seqs, token_lists, filled):
            if len(tokens) - start == 1 and type(tokens[-1]) is int and 0 <= tokens[-1] <= MAX_TOKEN_ID:
                continue  # the usual decode step: one plain new token
            check_new_tokens(seq, tokens, start)
        num_drops, extras, token_parts = [0] * len(seqs), [0] * len(seqs), [T.NO_TOKENS] * len(seqs)
        if self.caching or self.windowed:
            for i, (seq, tokens, start) in enumerate(zip(seqs, token_lists, filled)):
                token_parts[i], num_drops[i], extras[i] = appends.args(seq, start, tokens)
        return rows_array, num_tokens, num_drops, extras, token_parts
