"""Every compiled kernel the fast manager's Python layer calls, by name.

Each is the ``@njit`` function of its module (``pool``, ``table``,
``tracker``, ``content``, ``rules``, ``row_api_kernels``) called through ``direct``
(``fast/dispatch.py``), which skips the dispatcher's typing: the Python
layer always passes the same argument types (C-contiguous int64 arrays,
Python ints and bools, one-pointer handles), so after the first call the
kernel's one compiled overload is called straight away, and the name here
is rebound to it. With ``BLOCKSPACE_KERNEL_DISPATCH=numba`` every name stays
a ``direct`` that calls Numba's dispatcher, so every call is typed: the
same answers, slower (``fast/dispatch.py`` lists the other cases that keep
a kernel on the dispatcher). Reading this list tells a newcomer what the
compiled side can do; nothing else in ``fast/`` wraps a kernel. The one
exception is the device table's delta kernels (``fast/table_deltas.py``):
``fast/device_sync.py`` imports them when tracking starts, and only
``fast/device_table.py`` brings in CUDA.
"""

from __future__ import annotations

from blockspace.fast import content as C
from blockspace.fast import pool as P
from blockspace.fast import row_api_kernels as R
from blockspace.fast import rules
from blockspace.fast import table as T
from blockspace.fast import tracker as K
from blockspace.fast.dispatch import direct, rebind_module

# block tables (fast/table.py)
allocate = direct(T.allocate)
append = direct(T.append)
fork = direct(T.fork)
free_table = direct(T.free)
swap = direct(T.swap)
swap_need = direct(T.swap_need)
swap_cost = direct(T.swap_cost)

# the batched step (fast/table.py, fast/row_api_kernels.py)
can_append_batch = direct(T.can_append_batch)
batch_needs = direct(T.batch_needs)
shared_bound = direct(T.shared_bound)
append_batch = direct(T.append_batch)
max_blocks = direct(T.max_blocks)
gather_tables = direct(T.gather_tables)
gather_slots = direct(T.gather_slots)
check_rows = direct(R.check_rows)
ends_rise_to = direct(R.ends_rise_to)
plan_tails = direct(R.plan_tails)
blocks_to_drop = direct(R.blocks_to_drop)

# the computed-blocks tracker (fast/tracker.py)
num_cached_tokens = direct(K.num_cached_tokens)
plan_tracker_rows = direct(K.plan_rows)
num_computed_rows = direct(K.num_computed_rows)
open_tracker_row = direct(K.open_row)

# content keys (fast/content.py)
has_room = direct(C.has_room)

# the pools (fast/pool.py)
mark_computed = direct(P.mark_computed)
hit_rate = direct(P.hit_rate)
reset_pool = direct(P.reset)

# pure rules on ints (fast/rules.py)
alloc_status = direct(rules.alloc_status)
swap_status = direct(rules.swap_status)
# The per-step check of can_append_slots is two lines of arithmetic: from
# Python, the rule's own Python form costs less than any kernel call.
blocks_touched = getattr(rules.blocks_touched, "py_func", rules.blocks_touched)
num_blocks_to_drop = direct(rules.num_blocks_to_drop)
blocks_for_prompt = direct(rules.blocks_for_prompt)  # the manager passes a huge cap for no window: ints only
# the window may be None, or the watermark a float: through the dispatcher (once, at construction)
window_blocks = rules.window_blocks
watermark_blocks = rules.watermark_blocks

rebind_module(globals())  # once compiled, ``kernels.<name>`` is the entry point itself (direct mode only)
