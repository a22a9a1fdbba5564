"""Errors raised by every blockspace manager.

Each error subclasses the built-in exception type that vLLM 0.9.2 raises in
the same situation, so a scheduler written against vLLM (``except ValueError``
around an allocation, ``pytest.raises(KeyError)`` in vLLM's own tests) keeps
working, while our own code can catch the precise condition by name.

Every manager checks its input before it changes anything: when one of these
is raised, the manager is exactly as it was before the call.
"""

from __future__ import annotations


class BlockSpaceError(Exception):
    """Base class of every error a blockspace manager raises on purpose."""


class NoFreeBlocksError(BlockSpaceError, ValueError):
    """The operation needs more free blocks on a device than it has."""


class UnknownSequenceError(BlockSpaceError, KeyError, AssertionError):
    """The sequence has no block table in this manager (vLLM raises KeyError,
    or AssertionError in ``access_all_blocks_in_seq``: this is both)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else "unknown sequence"


class DuplicateTableError(BlockSpaceError, AssertionError):
    """A block table (or cross table) already exists for this sequence (group)."""


class ChildExistsError(BlockSpaceError, AssertionError):
    """``fork`` onto a child sequence that already has a block table."""


class NoWaitingSequenceError(BlockSpaceError, IndexError):
    """``can_allocate``/``allocate`` of a group without a WAITING sequence."""


class EmptyTableError(BlockSpaceError, AssertionError):
    """Append to, or fork from, a table that holds no blocks (empty prompt)."""


class NoCrossTableError(BlockSpaceError, AssertionError):
    """The sequence group has no encoder-decoder cross-attention table."""


class TrackerError(BlockSpaceError, AssertionError):
    """Misuse of the computed-blocks tracker (unqueried sequence, shrunk tokens)."""


class WrongDeviceError(BlockSpaceError, ValueError):
    """A table is not on the device the operation needs (append to a swapped
    sequence, swap in a running one, ...)."""


class UnknownDeviceError(BlockSpaceError, AssertionError, ValueError):
    """A device argument that names neither the GPU nor the CPU."""


class InvalidArgumentError(BlockSpaceError, ValueError):
    """An argument out of its range: negative lookahead, non-positive size,
    a token id that is not a non-negative int, ..."""


class SaltMismatchError(InvalidArgumentError):
    """A group whose sequences, or the group itself, carry different cache salts."""


class InvalidConfigError(InvalidArgumentError, AssertionError):
    """A constructor argument out of range (vLLM asserts ``watermark >= 0``)."""


class UnsupportedError(BlockSpaceError, NotImplementedError):
    """A combination vLLM does not support: encoder-decoder with prefix caching
    or sliding window, fork or swap of a table after sliding-window drops."""


class MissingExtraError(BlockSpaceError, ImportError):
    """A part of the package whose optional dependencies are not installed;
    the message names the extra that installs them (``blockspace/extras.py``)."""


class ClusterError(BlockSpaceError, RuntimeError):
    """Work sent to a Ray cluster failed there: a worker could not start,
    import the implementations, or died (``--executor ray``)."""


class ReadOnlyTableError(BlockSpaceError, TypeError):
    """A caller tried to change a block table answer (``BlockIds``) in place."""


__all__ = [
    "BlockSpaceError",
    "ChildExistsError",
    "DuplicateTableError",
    "EmptyTableError",
    "InvalidArgumentError",
    "InvalidConfigError",
    "NoCrossTableError",
    "NoFreeBlocksError",
    "MissingExtraError",
    "NoWaitingSequenceError",
    "ReadOnlyTableError",
    "SaltMismatchError",
    "TrackerError",
    "UnknownDeviceError",
    "UnknownSequenceError",
    "UnsupportedError",
    "WrongDeviceError",
]


class InvariantError(BlockSpaceError, AssertionError):
    """``check_invariants()`` found the manager's state inconsistent (a bug)."""


__all__ += ["InvariantError"]
