"""Content keys: the identity of a full block's content, prefix included.

vLLM keys a full block by Python's ``hash`` of (is_first, previous key,
tokens, extra). A hash alone lets two different prefixes collide and share a
block (GHSA-rm76-4mrf-v9r8). Here a key is a small int handed out by
interning the content itself, ``(parent key, tokens, extra)``: the dict
compares the whole tuple on every lookup, so equal keys mean equal content,
by construction. ``parent`` is ``None`` for the first block of a sequence.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Optional


class ContentKeys:
    """Interns block contents into consecutive ints (the content keys)."""

    def __init__(self) -> None:
        self._key_of: dict[tuple[Optional[int], tuple[int, ...], Hashable], int] = {}

    def __len__(self) -> int:
        return len(self._key_of)

    def key(self, parent: Optional[int], tokens: Sequence[int], extra: Hashable) -> int:
        """The key of a full block holding ``tokens`` after the block keyed
        ``parent`` (None: first block), with adapter identity ``extra``."""
        content = (parent, tuple(tokens), extra)
        key = self._key_of.get(content)
        if key is None:
            key = self._key_of[content] = len(self._key_of)
        return key

    def chain(
        self, tokens: Sequence[int], block_size: int, extra: Hashable, keys: Optional[list[int]] = None
    ) -> list[int]:
        """Keys of every full block of ``tokens``, extending ``keys`` (the keys
        of its first blocks, already known) in place."""
        keys = [] if keys is None else keys
        for index in range(len(keys), len(tokens) // block_size):
            parent = keys[index - 1] if index else None
            keys.append(self.key(parent, tokens[index * block_size : (index + 1) * block_size], extra))
        return keys
