"""Situations: the behaviours of the spec, each as a predicate over one
transition, so an exploration can say which of them it reached.

A scope's theorem says every call sequence within it agrees; it does not
say what those sequences do. A scope too small for two idle blocks never
decides an eviction by time, and a theorem about it says nothing about
that rule. Each ``Situation`` here names one behaviour of
``docs/semantics.md`` (its sections, among them every section that holds a
**[verified]** claim and every §14 item) and recognises a transition that
exercises it from what a caller sees: the move, the yardstick's snapshots
before and after it, and the values of the move's calls. The explorer
(``explore.py``) records the shallowest depth at which each is reached;
``NOT_TRANSITIONS`` names the parts of the spec that no transition can show,
and why. ``tests/test_situations.py`` holds this registry to the spec: a
new [verified] section or §14 item must come with a situation or a reason.

A predicate only recognises; it asserts nothing. Agreement is the
explorer's business; this says where it was checked.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from blockspace.enums import AllocStatus


class Transition(NamedTuple):
    """One move seen by a caller."""

    move: tuple
    before: dict[str, Any]  # the yardstick's snapshot (blockspace/snapshot.py)
    after: dict[str, Any]
    calls: tuple[tuple[str, Any, str], ...]  # (method, value, error class name, "" when none), in order
    block_size: int
    window_blocks: int | None  # blocks in the sliding window, None without one
    caching: bool


@dataclass(frozen=True)
class Situation:
    name: str
    sections: tuple[str, ...]  # where docs/semantics.md states it: "§6.3", "§14.10"
    says: str
    reached: Callable[[Transition], bool]


# -- what a transition shows -----------------------------------------------------------------
def _values(t: Transition, method: str) -> Iterator[Any]:
    return (value for name, value, error in t.calls if name == method and not error)


def _raised(t: Transition, method: str) -> bool:
    return any(name == method and error for name, _, error in t.calls)


def _refs(snap: dict[str, Any], block: int) -> int:
    return snap["blocks"][block][0]


def _replaced(t: Transition) -> Iterator[tuple[str, int, int, int]]:
    """(seq, index, old id, new id) of each table entry the move pointed elsewhere."""
    for seq, table in t.before["tables"].items():
        later = t.after["tables"].get(seq)
        if later is None or later["device"] != table["device"]:
            continue
        for index, (old, new) in enumerate(zip(table["blocks"], later["blocks"])):
            if old != new and old != t.before["null_block"] and new != t.after["null_block"]:
                yield seq, index, old, new


def _new_tables(t: Transition) -> Iterator[dict[str, Any]]:
    return (table for seq, table in t.after["tables"].items() if seq not in t.before["tables"])


def _eviction(t: Transition) -> tuple[int, int] | None:
    """(victim, next in line) of a GPU eviction, where a snapshot tells it
    apart from a revival of cached content: the victim handed out for a
    partial block (a revived block is cached), or by a move that marks
    nothing computed (an admission, a swap-in: a revived block is computed,
    a new one not yet)."""
    idle = t.before["evictable"]["GPU"]
    if t.before["free"]["GPU"] or len(idle) < 2:
        return None
    victim = idle[0]
    refs, cached, computed, _ = t.after["blocks"][victim]
    unmarked = _moved(t, "admit", "force", "swap_in")
    return (victim, idle[1]) if refs > 0 and (not cached or (unmarked and not computed)) else None


def _evicted_by(t: Transition, rule: str) -> bool:
    pair = _eviction(t)
    if pair is None:
        return False
    first, second = (t.before["blocks"][b][3] for b in pair)
    if rule == "time":
        return first < second
    return first == second and ((pair[0] > pair[1]) if rule == "depth" else (pair[0] < pair[1]))


def _leading_cached(t: Transition, blocks: list[int]) -> int:
    """Leading blocks cached and computed (an idle block counts as computed)."""
    count = 0
    for block in blocks:
        refs, cached, computed, _ = t.after["blocks"][block]
        if not cached or (refs > 0 and not computed):
            break
        count += 1
    return count


def _past_hole(t: Transition) -> bool:
    """A count of two blocks or more past its table's cached prefix: a hole
    and a block past it (a count of one block may only be stale, frozen
    while the prefix changed, which no scan order decides)."""
    for seq, (_, cached_tokens) in t.after["tracker"].items():
        table = t.after["tables"].get(seq)
        if table is not None and table["device"] == "GPU" and cached_tokens // t.block_size > 1:
            if cached_tokens // t.block_size > _leading_cached(t, table["blocks"]):
                return True
    return False


def _cow_pairs(t: Transition) -> Iterator[tuple[int, int]]:
    for value in _values(t, "append_slots"):
        yield from value


def _swap_pairs(t: Transition, method: str) -> Iterator[list[tuple[int, int]]]:
    return (list(value) for value in _values(t, method) if value)


def _unshares(pairs: list[tuple[int, int]]) -> bool:
    sources = [source for source, _ in pairs]
    return len(set(sources)) < len(sources)


def _answered(method: str, answer: Any, t: Transition) -> bool:
    return answer in _values(t, method)


def _moved(t: Transition, *names: str) -> bool:
    return t.move[0] in names


def _freed_seq(t: Transition) -> Any:
    return t.move[1] if t.move[0] == "free" else None


def _in_use_before(t: Transition) -> int:
    return sum(block[0] for block in t.before["blocks"])


# -- shapes: answers that carry an order or a mapping ----------------------------------------------
def _holds_two(method: str, t: Transition) -> bool:
    """An answer of ``method`` of two different elements or more: its move's
    calls, and for a table answer the state after, whose every table the
    explorer asks (``protocol.observe``)."""
    answers = [*_values(t, method), *ASKED_OF_EVERY_STATE.get(method, lambda snap: ())(t.after)]
    return any(len(set(answer)) > 1 for answer in answers)


def _moves_two(method: str, t: Transition) -> bool:
    """A swap of a table of two different blocks or more: its pairs come
    table by table, each in its table's order, so an order within a table
    shows only there (two tables of one block each show the order of the
    tables alone)."""
    if not any(_swap_pairs(t, method)):
        return False
    moved = (table for seq, table in t.before["tables"].items()
             if seq in t.after["tables"] and t.after["tables"][seq]["device"] != table["device"])  # fmt: skip
    return any(len(set(table["blocks"])) > 1 for table in moved)


class Shape(NamedTuple):
    """An answer that carries an order or a mapping, and its situation: the
    answer holding two different elements or more (two equal pairs, one
    block shared by two sequences swapped, read the same in either order)."""

    situation: str
    sections: tuple[str, ...]
    says: str
    reached: Callable[[Transition], bool]


ASKED_OF_EVERY_STATE: dict[str, Callable[[dict[str, Any]], Iterator[Any]]] = {  # a table answer -> the state's
    "get_block_table": lambda snap: (table["blocks"] for table in snap["tables"].values()),
    "get_cross_block_table": lambda snap: iter(snap["cross_tables"].values()),
}

# Every answer of the manager that is a list (tests/test_situations.py walks the yardstick's methods and
# holds this to them), each with a situation of its own. Why: an answer of one element has one order, so a
# wrong order (a swap's pairs reversed) or a wrong pairing agrees with the yardstick until a scope lets the
# answer hold two (Alloy's rule: a scope must let every output hold two of anything). The situations of the
# spec's sections do not see it: the standard set once reached "a swap-out" only with tables of one block,
# and passed a manager that reversed each table's pairs (issue #51; ``broken.ReversedSwapOrder``).
ORDERED_ANSWERS = {
    "append_slots": Shape("cow_two_pairs", ("§9.4", "§8.3"),
                          "append_slots answers two copy-on-write pairs or more", partial(_holds_two, "append_slots")),
    "swap_out": Shape("swap_out_two_blocks", ("§9.7",), "swap_out moves a table of two blocks or more, pair by pair",
                      partial(_moves_two, "swap_out")),
    "swap_in": Shape("swap_in_two_blocks", ("§9.7",), "swap_in moves a table of two blocks or more, pair by pair",
                     partial(_moves_two, "swap_in")),
    "get_block_table": Shape("table_two_blocks", ("§9.10",), "get_block_table answers two different blocks or more",
                             partial(_holds_two, "get_block_table")),
    "get_cross_block_table": Shape("cross_table_two_blocks", ("§9.11",),
                                   "get_cross_block_table answers two different blocks or more",
                                   partial(_holds_two, "get_cross_block_table")),
    "get_common_computed_block_ids": Shape("common_two_blocks", ("§9.15",),
                                           "get_common_computed_block_ids answers two blocks or more",
                                           partial(_holds_two, "get_common_computed_block_ids")),
}  # fmt: skip


SITUATIONS = (
    # -- eviction (§6.3) and its tie-breaks
    Situation("evict_by_time", ("§6.3",), "an eviction decided by the blocks' times: the victim was idle longest",
              lambda t: _evicted_by(t, "time")),
    Situation("evict_by_depth", ("§6.3", "§14.10"),
              "an eviction among blocks of one time decided by depth: the victim's id is the larger",
              lambda t: _evicted_by(t, "depth")),
    Situation("evict_equal_times", ("§6.3", "§14.10"),
              "an eviction among blocks of one time, the smaller id first (by depth or by id)",
              lambda t: _evicted_by(t, "id")),
    # -- the prefix cache (§6.4-§6.7)
    Situation("hit_in_use", ("§6.4", "§7"), "an admission shares a block another table holds, by content",
              lambda t: _moved(t, "admit", "force") and any(
                  0 < _refs(t.before, b) < _refs(t.after, b) for table in _new_tables(t) for b in table["blocks"])),
    Situation("revive_idle", ("§6.4",), "an idle cached block taken back by content",
              lambda t: any(t.after["blocks"][b][0] > 0 and t.after["blocks"][b][1] and t.after["blocks"][b][2]
                            for b in t.before["evictable"]["GPU"])),
    Situation("promote_duplicate", ("§6.5", "§8.3"),
              "an append fills a block whose content is cached: it is given back and the cached one shared",
              lambda t: any(_refs(t.before, old) == 1 and (_refs(t.before, new) > 0
                                                           or new in t.before["evictable"]["GPU"])
                            for _, _, old, new in _replaced(t))),
    Situation("cow_shared", ("§6.5", "§8.3"), "a copy-on-write of a block another table shares",
              lambda t: any(_refs(t.before, old) > 1 for _, _, old, _ in _replaced(t))),
    Situation("cow_twice_in_one_call", ("§8.3",), "two copies on write of one table in one move, in block order",
              lambda t: any(sum(1 for s, _, old, _ in _replaced(t) if s == seq and _refs(t.before, old) > 1) > 1
                            for seq in t.before["tables"])),
    Situation("cow_stale_pair", ("§14.1",),
              "an append reports a copy whose target it gave back in the same call (de-duplicated)",
              lambda t: any(all(dst not in table["blocks"] for table in t.after["tables"].values())
                            for _, dst in _cow_pairs(t))),
    Situation("mark_computed", ("§6.6", "§9.14"), "blocks registered since the last marking marked computed",
              lambda t: bool(t.before["touched"]) and not t.after["touched"]),
    Situation("idle_counts_computed", ("§14.9", "§10"),
              "a waiting request's cached tokens counted on idle blocks alone (nothing in use)",
              lambda t: _moved(t, "admit") and _in_use_before(t) == 0 and bool(t.before["evictable"]["GPU"])
              and any(v > 0 for v in _values(t, "get_num_cached_tokens"))),
    Situation("bucket_completes", ("§6.7", "§14.15"), "a hit-rate bucket of 1,000 lookups completes",
              lambda t: t.after["hit_stats"]["GPU"][0] > t.before["hit_stats"]["GPU"][0]),
    # -- reset (§6.8, §9.17)
    Situation("reset_forgets", ("§6.8", "§9.17"), "a reset forgets every idle cached block",
              lambda t: _moved(t, "reset") and bool(t.before["evictable"]["GPU"]) and not t.after["evictable"]["GPU"]),
    Situation("reset_refused", ("§6.8", "§9.17"), "a reset refused: a block is in use",
              lambda t: _moved(t, "reset") and False in _values(t, "reset_prefix_cache")),
    Situation("reset_reorders", ("§14.14",), "a reset puts two or more forgotten blocks at the free list's front",
              lambda t: _moved(t, "reset") and len(t.before["evictable"]["GPU"]) > 1
              and not t.after["evictable"]["GPU"]),
    Situation("reset_both_with_cpu_in_use", ("§14.13", "§9.17"),
              "a reset of both devices while the CPU holds a swapped table: refused, the GPU still tried",
              lambda t: t.move == ("reset", None)
              and any(table["device"] == "CPU" for table in t.before["tables"].values())),
    # -- the tracker (§9.18, §10)
    Situation("count_past_hole", ("§14.8", "§10", "§9.18"),
              "the binary search counts cached tokens past a block that is not computed",
              _past_hole),
    Situation("free_untracked", ("§14.12",), "a free of a sequence the tracker does not hold, with caching",
              lambda t: t.caching and (seq := _freed_seq(t)) is not None and seq in t.before["tables"]
              and seq not in t.before["tracker"]),
    # -- prompts and appends (§8)
    Situation("partial_last_block", ("§8.1",), "a prompt allocated with a partial last block",
              lambda t: any(table["num_tokens"] % t.block_size for table in _new_tables(t))),
    Situation("empty_prompt", ("§8.6",), "an empty prompt allocated: a table of no block",
              lambda t: any(not table["blocks"] for table in _new_tables(t))),
    Situation("lookahead_two_blocks", ("§8.2", "§9.4"), "one append or step adds two blocks or more to a table",
              lambda t: _moved(t, "append", "step") and any(
                  len(t.after["tables"][seq]["blocks"]) - len(table["blocks"]) > 1
                  for seq, table in t.before["tables"].items() if seq in t.after["tables"])),
    Situation("fork_shares", ("§8.4", "§9.5"), "a fork: the child shares every block of the parent",
              lambda t: _moved(t, "fork") and not _raised(t, "fork")
              and any(table["blocks"] for table in _new_tables(t))),
    Situation("free_to_idle", ("§8.5", "§9.8"), "a free sends cached blocks to the evictor",
              lambda t: _moved(t, "free", "abort", "recompute")
              and len(t.after["evictable"]["GPU"]) > len(t.before["evictable"]["GPU"])),
    Situation("free_lifo", ("§14.21", "§5"),
              "a block handed out from the front of a free list that releases reordered",
              lambda t: len(free := t.before["free"]["GPU"]) > 1 and free != sorted(free)
              and _refs(t.after, free[0]) > 0),
    Situation("shared_stamped_by_last", ("§14.20",), "a free of a sharer whose access time is recorded",
              lambda t: (seq := _freed_seq(t)) is not None and (table := t.before["tables"].get(seq)) is not None
              and table["last_access"] is not None and any(_refs(t.before, b) > 1 for b in table["blocks"])),
    # -- the questions' answers (§9.1, §9.3, §9.15)
    *(Situation(f"can_allocate_{status.name.lower()}", ("§9.1",), f"can_allocate answers {status.name}",
                partial(_answered, "can_allocate", status)) for status in AllocStatus),
    Situation("can_append_false", ("§9.3",), "can_append_slots answers False",
              lambda t: False in _values(t, "can_append_slots")),
    Situation("common_nothing", ("§14.7", "§9.15"), "get_common_computed_block_ids has nothing in common: []",
              lambda t: [] in _values(t, "get_common_computed_block_ids")),
    Situation("common_blocks", ("§9.15",), "get_common_computed_block_ids finds computed blocks",
              lambda t: any(v for v in _values(t, "get_common_computed_block_ids"))),
    # -- swapping (§9.6, §9.7)
    Situation("swap_out", ("§9.7", "§3"), "a swap-out maps GPU ids to CPU ids",
              lambda t: any(_swap_pairs(t, "swap_out"))),
    Situation("swap_in", ("§9.7",), "a swap-in maps CPU ids to GPU ids", lambda t: any(_swap_pairs(t, "swap_in"))),
    Situation("swap_unshares", ("§14.5", "§9.7"), "a swap maps one source block twice (a fork's shared blocks)",
              lambda t: any(_unshares(p) for m in ("swap_out", "swap_in") for p in _swap_pairs(t, m))),
    Situation("swap_out_fails_after_ok", ("§14.6", "§9.6"), "can_swap_out said True and swap_out ran out",
              lambda t: True in _values(t, "can_swap_out") and _raised(t, "swap_out")),
    Situation("can_swap_out_false", ("§9.6",), "can_swap_out answers False",
              lambda t: False in _values(t, "can_swap_out")),
    Situation("can_swap_in_later", ("§9.6",), "can_swap_in answers LATER",
              lambda t: AllocStatus.LATER in _values(t, "can_swap_in")),
    Situation("swapped_time_minus_one", ("§14.19",), "a swap-out leaves cached GPU blocks idle at time -1",
              lambda t: _moved(t, "swap_out") and any(
                  t.after["blocks"][b][3] == -1.0
                  for b in set(t.after["evictable"]["GPU"]) - set(t.before["evictable"]["GPU"]))),
    Situation("cross_not_swapped", ("§14.22", "§9.6"), "a swap-out of a request with a cross table, which stays",
              lambda t: any(_swap_pairs(t, "swap_out")) and bool(t.after["cross_tables"])),
    Situation("free_swapped", ("§14.11", "§9.8"), "a free of a swapped-out sequence",
              lambda t: (seq := _freed_seq(t)) is not None and seq in t.before["tables"]
              and t.before["tables"][seq]["device"] == "CPU"),
    # -- encoder-decoder (§9.2)
    Situation("cross_table_made", ("§9.2",), "an admission makes a cross table after the decoder's",
              lambda t: _moved(t, "admit", "force") and len(t.after["cross_tables"]) > len(t.before["cross_tables"])),
    Situation("encoder_refused_first", ("§14.18", "§9.2", "§15"),
              "an encoder-decoder allocation refused before any table is made",
              lambda t: _moved(t, "illegal") and "encoder_unsupported" in t.move[1:] and _raised(t, "allocate")),
    # -- the sliding window (§11)
    Situation("window_drops", ("§11",), "a table's oldest block dropped to the null block",
              lambda t: t.after["null_block"] is not None and any(
                  t.after["null_block"] in table["blocks"] and t.after["null_block"] not in
                  t.before["tables"].get(seq, {"blocks": ()})["blocks"] for seq, table in t.after["tables"].items())),
    Situation("window_null_block", ("§14.3", "§11"), "the null block taken, at the first append",
              lambda t: t.before["null_block"] is None and t.after["null_block"] is not None),
    Situation("window_cap_only_asked", ("§14.2", "§11"),
              "an allocation takes more blocks than the window holds (the cap is can_allocate's alone)",
              lambda t: t.window_blocks is not None and any(
                  len(table["blocks"]) > t.window_blocks for table in _new_tables(t))),
    Situation("window_fork_after_drop", ("§14.4", "§11"), "a fork of a table that dropped blocks, refused",
              lambda t: _moved(t, "fork") and _raised(t, "fork") and t.before["null_block"] is not None
              and t.before["null_block"] in t.before["tables"].get(t.move[1], {"blocks": ()})["blocks"]),
    # -- errors (§15)
    Situation("refused_unchanged", ("§15",), "a forbidden call refused, changing nothing",
              lambda t: _moved(t, "illegal") and any(error for _, _, error in t.calls) and t.before == t.after),
    # -- shapes: each answer that carries an order or a mapping, holding two elements or more
    *(Situation(shape.situation, shape.sections, shape.says, shape.reached) for shape in ORDERED_ANSWERS.values()),
)  # fmt: skip

NOT_TRANSITIONS = {  # parts of the spec no transition shows, and where they are held instead
    "§3": "constructor arithmetic (the watermark's float truncation): tests/test_methods.py, every manager",
    "§12": "the placeholder manager, no family of the explorer: tests/test_methods.py",
    "§13": "the worked examples, each replayed call for call: tests/test_examples.py",
    "§14.16": "a return type (a fresh list, where vLLM's is live): every call's value is compared by type",
    "§14.17": "constructor arithmetic (0.29 * 100 -> 28): tests/test_methods.py, every manager",
    "§14.23": "multimodal data, which no sequence of the kit carries",
}

BY_NAME = {situation.name: situation for situation in SITUATIONS}

# What a situation needs of a scope, where a scope without it can never reach it: not looked for
# there (``possible``), which spares each transition the situations of other families.
FEATURES: dict[str, Callable[[Any], bool]] = {  # a feature -> whether a scope has it
    "caching": lambda scope: scope.enable_caching,
    "cpu": lambda scope: scope.num_cpu_blocks > 0 and scope.max_preemptions > 0,  # swaps that move blocks
    "window": lambda scope: scope.sliding_window is not None,
    "encoder": lambda scope: scope.encoder_decoder,
}
NEEDS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("evict_by_time", "evict_by_depth", "evict_equal_times", "hit_in_use", "revive_idle",
                     "promote_duplicate", "cow_stale_pair", "mark_computed", "idle_counts_computed",
                     "bucket_completes", "reset_forgets", "reset_refused", "reset_reorders", "count_past_hole",
                     "free_untracked", "free_to_idle", "common_two_blocks"), ("caching",)),
    **dict.fromkeys(("swap_out", "swap_in", "swap_unshares", "swap_out_fails_after_ok", "can_swap_in_later",
                     "free_swapped", "reset_both_with_cpu_in_use", "swap_out_two_blocks", "swap_in_two_blocks"),
                    ("cpu",)),
    "swapped_time_minus_one": ("cpu", "caching"),
    "cross_not_swapped": ("cpu", "encoder"),
    **dict.fromkeys(("cross_table_made", "cross_table_two_blocks"), ("encoder",)),
    **dict.fromkeys(("window_drops", "window_null_block", "window_cap_only_asked", "window_fork_after_drop"),
                    ("window",)),
}  # fmt: skip


def possible(scope: Any) -> tuple[Situation, ...]:
    """The situations ``scope`` may reach: those whose ``NEEDS`` it has."""
    return tuple(s for s in SITUATIONS if all(FEATURES[need](scope) for need in NEEDS.get(s.name, ())))


def reached(t: Transition, skip: Collection[str] = frozenset(), among: Collection[Situation] = SITUATIONS) -> list[str]:
    """The situations ``t`` reaches, of those ``among`` not in ``skip``."""
    return [s.name for s in among if s.name not in skip and s.reached(t)]
