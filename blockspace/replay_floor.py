"""The least work any manager must do on the bench's replay: a lower bound
for the time spent inside the manager, hence an upper bound for the ratio
any implementation of the interface can reach on that replay.

``Recorder`` wraps a manager and keeps its answers; ``Floor`` then serves the
same replay from those answers, doing per call only the work the interface
forces on every implementation:

- a Python method call per operation (the scheduler makes one);
- a fresh list for every block table and computed-prefix answer, since the
  caller may keep or change it (a copy of the recorded answer; also for
  the copy-on-write pairs);
- every token of a prompt read when it is first keyed (converted to int64,
  NumPy's conversion, as a manager that keys in compiled code needs), and the
  whole token list compared with the keyed copy when a sequence dropped from
  the tracker is queried again or allocated: its tokens may have changed in
  place since, and only a full comparison tells.

Everything else (keying, the binary search, choosing blocks) costs nothing
here. The replay's control flow depends on the answers, so the recording and
the floor see the very same calls. The bound holds for managers built as
this project's are, in Python with NumPy and Numba: an extension written in
C could read Python ints faster than NumPy converts them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

_LISTS = ("get_block_table", "get_common_computed_block_ids", "append_slots")  # answers that are lists


class Recorder:
    """Passes every call to ``manager`` and records its answer, in order."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self.answers: list[Any] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._manager, name)

        def recorded(*args: Any) -> Any:
            answer = method(*args)
            self.answers.append(answer)
            return answer

        self.__dict__[name] = recorded
        return recorded


class Floor:
    """Serves a recording, doing only the work every implementation must do."""

    def __init__(self, answers: list[Any]) -> None:
        self._answers: Iterator[Any] = iter(answers)
        self._keyed: dict[int, list[int]] = {}  # tracked sequences: the tokens keyed
        self._dropped: dict[int, list[int]] = {}  # dropped from the tracker: the tokens once keyed

    def __getattr__(self, name: str) -> Callable[..., Any]:
        answers = self._answers

        def answer(*args: Any) -> Any:
            return next(answers)

        def fresh_list(*args: Any) -> Any:
            return next(answers)[:]

        self.__dict__[name] = fresh_list if name in _LISTS else answer
        return self.__dict__[name]

    @staticmethod
    def _read(tokens: list[int], known: list[int] | None) -> list[int]:
        """The keyed copy of ``tokens``: ``known`` if they still equal it, else
        a new copy, the tokens converted."""
        if known is not None and tokens == known:
            return known
        np.array(tokens)
        return tokens[:]

    def get_num_cached_tokens(self, seq: Any) -> int:
        seq_id = seq.seq_id
        if seq_id not in self._keyed:  # first keyed, or keyed again after a drop
            self._keyed[seq_id] = self._read(seq.get_token_ids(), self._dropped.pop(seq_id, None))
        return next(self._answers)

    def remove_seq_from_computed_blocks_tracker(self, seq: Any) -> None:
        self._dropped[seq.seq_id] = self._keyed.pop(seq.seq_id)
        return next(self._answers)

    def allocate(self, seq_group: Any) -> None:
        seq = seq_group.seqs[0]
        self._read(seq.get_token_ids(), self._keyed.get(seq.seq_id))
        return next(self._answers)

    def free(self, seq: Any) -> None:
        self._keyed.pop(seq.seq_id, None)
        self._dropped.pop(seq.seq_id, None)
        return next(self._answers)
