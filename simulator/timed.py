"""Measuring the wall time a manager spends inside its calls, call by call.

The simulated clock says how long the GPU would take; this says how long
the block manager itself took on this machine, which is what the ``fast``
implementation exists to cut. ``TimedManager`` wraps every method of the
manager the scheduler calls with ``time.perf_counter`` and adds the elapsed
time to one counter, which the simulation reads and resets once per step,
and to the method's own total (``by_method``), which says where the
manager's share of a step goes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from blockspace.interfaces import ROW_API

# The manager methods a scheduler calls (the v0 interface plus the tracker's).
TIMED_METHODS = (
    "can_allocate",
    "allocate",
    "can_append_slots",
    "append_slots",
    "fork",
    "can_swap_in",
    "swap_in",
    "can_swap_out",
    "swap_out",
    "free",
    "get_block_table",
    "get_num_free_gpu_blocks",
    "get_num_free_cpu_blocks",
    "access_all_blocks_in_seq",
    "get_common_computed_block_ids",
    "mark_blocks_as_computed",
    "get_prefix_cache_hit_rate",
    "get_num_cached_tokens",
    "remove_seq_from_computed_blocks_tracker",
)


class TimedManager:
    """The manager's methods, each timed into ``seconds``."""

    # Set on each instance by __init__ (one per name of TIMED_METHODS), declared for type checkers.
    can_allocate: Callable[..., Any]
    allocate: Callable[..., Any]
    can_append_slots: Callable[..., Any]
    append_slots: Callable[..., Any]
    fork: Callable[..., Any]
    can_swap_in: Callable[..., Any]
    swap_in: Callable[..., Any]
    can_swap_out: Callable[..., Any]
    swap_out: Callable[..., Any]
    free: Callable[..., Any]
    get_block_table: Callable[..., Any]
    get_num_free_gpu_blocks: Callable[..., Any]
    get_num_free_cpu_blocks: Callable[..., Any]
    access_all_blocks_in_seq: Callable[..., Any]
    get_common_computed_block_ids: Callable[..., Any]
    mark_blocks_as_computed: Callable[..., Any]
    get_prefix_cache_hit_rate: Callable[..., Any]
    get_num_cached_tokens: Callable[..., Any]
    remove_seq_from_computed_blocks_tracker: Callable[..., Any]

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.seconds = 0.0
        self.num_calls = 0
        self.by_method: dict[str, list[float]] = {}  # name -> [seconds, calls], over the whole run
        for name in TIMED_METHODS:
            setattr(self, name, self._timed(name, getattr(manager, name)))
        for name in ROW_API:  # the row API, timed where the manager offers it
            if callable(getattr(manager, name, None)):
                setattr(self, name, self._timed(name, getattr(manager, name)))

    def _timed(self, name: str, method: Any) -> Any:
        clock = time.perf_counter
        total = self.by_method[name] = [0.0, 0]

        def call(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = clock() - start
                self.seconds += elapsed
                self.num_calls += 1
                total[0] += elapsed
                total[1] += 1

        return call

    def take_seconds(self) -> float:
        """The time spent since the last call (and start counting again)."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds


__all__ = ["TIMED_METHODS", "TimedManager"]
