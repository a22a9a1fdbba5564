"""The compiled replay loop: arrivals, a scheduler step (``policy.py``), the
model's side of the step, the clock and the figures; the twin of
``Simulation._replay`` and ``_run_model`` (``simulation.py``).

``run`` goes on step after step without returning to Python, and returns
only at the end, when a stretch of ``PROGRESS_EVERY`` steps is done (for a
progress bar), or at the start of a step that could run out of room: then
``meta`` says how much room (keys, table or tracker rows, log entries) and
the driver (``engine.py``) makes it and calls again. Returning there is
safe: nothing of the step has happened yet, and the next call starts it
afresh.

A replica of a fleet (``fleet.py``) also returns at the first step that
starts at or after ``Loop.until`` (PAUSED), and whenever all it was routed
is done (DONE) or stuck (STALLED): it goes on from there at the next call,
with the requests routed meanwhile (``Loop.arrivals``), as
``Simulation.advance`` does.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from blockspace.fast import content as C
from blockspace.fast.borrowing import borrowing, counting
from blockspace.simulator import clock
from blockspace.simulator.compiled import blocks as B
from blockspace.simulator.compiled import policy
from blockspace.simulator.compiled import queues as Q
from blockspace.simulator.compiled import trace_keys as TK
from blockspace.simulator.compiled.state import (
    ABORTED_EVENT,
    ADMITTING,
    BLOCK_SIZE,
    CLOCK,
    DECODES,
    DONE,
    DONE_BLOCKS,
    DONE_ORDER,
    ERROR,
    ERROR_STOP,
    FINISHED,
    FINISHED_EVENT,
    FINISHED_LIST,
    FINISHING,
    FIRST_EVENT,
    FREE_TRACKER_ROWS,
    IGNORED_EVENT,
    IS_STALLED,
    MAX_SEQS,
    MAX_TOKENS,
    NEED_KEYS,
    NEED_LOG,
    NEED_TRACKER_ROWS,
    NEW_PREFILLS,
    NUM_ADMISSIONS,
    NUM_COPIES,
    NUM_DONE,
    NUM_EVENTS,
    NUM_GAPS,
    NUM_GPU,
    NUM_PENDING,
    NUM_ROUTED,
    NUM_SCHEDULED,
    NUM_SWAP_IN,
    NUM_SWAP_OUT,
    NUM_TIMELINE,
    PAUSED,
    PREEMPTED,
    PREFILLS,
    PROGRESS,
    PROGRESS_EVERY,
    RECORD,
    RESERVED_KEYS,
    ROOM,
    STALLED,
    STEP,
    STEPS_SINCE_CALL,
    SWAPPED_IN,
    SWAPPED_OUT,
    count_slot,
    timeline_row,
)

# the slots of the counts this loop keeps (metrics.Counts declares them; Metrics.decided counts them in Python)
RECOMPUTE_PREEMPTIONS = count_slot("recompute_preemptions")
SWAP_OUTS = count_slot("swap_outs")
SWAP_INS = count_slot("swap_ins")
BLOCKS_SWAPPED_OUT = count_slot("blocks_swapped_out")
BLOCKS_SWAPPED_IN = count_slot("blocks_swapped_in")
COPY_ON_WRITES = count_slot("copy_on_writes")
PREFILL_TOKENS_ADMITTED = count_slot("prefill_tokens_admitted")
CACHED_TOKENS_ADMITTED = count_slot("cached_tokens_admitted")
# the rows of the timeline it writes (metrics.Timeline's columns; Metrics.stepped writes them in Python)
TIME_S, STEP_S, KV_USED, RUNNING, WAITING, SWAPPED_ROW, HIT_RATE, TOKENS, ADMITTED_TOKENS = (
    timeline_row(name)
    for name in ("time_s", "step_s", "kv_used_blocks", "num_running", "num_waiting", "num_swapped", "hit_rate",
                 "num_batched_tokens", "prefill_tokens_admitted")
)  # fmt: skip


@njit(cache=True, nogil=True)  # nogil: the replicas of a fleet replayed apart run in threads (fleet.py)
def run(fast, loop, requests):
    """Replay until the end or a stop (see the module doc); returns why it stopped."""
    return replay(fast, B.views_of(fast), loop, requests)


@borrowing(nogil=True)
def replay(fast, views, loop, requests):
    """``run``'s work, borrowing the state its caller holds (``fast/borrowing.py``):
    it and the step's parts it calls (``policy.begin``, ``admit``, ``end``,
    ``run_model``) take the state's tuples, about a hundred arrays, whose
    references would be counted at each call and in each inlined helper."""
    meta, clock, arrivals, arrival = loop.meta, loop.clock, loop.arrivals, requests.arrival
    meta[STEPS_SINCE_CALL] = 0
    while True:
        first = meta[ADMITTING] == 0
        if first:
            pending, routed = meta[NUM_PENDING], meta[NUM_ROUTED]
            if meta[IS_STALLED]:  # nothing queued could run: wait for the next arrival
                if pending == routed:
                    return STALLED
                clock[0] = arrival[arrivals[pending]]
                meta[IS_STALLED] = 0
            while pending < routed and arrival[arrivals[pending]] <= clock[0]:
                Q.push(loop, Q.WAITING_QUEUE, arrivals[pending])
                pending += 1
            meta[NUM_PENDING] = pending
            unfinished = Q.size(loop, 0) + Q.size(loop, 1) + Q.size(loop, 2)
            if not unfinished:
                if pending == routed:
                    return DONE
                clock[0] = arrival[arrivals[pending]]  # idle GPU: jump to the next arrival
                continue
            if clock[0] >= loop.until[0]:
                return PAUSED
            if not room_for_step(fast, views, loop, requests):
                return ROOM
            if meta[STEPS_SINCE_CALL] >= loop.config[PROGRESS_EVERY]:
                return PROGRESS
            meta[STEPS_SINCE_CALL] += 1
            meta[FIRST_EVENT] = meta[NUM_EVENTS]
            loop.step_times[meta[STEP]] = clock[0]
            policy.begin(fast, views, loop, requests)
        meta[ADMITTING] = 1
        if not policy.admit(fast, views, loop, requests, first):
            return ROOM  # the admissions go on from there once the driver has made room
        meta[ADMITTING] = 0
        policy.end(fast, views, loop, requests, clock[0])
        if meta[ERROR]:
            return ERROR_STOP
        queues_changed = decided(loop, requests, meta[FIRST_EVENT])
        meta[STEP] += 1
        pending = meta[NUM_PENDING]
        if Q.length(loop, PREFILLS) == 0 and Q.length(loop, DECODES) == 0:
            if queues_changed:
                continue  # the queues changed: schedule again
            if pending < meta[NUM_ROUTED]:
                clock[0] = arrival[arrivals[pending]]
                continue
            meta[IS_STALLED] = 1
            return STALLED
        run_model(fast, views, loop, requests)


@njit(cache=True, inline="always")  # as the step's parts are (policy.py says why)
def decided(loop, requests, first_event):
    """``Metrics.decided`` from the step's events and lists; True when a
    request was ignored, aborted, preempted or swapped out."""
    meta = loop.meta
    changed = False
    for e in range(first_event, meta[NUM_EVENTS]):
        kind, r = loop.events[1, e], loop.events[2, e]
        if kind == PREEMPTED:
            meta[RECOMPUTE_PREEMPTIONS] += 1
            requests.preemptions[r] += 1
            changed = True
        elif kind == SWAPPED_OUT:
            meta[SWAP_OUTS] += 1
            requests.swap_outs[r] += 1
            changed = True
        elif kind == SWAPPED_IN:
            meta[SWAP_INS] += 1
        elif kind == IGNORED_EVENT or kind == ABORTED_EVENT:
            done(loop, requests, r, loop.clock[0])
            changed = True
    meta[BLOCKS_SWAPPED_OUT] += meta[NUM_SWAP_OUT]
    meta[BLOCKS_SWAPPED_IN] += meta[NUM_SWAP_IN]
    meta[COPY_ON_WRITES] += meta[NUM_COPIES]
    for i in range(Q.length(loop, NEW_PREFILLS)):
        r = Q.item(loop, NEW_PREFILLS, i)
        cached = loop.chunk[r] - loop.uncached[r]
        meta[PREFILL_TOKENS_ADMITTED] += requests.seq_len[r]
        meta[CACHED_TOKENS_ADMITTED] += cached
        n = meta[NUM_ADMISSIONS]
        loop.admissions[0, n] = r
        loop.admissions[1, n] = loop.clock[0]
        meta[NUM_ADMISSIONS] = n + 1
        requests.cached_tokens[r] += cached
    return changed


@njit(cache=True, inline="always")
def done(loop, requests, r, at):
    """The request is done (finished, ignored or aborted) at ``at``: what a
    fleet's router and closed loop read (``Simulation._done``)."""
    meta = loop.meta
    loop.done_at[meta[NUM_DONE]] = at
    meta[NUM_DONE] += 1
    meta[DONE_BLOCKS] += -(-requests.prompt_len[r] // loop.config[BLOCK_SIZE])


step_seconds = counting(clock.step_seconds)  # the one rule of both engines, compiled
chunk_attention = njit(cache=True, inline="always")(clock.chunk_attention)


@njit(cache=True, inline="always")
def gap(gaps, meta, last_token, r, now):
    """A token at ``now``: the gap since the request's previous one."""
    if not np.isnan(last_token[r]):
        gaps[meta[NUM_GAPS]] = now - last_token[r]
        meta[NUM_GAPS] += 1
    last_token[r] = now


@njit(cache=True, inline="always")
def sample(seq_len, num_output, out_len, r):
    """The request takes its next token; True when it has all it wanted."""
    seq_len[r] += 1
    num_output[r] += 1
    return num_output[r] >= out_len[r]


@borrowing
def run_model(fast, views, loop, requests):
    """Advance the clock by the batch's cost, then compute and sample
    (decodes first, then prefills, as ``_run_model``); free what finished.
    The per-request arrays are read once (``policy.take_decode`` says why)."""
    meta, clock, lists, lens, gaps = loop.meta, loop.clock, loop.lists, loop.list_lens, loop.gaps
    seq_len, num_output, out_len, computed = requests.seq_len, requests.num_output, requests.out_len, requests.computed
    last_token, first_token, decoding = requests.last_token, requests.first_token, requests.decoding
    num_prefill_tokens = prefill_context = prefill_pairs = 0
    for i in range(lens[PREFILLS]):  # as Simulation._run_model counts them
        r = lists[PREFILLS, i]
        new = loop.uncached[r]
        start = computed[r] + loop.chunk[r] - new
        num_prefill_tokens += new
        prefill_context += start
        prefill_pairs += chunk_attention(start, new)
    num_decodes = lens[DECODES]
    num_context = 0
    finished, done_order = lists[FINISHING], lists[DONE_ORDER]  # scratch rows: the replay allocates nothing
    num_finished_decodes = 0
    for i in range(num_decodes):  # decodes that finish go after the prefills that do: kept apart
        r = lists[DECODES, i]
        num_context += seq_len[r]
        computed[r] += 1
        if sample(seq_len, num_output, out_len, r):
            finished[num_finished_decodes] = r
            num_finished_decodes += 1
    step_s = step_seconds(
        loop.config[CLOCK], loop.step_model, num_prefill_tokens, num_decodes, lens[PREFILLS], num_context,
        prefill_context, prefill_pairs, meta[NUM_SWAP_IN] + meta[NUM_SWAP_OUT],
    )  # fmt: skip
    clock[0] += step_s
    now = clock[0]
    for i in range(num_decodes):
        gap(gaps, meta, last_token, lists[DECODES, i], now)
    num_done = 0
    for i in range(lens[PREFILLS]):
        r = lists[PREFILLS, i]
        computed[r] += loop.chunk[r]
        if computed[r] == seq_len[r]:
            decoding[r] = 1
        if not decoding[r]:
            continue  # a prefill chunk that does not end the prompt samples nothing
        if np.isnan(first_token[r]):
            first_token[r] = now
        gap(gaps, meta, last_token, r, now)
        if sample(seq_len, num_output, out_len, r):
            done_order[num_done] = r
            num_done += 1
    for i in range(num_finished_decodes):
        done_order[num_done] = finished[i]
        num_done += 1
    for i in range(num_done):
        requests.status[done_order[i]] = FINISHED
    for i in range(num_done):
        B.free(fast, loop, requests, done_order[i])
    if num_done:
        Q.keep_unfinished(loop, Q.RUNNING_QUEUE, requests, FINISHED)
        for i in range(Q.length(loop, FINISHED_LIST)):
            r = Q.item(loop, FINISHED_LIST, i)
            requests.finish[r] = now
            policy.log_at(loop, meta[STEP] - 1, FINISHED_EVENT, r)
            done(loop, requests, r, now)
    t = meta[NUM_TIMELINE]
    timeline = loop.timeline
    timeline[TIME_S, t] = now
    timeline[STEP_S, t] = step_s
    timeline[KV_USED, t] = loop.config[NUM_GPU] - B.num_free_gpu(views)
    timeline[RUNNING, t] = Q.size(loop, Q.RUNNING_QUEUE)
    timeline[WAITING, t] = Q.size(loop, Q.WAITING_QUEUE)
    timeline[SWAPPED_ROW, t] = Q.size(loop, Q.SWAPPED_QUEUE)
    timeline[HIT_RATE, t] = B.hit_rate(fast, loop)
    timeline[TOKENS, t] = num_prefill_tokens + num_decodes
    timeline[ADMITTED_TOKENS, t] = meta[PREFILL_TOKENS_ADMITTED]
    meta[NUM_TIMELINE] = t + 1


# -- room for the next step ---------------------------------------------------------------
@njit(cache=True, inline="always")
def room_for_step(fast, views, loop, requests):
    """Is there room for what the step can do before its admissions (which
    ask for theirs one request at a time, ``policy.room_to_admit``)? If
    not, say how much in meta (NEED_*) for the driver. The bounds are loose
    on purpose: the running and swapped requests key at most their unkeyed
    full blocks past their prompts' (``trace_keys.py``), and fill at most a block per budget block and two each.
    (fast's arrays are the views ``run`` read off the handles: a borrowing
    kernel reads no handle.)"""
    meta, config = loop.meta, loop.config
    block_size = config[BLOCK_SIZE]
    num_keys, num_filled = views.num_keys, views.num_filled
    tracker_row, table_row, seq_len = requests.tracker_row, requests.table_row, requests.seq_len
    keys = config[MAX_TOKENS] // block_size + 2
    tracker_rows = 0
    looked_at = 0
    for q in (Q.RUNNING_QUEUE, Q.SWAPPED_QUEUE):
        for i in range(Q.size(loop, q)):
            r = Q.at(loop, q, i)
            known = num_keys[tracker_row[r]] if tracker_row[r] >= 0 else 0
            keys += TK.num_table_keys(requests.prompt_len[r], known, seq_len[r] // block_size, block_size)
            keys += 2 + (seq_len[r] - num_filled[table_row[r]]) // block_size
            tracker_rows += tracker_row[r] < 0
            looked_at += 1
    meta[RESERVED_KEYS] = keys  # the admissions leave these free (policy.room_to_admit)
    # and rows for the admissions, at most one per waiting request: a row is as wide as the longest
    # request (64 KB at 128k tokens), so a replica with a short queue keeps few
    tracker_rows += min(config[MAX_SEQS], Q.size(loop, Q.WAITING_QUEUE)) + 2
    enough = True
    if not C.has_room(fast.keys, keys):
        meta[NEED_KEYS] = keys
        enough = False
    if meta[FREE_TRACKER_ROWS] < tracker_rows:
        meta[NEED_TRACKER_ROWS] = tracker_rows
        enough = False
    entries = 4 * looked_at + config[MAX_SEQS] + 16
    if (
        meta[NUM_EVENTS] + entries > loop.events.shape[1]
        or meta[NUM_ADMISSIONS] + entries > loop.admissions.shape[1]
        or meta[NUM_GAPS] + entries > loop.gaps.shape[0]
        or meta[NUM_DONE] + entries > loop.done_at.shape[0]
        or meta[NUM_TIMELINE] + 1 >= loop.timeline.shape[1]
        or meta[STEP] + 1 >= loop.step_times.shape[0]
        or (config[RECORD] and meta[NUM_SCHEDULED] + entries > loop.scheduled.shape[1])
    ):
        meta[NEED_LOG] = entries
        enough = False
    return enough
