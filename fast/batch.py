"""The batched scheduler step of the fast manager: one kernel call for all
running sequences instead of one Python call per sequence.

Each method gives exactly what the per-sequence calls give, in the same
order (tests prove it), because it runs the same kernels: ``append_slots_batch``
is ``table.append`` per sequence inside one kernel, ``can_append_slots_batch``
the same ``touched`` rule as ``can_append_slots``. The one difference is
failure: a batch that runs out of blocks raises before changing anything,
where the per-sequence calls would have done the first appends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from blockspace.enums import SequenceStatus
from blockspace.errors import InvalidArgumentError, NoFreeBlocksError
from blockspace.fast import table as T
from blockspace.fast.checks import check_new_tokens, checked_lookahead
from blockspace.fast.content import has_room
from blockspace.fast.dispatch import direct
from blockspace.fast.handles import handle
from blockspace.validation import MAX_TOKEN_ID, check_lookahead

BLOCK_TABLE_PAD = 0  # what vLLM's model runner pads block tables with (never read: lengths bound the kernels)

# The step's kernels through their entry points (fast/dispatch.py): every call
# passes the same types (C-contiguous int64 rows and counts, Python ints and
# bools), and on a thousand-sequence step the dispatcher's typing would cost
# more than some of the kernels.
_can_append_batch, _batch_needs, _append_batch = (
    direct(T.can_append_batch),
    direct(T.batch_needs),
    direct(T.append_batch),
)
_gather_tables, _gather_slots = direct(T.gather_tables), direct(T.gather_slots)


class BatchedSteps:
    """Mixin of ``FastBlockSpaceManager``: the batched scheduler API."""

    def can_append_slots_batch(self, seq_groups: list[Any], num_lookahead_slots: int) -> list[bool]:
        """``[can_append_slots(group, num_lookahead_slots) for group in seq_groups]``."""
        check_lookahead(num_lookahead_slots)
        rows: list[int] = []
        num_tokens: list[int] = []
        group_ends: list[int] = []
        row_of = self._rows
        for group in seq_groups:
            for seq in group.get_seqs(status=SequenceStatus.RUNNING):
                row = row_of.get(seq.seq_id)
                rows.append(self._row(seq) if row is None else row)  # _row raises for an unknown sequence
                num_tokens.append(len(seq.get_token_ids()))
            group_ends.append(len(rows))
        result = np.zeros(len(seq_groups), np.bool_)
        _can_append_batch(
            self._gpu, self._tables, np.array(rows, np.int64), np.array(num_tokens, np.int64),
            np.array(group_ends, np.int64), num_lookahead_slots, self.block_size, result,
        )  # fmt: skip
        return result.tolist()

    def append_slots_batch(self, seqs: list[Any], num_lookahead_slots: int) -> list[tuple[int, int]]:
        """``append_slots(seq, num_lookahead_slots)`` for each sequence in
        order; returns all copy-on-write pairs of the step, in order. Raises
        ``NoFreeBlocksError`` before any change if the blocks run out."""
        checked_lookahead(num_lookahead_slots)
        if len({seq.seq_id for seq in seqs}) != len(seqs):
            raise InvalidArgumentError("append_slots_batch got the same sequence twice")
        rows, seq_lens, num_drops, extras, token_parts = self._check_batch(seqs)
        token_starts = np.zeros(len(seqs) + 1, np.int64)
        np.cumsum([len(part) for part in token_parts], out=token_starts[1:])
        tokens = np.concatenate(token_parts) if self.enable_caching and seqs else T.NO_TOKENS
        cow, count = self._run_appends(
            rows, seq_lens, num_lookahead_slots, tokens, token_starts, np.array(num_drops, np.int64),
            np.array(extras, np.int64), lambda index: f"sequence {seqs[index].seq_id}",
        )  # fmt: skip
        return self._pairs(cow, count)

    def _run_appends(
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
        they run on copies of the state, kept only if every append fits
        (``name(i)`` names the one that did not). Returns the copy-on-write
        pairs, flat, and their number."""
        needs = self._needs
        args = (rows, seq_lens, num_lookahead_slots, self.block_size, self._window, self.null_block)
        bound = _batch_needs(self._tables, *args, needs)
        if bound > self._num_free(self.gpu):
            bound = T.shared_bound(self._gpu, self._tables, *args)
        if needs[0] > self.tables.blocks.shape[1]:
            self.tables = T.grow_tables(self.tables, num_cols=int(needs[0]))
        if self.enable_caching and not has_room(self.keys, int(needs[1])):
            self._grow_keys(int(needs[1]))
        cow = self._scratch(2 * int(bound) + 2)
        args = (rows, tokens, token_starts, seq_lens, num_lookahead_slots, num_drops, extras, self._window)
        status = self._status
        status[0] = 0
        if bound <= self._num_free(self.gpu):  # no append can fail
            count = _append_batch(self._gpu, self._keys, self._tables, *args, self.null_block, cow, status)
        else:  # it may fail: run it on copies, keep them only if it all fits
            gpu, keys, tables, null = (_copy(self.gpu), _copy(self.keys), _copy(self.tables), self.null_block.copy())
            count = _append_batch(handle(gpu), handle(keys), handle(tables), *args, null, cow, status)
            if status[0] in T.SHORTAGE:
                raise NoFreeBlocksError(
                    f"append_slots needs a free GPU block for {T.SHORTAGE[int(status[0])]}; none is left"
                    f" ({name(int(status[1]))} of the batch; nothing was changed)"
                )
            self.gpu, self.keys, self.tables, self.null_block[:] = gpu, keys, tables, null
        assert status[0] == 0, "append_slots_batch ran out of array room"
        return cow, int(count)

    def _check_batch(self, seqs: list[Any]) -> tuple[np.ndarray, np.ndarray, list[int], list[int], list[Any]]:
        """``append_slots``'s checks for every sequence, raising the error the
        per-sequence calls would raise first; returns the rows, the sequence
        lengths, drops, extra ids and token arrays of the appends. The checks
        run vectorised; any failure reruns them sequence by sequence, in order,
        to raise the same error as the per-sequence calls."""
        row_of = self._rows
        rows: list[int] = []
        token_lists = []
        for seq in seqs:
            row = row_of.get(seq.seq_id)
            if row is None:
                break
            rows.append(row)
            token_lists.append(seq.get_token_ids())
        rows_array = np.array(rows, np.int64)
        num_filled = self.tables.num_filled[rows_array]
        num_tokens = np.array([len(tokens) for tokens in token_lists], np.int64)
        broken = (self.tables.num_blocks[rows_array] == 0) | (self.tables.device[rows_array] != T.GPU)
        if len(rows) < len(seqs) or (broken | (num_tokens < num_filled)).any():
            for seq in seqs:  # one of them fails: find which, as the per-sequence calls would
                self._check_appendable(seq)
        filled = num_filled.tolist()
        for seq, tokens, start in zip(seqs, token_lists, filled):
            if len(tokens) - start == 1 and type(tokens[-1]) is int and 0 <= tokens[-1] <= MAX_TOKEN_ID:
                continue  # the usual decode step: one plain new token
            check_new_tokens(seq, tokens, start)
        num_drops, extras, token_parts = [0] * len(seqs), [0] * len(seqs), [T.NO_TOKENS] * len(seqs)
        if self.enable_caching or self._window:
            for i, (seq, tokens, start) in enumerate(zip(seqs, token_lists, filled)):
                token_parts[i], num_drops[i], extras[i] = self._append_args(seq, start, tokens)
        return rows_array, num_tokens, num_drops, extras, token_parts

    def block_tables(self, seqs: Any, pad: int = BLOCK_TABLE_PAD) -> Any:
        """The sequences' block tables as one ``int32`` torch tensor of shape
        ``(len(seqs), longest table)``, rows padded at the end with ``pad``
        (default 0, as vLLM's model runner). ``seqs`` may also be an array
        of table rows (``rows_of``)."""
        import torch

        if type(pad) is not int:
            raise InvalidArgumentError(f"pad must be an int block id, got {pad!r}")
        rows, width = self._rows_and_width(seqs)
        out = np.empty((len(rows), width), np.int32)
        _gather_tables(self._tables, rows, pad, out)
        return torch.from_numpy(out)

    def slot_mapping(self, seqs: Any, num_step_tokens: int | list[int] = 1) -> Any:
        """The KV-cache slot of every token of the step, sequence by sequence:
        the last ``num_step_tokens`` (one number, or one per sequence) written
        tokens of each table, slot = ``block_id * block_size + offset`` (as
        vLLM), as an ``int64`` torch tensor. Decode: 1 token; prefill: the chunk.
        ``seqs`` may also be an array of table rows (``rows_of``)."""
        import torch

        rows, _ = self._rows_and_width(seqs)
        if isinstance(num_step_tokens, int):
            counts = np.full(len(rows), num_step_tokens, np.int64)
        else:
            counts = np.broadcast_to(np.asarray(num_step_tokens, np.int64), rows.shape).copy()
        slots, bad = _gather_slots(self._tables, rows, counts, self.block_size)
        if bad >= 0:
            raise InvalidArgumentError("num_step_tokens must be between 0 and each table's written tokens")
        return torch.from_numpy(slots)


def _copy(state: Any) -> Any:
    """A deep copy of a NamedTuple of arrays."""
    return type(state)(*(array.copy() for array in state))
