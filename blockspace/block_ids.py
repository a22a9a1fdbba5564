"""The block ids a manager hands out: a read-only ``list``.

Why a list that cannot change: a scheduler asks for every running
sequence's block table at every step, and a table holds hundreds of ids.
vLLM 0.9.2 answers with its internal list, so the answer costs nothing, but
a caller that appends to it (or keeps it and sees it change under the next
``append_slots``) silently corrupts or misreads the manager. Copying on
every call is safe and costs microseconds per step per sequence. A
``BlockIds`` is both: the manager builds one when a table changes and hands
the same object out until the table changes again, and nobody can write to
it. A new answer after a change is a new object, so a kept answer is a
snapshot of the table at the time of the call.

To every caller it is a ``list``: ``isinstance(ids, list)``, equal to the
plain list of the same ids, indexing, iteration and ``len`` as usual.
Anything that makes a new list makes a plain, writable one: slicing,
``ids + [...]``, ``list(ids)``, ``copy.copy(ids)``; pickle and msgspec (the
serializer of vLLM's ``SequenceGroupMetadata``) write it as a plain list.
Every method that would change it in place raises ``ReadOnlyTableError``,
a ``TypeError`` (as for a tuple).
"""

from __future__ import annotations

from typing import Any, NoReturn

from blockspace.errors import ReadOnlyTableError


def _refuse(self: BlockIds, *args: Any, **kwargs: Any) -> NoReturn:
    raise ReadOnlyTableError(
        "a block table answer is read-only (the manager hands the same list to every caller until the table "
        "changes); copy it with list(ids) to change it"
    )


class BlockIds(list):
    """A read-only list of block ids (see the module docstring)."""

    __slots__ = ()

    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def __reduce__(self) -> tuple[type, tuple[list[int]]]:
        return list, (list(self),)  # pickle and copy make a plain list


def rebuilt(old: list[int], start: int, tail: list[int]) -> BlockIds:
    """A new answer: the first ``start`` ids of ``old``, then ``tail``. For a
    manager whose table changed from entry ``start`` on: copying the kept
    ids shares their int objects, where converting a whole table makes
    new ones (five times slower for a thousand ids)."""
    ids = BlockIds(old)
    if start < len(ids):
        list.__delitem__(ids, slice(start, None))  # not yet handed out: the manager may still shape it
    list.extend(ids, tail)
    return ids


EMPTY = BlockIds()  # the answer for a table without blocks, and for no common computed blocks


def common_prefix(prefixes: list[list[int]]) -> BlockIds:
    """The longest prefix that the id lists share, the empty ones left out:
    ``get_common_computed_block_ids`` of several sequences, each list a
    sequence's cached blocks (vLLM drops sequences without any, spec §9.15)."""
    prefixes = [ids for ids in prefixes if ids]
    if not prefixes:
        return EMPTY
    common = prefixes[0]
    for ids in prefixes[1:]:
        length = 0
        while length < min(len(common), len(ids)) and common[length] == ids[length]:
            length += 1
        common = common[:length]
    return BlockIds(common)


__all__ = ["EMPTY", "BlockIds", "common_prefix", "rebuilt"]
