"""Enums shared by every implementation, equal to vLLM's own members.

vLLM's schedulers compare results with ``==`` against *their* enums
(``vllm.core.interfaces.AllocStatus``, ``vllm.utils.Device``). Our members
therefore compare equal to, and hash like, any enum member of a class with the
same name and a member with the same name, without importing vLLM. ``Enum``
hashes a member by its name, so equal members also share a hash.
"""

from __future__ import annotations

import enum
from typing import Any

from blockspace.errors import UnknownDeviceError


class _PeerEnum(enum.Enum):
    """An Enum whose members equal same-named members of same-named enums."""

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, enum.Enum) and not isinstance(other, type(self)):
            return type(other).__name__ == type(self).__name__ and other.name == self.name
        return NotImplemented if not isinstance(other, enum.Enum) else False

    def __hash__(self) -> int:
        return hash(self._name_)


class AllocStatus(_PeerEnum):
    """Result of ``can_allocate``/``can_swap_in``.

    OK: it fits now. LATER: it would fit once blocks are freed.
    NEVER: it can never fit on the GPU (with the watermark kept free).
    """

    OK = 1
    LATER = 2
    NEVER = 3


class Device(_PeerEnum):
    """A memory pool: the GPU (device) blocks or the CPU (swap) blocks."""

    GPU = 1
    CPU = 2

    @classmethod
    def parse(cls, value: Any) -> Device:
        """Accept a member of ours, any enum member named GPU/CPU (vLLM's), or
        the name as a string in any case; anything else is an error."""
        if isinstance(value, cls):
            return value
        name = value.name if isinstance(value, enum.Enum) else value
        if isinstance(name, str) and name.upper() in cls.__members__:
            return cls[name.upper()]
        raise UnknownDeviceError(f"unknown device {value!r}: expected Device.GPU or Device.CPU")


class SequenceStatus(enum.IntEnum):
    """vLLM's sequence status values; statuses above SWAPPED are finished."""

    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_IGNORED = 6

    @staticmethod
    def is_finished(status: SequenceStatus) -> bool:
        return status > SequenceStatus.SWAPPED


__all__ = ["AllocStatus", "Device", "SequenceStatus"]
