"""The compiled engine's state: plain arrays in NamedTuples, made here from
the trace and the configuration.

Why arrays: the compiled step (``policy.py``, ``loop.py``) is Numba code,
which reads NamedTuples of arrays at C speed and holds no Python object.
A request of the Python engine (``request.py``) is a ``SequenceGroup``; here
it is an index ``r`` into ``Requests``, in arrival order (sample ``i`` of
trace request ``k`` is ``r = k * n + i``, the sequence id vLLM's engine
would give it). Its tokens are never stored: a prompt token is a function
of its chunk id and offset, a generated one of (request, sample, position)
(``blockspace/workloads.py``), so the kernels that key blocks make them
when they need them (``tokens.py``).

Every count the loop keeps between calls lives in ``Loop.meta`` under a
name below, so that the loop can stop at a step's start (for room, for
progress) and go on from there when called again.
"""

from __future__ import annotations

from dataclasses import fields
from typing import NamedTuple

import numpy as np

from blockspace.simulator.metrics import Counts, Timeline
from blockspace.workloads import TraceRequest

# request status (``Requests.status``): vLLM's SequenceStatus, as small ints
WAITING, RUNNING, SWAPPED, FINISHED, IGNORED, ABORTED = range(6)

# Loop.config: the run's settings
BLOCK_SIZE, CACHING, MAX_SEQS, MAX_TOKENS, SWAP_MODE, NUM_GPU, NUM_CPU, WATERMARK, RECORD, PROGRESS_EVERY = range(10)
CLOCK = 10  # the clock's kind (clock.LINEAR, clock.ROOFLINE); Loop.step_model holds its coefficients
NUM_CONFIG = 11

# Loop.meta: what the loop keeps between calls
(
    STEP,  # schedule() calls so far (StepRecord.step)
    NUM_PENDING,  # requests arrived so far (the next to arrive)
    NUM_DONE,  # requests finished, ignored or aborted
    NUM_TIMELINE,  # timeline entries (steps that ran a batch)
    NUM_GAPS,  # inter-token gaps
    NUM_EVENTS,  # decision events
    NUM_SCHEDULED,  # scheduled entries (recorded runs)
    NUM_ADMISSIONS,
    FREE_TABLE_ROWS,  # table rows on the free stack
    FREE_TRACKER_ROWS,
    NEED_KEYS,  # at a ROOM stop: keys the next step may make
    NEED_TABLE_ROWS,
    NEED_TRACKER_ROWS,
    NEED_LOG,  # at a ROOM stop: entries a log needs
    ERROR,  # a kernel's unexpected code (never 0 when the loop says ERROR)
    STEPS_SINCE_CALL,
    ADMITTING,  # 1 while a step's admissions stopped for room and go on at the next call
    FIRST_EVENT,  # the step's first event
    RESERVED_KEYS,  # keys the step's start kept for its metadata pass
    # the step's budget (vLLM's SchedulingBudget)
    BUDGET_TOKENS,
    BUDGET_CACHED,
    BUDGET_SEQS,
    # the step's block traffic, in pairs
    NUM_COPIES,
    NUM_SWAP_IN,
    NUM_SWAP_OUT,
    # a replica of a fleet (fleet.py): requests routed here arrive one by one
    NUM_ROUTED,  # requests routed so far (Loop.arrivals[:NUM_ROUTED])
    DONE_BLOCKS,  # prompt blocks of the requests done (a router's load)
    IS_STALLED,  # 1 after a STALLED stop, until a request arrives
) = range(28)

# then the run's counts: a slot for each field of ``metrics.Counts``, in its order. Why
# derived: a count is declared once, there; the compiled loop names its slot by the field's
# name (``count_slot``), and the driver reads them back in order (``engine.py``).
COUNTS = tuple(field.name for field in fields(Counts))
FIRST_COUNT = IS_STALLED + 1
NUM_META = FIRST_COUNT + len(COUNTS)

# Loop.timeline: a row for each column of ``metrics.Timeline`` but the manager's time (the
# compiled step does not time its manager calls apart), in its order
TIMELINE_ROWS = tuple(field.name for field in fields(Timeline) if field.name != "manager_s")


def count_slot(name: str) -> int:
    """The slot of ``Loop.meta`` that holds the count ``name`` of ``metrics.Counts``."""
    return FIRST_COUNT + COUNTS.index(name)


def timeline_row(name: str) -> int:
    """The row of ``Loop.timeline`` that holds the column ``name`` of ``metrics.Timeline``."""
    return TIMELINE_ROWS.index(name)


# why the loop returned (PAUSED: at a step that starts at or after Loop.until)
DONE, ROOM, PROGRESS, STALLED, ERROR_STOP, PAUSED = range(6)

