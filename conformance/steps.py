"""One decode step, three ways: the per-sequence calls, the batched calls
and the row API.

``Lockstep.row_step`` runs a decode step of several running sequences in
every manager: through the row API (``blockspace.interfaces.ROW_API``), as
an array-level scheduler makes it, or through the batched calls on
Sequence objects (``BATCH_API``), where a manager offers the way asked
for, and through the per-sequence v0 calls elsewhere. Every way answers
the same tuple, so the step is differential like every other call:

    (appended, fits of each group, copy-on-write pairs, block tables, slots, computed blocks)

*Guarded* steps ask whether each group fits first and append only if all
do; *unguarded* steps append whether or not the conservative check said
so. Either can run out of blocks (groups that fit one by one need not fit
together): a batch of appends is all or none, so it then raises
``NoFreeBlocksError`` and changes nothing. The per-sequence way gets that
rule by trying the appends on the manager and putting back a copy of its
state when one fails.

``table_arrays`` asks for the block tables of any sequences (empty and
swapped-out ones too) as one array: ``block_table_array`` of their rows
and of the sequences themselves where a manager offers it, the
``get_block_table`` lists padded with -1 elsewhere. Its width is the
longest table's, as documented, so the width is compared too.

``row_misuse`` makes row-API calls at the edge of what is allowed, for
managers that offer it (the reference has no rows to compare with): rows
that are no live sequence's must raise ``UnknownSequenceError``; a 2-D row
array, a pad past int32 and ``seq_lens=None`` raise ``InvalidArgumentError``;
rows as unsigned ints are the same rows; a group of no rows fits; and with
prefix caching token ids that do not match a row's length, or that are
floats, raise ``InvalidArgumentError``.

``DeviceMirror`` is a host copy of a device block table fed only by a
manager's ``table_delta()`` answers, for managers that keep one in sync.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from blockspace.enums import SequenceStatus
from blockspace.errors import InvalidArgumentError, NoFreeBlocksError, UnknownSequenceError
from blockspace.extras import missing_modules
from blockspace.interfaces import offers_batch, offers_rows
from blockspace.snapshot import diff

STEP_TOKENS = (1, 0, 2, 5)  # slots a sequence's step asks for (capped at its tokens): decode, none, chunks


def running(groups: list[Any]) -> list[Any]:
    return [seq for group in groups for seq in group.get_seqs(status=SequenceStatus.RUNNING)]


def step_tokens(seqs: list[Any]) -> list[int]:
    """How many of its last tokens' slots each sequence's step asks for
    (picked by its length and place, so that it varies from step to step)."""
    return [min(seq.get_len(), STEP_TOKENS[(seq.get_len() + i) % len(STEP_TOKENS)]) for i, seq in enumerate(seqs)]


def calls_step(manager: Any, groups: list[Any], lookahead: int, access_time: float, guarded: bool = True) -> tuple:
    """The step through the per-sequence calls."""
    seqs = running(groups)
    fits = [bool(manager.can_append_slots(group, lookahead)) for group in groups]
    if guarded and not all(fits):
        return (False, fits, [], [], [], [])
    backup = _backup(manager)
    try:
        pairs = [tuple(pair) for seq in seqs for pair in manager.append_slots(seq, lookahead)]
    except NoFreeBlocksError:  # all or none: the appends that fitted are undone
        manager.__dict__.clear()
        manager.__dict__.update(backup().__dict__)
        raise
    return (True, fits, pairs, *_after_appends(manager, seqs, access_time))


def _backup(manager: Any) -> Callable[[], Any]:
    """A copy of ``manager`` to be made on demand: from its pickle, taken
    now (a fraction of ``copy.deepcopy``'s time, and the explorer steps
    thousands of states), or, where it does not pickle, a deep copy."""
    try:
        frozen = pickle.dumps(manager, pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - any reason a manager does not pickle
        copied = copy.deepcopy(manager)
        return lambda: copied
    return lambda: pickle.loads(frozen)


def batch_step(manager: Any, groups: list[Any], lookahead: int, access_time: float, guarded: bool = True) -> tuple:
    """The step through the batched calls on Sequence objects (``BATCH_API``)."""
    seqs = running(groups)
    fits = manager.can_append_slots_batch(groups, lookahead)
    if guarded and not all(fits):
        return (False, fits, [], [], [], [])
    pairs = [tuple(pair) for pair in manager.append_slots_batch(seqs, lookahead)]
    return (True, fits, pairs, *_after_appends(manager, seqs, access_time))


def _after_appends(manager: Any, seqs: list[Any], access_time: float) -> tuple[list, list, list]:
    """(block tables, slots, computed blocks) of a step after its appends,
    through the per-sequence calls."""
    tables = [list(manager.get_block_table(seq)) for seq in seqs]
    bs = manager.block_size
    slots = [
        table[token // bs] * bs + token % bs
        for seq, table, count in zip(seqs, tables, step_tokens(seqs))
        for token in range(seq.get_len() - count, seq.get_len())
    ]
    for seq in seqs:
        manager.access_all_blocks_in_seq(seq, access_time)
    computed = [len(manager.get_common_computed_block_ids([seq])) for seq in seqs]
    return tables, slots, computed


def rows_step(manager: Any, groups: list[Any], lookahead: int, access_time: float, guarded: bool = True) -> tuple:
    """The step through the row API (and its tensor forms, where offered:
    they must hold what the arrays hold)."""
    seqs = running(groups)
    rows = manager.rows_of(seqs)
    lengths = [seq.get_len() for seq in seqs]
    group_ends = np.cumsum([len(group.get_seqs(status=SequenceStatus.RUNNING)) for group in groups])
    fits = manager.can_append_slots_rows(rows, lengths, lookahead, group_ends).tolist()
    if guarded and not all(fits):
        return (False, fits, [], [], [], [])
    tokens = [seq.get_token_ids() for seq in seqs]
    computed_tokens = [seq.data.get_num_computed_tokens() for seq in seqs]
    mixed = [
        np.array(ids, np.int64) if i % 2 else ids for i, ids in enumerate(tokens)
    ]  # lists and arrays: both are taken
    pairs = manager.append_slots_rows(rows, lengths, lookahead, token_ids=mixed, num_computed_tokens=computed_tokens)
    padded = manager.block_table_array(rows, -1)
    tables = [[block for block in row if block != -1] for row in padded.tolist()]
    slots = manager.slot_mapping_array(rows, step_tokens(seqs)).tolist()
    _same_in_other_forms(manager, rows, seqs, padded.tolist(), slots)
    manager.access_all_blocks_rows(rows, access_time)
    computed = manager.num_computed_blocks_rows(rows, tokens, [seq.is_prefill() for seq in seqs]).tolist()
    return (True, fits, [tuple(pair) for pair in pairs.tolist()], tables, slots, computed)


def _same_in_other_forms(manager: Any, rows: np.ndarray, seqs: list[Any], padded: list, slots: list) -> None:
    """The row API's other forms hold what its arrays hold: the slot of each
    sequence's last token for a count of one (``slot_mapping_array``'s
    default), and where a manager offers them and torch imports,
    ``block_tables`` and ``slot_mapping`` (torch tensors) of rows and of
    sequences."""
    bs = manager.block_size
    last = [padded[i][(seq.get_len() - 1) // bs] * bs + (seq.get_len() - 1) % bs for i, seq in enumerate(seqs)]
    if (one := manager.slot_mapping_array(rows).tolist()) != last:
        raise AssertionError(f"slot_mapping_array of one token each gave {one}; the tables give {last}")
    if not callable(getattr(manager, "block_tables", None)) or missing_modules("bench"):
        return
    for chosen in (rows, list(seqs)):
        tensors = manager.block_tables(chosen, -1).tolist(), manager.slot_mapping(chosen, step_tokens(seqs)).tolist()
        if tensors != (padded, slots):
            raise AssertionError(f"block_tables and slot_mapping gave {tensors}; the arrays {(padded, slots)}")


WAYS = {"rows": rows_step, "batch": batch_step}  # a step's way -> how a manager offering it makes the step


def decode_step(
    manager: Any, groups: list[Any], lookahead: int, access_time: float, guarded: bool = True, way: str = "rows"
) -> tuple:
    """The step the way ``way`` where ``manager`` offers it (``offers``),
    else through the per-sequence calls."""
    step = WAYS[way] if offers(manager, way) else calls_step
    return step(manager, groups, lookahead, access_time, guarded)


def offers(manager: Any, way: str) -> bool:
    return offers_rows(manager) if way == "rows" else offers_batch(manager)


def table_arrays(manager: Any, seqs: list[Any]) -> tuple[int, list[list[int]]]:
    """(width, rows padded with -1) of the sequences' block tables."""
    if offers_rows(manager):
        by_rows = manager.block_table_array(manager.rows_of(seqs), -1)
        by_seqs = manager.block_table_array(list(seqs), -1)
        if by_rows.shape != by_seqs.shape or (by_rows != by_seqs).any():
            raise AssertionError(
                f"block_table_array of rows {by_rows.tolist()} and of sequences {by_seqs.tolist()} differ"
            )
        return by_rows.shape[1], by_rows.tolist()
    tables = [list(manager.get_block_table(seq)) for seq in seqs]
    width = max(map(len, tables), default=0)
    return width, [table + [-1] * (width - len(table)) for table in tables]


