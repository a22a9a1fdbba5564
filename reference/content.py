"""Content keys: the identity of a full block's content, prefix included.

vLLM keys a full block by Python's ``hash`` of (is_first, previous key,
tokens, extra). A hash alone lets two different prefixes collide and share a
block (GHSA-rm76-4mrf-v9r8). Here a key is a small int handed out by
interning the content itself, ``(parent key, tokens, extra)``: the dict
compares the whole tuple on every lookup, so equal keys mean equal content,
by construction. ``parent`` is the table's *root* for the first block of a
sequence: ``None``, or ``("cache_salt", salt)`` for a salted request, so a
salt sits in the parent slot, apart from the adapter ``extra`` slot, and no
salt can ever produce the key of some LoRA id or of another tenant's prefix.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


class ContentKeys:
    """Interns block contents into consecutive ints (the content keys)."""

    def __init__(self) -> None:
        self._key_of: dict[tuple[Hashable, tuple[int, ...], Hashable], int] = {}

    def __len__(self) -> int:
        return len(self._key_of)

    @staticmethod
    def root(cache_salt: Hashable) -> Hashable:
        """What stands before the first block: nothing, or the tenant's salt."""
        return None if cache_salt is None else ("cache_salt", cache_salt)

    def key(self, parent: Hashable, tokens: Sequence[int], extra: Hashable) -> int:
        """The key of a full block holding ``tokens`` after the block keyed
        ``parent`` (for the first block: the root), with adapter identity ``extra``."""
        content = (parent, tuple(tokens), extra)
        key = self._key_of.get(content)
        if key is None:
            key = self._key_of[content] = len(self._key_of)
        return key

    def chain(
        self,
        tokens: Sequence[int],
        block_size: int,
        extra: Hashable,
        root: Hashable = None,
        keys: list[int] | None = None,
    ) -> list[int]:
        """Keys of every full block of ``tokens``, extending ``keys`` (the keys
        of its first blocks, already known) in place."""
        keys = [] if keys is None else keys
        for index in range(len(keys), len(tokens) // block_size):
            parent = keys[index - 1] if index else root
            keys.append(self.key(parent, tokens[index * block_size : (index + 1) * block_size], extra))
        return keys
