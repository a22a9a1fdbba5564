"""Scopes: the small worlds the explorer exhausts (``explore.py``).

A scope is a handful of named values: the managers' configuration and the
bounds of the scheduler that drives them. Everything the explorer may do in
a state is derived from it (``protocol.py``), so two runs of one scope walk
the same state space, and a theorem about a scope says exactly what was
checked. Why small: by the small-scope hypothesis (Alloy's), most bugs of a
state machine show up in small instances, and a small instance can be
*exhausted*, where a large one can only be sampled.

``histories``: a state is told apart by what callers see (``explore.canonical``),
so two histories that reach it are one state, gone on from as the first left it.
A bug of an implementation's private layout (a list of free rows, a parked
tracker row) that only a later history leaves behind is then never met;
``histories=2`` goes on from the first two histories of each state: the same
states, about twice the work.

``SCOPES`` names the documented ones: ``default`` (the one CI exhausts),
one for each family, and a few more that each reach one thing the
family's cannot (two shared blocks written in one append, adapters, cache salts,
adapters in recycled rows, blocks of one token, prompts of 500 blocks and of 1,000, tables of three full
blocks, steps of two tokens a sequence, more content keys than the key table's
first size, three sequences of one request, evictions decided by time, the spec's stale copy-on-write
pair), each family's scope with one request (``*_single``); ``scope_from`` builds one from a name and ``key=value``
changes, and says which key or value is wrong.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from blockspace.conformance.pool_config import ManagerConfig


@dataclass(frozen=True)
class Scope(ManagerConfig):
    """A family's configuration and the scheduler's bounds.

    ``prompt_lengths`` x ``alphabet`` gives every prompt a request may
    have (all strings of those lengths); ``samples`` the sequences a
    request may start with, ``max_seqs`` how many it may reach by forks.
    ``max_requests`` arrivals over a run, ``max_preemptions`` swap-outs and
    recomputes over a run (each brings a later ``allocate`` or ``swap_in``,
    so the hit counters stay bounded), ``max_len`` the longest sequence.
    ``new_tokens``: how many tokens an append's decode step may have
    sampled (two: one append then covers two new slots, which may cross a
    block edge, as speculative decoding makes it).
    A step may also sample none (0): the scheduler appends to a running
    prefill, a chunked prefill's later chunk, with no new token.
    ``step_tokens``: the same for the ``step`` move, a decode step of
    every running group at once, each sequence the same count.
    ``adapters``: the LoRA ids a request may carry (0: none); they key
    the prefix cache apart. ``salts``: the same for cache salts (tenants).
    ``max_depth`` cuts the search (None: until no new state is found)."""

    name: str = "custom"
    family: str = "plain"
    max_requests: int = 2
    samples: tuple[int, ...] = (1,)
    max_seqs: int = 2
    prompt_lengths: tuple[int, ...] = (1, 3)
    alphabet: tuple[int, ...] = (1, 2)
    max_len: int = 4
    lookaheads: tuple[int, ...] = (0,)
    new_tokens: tuple[int, ...] = (1,)  # tokens one decode step samples (more: speculative decoding)
    step_tokens: tuple[int, ...] = (1,)  # tokens each sequence samples in a step of every running group
    max_preemptions: int = 1
    adapters: tuple[int, ...] = (0,)
    salts: tuple[int, ...] = (0,)  # cache salts a request may carry, as "t<n>" (0: none)
    free_calls: bool = False  # the cache calls as moves of their own, in every order (else where vLLM makes them)
    histories: int = 1  # how many histories of each state to go on from (the first ones found; module docstring)
    max_depth: int | None = None

    @property
    def prompts(self) -> list[list[int]]:
        """Every prompt a request may carry, shortest first."""
        return [list(p) for n in self.prompt_lengths for p in itertools.product(self.alphabet, repeat=n)]

    def manager_kwargs(self) -> dict[str, Any]:
        """The managers' constructor arguments; a sliding window or prefix
        caching left out where the scope has none, so that the constructor's
        own defaults (none, off) are what the scope runs with, as a
        scheduler that never names them gets (``watermark=None``: the same
        for the watermark)."""
        kwargs = self.kwargs()
        for key, default in (("sliding_window", None), ("enable_caching", False)):
            if kwargs[key] is default:
                del kwargs[key]
        return kwargs

    def describe(self) -> str:
        """The scope as ``key=value`` pairs, as ``--scope-set`` takes them."""
        skip = {"name", "encoder_decoder"}
        return " ".join(f"{key}={_show(value)}" for key, value in asdict(self).items() if key not in skip)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


FAMILIES = ("plain", "caching", "sliding_window", "swap", "encoder_decoder")

SCOPES = {
    # CI exhausts this one (tests/test_explore.py) in well under a minute: sharing by forks and
    # by prefix, copy-on-write, eviction, promotion and a dry pool happen in it (swaps: "swap").
    "default": Scope(name="default", family="caching", block_size=2, num_gpu_blocks=2, num_cpu_blocks=0,
                     watermark=None, enable_caching=True, max_requests=2, max_seqs=2, prompt_lengths=(1,),
                     alphabet=(1,), max_len=2, max_preemptions=0),
    # An empty prompt too: a running sequence with an empty table.
    "plain": Scope(name="plain", family="plain", block_size=2, num_gpu_blocks=3, num_cpu_blocks=1, watermark=0.34,
                   max_requests=2, max_seqs=2, prompt_lengths=(0, 1, 2), alphabet=(0,), max_len=2,
                   lookaheads=(0, 2), max_preemptions=1),
    # The plain family's largest (10^5 states): plain with a second CPU block, more room to swap out.
    "plain_swaps": Scope(name="plain_swaps", family="plain", block_size=2, num_gpu_blocks=3, num_cpu_blocks=2,
                         watermark=0.34, max_requests=2, max_seqs=2, prompt_lengths=(0, 1, 2), alphabet=(0,),
                         max_len=2, lookaheads=(0, 2), max_preemptions=1),
    "caching": Scope(name="caching", family="caching", block_size=2, num_gpu_blocks=2, num_cpu_blocks=0,
                     enable_caching=True, max_requests=2, max_seqs=2, prompt_lengths=(1,), alphabet=(0, 1),
                     max_len=2, max_preemptions=0),
    # Five blocks: a prompt of three, the null block and a new one, so the window's drops happen (with
    # four, no state ever dropped a block); sequences of six, so a table drops twice.
    "sliding_window": Scope(name="sliding_window", family="sliding_window", block_size=1, num_gpu_blocks=5,
                            num_cpu_blocks=0, sliding_window=1, max_requests=2, max_seqs=2, prompt_lengths=(3,),
                            alphabet=(1,), max_len=6, max_preemptions=1),
    # Appends of two sampled tokens (speculative decoding) across a block edge, with lookahead
    # blocks ahead: a write that fills a block onto its cached twin frees one, which a copy-on-write
    # later in the same append may need (the others' blocks of two never cross an edge in one append).
    "speculative": Scope(name="speculative", family="caching", block_size=3, num_gpu_blocks=3, num_cpu_blocks=0,
                         enable_caching=True, max_requests=1, max_seqs=2, prompt_lengths=(1,), alphabet=(1,),
                         max_len=4, lookaheads=(0, 3), new_tokens=(0, 1, 2), max_preemptions=0),
    # Two blocks shared by a fork, written in one append: the lookahead slots an append of no token
    # reserves make the second block, so the child's two-token append copies both (two copies in one
    # call), and the parent's fills its first block onto the child's cached copy, a promotion whose
    # block a copy later in the same append takes, with a block to spare (the speculative scope's pool
    # is dry by then, where a gain miscounted as a loss still passes).
    "shared_writes": Scope(name="shared_writes", family="caching", block_size=2, num_gpu_blocks=4, num_cpu_blocks=0,
                           enable_caching=True, max_requests=1, max_seqs=2, prompt_lengths=(1,), alphabet=(1,),
                           max_len=4, lookaheads=(0, 2), new_tokens=(0, 1, 2), max_preemptions=0),
    # Prompts of a full block, keyed at admission: a request the dry pool turns away parks its tracker
    # row and takes it back; LoRA adapters key equal tokens apart.
    "adapters": Scope(name="adapters", family="caching", block_size=2, num_gpu_blocks=2, num_cpu_blocks=0,
                      enable_caching=True, max_requests=2, max_seqs=2, prompt_lengths=(2,), alphabet=(1,),
                      max_len=3, max_preemptions=0, adapters=(0, 1)),
    # Two tenants' cache salts: equal prompts of two salts are keyed apart (two salts, not a salt and
    # none: a root that mixes up the salted and the unsalted still tells those two apart).
    "salts": Scope(name="salts", family="caching", block_size=2, num_gpu_blocks=2, num_cpu_blocks=0,
                   enable_caching=True, max_requests=2, max_seqs=2, prompt_lengths=(2,), alphabet=(1,),
                   max_len=3, max_preemptions=0, salts=(1, 2)),
    # A one-block LoRA request in the table row a two-block request of another adapter left, its
    # block filled in a row step: the adapter ids read for it must be its own (prompts of one and two
    # tokens; no forks, which would make it too large to exhaust).
    "adapter_rows": Scope(name="adapter_rows", family="caching", block_size=2, num_gpu_blocks=2, num_cpu_blocks=0,
                          enable_caching=True, max_requests=2, max_seqs=1, prompt_lengths=(1, 2), alphabet=(1,),
                          max_len=3, max_preemptions=0, adapters=(0, 1)),
    # Blocks of one token: prefixes and tracker rows of several blocks, appends that key two blocks in a
    # chain, forks whose cached prefixes part after a common block.
    "chains": Scope(name="chains", family="caching", block_size=1, num_gpu_blocks=4, num_cpu_blocks=0,
                    enable_caching=True, max_requests=1, max_seqs=2, prompt_lengths=(1,), alphabet=(0, 1),
                    max_len=4, new_tokens=(1, 2), max_preemptions=0),
    # Prompts of 500 blocks: the hit rate's first bucket of 1,000 queries fills with the second
    # request's hits in it, so its mean is not 0 (a few states, each large).
    "long_prompt": Scope(name="long_prompt", family="caching", block_size=1, num_gpu_blocks=1001, num_cpu_blocks=0,
                         enable_caching=True, max_requests=2, max_seqs=1, prompt_lengths=(500,), alphabet=(1,),
                         max_len=501, max_preemptions=0),
    # Prompts of 1,000 blocks: two admissions fill two buckets of 1,000 lookups (all misses, then all
    # hits), so the hit rate blends two completed buckets (``long_prompt`` completes one at most).
    "two_buckets": Scope(name="two_buckets", family="caching", block_size=1, num_gpu_blocks=1001,
                         num_cpu_blocks=0, enable_caching=True, max_requests=2, max_seqs=1, prompt_lengths=(1000,),
                         alphabet=(1,), max_len=1001, max_preemptions=0),
    # Prompts of one block and of five: a running request's two blocks of zeros are keyed (root, 00)
    # and (key 0, 00), whose hashes meet in one slot of the key table; a prompt of five blocks, asked
    # about (NEVER on two blocks), keys more than the table's first size (four), so it grows, and its
    # rehash must keep both keys of that slot, or the prompt misses the cached block it starts with.
    "key_room": Scope(name="key_room", family="caching", block_size=2, num_gpu_blocks=2, num_cpu_blocks=0,
                      enable_caching=True, max_requests=2, max_seqs=1, prompt_lengths=(2, 10), alphabet=(0,),
                      max_len=10, max_preemptions=0),
    # Tables of three full blocks: a free releases three blocks at one time, and their depths order
    # the evictable blocks (with blocks of one token, the depth's division is exact).
    "long_tables": Scope(name="long_tables", family="caching", block_size=2, num_gpu_blocks=4, num_cpu_blocks=0,
                         enable_caching=True, max_requests=1, max_seqs=2, prompt_lengths=(2,), alphabet=(1,),
                         max_len=6, lookaheads=(0,), new_tokens=(2,), max_preemptions=0),
    # A promotion and then two copies on write in one append, on a dry pool: blocks of one token, three
    # lookahead blocks reserved and shared by a fork, the child's one-token append copies the first, and
    # the parent's three-token append fills its first onto the child's copy (a block back) and must copy
    # the other two: one block short, so the fit check must count the promotion's block once.
    "promoted_copies": Scope(name="promoted_copies", family="caching", block_size=1, num_gpu_blocks=5,
                             num_cpu_blocks=0, enable_caching=True, max_requests=1, max_seqs=2, prompt_lengths=(1,),
                             alphabet=(1,), max_len=4, lookaheads=(0, 3), new_tokens=(0, 1, 3), max_preemptions=0),
    # Steps of two tokens a sequence, blocks of three: a row that fills no block (a fork's parent two
    # tokens ahead) before one that fills one, so the keyed tails' offsets in one flat array matter;
    # two token values, so a tail read from the wrong offset keys other content.
    "step_tails": Scope(name="step_tails", family="caching", block_size=3, num_gpu_blocks=3, num_cpu_blocks=0,
                        enable_caching=True, max_requests=1, max_seqs=2, prompt_lengths=(1,), alphabet=(0, 1),
                        max_len=5, lookaheads=(0,), new_tokens=(2,), step_tokens=(2,), max_preemptions=0),
    # Three sequences of one request: a batch whose one group needs more blocks than any of its
    # sequences may (the batched step's quick bound on the whole batch, fast/table.py, is met only then).
    # Lookahead slots reserved by an append of no token, then written by one of two tokens: a
    # multi-token append that needs no block (the batched step's in-place test). A request may
    # arrive with two sequences (its tables made at once, not by a fork; two more states only).
    "wide": Scope(name="wide", family="plain", block_size=1, num_gpu_blocks=3, num_cpu_blocks=0, max_requests=1,
                  samples=(1, 2), max_seqs=3, prompt_lengths=(1,), alphabet=(1,), max_len=3, lookaheads=(0, 2),
                  new_tokens=(0, 1, 2), max_preemptions=0),
    # Three sequences sampling sixteen tokens each in one row step: 48 new blocks, where the batch's
    # quick bound allows 2 x 48 + 3 x 3; on 44 free blocks only the trial tells whether the step fits,
    # so a quick bound that counted one row's tokens (2 x 16 + 9 = 41) would step in place and run dry.
    "big_steps": Scope(name="big_steps", family="plain", block_size=1, num_gpu_blocks=45, num_cpu_blocks=0,
                       max_requests=1, samples=(1, 2), max_seqs=3, prompt_lengths=(1,), alphabet=(1,), max_len=17,
                       new_tokens=(16,), step_tokens=(16,), max_preemptions=0),
    # Three requests of one sequence each on two blocks: two fill their blocks at times of their own and
    # leave them idle, so the third's admission evicts by time (the oldest), or, where both were freed
    # at one time, by the tie-break (§6.3); the ``caching`` scope reaches this too, in minutes.
    "evictions": Scope(name="evictions", family="caching", block_size=2, num_gpu_blocks=2, num_cpu_blocks=0,
                       enable_caching=True, max_requests=3, max_seqs=1, prompt_lengths=(1,), alphabet=(0, 1),
                       max_len=2, max_preemptions=0),
    # Example 4 of the spec: a request's one-token prompt forked, and another's prompt of a full block
    # of the same tokens cached; the first sequence's append fills its shared block, which is copied
    # and then folded into the cached one in the same call: the copy's pair is stale (§14.1).
    "stale_pair": Scope(name="stale_pair", family="caching", block_size=2, num_gpu_blocks=3, num_cpu_blocks=0,
                        enable_caching=True, max_requests=2, max_seqs=2, prompt_lengths=(1, 2), alphabet=(1,),
                        max_len=2, max_preemptions=0),
    # A hole in a cached prefix (spec §14.8): a one-token prompt's block, in use and not yet computed,
    # and a two-token prompt sharing it, recomputed, so its second block waits idle (computed, as every
    # idle block is); asked again, vLLM's binary search counts both blocks past the first, where a scan
    # in order stops at it (conformance/wrong.py: LinearScanTracker). Three blocks, so that it is let in.
    "tracker_hole": Scope(name="tracker_hole", family="caching", block_size=1, num_gpu_blocks=3, num_cpu_blocks=0,
                          enable_caching=True, max_requests=2, max_seqs=1, prompt_lengths=(1, 2), alphabet=(1,),
                          max_len=2, max_preemptions=1),
    # A sequence that leaves the tracker and comes back: the cache calls as moves of their own, so a
    # count, a removal, a marking and a count again come in every order (vLLM counts afresh; a tracker
    # that parks a row must not take its old count back: conformance/wrong.py, TrackerCountKept).
    "untracked": Scope(name="untracked", family="caching", block_size=2, num_gpu_blocks=1, num_cpu_blocks=0,
                       enable_caching=True, max_requests=1, max_seqs=1, prompt_lengths=(2,), alphabet=(1,),
                       max_len=2, new_tokens=(0,), max_preemptions=0, free_calls=True),
    # A sliding window cut while the computed count is mid-block: blocks of two tokens (the family's
    # scope has blocks of one, where every count is a block edge), a window of two blocks, a sequence
    # grown to seven tokens, so the cut at 5 computed tokens rounds down (conformance/wrong.py,
    # WindowCutRoundedUp, rounds it up and drops a block early).
    "window_mid_block": Scope(name="window_mid_block", family="sliding_window", block_size=2, num_gpu_blocks=5,
                              num_cpu_blocks=0, sliding_window=1, max_requests=1, max_seqs=1, prompt_lengths=(1,),
                              alphabet=(1,), max_len=7, max_preemptions=0),
    "swap": Scope(name="swap", family="swap", block_size=2, num_gpu_blocks=2, num_cpu_blocks=1,
                  enable_caching=True, max_requests=2, max_seqs=2, prompt_lengths=(1,), alphabet=(1,),
                  max_len=2, max_preemptions=1),
    # Prompts of a full block and a part of one (three tokens), admitted without asking on a pool a
    # block short; a request's tables in rows another's freed, the cross table in the first row.
    "encoder_decoder": Scope(name="encoder_decoder", family="encoder_decoder", block_size=2, num_gpu_blocks=3,
                             num_cpu_blocks=1, encoder_decoder=True, max_requests=2, max_seqs=2,
                             prompt_lengths=(1, 3), alphabet=(1,), max_len=3, max_preemptions=1),
    # The family's largest (10^5 states): encoder_decoder with lookaheads of 0 and 2 (at admission, appends
    # and swap-ins) and three CPU blocks, more room to swap out.
    "encoder_decoder_swaps": Scope(name="encoder_decoder_swaps", family="encoder_decoder", block_size=2,
                                   num_gpu_blocks=3, num_cpu_blocks=3, encoder_decoder=True, max_requests=2,
                                   max_seqs=2, prompt_lengths=(1, 3), alphabet=(1,), max_len=3, lookaheads=(0, 2),
                                   max_preemptions=1),
}  # fmt: skip

# Each family's scope with one request: its own mechanism (a fork makes the sharing, preemptions the
# swaps and recomputes) exhausted in seconds, where the two-request scope takes minutes. The
# standard set (blockspace/kit_options.py) takes these; the two-request ones stay for a longer proof.
# The swapping families' get a second CPU block, so that a swap moves two blocks (a table of two, or two
# tables of one each) and its order shows (situations.ORDERED_ANSWERS); with one, a manager that
# reversed each table's pairs passed the standard set (issue #51, broken.ReversedSwapOrder).
SINGLE_CPU_BLOCKS = {"swap": 2, "encoder_decoder": 2}
SCOPES.update({f"{name}_single": replace(SCOPES[name], name=f"{name}_single", max_requests=1,
                                         num_cpu_blocks=SINGLE_CPU_BLOCKS.get(name, SCOPES[name].num_cpu_blocks))
               for name in ("plain", "sliding_window", "swap", "encoder_decoder")})  # fmt: skip

FAMILY_CAPABILITY = {  # the capability a scope's family needs from a manager (None: every manager)
    "plain": None,
    "caching": "supports_caching",
    "sliding_window": "supports_sliding_window",
    "swap": None,
    "encoder_decoder": "supports_encoder_decoder",
}


class ScopeError(ValueError):
    """A scope name, key or value that does not make a scope."""


def _parse(field_type: Any, text: str) -> Any:
    """``text`` as a value of a ``Scope`` field's type."""
    kind = str(field_type)
    if "tuple" in kind:
        return tuple(int(part) for part in text.split(",") if part and part != "-")
    if text in ("None", "none", "") and "None" in kind:
        return None
    if "bool" in kind:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(text)
        return text.lower() in ("true", "1")
    if "float" in kind:
        return float(text)
    if "int" in kind:
        return int(text)
    return text