def row_misuse(manager: Any, seqs: list[Any]) -> list[str]:
    """What the row API does wrong at its edges (``seqs``: running,
    non-empty), and any change it made to the manager's snapshot (where it
    offers one): every call here must change nothing."""
    before = manager.snapshot() if callable(getattr(manager, "snapshot", None)) else None
    problems = _edge_problems(manager, seqs)
    if before is not None and (after := manager.snapshot()) != before:
        problems.append("the calls at the edges changed the manager:\n    " + "\n    ".join(diff(before, after)[:12]))
    return problems


def _edge_problems(manager: Any, seqs: list[Any]) -> list[str]:
    rows = manager.rows_of(seqs)
    lengths = [seq.get_len() for seq in seqs]
    problems: list[str] = []
    for bad in (-1, 1 << 30):
        _refused(problems, f"block_table_array of row {bad} (no live sequence's)",
                 partial(manager.block_table_array, np.append(rows, bad), -1), UnknownSequenceError)  # fmt: skip
    _refused(problems, "block_table_array of a 2-D row array", lambda: manager.block_table_array(rows[None, :], -1))
    for pad in (2**31, -(2**31) - 1):  # just past int32: the table is handed out as int32
        _refused(problems, f"block_table_array padded with {pad}", partial(manager.block_table_array, rows, pad))
    _refused(problems, "can_append_slots_rows with seq_lens=None", lambda: manager.can_append_slots_rows(rows, None, 0))
    try:
        padded = manager.block_table_array(rows, -1).tolist()
        unsigned = manager.block_table_array(rows.astype(np.uint64), -1).tolist()
        together = manager.can_append_slots_rows(rows, lengths, 0, [len(rows)]).tolist()
        with_empty = manager.can_append_slots_rows(rows, lengths, 0, [0, len(rows)]).tolist()
    except Exception as error:  # noqa: BLE001
        return [*problems, f"block_table_array or can_append_slots_rows raised {type(error).__name__}: {error}"]
    if unsigned != padded:
        problems.append(f"block_table_array of the rows as uint64 gave {unsigned}, as int64 {padded}")
    if with_empty != [True, *together]:
        problems.append(
            f"can_append_slots_rows with an empty first group answered {with_empty}, not {[True, *together]}"
        )
    if getattr(manager, "enable_caching", False):  # each row's token ids: as long as its length says, and ids
        for i in range(len(seqs)):
            wrong = [seq.get_token_ids() + ([1] if j == i else []) for j, seq in enumerate(seqs)]
            _refused(problems, f"append_slots_rows with token_ids[{i}] one longer than seq_lens[{i}]",
                     partial(manager.append_slots_rows, rows, lengths, 0, token_ids=wrong,
                             num_computed_tokens=lengths))  # fmt: skip
        floats = [np.array([*seqs[0].get_token_ids(), 1], np.float64), *(seq.get_token_ids() for seq in seqs[1:])]
        _refused(problems, "append_slots_rows with token_ids[0] an array of floats",
                 lambda: manager.append_slots_rows(rows, [lengths[0] + 1, *lengths[1:]], 0, token_ids=floats,
                                                   num_computed_tokens=lengths))  # fmt: skip
    return problems


