"""Arrays that the compiled loop borrows for one call, without counting
their references.

Why: Numba counts a reference up and down, two atomic operations, each
time compiled code takes an array out of a tuple or passes a tuple of
arrays to a function it does not inline. The loop's state is tuples of
about sixty arrays (``state.py``), read by every part of a step, so a
step of a few decodes spent most of its time on those counts (about 7 us
a step: a fleet's small batches made the count the cost of the replay).
An array whose memory record is null is counted by nobody: Numba's
count functions skip a null record.

Why it is safe: the driver (``engine.py``) holds every array of the state
for the whole of a call of the loop, and grows or replaces them only
between calls; the loop keeps no array of the state after it returns.

Without compilation (``NUMBA_DISABLE_JIT=1``), ``borrowed`` returns the
tuple itself: Python counts its references its own way.
"""

from __future__ import annotations

from typing import Any

from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic


def _borrowed(typingctx: Any, values: Any) -> Any:
    """``values`` (a tuple, named or not), each array in it with a null memory record."""
    if not isinstance(values, types.BaseTuple):
        return None
    kinds: list[Any] = list(values.types)  # type: ignore[attr-defined]  # every tuple type has them

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        (result,) = args
        for index, kind in enumerate(kinds):
            if isinstance(kind, types.Array):
                array = context.make_array(kind)(context, builder, value=builder.extract_value(result, index))
                array.meminfo = cgutils.get_null_value(array.meminfo.type)
                array.parent = cgutils.get_null_value(array.parent.type)
                result = builder.insert_value(result, array._getvalue(), index)
        return result

    return values(values), codegen


def _as_is(values: Any) -> Any:
    return values


# DISABLE_JIT is set from NUMBA_DISABLE_JIT when numba loads
borrowed: Any = _as_is if config.DISABLE_JIT else intrinsic(_borrowed)  # type: ignore[attr-defined]

__all__ = ["borrowed"]
