"""One-pointer handles on the state, for cheap kernel calls.

A kernel taking three NamedTuples of arrays spends about 2 us per call just
unboxing their ~30 arrays. A Numba ``StructRef`` holding the same arrays is
passed as one pointer (about 0.3 us), and kernels read its fields with the
same ``state.field`` syntax, so every kernel accepts either form. The
manager keeps each state as a NamedTuple (what Python code reads) and a
``StructRef`` over the very same arrays (what kernels get): writes by a
kernel are writes to the NamedTuple's arrays.

``State`` keeps the two in step: after ``store.gpu = pool``,
``store.gpu_ref`` is a fresh handle (``fast/store.py``), and ``store.gpu_view``
memoryviews of its arrays. Under ``NUMBA_DISABLE_JIT=1`` the handle is the
NamedTuple itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar, overload

from numba import config, njit, types
from numba.experimental import structref

from blockspace.fast.content import Keys
from blockspace.fast.pool import Pool
from blockspace.fast.table import Tables
from blockspace.fast.tracker import Tracker


class _ArrayFields(types.StructRef):
    def preprocess_fields(self, fields: Any) -> tuple:
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


@structref.register
class PoolHandleType(_ArrayFields):
    pass


@structref.register
class KeysHandleType(_ArrayFields):
    pass


@structref.register
class TablesHandleType(_ArrayFields):
    pass


@structref.register
class TrackerHandleType(_ArrayFields):
    pass


class PoolHandle(structref.StructRefProxy):
    pass


class KeysHandle(structref.StructRefProxy):
    pass


class TablesHandle(structref.StructRefProxy):
    pass


class TrackerHandle(structref.StructRefProxy):
    pass


structref.define_proxy(PoolHandle, PoolHandleType, list(Pool._fields))
structref.define_proxy(KeysHandle, KeysHandleType, list(Keys._fields))
structref.define_proxy(TablesHandle, TablesHandleType, list(Tables._fields))
structref.define_proxy(TrackerHandle, TrackerHandleType, list(Tracker._fields))
HANDLES = {Pool: PoolHandle, Keys: KeysHandle, Tables: TablesHandle, Tracker: TrackerHandle}


def maker(state_type: type[NamedTuple], proxy: type) -> Any:
    """The cached compiled ``proxy(*state)`` for a ``state_type`` NamedTuple.

    Why compiled and cached: the proxies' own constructors would be compiled
    afresh in every process (about 0.3 s each). Why made here rather than
    written out as ``@njit`` functions: Numba keys a cache entry on the
    argument types, the bytecode, the source file's timestamp and the
    contents of the function's closure cells, but not on the NamedTuple's
    field names. After renaming or reordering fields of the same dtypes
    (in ``fast/pool.py``, say), a maker keyed on this file alone would load
    code that lays the handle out by the old names. Here the field names are
    a closure cell of the maker, so a change of fields is a new cache key
    and a fresh compile, with no file to touch. Each state type's maker gets
    its own name, hence its own index file: four makers sharing one index
    could pick the same data file when two processes compile at once."""
    fields = tuple(state_type._fields)

    def make(state):  # type: ignore[no-untyped-def]  # compiled: Numba types it from its argument
        fields  # noqa: B018 - read only so that it is a closure cell, which Numba hashes into the cache key
        return proxy(*state)

    make.__name__ = make.__qualname__ = f"{state_type.__name__.lower()}_handle"
    return njit(cache=True)(make)


MAKERS = {state: maker(state, proxy) for state, proxy in HANDLES.items()}


def handle(state: Any) -> Any:
    """The kernels' view of a state NamedTuple (the NamedTuple itself without JIT)."""
    if config.DISABLE_JIT:  # type: ignore[attr-defined]  # set from NUMBA_DISABLE_JIT when numba loads
        return state
    return MAKERS[type(state)](state)


_S = TypeVar("_S")


class State(Generic[_S]):
    """An attribute holding a state NamedTuple. Reads go straight to the
    instance dict. Its handle (``<name>_ref``) and the same NamedTuple over
    memoryviews of the same arrays (``<name>_view``) are made on their first
    read after each assignment (``Derived``): a state is replaced rarely
    (growth, a batch's trial) and read often, and a manager loaded from a
    pickle (the conformance explorer loads one per move) may never need some
    of them.

    Why views: Python code that reads one cell (a row's token count, a free
    count) pays about 80 ns for ``array.item(i)`` and 30 ns for
    ``memoryview[i]``, which gives a plain ``int``/``float``/``bool``; a
    per-step call reads several.

    The type parameter is the NamedTuple held. There is no ``__get__`` at
    run time (a read is the instance dict's); the checker is told that a read
    on an instance gives the NamedTuple."""

    if TYPE_CHECKING:

        @overload
        def __get__(self, holder: None, owner: type) -> State[_S]: ...
        @overload
        def __get__(self, holder: object, owner: type) -> _S: ...
        def __get__(self, holder: object, owner: type) -> State[_S] | _S: ...

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __set__(self, holder: Any, value: _S) -> None:
        held = holder.__dict__
        held[self.name] = value
        held.pop(self.name + "_ref", None)
        held.pop(self.name + "_view", None)


class Derived:
    """A holder of ``State`` attributes: ``<name>_ref`` and ``<name>_view``
    are made on a miss (``__getattr__`` runs only when the instance dict has
    no such entry) and kept until ``<name>`` is set again."""

    def __getattr__(self, name: str) -> Any:
        state, _, kind = name.rpartition("_")
        if (
            kind not in ("ref", "view")
            or not isinstance(getattr(type(self), state, None), State)
            or state not in self.__dict__
        ):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = self.__dict__[state]
        made = handle(value) if kind == "ref" else type(value)(*(memoryview(array) for array in value))
        self.__dict__[name] = made
        return made
