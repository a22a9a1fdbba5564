"""The shared argument checks (``blockspace.validation``), with quick passes
for the usual case: every error still comes from the shared check, so the
fast manager raises exactly the reference's error for the same bad input."""

from __future__ import annotations

from array import array
from itertools import chain
from typing import Any

import numpy as np

from blockspace.protocols import SequenceLike
from blockspace.validation import MAX_TOKEN_ID, check_lookahead, check_token_ids

_FEW_TOKENS = 32  # below this, the shared per-token check is as quick as the vectorised one
_NO_TOKENS = np.zeros(0, np.int64)
_LOOP_TOKENS = 256  # below this, a check of plain ints in Python beats converting them


def check_new_tokens(seq: SequenceLike, tokens: Any, start: int) -> None:
    """``check_token_ids(seq, tokens, start)``, with a quick pass for the usual
    case (a few plain ints) that leaves any error to the shared check."""
    num_new = len(tokens) - start
    if num_new == 1:  # a decode step
        token = tokens[start]
        if type(token) is int and 0 <= token <= MAX_TOKEN_ID:
            return
    elif num_new > _FEW_TOKENS:
        checked_token_array(seq, tokens, start)
        return
    for position in range(start, len(tokens)):
        token = tokens[position]
        if type(token) is not int or not 0 <= token <= MAX_TOKEN_ID:
            check_token_ids(seq, tokens, start)


def checked_lookahead(num_lookahead_slots: Any) -> None:
    """``check_lookahead``, with a quick pass for a plain non-negative int."""
    if type(num_lookahead_slots) is not int or num_lookahead_slots < 0:
        check_lookahead(num_lookahead_slots)


def int64_or_none(values: Any) -> np.ndarray | None:
    """``values`` as a 1-D int64 array if NumPy finds only integers in them
    (Python or NumPy ints, or bools: see ``_no_bools``), else None. One
    conversion in C, where checking each value's type in Python costs as much again."""
    try:
        array = np.array(values) if len(values) else np.zeros(0, np.int64)  # NumPy reads [] as floats
    except (OverflowError, TypeError, ValueError):
        return None
    return array if array.dtype == np.int64 and array.ndim == 1 else None


def _no_bools(values: Any, array: np.ndarray) -> bool:
    """No bool hides among the ints (NumPy reads True as 1): only where the
    value is 0 or 1 can one be, so only those positions are looked at."""
    return all(type(values[i]) is int for i in np.flatnonzero(array <= 1).tolist())


def token_array_or_none(values: Any, known: np.ndarray | None = None) -> np.ndarray | None:
    """``values`` (a list, or an array of integers) as a 1-D int64 array if
    every one is a token id (an int in ``0..MAX_TOKEN_ID``, not a bool), else
    None. ``known``: ``int64_or_none(values)`` of a list, made earlier."""
    if isinstance(values, np.ndarray):
        array = values if values.ndim == 1 and values.dtype.kind in "iu" else None
    else:
        array = int64_or_none(values) if known is None else known
        if array is not None and not _no_bools(values, array):
            array = None
    if array is None or (array.size and (array.min() < 0 or array.max() > MAX_TOKEN_ID)):
        return None
    return array.astype(np.int64, copy=False)


def all_token_ids(values: list[Any]) -> bool:
    """Is every value a token id (an int in ``0..MAX_TOKEN_ID``, not a bool)?
    A Python loop for up to a few hundred values (a decode step's new
    tokens), where NumPy's conversion and checks cost more; else one
    conversion in C."""
    if len(values) <= _LOOP_TOKENS:
        return all(type(value) is int and 0 <= value <= MAX_TOKEN_ID for value in values)
    return token_array_or_none(values) is not None


def _int64_list(values: list[Any]) -> np.ndarray | None:
    """A list of ints as an int64 array, or None if it holds anything else
    (bools aside: see ``_no_bools``). Why ``array("q")``: it converts in C
    at the cost of NumPy's int64 conversion, and refuses a float, which
    NumPy would truncate, where letting NumPy find the type costs half as
    much again (a prefill converts thousands of tokens a step)."""
    try:
        return np.frombuffer(array("q", values), np.int64)
    except (TypeError, OverflowError):
        return None


def joined_token_ids(parts: list[Any]) -> tuple[np.ndarray, int]:
    """``parts`` (token lists, or 1-D integer arrays) as one int64 array,
    and -1; or an empty array and the index of the first part that holds
    a value that is no token id. Plain lists are checked in one pass."""
    if not parts:
        return _NO_TOKENS, -1
    if all(type(part) is list for part in parts):  # the usual case: plain lists of ints
        flat = list(chain.from_iterable(parts))
        array = _int64_list(flat)
        if array is not None and (not array.size or 0 <= (least := array.min()) <= array.max() <= MAX_TOKEN_ID):
            if not array.size or least > 1 or _no_bools(flat, array):  # a bool can only hide as a 0 or a 1
                return array, -1
    arrays = []
    for i, part in enumerate(parts):
        array = token_array_or_none(part)
        if array is None:
            return np.zeros(0, np.int64), i
        arrays.append(array)
    return (np.concatenate(arrays) if arrays else np.zeros(0, np.int64)), -1


def checked_token_array(seq: SequenceLike, tokens: Any, start: int = 0, known: np.ndarray | None = None) -> np.ndarray:
    """``tokens[start:]`` as int64, each checked as ``check_token_ids`` does
    (raising its error for the first bad one), but vectorised for the usual
    list of ints. ``known``: ``int64_or_none(tokens)``, made earlier."""
    part = tokens[start:] if start else tokens  # a prompt: no copy of its list
    if len(part) > _FEW_TOKENS:
        array = token_array_or_none(part, None if known is None else known[start:])
        if array is not None:
            return array
    check_token_ids(seq, tokens, start)
    return np.array(part, np.int64).reshape(-1)
