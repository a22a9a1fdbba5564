"""The row API's boundary: every argument it takes, checked before anything runs.

Why one boundary: the row API's kernels are called without Numba's typing
(``fast/dispatch.py``). They are compiled for C-contiguous int64 and bool
arrays, and a float or 2-D array passed on would be read as memory of
another type. So every public method of ``fast/row_api.py`` that takes
arrays passes each one through a function below first, and so do the
other public APIs that hand arrays or counts to kernels
(``DeviceBlockTable.step``, ``TableDeltas``). A wrong dtype,
shape or length raises ``InvalidArgumentError`` naming the argument, and
what comes back is the one layout the kernels take. The values (live rows,
lengths against tables, token ids) are checked next, still before any
change, by the kernels and the parts that read them.
"""

from __future__ import annotations

from collections.abc import Collection, Sized
from typing import Any

import numpy as np

from blockspace.errors import InvalidArgumentError
from blockspace.validation import MAX_TOKEN_ID

INT32_MAX = 2**31 - 1  # block tables are handed out as int32
INT64_MAX = 2**63 - 1
_UNREADABLE = np.zeros((0, 0))  # what int_array holds for input NumPy cannot read: refused as not 1-D


def int_array(name: str, values: Any, size: int | None = None) -> np.ndarray:
    """``values`` (a list or an array of integers) as a 1-D C-contiguous
    int64 array, of ``size`` entries if given. Bools, floats and integers
    outside int64 are refused."""
    try:
        array = np.asarray(values)
    except (TypeError, ValueError, OverflowError):  # ragged lists, or what NumPy cannot read
        array = _UNREADABLE
    kind = array.dtype.kind
    if array.ndim != 1 or (kind != "i" and kind != "u" and array.size):  # [] is float64 to NumPy
        raise InvalidArgumentError(f"{name} must be a 1-D array of integers")
    if kind == "u" and array.size and array.max() > INT64_MAX:
        raise InvalidArgumentError(f"{name} holds an integer beyond int64")
    if size is not None and len(array) != size:
        raise InvalidArgumentError(f"{name} has {len(array)} entries for {size} rows")
    return np.ascontiguousarray(array, dtype=np.int64)


def bool_array(name: str, values: Any, size: int) -> np.ndarray:
    """``values`` as a 1-D C-contiguous bool array of ``size`` entries."""
    try:
        array = np.asarray(values)
    except (TypeError, ValueError):
        array = None
    if array is None or array.shape != (size,) or (array.dtype != np.bool_ and array.size):  # [] is float64
        raise InvalidArgumentError(f"{name} must be {size} bools, one per row")
    return np.ascontiguousarray(array, dtype=np.bool_)


def token_lists(method: str, values: Collection[Any] | None, size: int) -> np.ndarray:
    """The lengths of ``values``, the ``token_ids`` argument of ``method``:
    ``size`` token lists (or 1-D arrays), one per row. Only their lengths are
    read here, in one pass in C (this runs at every step); the values are
    checked where they are read, also before any change."""
    name = "token_ids"
    if values is None or isinstance(values, (str, bytes)) or not isinstance(values, Sized) or len(values) != size:
        raise InvalidArgumentError(f"with prefix caching, {method} needs {name} for every row")
    try:
        return np.fromiter(map(len, values), np.int64, size)
    except TypeError:  # an entry without a length: say which
        bad = next(i for i, entry in enumerate(values) if not isinstance(entry, Sized))
        raise InvalidArgumentError(f"{name}[{bad}] must be a list or 1-D array of token ids") from None


def step_counts(num_step_tokens: Any, size: int) -> np.ndarray:
    """``num_step_tokens``, one int or one per row, as ``size`` int64 counts."""
    if type(num_step_tokens) is int or isinstance(num_step_tokens, np.integer):
        return np.full(size, num_step_tokens, np.int64)
    return int_array("num_step_tokens", num_step_tokens, size)


def block_id_pad(pad: Any) -> int:
    """The pad value of an int32 block table."""
    if type(pad) is not int or not -INT32_MAX - 1 <= pad <= INT32_MAX:
        raise InvalidArgumentError(f"pad must be an int32 block id, got {pad!r}")
    return pad


def count(name: str, value: Any) -> None:
    """A non-negative int (a Python or NumPy integer, not a bool)."""
    if type(value) is bool or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative int, got {value!r}")


def optional_count(name: str, value: Any) -> None:
    """None, or a non-negative int."""
    if value is not None:
        count(name, value)


def not_token_ids(index: int) -> InvalidArgumentError:
    """The error of a ``token_ids`` entry holding a value that is no token id."""
    return InvalidArgumentError(f"token_ids[{index}] holds a value that is no token id (0 to {MAX_TOKEN_ID})")
