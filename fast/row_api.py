"""The array-level scheduler step: table rows and sequence lengths in,
arrays out.

Why: the batched API of ``fast/batch.py`` takes Sequence objects, and reading
them (ids, token lists, statuses) costs about a microsecond per sequence in
Python, some forty times the kernels' own work. A scheduler or model runner
that keeps its running batch as arrays (SGLang's request-pool indices, the
``seq_lens`` a v0 model runner builds anyway) hands the manager table rows
and lengths instead; the checks run in a kernel too, and a decode step of a
thousand sequences costs tens of microseconds.

A sequence's row comes from ``rows_of(seqs)`` (or ``row_of(seq)``) and stays
the same until the sequence is freed (a fork gets its own). Each method gives
exactly what the per-sequence calls give for sequences of those lengths;
``block_tables`` and ``slot_mapping`` also accept such a row array in place of
the sequences. Every argument is checked first, in ``fast/row_args.py``: the
kernels behind these methods take no other layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from blockspace.errors import EmptyTableError, InvalidArgumentError, UnknownSequenceError, WrongDeviceError
from blockspace.extras import require
from blockspace.fast import kernels
from blockspace.fast import row_args as A
from blockspace.fast import table as T
from blockspace.fast.appends import Appends
from blockspace.fast.checks import all_token_ids, checked_lookahead, joined_token_ids
from blockspace.fast.row_api_kernels import DUPLICATE, EMPTY, NEGATIVE, NOT_LIVE, ROWS_OK, SHRUNK, SWAPPED
from blockspace.fast.store import Store
from blockspace.fast.table_rows import TableRows
from blockspace.fast.tracker_rows import TrackerRows
from blockspace.protocols import SequenceLike

NO_LENGTHS = object()  # ``_checked_rows`` of a call that takes no sequence lengths
BLOCK_TABLE_PAD = 0  # what vLLM's model runner pads block tables with (never read: lengths bound the kernels)

_PROBLEMS = {
    NOT_LIVE: (UnknownSequenceError, "is not the block table of a live sequence"),
    DUPLICATE: (InvalidArgumentError, "appears twice in the batch"),
    NEGATIVE: (InvalidArgumentError, "has a negative sequence length"),
    EMPTY: (EmptyTableError, "has no blocks to append to"),
    SWAPPED: (WrongDeviceError, "is swapped out; swap it in before appending"),
    SHRUNK: (InvalidArgumentError, "has a sequence length below the tokens its block table holds"),
}


def _torch(method: str) -> Any:
    """torch, for the tensor answers (``MissingExtraError`` naming the extra without it)."""
    require("gpu", f"{method} (its answer is a torch tensor)", "torch")
    import torch

    return torch


class RowApi:
    """The array-level step: rows and lengths in, arrays out. Every
    argument goes through ``fast/row_args.py`` first."""

    def __init__(
        self,
        store: Store,
        rows: TableRows,
        appends: Appends,
        tracker: TrackerRows,
        *,
        block_size: int,
        caching: bool,
        window_blocks: int | None,
    ) -> None:
        self.store, self.rows, self.appends, self.tracker = store, rows, appends, tracker
        self.block_size, self.caching, self.window_blocks = block_size, caching, window_blocks

    def rows_of(self, seqs: Sequence[SequenceLike]) -> np.ndarray:
        """The table rows of ``seqs`` (int64), for the ``*_rows`` methods."""
        require = self.rows.require
        try:
            return np.array([require(seq) for seq in seqs], np.int64)
        except AttributeError:  # not sequences: say so by name
            bad = next(i for i, seq in enumerate(seqs) if not hasattr(seq, "seq_id"))
            raise InvalidArgumentError(f"seqs[{bad}] is no sequence (a row array must be a NumPy array)") from None

    def _checked_rows(
        self, rows: Any, seq_lens: Any = NO_LENGTHS, appending: bool = False
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """The rows and lengths as int64 arrays, checked, and the longest
        table (calls without lengths check the rows against zeros)."""
        rows = A.int_array("rows", rows)
        if seq_lens is NO_LENGTHS:
            seq_lens = np.zeros(len(rows), np.int64)
        else:
            seq_lens = A.int_array("seq_lens", seq_lens, len(rows))
        code, index, longest = self.rows.check_batch(rows, seq_lens, appending)
        if code != ROWS_OK:
            error, why = _PROBLEMS[code]
            raise error(f"row {int(rows[index])} (entry {index} of the batch) {why}")
        return rows, seq_lens, longest

    def can_append_slots_rows(
        self, rows: Any, seq_lens: Any, num_lookahead_slots: int, group_ends: Any = None
    ) -> np.ndarray:
        """``can_append_slots`` for groups of rows (bool per group): group ``g``
        is ``rows[group_ends[g-1]:group_ends[g]]``, the RUNNING sequences of a
        group; without ``group_ends`` every row is a group of its own."""
        checked_lookahead(num_lookahead_slots)
        rows, seq_lens, _ = self._checked_rows(rows, seq_lens)
        if group_ends is None:
            group_ends = np.arange(1, len(rows) + 1, dtype=np.int64)
        else:
            group_ends = A.int_array("group_ends", group_ends)
            if not kernels.ends_rise_to(group_ends, len(rows)):
                raise InvalidArgumentError("group_ends must rise from 0 to the number of rows")
        result = np.zeros(len(group_ends), np.bool_)
        kernels.can_append_batch(
            self.store.gpu_ref, self.store.tables_ref, rows, seq_lens, group_ends, num_lookahead_slots,
            self.block_size, result,
        )  # fmt: skip
        return result

    def append_slots_rows(
        self,
        rows: Any,
        seq_lens: Any,
        num_lookahead_slots: int,
        *,
        token_ids: Any = None,
        num_computed_tokens: Any = None,
    ) -> np.ndarray:
        """``append_slots`` for each row in order, for sequences now of
        ``seq_lens`` tokens; returns every copy-on-write pair of the step as
        an int64 array of shape ``(k, 2)``. With prefix caching, ``token_ids[i]``
        (the token ids of row ``i``'s sequence, a list or array) keys the
        blocks that fill; with a sliding window, ``num_computed_tokens[i]``
        decides the blocks to drop. Raises before any change, as
        ``append_slots_batch``."""
        checked_lookahead(num_lookahead_slots)
        tables = self.store.tables
        rows, seq_lens, _ = self._checked_rows(rows, seq_lens, appending=True)
        num_drops = extras = np.zeros(len(rows), np.int64)
        if self.window_blocks is not None:
            if num_computed_tokens is None:
                raise InvalidArgumentError("with a sliding window, append_slots_rows needs num_computed_tokens")
            computed = A.int_array("num_computed_tokens", num_computed_tokens, len(rows))
            num_drops = kernels.blocks_to_drop(computed, self.block_size, self.window_blocks)
        tokens, token_starts = T.NO_TOKENS, np.zeros(len(rows) + 1, np.int64)
        if self.caching:
            tokens, token_starts = self._tails(token_ids, rows, seq_lens)
            last = np.maximum(tables.num_blocks[rows] - 1, 0)
            extras = tables.extras[rows, last]  # the adapter ids recorded at allocate
        cow, count = self.appends.run(
            rows, seq_lens, num_lookahead_slots, tokens, token_starts, num_drops, extras,
            lambda index: f"row {int(rows[index])}",
        )  # fmt: skip
        return cow[: 2 * count].reshape(-1, 2).copy()

    def _tails(self, token_ids: Any, rows: np.ndarray, seq_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What the append kernel keys, in one flat array with offsets: for
        each row whose append fills a block, its token ids from the start of
        its last block; nothing for the others (a decode fills a block once
        in ``block_size`` steps, and reading a token list costs more than the
        kernel). Every row's new tokens are checked all the same."""
        lengths = A.token_lists("append_slots_rows", token_ids, len(rows))
        firsts, starts = np.empty(len(rows), np.int64), np.empty(len(rows) + 1, np.int64)
        i = kernels.plan_tails(self.store.tables_ref, rows, seq_lens, lengths, self.block_size, firsts, starts)
        if i >= 0:
            raise InvalidArgumentError(f"token_ids[{i}] has {lengths[i]} tokens, seq_lens[{i}] says {seq_lens[i]}")
        tails = [ids[first:] for ids, first in zip(token_ids, firsts.tolist())]
        keyed = np.flatnonzero(starts[1:] > starts[:-1]).tolist()
        if all(type(tail) is list for tail in tails) and all_token_ids(list(chain.from_iterable(tails))):
            flat = list(chain.from_iterable(tails[i] for i in keyed))  # the usual case: one check for the batch
            return (np.array(flat, np.int64) if flat else T.NO_TOKENS), starts
        bad = joined_token_ids(tails)[1]  # arrays, or a bad value: every tail checked, the first bad one named
        if bad >= 0:
            raise A.not_token_ids(bad)
        return joined_token_ids([tails[i] for i in keyed])[0], starts

    def block_tables(self, seqs: Sequence[SequenceLike] | np.ndarray, pad: int = BLOCK_TABLE_PAD) -> Any:
        """The sequences' block tables as one ``int32`` torch tensor of shape
        ``(len(seqs), longest table)``, rows padded at the end with ``pad``
        (default 0, as vLLM's model runner). ``seqs`` may also be an array
        of table rows (``rows_of``). Needs torch (the ``[gpu]`` extra)."""
        torch = _torch("block_tables")
        return torch.from_numpy(self.block_table_array(seqs, pad))

    def block_table_array(self, seqs: Sequence[SequenceLike] | np.ndarray, pad: int = BLOCK_TABLE_PAD) -> np.ndarray:
        """``block_tables`` as a NumPy ``int32`` array (no torch needed): for a
        scheduler that keeps its batch in NumPy, or a model runner of its own.
        With ``pad=-1`` a row's block ids are its entries up to the first -1."""
        pad = A.block_id_pad(pad)
        rows, width = self._rows_and_width(seqs)
        out = np.empty((len(rows), width), np.int32)
        kernels.gather_tables(self.store.tables_ref, rows, pad, out)
        return out

    def access_all_blocks_rows(self, rows: Any, access_time: float) -> None:
        """``access_all_blocks_in_seq(seq, access_time)`` for the sequence of
        every row (the rows are checked first: nothing changes on bad input)."""
        if not self.caching:
            A.int_array("rows", rows)  # nothing to do, but a wrong array is still refused
            return
        rows, _, _ = self._checked_rows(rows)
        times, seq_of_row = self.rows.access_times, self.rows.seq_of_row
        for row in rows.tolist():
            times[seq_of_row[row]] = access_time

    def num_computed_blocks_rows(self, rows: Any, token_ids: Any = None, prefill: Any = None) -> np.ndarray:
        """``get_common_computed_block_ids([seq])`` for the sequence of each
        row, as counts (int64): row ``i``'s answer is the first ``counts[i]``
        ids of its table (``block_table_array(rows)[i, :counts[i]]``). With
        prefix caching it keys each sequence's new full blocks in the
        computed-blocks tracker, as that call does: ``token_ids[i]`` are the
        token ids of row ``i``'s sequence, and ``prefill[i]`` (default all
        False) says that sequence is still in prefill, when vLLM keeps its
        last count. The salt and adapter ids are those the table was
        allocated with. Without prefix caching every count is 0."""
        rows, _, _ = self._checked_rows(rows)
        if not self.caching:
            return np.zeros(len(rows), np.int64)
        lengths = A.token_lists("num_computed_blocks_rows", token_ids, len(rows))
        prefill = np.zeros(len(rows), np.bool_) if prefill is None else A.bool_array("prefill", prefill, len(rows))
        seq_of_row = self.rows.seq_of_row
        seq_ids = [seq_of_row[row] for row in rows.tolist()]
        if len(set(seq_ids)) != len(seq_ids):
            raise InvalidArgumentError("a row appears twice in the batch")
        return self.tracker.num_computed_rows(seq_ids, rows, token_ids, lengths, prefill)

    def slot_mapping(self, seqs: Sequence[SequenceLike] | np.ndarray, num_step_tokens: int | list[int] = 1) -> Any:
        """The KV-cache slot of every token of the step, sequence by sequence:
        the last ``num_step_tokens`` (one number, or one per sequence) written
        tokens of each table, slot = ``block_id * block_size + offset`` (as
        vLLM), as an ``int64`` torch tensor. Decode: 1 token; prefill: the chunk.
        ``seqs`` may also be an array of table rows (``rows_of``). Needs torch."""
        torch = _torch("slot_mapping")
        return torch.from_numpy(self.slot_mapping_array(seqs, num_step_tokens))

    def slot_mapping_array(
        self, seqs: Sequence[SequenceLike] | np.ndarray, num_step_tokens: int | list[int] = 1
    ) -> np.ndarray:
        """``slot_mapping`` as a NumPy ``int64`` array (no torch needed)."""
        rows, _ = self._rows_and_width(seqs)
        counts = A.step_counts(num_step_tokens, len(rows))
        slots, bad = kernels.gather_slots(self.store.tables_ref, rows, counts, self.block_size)
        if bad >= 0:
            raise InvalidArgumentError("num_step_tokens must be between 0 and each table's written tokens")
        return slots

    def _rows_and_width(self, seqs_or_rows: Sequence[SequenceLike] | np.ndarray) -> tuple[np.ndarray, int]:
        """Checked rows of sequences or of a row array, and the longest table."""
        if isinstance(seqs_or_rows, np.ndarray):  # the documented form of rows; a list is of sequences
            rows, _, longest = self._checked_rows(seqs_or_rows)
            return rows, longest
        rows = self.rows_of(seqs_or_rows)
        return rows, kernels.max_blocks(self.store.tables_ref, rows)
