"""Long runs in lockstep: states only thousands of calls reach.

The state machine's runs are tens of calls, and a trace goes a whole prompt
at a time, so some edges are out of their reach. Each run here is
deterministic, a few seconds long, and walks up to one of them:

* ``hit_rate_walk``: vLLM's hit rate averages completed buckets of 1,000
  lookups and blends in the running one (spec §6.7), so it has edges
  exactly at a bucket's end and one lookup into the next. One-block
  prompts (one lookup each: 7 contents share 4 blocks, so hits and misses
  come in a fixed pattern) are allocated and freed, the rate read after
  each, through two buckets and a few lookups more.
* ``key_churn_walk``: thousands of distinct blocks through a small cached
  pool, up to three requests running and decoding. A manager that keeps
  content keys in a table of its own must forget the ones nothing names
  any more, or grow: this is where such a table is collected and rehashed
  again and again (31 times for the fast manager), and where contents
  under one parent (few first blocks, many second ones) meet in a crowded
  hash table.

A divergence names the step, and its repro is one call, the run cut at that
step, runnable as printed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from blockspace.conformance.check import Check, scripted_check
from blockspace.conformance.lockstep import REPRO_HEADING, Divergence, Lockstep
from blockspace.conformance.script import HEADER, Script, impls_source
from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.sequence import Sequence, SequenceGroup

BUCKET = 1000  # lookups a bucket (spec §6.7)
NUM_LOOKUPS = 2 * BUCKET + 3
CONTENTS = (1, 2, 1, 3, 1, 4, 5, 1, 6, 2, 7)  # the token of each one-block prompt, in turn
NUM_PROMPTS = 3000


class Unlogged(Script):
    """A script that logs nothing: a long run's repro is the run itself."""

    def call_line(self, method: str, args: tuple, kwargs: Mapping[str, Any]) -> str:
        return method

    def add(self, line: str, comment: str = "", quiet: bool = False) -> None:
        pass


def build(impls: Mapping[str, Any], num_gpu_blocks: int) -> Lockstep:
    config = dict(block_size=1, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=0, watermark=0.0, enable_caching=True)
    return Lockstep.build(impls, Unlogged(impls, config), every_call=False, **config)


def hit_rate_walk(impls: Mapping[str, Any], num_steps: int = NUM_LOOKUPS) -> int:
    """``num_steps`` one-block prompts, each allocated, followed by the GPU
    hit rate, and freed. Returns the number of calls."""
    lock = build(impls, num_gpu_blocks=4)

    def step(i: int) -> None:
        seq = Sequence(i, [CONTENTS[i % len(CONTENTS)]])
        lock.value("allocate", SequenceGroup(f"g{i}", [seq]))
        seq.status = SequenceStatus.RUNNING
        lock.value("get_prefix_cache_hit_rate", Device.GPU)
        seq.status = SequenceStatus.FINISHED_STOPPED
        lock.value("free", seq)

    return _run(lock, step, num_steps, hit_rate_walk, impls)


def churn_prompt(i: int) -> list[int]:
    """Prompt ``i`` of the churn: 1-6 tokens from a fixed generator, the
    first of 3 and the rest of 64, so first blocks repeat (hits) and the
    blocks after them are mostly new: many siblings under few parents."""
    length = 1 + (i * 5) % 6
    x = i * 2_654_435_761 % 2**32
    tokens = []
    for position in range(length):
        x = (x * 1_103_515_245 + 12_345) % 2**31
        tokens.append(1 + (x >> 16) % (64 if position else 3))
    return tokens


def key_churn_walk(impls: Mapping[str, Any], num_steps: int = NUM_PROMPTS) -> int:
    """``num_steps`` requests through a 12-block cached pool, each counted and
    admitted if it fits (every other one that does not is admitted anyway:
    it fits once its cache hits count, or fails cleanly); then every running
    request decodes a token of 3, whose block fills and may be cached
    already, and the oldest of three running ends. Returns the number of calls."""
    lock = build(impls, num_gpu_blocks=12)
    running: list[SequenceGroup] = []

    def finish(group: SequenceGroup) -> None:
        running.remove(group)
        seq = group.get_seqs()[0]
        seq.status = SequenceStatus.FINISHED_STOPPED
        lock.value("free", seq)

    def step(i: int) -> None:
        seq = Sequence(i, churn_prompt(i))
        group = SequenceGroup(f"g{i}", [seq])
        lock.value("get_num_cached_tokens", seq)
        fits = lock.value("can_allocate", group) == AllocStatus.OK
        if not fits and i % 2:
            lock.checkpoint("before an allocate that may not fit")  # so a failed one is seen to change nothing
        if (fits or i % 2) and not lock.call("allocate", group).raised:
            seq.status = SequenceStatus.RUNNING
            seq.data.update_num_computed_tokens(seq.get_len())
            running.append(group)
        else:
            lock.value("remove_seq_from_computed_blocks_tracker", seq)
        for group in list(running):
            seq = group.get_seqs()[0]
            seq.append_token_id(1 + (i + seq.seq_id) % 3)
            if lock.value("can_append_slots", group, 0):
                lock.value("append_slots", seq, 0)
                lock.value("get_block_table", seq)
                seq.data.update_num_computed_tokens(1)
            else:
                finish(group)
        if len(running) > 2:
            finish(running[0])

    return _run(lock, step, num_steps, key_churn_walk, impls)


def _run(lock: Lockstep, step: Callable[[int], None], num_steps: int, walk: Callable, impls: Mapping[str, Any]) -> int:
    """Make the steps, compare the snapshots at the end; a divergence's repro
    is ``walk`` cut at the failing step (the log is thousands of calls)."""
    for i in range(num_steps):
        try:
            step(i)
            if i + 1 == num_steps:
                lock.checkpoint("the end of the run")
        except Divergence as failure:
            repro = f"{HEADER}from {__name__} import {walk.__name__}\n{walk.__name__}({impls_source(impls)}, {i + 1})\n"
            message = str(failure).partition(REPRO_HEADING)[0]
            raise Divergence(f"at step {i + 1}: {message}{REPRO_HEADING}{repro}") from None
    return lock.num_calls


RUNS = {"long[hit_rate_buckets]": (hit_rate_walk, NUM_LOOKUPS), "long[key_churn]": (key_churn_walk, NUM_PROMPTS)}


def long_run_check(impls: Mapping[str, Any], capabilities: Mapping[str, bool], name: str) -> Check:
    """The run ``name`` of ``RUNS`` as a check (it needs prefix caching)."""
    walk, num_steps = RUNS[name]
    return scripted_check(name, "supports_caching", capabilities, num_steps, lambda: walk(impls, num_steps))


def long_run_checks(impls: Mapping[str, Any], capabilities: Mapping[str, bool]) -> list[Check]:
    return [long_run_check(impls, capabilities, name) for name in RUNS]
