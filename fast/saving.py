"""A part's state as bytes and plain copies, and that state put back in place.

Two uses. Pickling (``__getstate__``): each NamedTuple of arrays travels
as one buffer and its layout (``packed``), since pickle's own way with
~50 small arrays costs a few microseconds each. And ``save_state`` /
``restore_state`` (``fast/manager.py``), which the conformance explorer
calls once a move: a restore writes the saved bytes into the very arrays
the manager already has (``Buffers``), so no array, memoryview or kernel
handle is made anew, and it copies each part's Python fields
(``SavedFields``) into the containers the part already holds, so
whoever bound them (the manager binds three of ``TableRows``'s) still
holds the live ones.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

Layout = tuple[tuple[str, tuple[int, ...], int], ...]
Packed = tuple[type, Layout, bytes]
_ALIGN = 16


def packed(state: Any) -> Packed:
    """A NamedTuple of arrays as its type, each array's dtype (as its
    character), shape and offset, and one buffer (each array's bytes padded to ``_ALIGN``: an
    unaligned array is slower, and its memoryview cannot be indexed)."""
    chunks = [_padded(array.tobytes()) for array in state]
    offsets = itertools.accumulate((len(chunk) for chunk in chunks[:-1]), initial=0)
    layout = tuple(
        (array.dtype.char, array.shape, offset) for array, offset in zip(state, offsets)
    )  # native byte order
    return type(state), layout, b"".join(chunks)


def _padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % _ALIGN)


def unpacked(kind: type, layout: Layout, blob: bytes) -> Any:
    """``packed``'s NamedTuple again, its arrays writable views of one new buffer."""
    return _unpacked_into(kind, layout, bytearray(blob))


def _unpacked_into(kind: type, layout: Layout, buffer: bytearray) -> Any:
    return kind(*[np.ndarray(shape, dtype, buffer, offset) for dtype, shape, offset in layout])


class Buffers:
    """The states an owner last restored, each with its layout and buffer,
    so that the next restore of the same layout overwrites the bytes
    (one copy) instead of making ~10 arrays and their handles. A state
    replaced since (grown, or a batch's trial committed) is not the one
    recorded, and is made anew."""

    def __init__(self) -> None:
        self.made: dict[str, tuple[Any, Layout, bytearray]] = {}

    def restored(self, name: str, current: Any, saved: Packed) -> Any:
        """``saved`` as a state: ``current`` overwritten where it can be, else new arrays."""
        kind, layout, blob = saved
        made = self.made.get(name)
        if made is not None and made[0] is current and made[1] == layout:
            made[2][:] = blob  # same length: a copy into the buffer the arrays view
            return current
        buffer = bytearray(blob)
        state = _unpacked_into(kind, layout, buffer)
        self.made[name] = (state, layout, buffer)
        return state


class SavedFields:
    """A part whose fields that change are named in ``SAVED``: ``save``
    copies them, containers one level deep (their entries are ints,
    floats, tuples, read-only ``BlockIds`` and memos, which nothing changes
    in place) and arrays whole; ``restore`` copies them back into the
    containers and arrays the part holds where they fit, leaving the saved
    copies as they were, for the next restore."""

    SAVED: tuple[str, ...] = ()

    def save(self) -> tuple:
        return tuple(_copied(getattr(self, name)) for name in self.SAVED)

    def restore(self, saved: tuple) -> None:
        for name, value in zip(self.SAVED, saved):
            current = getattr(self, name)
            if isinstance(current, dict):
                current.clear()
                current.update(value)
            elif isinstance(current, list):
                current[:] = value
            elif isinstance(current, np.ndarray) and current.shape == value.shape:
                current[...] = value
            else:
                setattr(self, name, _copied(value))


def _copied(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return type(value)(value)
    if isinstance(value, np.ndarray):
        return value.copy()
    return value
