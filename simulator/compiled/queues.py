"""The waiting, running and swapped queues as ring buffers, and the step's
lists: the compiled twins of the Python engine's ``deque`` and ``list``.

Each queue is a row of ``Loop.queues`` with its head and length in
``Loop.queue_ends``; a request is in one queue at most, so a row as long as
the requests never overflows. Each list is a row of ``Loop.lists`` with its
length in ``Loop.list_lens``.
"""

from __future__ import annotations

from numba import njit

from blockspace.simulator.compiled.state import FINISHED_LIST

WAITING_QUEUE, RUNNING_QUEUE, SWAPPED_QUEUE = 0, 1, 2


@njit(cache=True, inline="always")
def size(loop, q):
    return loop.queue_ends[q, 1]


@njit(cache=True, inline="always")
def at(loop, q, i):
    """The ``i``-th request of queue ``q`` from its head."""
    return loop.queues[q, (loop.queue_ends[q, 0] + i) % loop.queues.shape[1]]


@njit(cache=True, inline="always")
def push(loop, q, r):
    """Append at the tail."""
    capacity = loop.queues.shape[1]
    loop.queues[q, (loop.queue_ends[q, 0] + loop.queue_ends[q, 1]) % capacity] = r
    loop.queue_ends[q, 1] += 1


@njit(cache=True, inline="always")
def push_front(loop, q, r):
    capacity = loop.queues.shape[1]
    loop.queue_ends[q, 0] = (loop.queue_ends[q, 0] - 1) % capacity
    loop.queues[q, loop.queue_ends[q, 0]] = r
    loop.queue_ends[q, 1] += 1


@njit(cache=True, inline="always")
def pop_front(loop, q):
    r = loop.queues[q, loop.queue_ends[q, 0]]
    loop.queue_ends[q, 0] = (loop.queue_ends[q, 0] + 1) % loop.queues.shape[1]
    loop.queue_ends[q, 1] -= 1
    return r


@njit(cache=True, inline="always")
def pop_back(loop, q):
    loop.queue_ends[q, 1] -= 1
    return at(loop, q, loop.queue_ends[q, 1])


@njit(cache=True, inline="always")
def keep_unfinished(loop, q, requests, finished):
    """Drop from queue ``q`` the requests whose status is ``finished`` or
    beyond, keeping the order; the dropped ones go to list FINISHED_LIST in
    queue order."""
    kept = 0
    loop.list_lens[FINISHED_LIST] = 0
    for i in range(size(loop, q)):
        r = at(loop, q, i)
        if requests.status[r] >= finished:
            append(loop, FINISHED_LIST, r)
        else:
            loop.queues[q, (loop.queue_ends[q, 0] + kept) % loop.queues.shape[1]] = r
            kept += 1
    loop.queue_ends[q, 1] = kept


# -- the step's lists ---------------------------------------------------------------
@njit(cache=True, inline="always")
def clear(loop, k):
    loop.list_lens[k] = 0


@njit(cache=True, inline="always")
def append(loop, k, r):
    loop.lists[k, loop.list_lens[k]] = r
    loop.list_lens[k] += 1


@njit(cache=True, inline="always")
def item(loop, k, i):
    return loop.lists[k, i]


@njit(cache=True, inline="always")
def length(loop, k):
    return loop.list_lens[k]


@njit(cache=True, inline="always")
def extend(loop, q, k):
    """Queue ``q`` takes list ``k``'s requests at its tail, in order."""
    for i in range(loop.list_lens[k]):
        push(loop, q, loop.lists[k, i])