# decision events (StepRecord's lists, in the order they were made)
ADMITTED, LATER, IGNORED_EVENT, PREEMPTED, SWAPPED_OUT, SWAPPED_IN, ABORTED_EVENT, FINISHED_EVENT = range(8)
EVENT_FIELDS = ("admitted", "later", "ignored", "preempted", "swapped_out", "swapped_in", "aborted", "finished")

# the step's lists (Step.lists rows)
RUNNING_PREFILLS, RUNNING_DECODES, PREEMPTED_LIST, SWAPPED_OUT_LIST, SWAPPED_PREFILLS, SWAPPED_DECODES = range(6)
NEW_PREFILLS, FINISHED_LIST, PREFILLS, DECODES = range(6, 10)
FINISHING, DONE_ORDER = 10, 11  # the model's side of the step: decodes that finished, then all that did, in order
NUM_LISTS = 12


class Requests(NamedTuple):
    """One entry per request (sample), in arrival order."""

    trace_index: np.ndarray  # int64: its trace request
    sample: np.ndarray  # int64
    seq_id: np.ndarray  # int64: trace index * n + sample, as vLLM's engine numbers them
    prompt_len: np.ndarray  # int64
    out_len: np.ndarray  # int64: output length, capped by max_output_len
    arrival: np.ndarray  # float64: seconds
    chunk_lo: np.ndarray  # int64: its first chunk id in Loop.chunks
    seq_len: np.ndarray  # int64: tokens (prompt and generated)
    computed: np.ndarray  # int64: tokens computed
    num_output: np.ndarray  # int64: tokens generated
    decoding: np.ndarray  # int64 (bool): every token computed once (SequenceData._is_decoding)
    status: np.ndarray  # int64: WAITING ... ABORTED
    table_row: np.ndarray  # int64: its row of fast's tables, -1 none
    tracker_row: np.ndarray  # int64: its row of fast's tracker, -1 none
    tracked: np.ndarray  # int64 (bool): the tracker holds it (a row kept while untracked is parked)
    accessed: np.ndarray  # int64 (bool): access_all_blocks_in_seq since its allocation
    access_time: np.ndarray  # float64: the last such time
    budget_step: np.ndarray  # int64: the step its tokens were counted in (each request counts once)
    first_token: np.ndarray  # float64, NaN: none yet
    last_token: np.ndarray  # float64, NaN: none yet
    finish: np.ndarray  # float64, NaN: not finished
    cached_tokens: np.ndarray  # int64: found in the prefix cache at its admissions
    preemptions: np.ndarray  # int64: recompute preemptions
    swap_outs: np.ndarray  # int64


class Loop(NamedTuple):
    """The queues, the step's lists, the logs and the counters."""

    config: np.ndarray  # int64[NUM_CONFIG]
    step_model: np.ndarray  # float64: the clock's coefficients (clock.step_seconds)
    meta: np.ndarray  # int64[NUM_META]
    clock: np.ndarray  # float64[1]: simulated seconds
    until: np.ndarray  # float64[1]: no step starts at or after this (inf: none; a fleet's replica stops there)
    arrivals: np.ndarray  # int64: the requests routed here, in the order they arrive (one replay: all, in order)
    chunks: np.ndarray  # int64: every trace request's chunk ids, one after another
    nodes: np.ndarray  # int64: each chunk id's node in the trace's tree of prompts (trace_keys.py); empty, no caching
    node_key: np.ndarray  # int32: a node's first key on this replica, -1 none yet (Run numbers them)
    queues: np.ndarray  # int64[3, capacity]: waiting, running, swapped as ring buffers
    queue_ends: np.ndarray  # int64[3, 2]: head and length of each
    lists: np.ndarray  # int64[NUM_LISTS, capacity]: the step's lists of requests
    list_lens: np.ndarray  # int64[NUM_LISTS]
    chunk: np.ndarray  # int64[capacity]: token_chunk_size of a prefill, by request
    uncached: np.ndarray  # int64[capacity]: its uncached tokens, by request
    free_table_rows: np.ndarray  # int64: the free stack of fast's table rows
    free_tracker_rows: np.ndarray  # int64
    tokens: np.ndarray  # int64: scratch for the token ids a kernel keys
    keyed: np.ndarray  # int64: scratch for a sequence's keys
    copies: np.ndarray  # int64: the step's copy-on-write pairs, flat
    swap_in: np.ndarray  # int64: the step's swap-in mapping, flat
    swap_out: np.ndarray  # int64
    one_row: np.ndarray  # int64[1]: a group's rows (one sequence)
    one_len: np.ndarray  # int64[1]
    info: np.ndarray  # int64[1]: the allocate kernel's need
    # logs, grown by the driver between calls
    timeline: np.ndarray  # float64[len(TIMELINE_ROWS), steps]: metrics.Timeline's columns, less manager_s
    gaps: np.ndarray  # float64: inter-token latencies, in order
    done_at: np.ndarray  # float64: when each request was done (finished, ignored or aborted), in order
    events: np.ndarray  # int64[3, n]: step, kind, request
    scheduled: np.ndarray  # int64[3, n]: step, request, token_chunk_size (recorded runs)
    admissions: np.ndarray  # float64[2, n]: request, time
    step_times: np.ndarray  # float64[steps]: StepRecord.time_s of each schedule() call
    digests: np.ndarray  # uint64[steps]: StepRecord.digest, unsigned (recorded runs)