def check_scope(scope: Scope) -> None:
    """Raise ``ScopeError`` naming the first value that makes no scope."""
    problems = [
        (scope.family not in FAMILIES, f"family must be one of {', '.join(FAMILIES)}"),
        (scope.block_size < 1, "block_size must be >= 1"),
        (scope.num_gpu_blocks < 1 or scope.num_cpu_blocks < 0, "num_gpu_blocks must be >= 1, num_cpu_blocks >= 0"),
        (scope.watermark is not None and not 0 <= scope.watermark < 1, "watermark must be in [0, 1) or None"),
        (scope.max_requests < 0 or scope.max_preemptions < 0, "max_requests and max_preemptions must be >= 0"),
        (not scope.samples or min(scope.samples) < 1, "samples must be >= 1"),
        (scope.max_seqs < max(scope.samples or (1,)) or scope.max_seqs > 9,
         "max_seqs must be >= every value of samples, and at most 9"),
        (not scope.alphabet or min(scope.alphabet) < 0, "alphabet must hold token ids >= 0"),
        (not scope.prompt_lengths or min(scope.prompt_lengths) < 0, "prompt_lengths must be >= 0"),
        (not scope.lookaheads or min(scope.lookaheads) < 0, "lookaheads must be >= 0"),
        (not scope.new_tokens or min(scope.new_tokens) < 0, "new_tokens must be >= 0"),
        (not scope.step_tokens or min(scope.step_tokens) < 0, "step_tokens must be >= 0"),
        (not scope.adapters or min(scope.adapters) < 0, "adapters must be LoRA ids >= 0"),
        (not scope.salts or min(scope.salts) < 0, "salts must be >= 0 (0: no salt)"),
        (scope.max_len < max(scope.prompt_lengths or (0,)), "max_len must be >= the longest prompt"),
        (scope.max_depth is not None and scope.max_depth < 0, "max_depth must be >= 0"),
        (scope.histories < 1, "histories must be >= 1"),
        (scope.enable_caching and scope.sliding_window is not None,
         "prefix caching and a sliding window exclude each other"),
        (scope.encoder_decoder and (scope.enable_caching or scope.sliding_window is not None),
         "encoder_decoder needs caching off and no sliding window"),
    ]  # fmt: skip
    for wrong, why in problems:
        if wrong:
            raise ScopeError(f"scope {scope.name!r}: {why}")


def scope_from(name: str, changes: list[str] | None = None) -> Scope:
    """The scope ``name`` (from ``SCOPES``) with ``key=value`` changes."""
    if name not in SCOPES:
        raise ScopeError(f"unknown scope {name!r}: known are {', '.join(SCOPES)}")
    scope = SCOPES[name]
    types = {f.name: f.type for f in fields(Scope)}
    for change in changes or ():
        key, sep, text = change.partition("=")
        if not sep or key not in types or key == "name":
            raise ScopeError(f"{change!r} is not key=value with a key of {', '.join(k for k in types if k != 'name')}")
        try:
            value = _parse(types[key], text)
        except ValueError:
            raise ScopeError(f"{change!r}: {text!r} is not a value of {key}") from None
        scope = replace(scope, **{key: value})
    check_scope(scope)
    return scope
