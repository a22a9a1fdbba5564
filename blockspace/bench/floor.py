"""The least work any manager must do on the bench's replay: a lower bound
for the time spent inside the manager, hence an upper bound for the ratio
any implementation of the interface can reach on that replay.

``Recorder`` wraps a manager and keeps its answers; ``Floor`` then serves the
same replay from those answers, doing per call only the work the interface
forces on every implementation:

- a Python method call per operation (the scheduler makes one);
- a new list for every new version of a block table or computed-prefix
  answer (a copy of the recorded answer when it is not the object last
  served for that call: answers are read-only lists kept while the table
  is unchanged, ``blockspace/block_ids.py``), and a fresh list of
  copy-on-write pairs per append;
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

_TABLES = ("get_block_table", "get_common_computed_block_ids")  # read-only answers, one per table version


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
        self._served: dict[Any, Any] = {}  # (method, sequence ids) -> the table answer last served

    def __getattr__(self, name: str) -> Callable[..., Any]:
        answers, served = self._answers, self._served

        def answer(*args: Any) -> Any:
            return next(answers)

        def table_answer(seqs: Any) -> Any:
            recorded = next(answers)
            key = (name, tuple(seq.seq_id for seq in seqs) if isinstance(seqs, list) else seqs.seq_id)
            if served.get(key) is not recorded:  # a new version: building it is work every manager does
                served[key] = recorded
                recorded[:]
            return recorded

        self.__dict__[name] = table_answer if name in _TABLES else answer
        return self.__dict__[name]

    def append_slots(self, seq: Any, num_lookahead_slots: int) -> list[tuple[int, int]]:
        return next(self._answers)[:]  # the copy-on-write pairs: a fresh list per call

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