def _refused(
    problems: list[str], what: str, call: Callable[[], Any], error: type[Exception] = InvalidArgumentError
) -> None:
    """``call()`` must raise ``error``; else ``problems`` says what it did."""
    try:
        call()
        problems.append(f"{what} was accepted")
    except error:
        pass
    except Exception as other:  # noqa: BLE001 - the wrong error is a finding
        problems.append(f"{what} raised {type(other).__name__}, not {error.__name__}")


class DeviceMirror:
    """A block table built from ``table_delta()`` answers alone, as a device
    copy would be: after each delta, every row of ``rows`` must hold its
    table's block ids and then padding (0), and its length."""

    def __init__(self) -> None:
        self.table = np.zeros((0, 0), np.int64)
        self.lengths = np.zeros(0, np.int64)

    def apply(self, delta: Any) -> None:
        rows, cols = max(delta.num_rows, self.table.shape[0]), max(delta.num_cols, self.table.shape[1])
        if (rows, cols) != self.table.shape:
            grown = np.zeros((rows, cols), np.int64)
            grown[: self.table.shape[0], : self.table.shape[1]] = self.table
            lengths = np.zeros(rows, np.int64)
            lengths[: len(self.lengths)] = self.lengths
            self.table, self.lengths = grown, lengths
        self.table[delta.rows, delta.cols] = delta.values
        self.lengths[delta.length_rows] = delta.length_values

    def problems(self, manager: Any, seqs: list[Any]) -> list[str]:
        """Where the mirror, after the manager's latest delta, differs from its tables."""
        self.apply(manager.table_delta())
        found = []
        for seq in seqs:
            row, table = manager.row_of(seq), list(manager.get_block_table(seq))
            held, length = (self.table[row].tolist(), int(self.lengths[row])) if row < len(self.lengths) else ([], None)
            if length != len(table) or held != table + [0] * (len(held) - len(table)):
                found.append(f"seq {seq.seq_id}: table_delta() built {held} (length {length}); the table is {table}")
        return found
