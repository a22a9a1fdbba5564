"""One scheduler step in compiled code: the twin of ``scheduler.py``.

It makes vLLM 0.9.2's chunked-prefill decisions in the same order as
``Scheduler.schedule``, call for call on the block manager
(``blocks.py``): running requests first, with preemption by recompute or
swap; then swapped ones, if nobody was preempted; then waiting ones, FCFS.
Every rule is written once per engine: a change here is a change in
``scheduler.py`` too, and ``tests/test_compiled_engine.py`` holds the two
equal, step for step, on random traces and on the listed configurations.
Where the Python policy departs from vLLM (its module docstring says where
and why), this one departs the same way.

Each function reads the step's state from ``Loop`` (queues, lists, budget
in ``meta``) and ``Requests``; the decisions go to the event log, in the
order the Python engine appends them to its ``StepRecord``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from blockspace.fast import content as C
from blockspace.fast import pool as P
from blockspace.fast import rules
from blockspace.fast import table as T
from blockspace.fast.borrowing import borrowing
from blockspace.simulator import budget
from blockspace.simulator.compiled import blocks as B
from blockspace.simulator.compiled import digest as D
from blockspace.simulator.compiled import queues as Q
from blockspace.simulator.compiled import trace_keys as TK
from blockspace.simulator.compiled.state import (
    ABORTED,
    ABORTED_EVENT,
    ADMITTED,
    BLOCK_SIZE,
    BUDGET_CACHED,
    BUDGET_SEQS,
    BUDGET_TOKENS,
    CACHING,
    DECODES,
    FINISHED,
    FIRST_EVENT,
    FREE_TABLE_ROWS,
    FREE_TRACKER_ROWS,
    IGNORED,
    IGNORED_EVENT,
    LATER,
    MAX_SEQS,
    MAX_TOKENS,
    NEED_KEYS,
    NEED_LOG,
    NEED_TABLE_ROWS,
    NEED_TRACKER_ROWS,
    NEW_PREFILLS,
    NUM_ADMISSIONS,
    NUM_COPIES,
    NUM_DONE,
    NUM_EVENTS,
    NUM_SCHEDULED,
    NUM_SWAP_IN,
    NUM_SWAP_OUT,
    PREEMPTED,
    PREEMPTED_LIST,
    PREFILLS,
    RECORD,
    RESERVED_KEYS,
    RUNNING,
    RUNNING_DECODES,
    RUNNING_PREFILLS,
    STEP,
    SWAP_MODE,
    SWAPPED,
    SWAPPED_DECODES,
    SWAPPED_IN,
    SWAPPED_OUT,
    SWAPPED_OUT_LIST,
    SWAPPED_PREFILLS,
    WAITING,
)

NO_STATUS = -1  # _new_tokens' status filter: none (the group's one sequence is always of the status asked)


# -- the decision log ----------------------------------------------------------------
@njit(cache=True, inline="always")
def log(loop, kind, r):
    log_at(loop, loop.meta[STEP], kind, r)


@njit(cache=True, inline="always")
def log_at(loop, step, kind, r):
    n = loop.meta[NUM_EVENTS]
    loop.events[0, n] = step
    loop.events[1, n] = kind
    loop.events[2, n] = r
    loop.meta[NUM_EVENTS] = n + 1


# -- the budget (budget.py) -------------------------------------------------------------
@njit(cache=True, inline="always")
def remaining(loop):
    return loop.config[MAX_TOKENS] - loop.meta[BUDGET_TOKENS]


@njit(cache=True, inline="always")
def can_schedule(loop, num_tokens, num_seqs):
    return (
        loop.meta[BUDGET_TOKENS] + num_tokens <= loop.config[MAX_TOKENS]
        and loop.meta[BUDGET_SEQS] + num_seqs <= loop.config[MAX_SEQS]
    )


@njit(cache=True, inline="always")
def charge(loop, requests, r, num_tokens, num_cached):
    """add_num_batched_tokens and add_num_seqs (one sequence): once per request."""
    if requests.budget_step[r] != loop.meta[STEP]:
        requests.budget_step[r] = loop.meta[STEP]
        loop.meta[BUDGET_TOKENS] += num_tokens
        loop.meta[BUDGET_CACHED] += num_cached
        loop.meta[BUDGET_SEQS] += 1


@njit(cache=True, inline="always")
def refund(loop, requests, r, num_tokens):
    """subtract_num_batched_tokens and subtract_num_seqs, if it was charged."""
    if requests.budget_step[r] == loop.meta[STEP]:
        requests.budget_step[r] = -1
        loop.meta[BUDGET_TOKENS] -= num_tokens
        loop.meta[BUDGET_SEQS] -= 1


# -- token counts (Scheduler._new_tokens, _chunk) ----------------------------------------
usable_tokens = njit(cache=True, inline="always")(budget.usable_tokens)  # the Python engine's rule, compiled


@njit(cache=True, inline="always")
def chunk(loop, num_tokens):
    """``num_tokens`` cut to the budget a chunk may use (scheduler.py: ``_chunk``)."""
    return min(num_tokens, usable_tokens(remaining(loop), loop.config[BLOCK_SIZE], loop.config[CACHING]))


@njit(cache=True, inline="always")
def new_tokens(fast, views, loop, requests, r, chunking):
    """(uncached, cached) new tokens of a group of one sequence."""
    if requests.decoding[r]:
        uncached, cached = 1, 0
    else:
        computed = requests.computed[r]
        num_new = requests.seq_len[r] - computed
        if not loop.config[CACHING]:
            uncached, cached = num_new, 0
        else:
            cached = max(0, B.num_cached_tokens(fast, views, loop, requests, r) - computed)
            uncached = num_new - cached
    if uncached == 0 and cached > 0:
        uncached, cached = 1, cached - 1  # a full hit still computes its last token
    if chunking:
        uncached = chunk(loop, uncached)
    return uncached, cached


# -- one step -----------------------------------------------------------------------------
# A step is decided in three calls, so that the admissions can stop for room
# and go on where they stopped (``loop.run``): ``begin`` (running, then
# swapped requests), ``admit`` (waiting ones; False when it stopped before a
# request it has no room for), ``end`` (the queues, the batch, the metadata pass).
# Each is a borrowing kernel (``fast/borrowing.py``) that the loop calls, as are
# the rarer paths (``schedule_swapped``, ``preempt``): a call that counts no
# reference passes the state's tuples, about a hundred arrays, for less than
# the noise of a replay, and each part compiled apart took the cold compile
# from 73 s to 51 s (inlined into one loop, they made one function too large
# for Numba and LLVM to compile quickly). The step's small parts are inlined
# into them (``inline="always"``): a step of one decode took 3.2 us as calls
# that counted the state's references, 0.6 us inlined.
@borrowing
def begin(fast, views, loop, requests):
    """The step's running and swapped requests (``Scheduler.schedule`` up to
    its admissions)."""
    meta = loop.meta
    meta[BUDGET_TOKENS] = meta[BUDGET_CACHED] = meta[BUDGET_SEQS] = 0
    meta[NUM_COPIES] = meta[NUM_SWAP_IN] = meta[NUM_SWAP_OUT] = 0
    for k in range(loop.list_lens.shape[0]):
        Q.clear(loop, k)
    schedule_running(fast, views, loop, requests)
    if Q.length(loop, PREEMPTED_LIST) == 0 and Q.length(loop, SWAPPED_OUT_LIST) == 0:
        schedule_swapped(fast, views, loop, requests)


@borrowing
def end(fast, views, loop, requests, now):
    """The queues after the step, the batch (PREFILLS with ``loop.chunk``
    and ``loop.uncached``, then DECODES) and its metadata pass."""
    for i in range(Q.length(loop, PREEMPTED_LIST)):  # extendleft: the last preempted ends up first
        Q.push_front(loop, Q.WAITING_QUEUE, Q.item(loop, PREEMPTED_LIST, i))
    Q.extend(loop, Q.RUNNING_QUEUE, SWAPPED_DECODES)
    Q.extend(loop, Q.RUNNING_QUEUE, SWAPPED_PREFILLS)
    Q.extend(loop, Q.RUNNING_QUEUE, RUNNING_DECODES)
    finishing_first(loop, requests)
    Q.extend(loop, Q.RUNNING_QUEUE, NEW_PREFILLS)
    Q.extend(loop, Q.SWAPPED_QUEUE, SWAPPED_OUT_LIST)

    for k in (NEW_PREFILLS, RUNNING_PREFILLS, SWAPPED_PREFILLS):
        for i in range(Q.length(loop, k)):
            Q.append(loop, PREFILLS, Q.item(loop, k, i))
    for k in (RUNNING_DECODES, SWAPPED_DECODES):
        for i in range(Q.length(loop, k)):
            Q.append(loop, DECODES, Q.item(loop, k, i))
    if loop.config[RECORD]:
        record_scheduled(loop)
    touch(fast, views, loop, requests, now)


@njit(cache=True, inline="always")
def finishing_first(loop, requests):
    """The running prefills back to the running queue, those whose chunk
    finishes the prompt this step first: a victim is taken from the queue's
    end (``victim``). Twin: ``finishing_first`` in ``scheduler.py``."""
    for finishing in (True, False):
        for i in range(Q.length(loop, RUNNING_PREFILLS)):
            r = Q.item(loop, RUNNING_PREFILLS, i)
            if (requests.seq_len[r] - requests.computed[r] == loop.chunk[r]) == finishing:
                Q.push(loop, Q.RUNNING_QUEUE, r)


@njit(cache=True, inline="always")
def victim(loop, q, r):
    """Who loses its blocks when ``r`` cannot append: the running queue's
    last, or ``r`` itself when none is left behind it. Twin:
    ``Scheduler._victim`` in ``scheduler.py``."""
    return Q.pop_back(loop, q) if Q.size(loop, q) else r


@njit(cache=True, inline="always")
def record_scheduled(loop):
    n = loop.meta[NUM_SCHEDULED]
    for k in (PREFILLS, DECODES):
        for i in range(Q.length(loop, k)):
            r = Q.item(loop, k, i)
            loop.scheduled[0, n] = loop.meta[STEP]
            loop.scheduled[1, n] = r
            loop.scheduled[2, n] = loop.chunk[r] if k == PREFILLS else 1
            n += 1
    loop.meta[NUM_SCHEDULED] = n


@njit(cache=True, inline="always")
def schedule_running(fast, views, loop, requests):
    q = Q.RUNNING_QUEUE
    while Q.size(loop, q):
        if take_decodes(fast, views, loop, requests) == 0:
            break  # the budget is spent
        if not Q.size(loop, q):
            break
        r = Q.at(loop, q, 0)
        num_tokens, _ = new_tokens(fast, views, loop, requests, r, True)
        if num_tokens == 0:
            break  # the budget is spent
        Q.pop_front(loop, q)
        while not B.can_append(views, loop, requests, r):
            refund(loop, requests, r, num_tokens)
            loser = victim(loop, q, r)
            alone = Q.length(loop, RUNNING_PREFILLS) == 0 and Q.length(loop, RUNNING_DECODES) == 0
            if loser == r and requests.decoding[r] == 0 and alone:
                # alone on the GPU and its prefill still cannot go on: abort (vLLM livelocks)
                finish_all(fast, views, loop, requests, r, ABORTED, True)
                log(loop, ABORTED_EVENT, r)
                break
            outcome = preempt(fast, views, loop, requests, loser)
            if outcome == PREEMPTED:
                Q.append(loop, PREEMPTED_LIST, loser)
            elif outcome == SWAPPED_OUT:
                Q.append(loop, SWAPPED_OUT_LIST, loser)
            if loser == r:
                break
        else:
            append_slots(fast, views, loop, requests, r)
            if requests.decoding[r] == 0:
                Q.append(loop, RUNNING_PREFILLS, r)
                loop.chunk[r] = loop.uncached[r] = num_tokens
            else:
                Q.append(loop, RUNNING_DECODES, r)
            charge(loop, requests, r, num_tokens, 0)


@njit(cache=True, inline="always")
def take_decodes(fast, views, loop, requests):
    """The decoding requests at the running queue's head, taken as
    ``schedule_running`` takes any request while no one is preempted (each
    token counted in, each append done, each on the RUNNING_DECODES list),
    up to the first that is not decoding or whose append does not fit (the
    general path takes that one, and preempts). Returns 0 when the budget
    is spent, else 1.

    Why written apart, on arrays read once, one call for the run: it is the
    common case, ~40 requests a step, and the general path's helpers take
    the state's tuples, whose every pass counts each of their arrays'
    references up and down; done that way a decode costs several times
    more. The rules are the general path's own: ``chunk`` for the budget (a
    decode's token cut to whole blocks), ``rules.blocks_touched`` for
    ``can_append_slots``, ``T.writes_in_place`` for the append, ``charge``."""
    meta, config, table_row, seq_len = loop.meta, loop.config, requests.table_row, requests.seq_len
    decoding, budget_step, lists, lens = requests.decoding, requests.budget_step, loop.lists, loop.list_lens
    num_filled, gpu_meta, refcount, blocks, num_blocks = (
        views.num_filled,
        views.gpu_meta,
        views.refcount,
        views.blocks,
        views.num_blocks,
    )
    queues, ends = loop.queues, loop.queue_ends
    q, capacity = Q.RUNNING_QUEUE, loop.queues.shape[1]
    block_size, caching, first_id = config[BLOCK_SIZE], config[CACHING], gpu_meta[P.FIRST_ID]
    while ends[q, 1]:
        r = queues[q, ends[q, 0]]
        if not decoding[r]:
            return 1
        left = usable_tokens(config[MAX_TOKENS] - meta[BUDGET_TOKENS], block_size, caching)
        if left < 1:
            return 0
        row = table_row[r]
        filled = num_filled[row]
        touched = rules.blocks_touched(filled, max(0, seq_len[r] - filled), 0, block_size)
        if touched > gpu_meta[P.NUM_FREE_IDS] + gpu_meta[P.NUM_IDLE]:
            return 1
        ends[q, 0] = (ends[q, 0] + 1) % capacity  # Q.pop_front
        ends[q, 1] -= 1
        new = seq_len[r] - filled
        if T.writes_in_place(refcount, first_id, blocks, num_blocks, num_filled, row, new, 0, block_size, caching):
            num_filled[row] = seq_len[r]
        else:
            append_slots(fast, views, loop, requests, r)
        lists[RUNNING_DECODES, lens[RUNNING_DECODES]] = r
        lens[RUNNING_DECODES] += 1
        if budget_step[r] != meta[STEP]:  # charge(r, 1, 0)
            budget_step[r] = meta[STEP]
            meta[BUDGET_TOKENS] += 1
            meta[BUDGET_SEQS] += 1
    return 1


@borrowing
def schedule_swapped(fast, views, loop, requests):
    q = Q.SWAPPED_QUEUE
    while Q.size(loop, q):
        r = Q.at(loop, q, 0)
        is_prefill = requests.decoding[r] == 0
        status = B.swap_status(fast, loop, requests, r, True)
        if status == rules.LATER:
            log(loop, LATER, r)
            break
        if status == rules.NEVER:
            Q.pop_front(loop, q)
            finish_all(fast, views, loop, requests, r, IGNORED, True)
            log(loop, IGNORED_EVENT, r)
            continue
        uncached, cached = new_tokens(fast, views, loop, requests, r, False)
        if is_prefill and uncached > loop.config[MAX_TOKENS]:
            uncached = chunk(loop, uncached)  # longer than any step's budget: chunked like a running prefill
        if uncached == 0 or not can_schedule(loop, uncached, 1):
            B.untrack(requests, r)
            break
        count = B.swap(fast, views, loop, requests, r, True, loop.swap_in, 2 * loop.meta[NUM_SWAP_IN])
        if count < 0:  # the estimate said yes, the exact count says no: wait
            log(loop, LATER, r)
            break
        loop.meta[NUM_SWAP_IN] += count
        Q.pop_front(loop, q)
        requests.status[r] = RUNNING
        log(loop, SWAPPED_IN, r)
        append_slots(fast, views, loop, requests, r)
        if is_prefill:
            Q.append(loop, SWAPPED_PREFILLS, r)
            loop.chunk[r], loop.uncached[r] = uncached + cached, uncached
        else:
            Q.append(loop, SWAPPED_DECODES, r)
        charge(loop, requests, r, uncached, cached)


@borrowing
def admit(fast, views, loop, requests, first):
    """The waiting requests, FCFS (``Scheduler._schedule_prefills``). ``first``:
    this is the step's first call (a call that goes on after a stop does not
    look at the budget anew, as the loop it continues did not). Returns
    False, having changed nothing for the request at the head, when that
    request may need room the state lacks (``room_to_admit``)."""
    if first and remaining(loop) == 0:
        return True
    q = Q.WAITING_QUEUE
    while Q.size(loop, q):
        r = Q.at(loop, q, 0)
        if not room_to_admit(fast, views, loop, requests, r):
            return False
        uncached, cached = new_tokens(fast, views, loop, requests, r, True)
        status = B.can_allocate(views, loop, requests, r)
        if status == rules.LATER:
            log(loop, LATER, r)
            B.untrack(requests, r)
            break
        if status == rules.NEVER:
            Q.pop_front(loop, q)
            B.untrack(requests, r)
            finish_all(fast, views, loop, requests, r, IGNORED, False)
            log(loop, IGNORED_EVENT, r)
            continue
        if loop.meta[BUDGET_TOKENS] >= loop.config[MAX_TOKENS] or uncached == 0 or not can_schedule(loop, uncached, 1):
            B.untrack(requests, r)
            break
        Q.pop_front(loop, q)
        B.allocate(fast, views, loop, requests, r)
        requests.status[r] = RUNNING
        log(loop, ADMITTED, r)
        Q.append(loop, NEW_PREFILLS, r)
        loop.chunk[r], loop.uncached[r] = uncached + cached, uncached
        charge(loop, requests, r, uncached, cached)
    return True


@njit(cache=True, inline="always")
def room_to_admit(fast, views, loop, requests, r):
    """Room for what looking at waiting request ``r`` can take: the keys
    of its unkeyed full blocks past its prompt's (``trace_keys.py``; beyond those the step's start reserved for
    the metadata pass) and a tracker row (with caching), a table row, and
    its log entries. If not, how much goes to meta (NEED_*)."""
    meta = loop.meta
    enough = True
    if loop.config[CACHING]:
        row = requests.tracker_row[r]
        known = views.num_keys[row] if row >= 0 else 0
        block_size = loop.config[BLOCK_SIZE]
        need = TK.num_table_keys(requests.prompt_len[r], known, requests.seq_len[r] // block_size, block_size)
        need += meta[RESERVED_KEYS]
        if not C.has_room(fast.keys, need):
            meta[NEED_KEYS] = need
            enough = False
        if row < 0 and meta[FREE_TRACKER_ROWS] == 0:
            meta[NEED_TRACKER_ROWS] = 1
            enough = False
    if meta[FREE_TABLE_ROWS] == 0:
        meta[NEED_TABLE_ROWS] = 1
        enough = False
    # the step's requests done so far are counted at its end (loop.decided), each ignored one
    # an event, and those that finish at most the running ones and the admitted
    num_done = meta[NUM_EVENTS] - meta[FIRST_EVENT] + Q.size(loop, Q.RUNNING_QUEUE) + 2
    if (
        meta[NUM_EVENTS] + 2 > loop.events.shape[1]
        or meta[NUM_ADMISSIONS] + 1 > loop.admissions.shape[1]
        or meta[NUM_DONE] + num_done > loop.done_at.shape[0]
    ):
        meta[NEED_LOG] = num_done
        enough = False
    return enough


# -- block traffic of one group ------------------------------------------------------------
@njit(cache=True, inline="always")
def append_slots(fast, views, loop, requests, r):
    count = B.append(fast, views, loop, requests, r, loop.copies, 2 * loop.meta[NUM_COPIES])
    loop.meta[NUM_COPIES] += count


@borrowing
def preempt(fast, views, loop, requests, r):
    """Take ``r`` off the GPU: SWAPPED_OUT, PREEMPTED (by recompute) or
    ABORTED_EVENT (the Python policy's "swap", "recompute", "abort")."""
    if loop.config[SWAP_MODE] and swap_out(fast, views, loop, requests, r):
        return SWAPPED_OUT
    requests.status[r] = WAITING
    B.free(fast, loop, requests, r)
    requests.computed[r] = 0  # reset_state_for_recompute
    requests.decoding[r] = 0
    log(loop, PREEMPTED, r)
    return PREEMPTED


@njit(cache=True, inline="always")
def swap_out(fast, views, loop, requests, r):
    if B.swap_status(fast, loop, requests, r, False) != rules.OK:
        return False
    count = B.swap(fast, views, loop, requests, r, False, loop.swap_out, 2 * loop.meta[NUM_SWAP_OUT])
    if count < 0:  # the estimate can be too optimistic (spec §14.6)
        return False
    loop.meta[NUM_SWAP_OUT] += count
    requests.status[r] = SWAPPED
    log(loop, SWAPPED_OUT, r)
    return True


@njit(cache=True, inline="always")
def finish_all(fast, views, loop, requests, r, status, has_blocks):
    """End the request with ``status``, freeing its blocks if it has any."""
    if requests.status[r] < FINISHED:
        requests.status[r] = status
        if has_blocks:
            B.free(fast, loop, requests, r)
        else:
            B.forget(loop, requests, r)  # the Python engine's tracker parks it; nothing will ask again


# -- the metadata pass (calls.py) ------------------------------------------------------------
@njit(cache=True, inline="always")
def touch(fast, views, loop, requests, now):
    """Access times and computed blocks of the batch, prefills then decodes
    (``B.touch``; a row with nothing new to key is counted on the arrays,
    read once: ``take_decode`` says why); with RECORD the step's digest of
    tables and block traffic."""
    record, caching, block_size = loop.config[RECORD], loop.config[CACHING], loop.config[BLOCK_SIZE]
    lists, lens = loop.lists, loop.list_lens
    table_row, seq_id, seq_len = requests.table_row, requests.seq_id, requests.seq_len
    tracker_row, tracked, decoding = requests.tracker_row, requests.tracked, requests.decoding
    access_time, accessed, num_keys = requests.access_time, requests.accessed, views.num_keys
    tables_acc = D.start()
    num_tables = 0
    for k in (PREFILLS, DECODES):
        for i in range(lens[k]):
            r = lists[k, i]
            if record:
                row = table_row[r]
                entry = D.add(D.start(), np.uint64(seq_id[r]))
                entry = D.add(entry, D.ints(views.blocks[row], views.num_blocks[row]))
                tables_acc = D.add(tables_acc, D.finish(entry, 2))
                num_tables += 1
            if not caching:
                continue
            row = tracker_row[r]
            if row >= 0 and seq_len[r] // block_size <= num_keys[row]:  # nothing new to key
                access_time[r] = now
                accessed[r] = 1
                frozen = tracked[r] == 1 and decoding[r] == 0
                tracked[r] = 1
                B.count_known(views, row, frozen, block_size)
            else:
                B.touch(fast, views, loop, requests, r, now)
    if Q.length(loop, PREFILLS) or Q.length(loop, DECODES):
        B.mark_computed(fast, views, loop)
    if record:
        acc = D.add(D.start(), D.finish(tables_acc, num_tables))
        acc = D.add(acc, D.pairs(loop.copies, loop.meta[NUM_COPIES]))
        acc = D.add(acc, D.pairs(loop.swap_in, loop.meta[NUM_SWAP_IN]))
        acc = D.add(acc, D.pairs(loop.swap_out, loop.meta[NUM_SWAP_OUT]))
        loop.digests[loop.meta[STEP]] = D.finish(acc, 4)
