"""The prefix-cache hit rate across its 1,000-lookup buckets, in lockstep.

vLLM does not divide hits by lookups: it averages completed buckets of
1,000 lookups and blends in the running bucket (spec §6.7), so the rate has
edges: exactly at a bucket's end, and one lookup into the next. The state
machine's runs make a few hundred lookups, and a trace makes them a whole
prompt at a time, so neither reads the rate at those edges. This walk
allocates and frees one-block prompts (one lookup each; a fixed pattern of
hits and misses, since 7 contents share 4 blocks) and reads the rate after
every one, through two buckets and a few lookups more.

A divergence names the lookup, and its repro is one call, ``walk`` up to
that lookup, runnable as printed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from blockspace.conformance.lockstep import REPRO_HEADING, Divergence, Lockstep
from blockspace.conformance.runner import Check, CheckResult
from blockspace.conformance.script import HEADER, class_path
from blockspace.enums import Device, SequenceStatus
from blockspace.sequence import Sequence, SequenceGroup

BUCKET = 1000  # lookups a bucket (spec §6.7)
NUM_LOOKUPS = 2 * BUCKET + 3
CONTENTS = (1, 2, 1, 3, 1, 4, 5, 1, 6, 2, 7)  # the token of each prompt, in turn


def walk(impls: Mapping[str, Any], num_lookups: int = NUM_LOOKUPS) -> int:
    """``num_lookups`` one-block prompts, each allocated, followed by the GPU
    hit rate, and freed; raises ``Divergence`` at the first disagreement.
    Returns the number of calls."""
    lock = Lockstep.build(
        impls, every_call=False, block_size=1, num_gpu_blocks=4, num_cpu_blocks=0, watermark=0.0, enable_caching=True
    )
    groups = [SequenceGroup(f"g{k}", [Sequence(k, [token])]) for k, token in enumerate(CONTENTS)]
    for i in range(num_lookups):
        seq = groups[i % len(groups)].get_seqs()[0]  # the same few objects again: the log stays small
        try:
            seq.status = SequenceStatus.WAITING
            lock.value("allocate", groups[i % len(groups)])
            seq.status = SequenceStatus.RUNNING
            lock.value("get_prefix_cache_hit_rate", Device.GPU)
            seq.status = SequenceStatus.FINISHED_STOPPED
            lock.value("free", seq)
            if i + 1 == num_lookups:
                lock.checkpoint("the end of the walk")
        except Divergence as failure:  # the log is thousands of calls: the repro is the walk itself
            impls_text = ", ".join(f"{name!r}: {class_path(impl)!r}" for name, impl in impls.items())
            repro = f"{HEADER}from blockspace.conformance.buckets import walk\nwalk({{{impls_text}}}, {i + 1})\n"
            message = str(failure).partition(REPRO_HEADING)[0]
            raise Divergence(f"at lookup {i + 1}: {message}{REPRO_HEADING}{repro}") from None
    return lock.num_calls


def bucket_check(impls: Mapping[str, Any], capabilities: Mapping[str, bool]) -> Check:
    name = "hit_rate[buckets]"

    def run() -> CheckResult:
        if not capabilities.get("supports_caching", True):
            return CheckResult(name, "skipped", detail="supports_caching is False")
        started = time.perf_counter()
        try:
            num_calls = walk(impls)
        except Divergence as failure:
            return CheckResult(name, "failed", NUM_LOOKUPS, time.perf_counter() - started, str(failure))
        return CheckResult(name, "passed", NUM_LOOKUPS, time.perf_counter() - started, extra={"calls": num_calls})

    return Check(name, run)