def new_requests(
    trace: list[TraceRequest], num_samples: int, max_output_len: int | None
) -> tuple[Requests, np.ndarray]:
    """The trace as requests, and every chunk id in one array."""
    lengths = np.array([len(entry.hash_ids) for entry in trace], np.int64)
    starts = np.zeros(len(trace) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    chunks = np.fromiter((c for entry in trace for c in entry.hash_ids), np.int64, int(starts[-1]))
    out_len = np.array([entry.output_length for entry in trace], np.int64)
    if max_output_len is not None:
        out_len = np.minimum(out_len, max_output_len)
    prompt_len = np.array([entry.input_length for entry in trace], np.int64)

    def each(values: np.ndarray) -> np.ndarray:
        return np.repeat(values, num_samples)

    requests = blank_requests(len(trace) * num_samples)._replace(
        trace_index=each(np.array([entry.index for entry in trace], np.int64)),
        sample=np.tile(np.arange(num_samples, dtype=np.int64), len(trace)),
        seq_id=np.array([entry.index * num_samples + i for entry in trace for i in range(num_samples)], np.int64),
        prompt_len=each(prompt_len),
        out_len=each(out_len),
        arrival=each(np.array([entry.arrival_s for entry in trace], np.float64)),
        chunk_lo=each(starts[:-1]),
        seq_len=each(prompt_len),
    )
    return requests, chunks


# what an entry of ``Requests`` holds before its request comes (the trace's fields: 0)
BLANK = {"status": WAITING, "table_row": -1, "tracker_row": -1, "budget_step": -1, "access_time": 0.0,
         "first_token": np.nan, "last_token": np.nan, "finish": np.nan, "arrival": 0.0}  # fmt: skip
FLOATS = frozenset({"arrival", "access_time", "first_token", "last_token", "finish"})


def blank_requests(count: int) -> Requests:
    """``count`` entries, none a request yet (``BLANK``; zeros made as
    zeros, a fifth of the time of a fill: a fleet replayed apart makes
    these for each replica)."""

    def blank(name: str) -> np.ndarray:
        dtype = np.float64 if name in FLOATS else np.int64
        return np.full(count, BLANK[name], dtype) if BLANK.get(name, 0) else np.zeros(count, dtype)

    return Requests(*(blank(name) for name in Requests._fields))


def new_loop(
    config: np.ndarray, step_model: np.ndarray, chunks: np.ndarray, nodes: np.ndarray, requests: Requests,
    max_tokens: int,
) -> Loop:  # fmt: skip
    """Queues and step lists for every request; the scratch buffers sized
    for the longest sequence (and, swapping, the pools); the logs sized for
    ``requests`` (``first_log_sizes``: the driver grows them past that, and
    a fleet's replica the rest: ``with_room``)."""
    count = len(requests.arrival)
    steps, tokens, per_request = first_log_sizes(config, requests)
    block_size, max_seqs = int(config[BLOCK_SIZE]), int(config[MAX_SEQS])
    swaps = 2 * (int(config[NUM_GPU]) + int(config[NUM_CPU])) + 2 if config[SWAP_MODE] else 2  # else none
    copies = 2 * (int(config[MAX_TOKENS]) // block_size + 2 * max_seqs + 16)
    meta = np.zeros(NUM_META, np.int64)
    meta[NUM_ROUTED] = count  # every request, in arrival order (a fleet's replica routes its own: engine.py)
    return Loop(
        config=config,
        step_model=step_model,
        meta=meta,
        clock=np.zeros(1),
        until=np.full(1, np.inf),
        arrivals=np.arange(count, dtype=np.int64),
        chunks=chunks,
        nodes=nodes,
        node_key=np.zeros(0, np.int32),
        queues=np.zeros((3, count + 1), np.int64),
        queue_ends=np.zeros((3, 2), np.int64),
        lists=np.zeros((NUM_LISTS, count + 1), np.int64),
        list_lens=np.zeros(NUM_LISTS, np.int64),
        chunk=np.zeros(count + 1, np.int64),
        uncached=np.zeros(count + 1, np.int64),
        free_table_rows=np.zeros(0, np.int64),
        free_tracker_rows=np.zeros(0, np.int64),
        tokens=np.zeros(max_tokens + block_size, np.int64),
        keyed=np.zeros(max_tokens // block_size + 1, np.int64),
        copies=np.zeros(copies, np.int64),
        swap_in=np.zeros(swaps, np.int64),
        swap_out=np.zeros(swaps, np.int64),
        one_row=np.zeros(1, np.int64),
        one_len=np.zeros(1, np.int64),
        info=np.zeros(1, np.int64),
        timeline=np.zeros((len(TIMELINE_ROWS), steps)),
        gaps=np.zeros(tokens),
        done_at=np.zeros(per_request),
        events=np.zeros((3, per_request), np.int64),
        scheduled=np.zeros((3, LOG_SIZE if config[RECORD] else 0), np.int64),
        admissions=np.zeros((2, per_request)),
        step_times=np.zeros(steps),
        digests=np.zeros(steps, np.uint64),
    )


LOG_SIZE = 64  # a log's least first size: the driver doubles it as the loop asks (engine.py)
LOG_CAP = 1 << 16  # a log's largest first size


def first_log_sizes(config: np.ndarray, requests: Requests) -> tuple[int, int, int]:
    """The logs' first sizes: by step, by output token (the gaps) and by
    request (events, admissions, completions), for the requests known at
    the start (a replay's whole trace or share; none for a fleet's replica
    on one clock, whose logs start at ``LOG_SIZE``).

    Why: each doubling is a stop of the loop, a call back into it and a
    copy of every log. Started at 64 entries, a fleet of 256 replicas
    replayed apart (8 requests each) stopped four times a replica for its
    logs alone (docs/measurements/2026-12-06-replica-memory.md). The
    estimates are of what the requests can use without preemption: a step
    per output token and per prefill chunk, a gap per output token, four
    events a request; each leaves the room the loop asks beyond what is
    used (``loop.room_for_step``: four entries a request looked at, a batch
    of ``MAX_SEQS``). Capped at ``LOG_CAP``: a long replay's logs still
    double as they fill, a few doublings against its many steps, and its
    address space holds what it uses rather than a bound."""
    count = len(requests.arrival)
    if not count:
        return LOG_SIZE, LOG_SIZE, LOG_SIZE
    margin = 4 * count + int(config[MAX_SEQS]) + 16
    outputs = int(requests.out_len.sum())
    chunks = int((requests.prompt_len // max(int(config[MAX_TOKENS]), 1) + 1).sum())

    def size(entries: int) -> int:
        return min(max(LOG_SIZE, entries + margin), LOG_CAP)

    return size(outputs + chunks), size(outputs), size(4 * count)


def with_room(loop: Loop, requests: Requests, count: int, max_tokens: int) -> tuple[Loop, Requests]:
    """The same state, with room for ``count`` requests and a sequence of
    ``max_tokens`` tokens: what a fleet's replica grows to as requests are
    routed to it (``replica.py``), between calls of the loop. Each array
    that grows at least doubles; a queue's ring is laid out again from its head."""
    capacity = len(requests.arrival)
    if count > capacity:
        capacity = max(count, 2 * capacity)
        grown = blank_requests(capacity)
        for old, new in zip(requests, grown):
            new[: len(old)] = old
        requests = grown

        def longer(values: np.ndarray, size: int) -> np.ndarray:
            bigger = np.zeros((*values.shape[:-1], size), values.dtype)
            bigger[..., : values.shape[-1]] = values
            return bigger

        queues = np.zeros((3, capacity + 1), np.int64)
        for q, (head, size) in enumerate(loop.queue_ends.tolist()):
            queues[q, :size] = loop.queues[q, (head + np.arange(size)) % loop.queues.shape[1]]
        loop.queue_ends[:, 0] = 0
        loop = loop._replace(
            arrivals=longer(loop.arrivals, capacity), queues=queues, lists=longer(loop.lists, capacity + 1),
            chunk=longer(loop.chunk, capacity + 1), uncached=longer(loop.uncached, capacity + 1),
        )  # fmt: skip
    block_size = int(loop.config[BLOCK_SIZE])
    if max_tokens + block_size > len(loop.tokens):
        size = max(max_tokens + block_size, 2 * len(loop.tokens))
        loop = loop._replace(tokens=np.zeros(size, np.int64), keyed=np.zeros(size // block_size + 1, np.int64))
    return loop, requests


def array_bytes(*states: tuple[object, ...]) -> int:
    """The bytes of the numpy arrays in ``states`` (NamedTuples of arrays,
    as fast's store and this engine keep them): what a replica holds
    (``replica.held_bytes``; ``memory.py`` sizes a fleet by it)."""
    return sum(value.nbytes for state in states for value in state if isinstance(value, np.ndarray))
