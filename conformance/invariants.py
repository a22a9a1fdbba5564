"""What must hold after every step, whatever the implementation.

Two families of checks:

* ``check_snapshot`` reads the full state from ``snapshot()`` (format in
  ``blockspace.snapshot``): refcounts equal table references; per device
  every id is exactly one of free, idle cached (evictable) or in use and the
  free counts agree; tables fit their token counts; swapped sequences live
  wholly on the CPU, running ones on the GPU; blocks shared by two tables
  hold equal content; an idle cached block comes back only for its content
  (``ContentLedger``); after everything is freed nothing is in use.
* ``check_returns`` needs only return values (block tables, free counts), for
  implementations without ``snapshot()``: id ranges per device, free counts
  that match the distinct ids in use, table lengths, shared-content equality.

Call-specific checks: ``check_cow`` (after a copy-on-write the written block
is the sequence's alone) and ``check_swap`` (a swap mapping sends each
destination block one source, on the right devices, onto the new table).

The checks need the scheduler's view of the world, a ``World``: the live
sequences, what their tables should hold, and the configuration.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from blockspace.enums import SequenceStatus


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class World:
    """The scheduler's side: what exists and what each table should hold."""

    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    enable_caching: bool = False
    sliding_window: int | None = None
    max_lookahead: int = 0
    seqs: dict[int, Any] = field(default_factory=dict)  # seq_id -> Sequence with a table
    written: dict[int, int] = field(default_factory=dict)  # seq_id -> tokens its table holds
    encoders: dict[str, Any] = field(default_factory=dict)  # request_id -> encoder Sequence with a cross table
    dropped: dict[int, int] = field(default_factory=dict)  # seq_id -> leading entries the sliding window dropped

    def device_of(self, block_id: int) -> str:
        return "GPU" if block_id < self.num_gpu_blocks else "CPU"

    def content(self, seq_id: int, index: int) -> tuple:
        """What block ``index`` of a table holds: the sequence's tokens up to
        the end of that block (prefix included), its adapter identity and
        its cache salt (tenants never share);
        nothing for an empty (lookahead) block, which forks may share after
        their prefixes diverged."""
        seq = self.seqs[seq_id]
        end = min(self.written[seq_id], (index + 1) * self.block_size)
        if end <= index * self.block_size:
            return ((), None)
        return (tuple(seq.get_token_ids()[:end]), seq.extra_hash(), getattr(seq, "cache_salt", None))

    def cross_content(self, request_id: str, index: int) -> tuple:
        tokens = self.encoders[request_id].get_token_ids()
        return (tuple(tokens[: (index + 1) * self.block_size]), "cross")


def world_source(world: World, render: Callable[[Any], str]) -> str:
    """``world`` as a ``World(...)`` expression of a repro script
    (``render`` names the script's sequences)."""
    fields = [f"{name}={getattr(world, name)!r}" for name in
              ("block_size", "num_gpu_blocks", "num_cpu_blocks", "enable_caching", "sliding_window",
               "max_lookahead")]  # fmt: skip
    for name in ("seqs", "written", "encoders", "dropped"):
        mapping = getattr(world, name)
        fields.append(f"{name}={{" + ", ".join(f"{key!r}: {render(value)}" for key, value in mapping.items()) + "}")
    return f"World({', '.join(fields)})"


# -- from snapshot() ----------------------------------------------------------------
def check_snapshot(snap: dict[str, Any], world: World, free_counts: tuple[int, int] | None = None) -> list[str]:
    """Every snapshot invariant; ``free_counts`` = what the manager reported."""
    return (
        check_refcounts(snap, world)
        + check_partition(snap, world, free_counts)
        + check_tables(snap, world)
        + check_devices(snap, world)
        + check_shared_content(_table_blocks(snap), world, snap.get("null_block"))
    )


def check_refcounts(snap: dict[str, Any], world: World) -> list[str]:
    """A block's refcount is the number of table entries pointing at it (the
    sliding-window null block holds one reference of its own)."""
    null = snap["null_block"]
    references: Counter[int] = Counter()
    for table in snap["tables"].values():
        references.update(b for b in table["blocks"] if b != null)
    for blocks in snap["cross_tables"].values():
        references.update(blocks)
    if null is not None:
        references[null] += 1
    problems = []
    for block_id, (refcount, *_rest) in enumerate(snap["blocks"]):
        if refcount != references[block_id]:
            problems.append(f"block {block_id}: refcount {refcount}, but {references[block_id]} references")
    return problems


def check_partition(snap: dict[str, Any], world: World, free_counts: tuple[int, int] | None) -> list[str]:
    """Per device, each id is exactly one of free, evictable or in use; the
    reported free counts are free + evictable; evictable blocks are cached,
    free-list blocks are not."""
    problems = []
    if len(snap["blocks"]) != world.num_gpu_blocks + world.num_cpu_blocks:
        return [f"{len(snap['blocks'])} blocks in the snapshot, expected {world.num_gpu_blocks + world.num_cpu_blocks}"]
    ranges = {"GPU": range(world.num_gpu_blocks), "CPU": range(world.num_gpu_blocks, len(snap["blocks"]))}
    for device, ids in ranges.items():
        free, evictable = snap["free"][device], snap["evictable"][device]
        for name, listed in (("free list", free), ("evictable list", evictable)):
            if len(set(listed)) != len(listed):
                problems.append(f"{device}: an id appears twice on the {name}: {listed}")
            if any(b not in ids for b in listed):
                problems.append(f"{device}: the {name} holds ids of another device: {listed}")
        free_set, evictable_set = set(free), set(evictable)
        for block_id in ids:
            refcount, cached = snap["blocks"][block_id][0], snap["blocks"][block_id][1]
            states = (refcount > 0) + (block_id in free_set) + (block_id in evictable_set)
            if states != 1:
                problems.append(f"{device} block {block_id} is in {states} of: in use / free / evictable")
            if block_id in evictable_set and not cached:
                problems.append(f"{device} block {block_id} is evictable but not cached")
            if block_id in free_set and cached:
                problems.append(f"{device} block {block_id} is on the free list but still cached")
        if free_counts is not None:
            reported = free_counts[0] if device == "GPU" else free_counts[1]
            if reported != len(free) + len(evictable):
                problems.append(f"{device}: {reported} free reported, {len(free)} free + {len(evictable)} evictable")
    return problems


def check_tables(snap: dict[str, Any], world: World) -> list[str]:
    """Tables exist exactly for the scheduler's live sequences and hold what
    was written: ``cdiv(tokens, bs) <= blocks <= cdiv(tokens + lookahead, bs)``."""
    problems = []
    if set(snap["tables"]) != set(world.seqs):
        problems.append(f"tables for sequences {sorted(snap['tables'])}, the scheduler holds {sorted(world.seqs)}")
    if set(snap["cross_tables"]) != set(world.encoders):
        problems.append(f"cross tables {sorted(snap['cross_tables'])}, expected {sorted(world.encoders)}")
    for seq_id, table in snap["tables"].items():
        if seq_id in world.written and table["num_tokens"] != world.written[seq_id]:
            problems.append(
                f"sequence {seq_id}: table holds {table['num_tokens']} tokens, {world.written[seq_id]} were written"
            )
        problems += _length_problems(f"sequence {seq_id}", len(table["blocks"]), table["num_tokens"], world)
    for request_id, blocks in snap["cross_tables"].items():
        if request_id in world.encoders:
            expected = cdiv(len(world.encoders[request_id].get_token_ids()), world.block_size)
            if len(blocks) != expected:
                problems.append(f"cross table {request_id!r}: {len(blocks)} blocks, expected {expected}")
    return problems


def _length_problems(name: str, num_blocks: int, num_tokens: int, world: World) -> list[str]:
    low = cdiv(num_tokens, world.block_size)
    high = cdiv(num_tokens + world.max_lookahead, world.block_size)
    if not low <= num_blocks <= high:
        return [f"{name}: {num_blocks} blocks for {num_tokens} tokens (expected {low}..{high})"]
    return []


def check_devices(snap: dict[str, Any], world: World) -> list[str]:
    """Swapped sequences are wholly on the CPU, running ones on the GPU."""
    problems = []
    for seq_id, table in snap["tables"].items():
        seq = world.seqs.get(seq_id)
        devices = {world.device_of(b) for b in table["blocks"]}
        if devices - {table["device"]}:
            problems.append(f"sequence {seq_id}: table on the {table['device']} holds blocks {table['blocks']}")
        if seq is None:
            continue
        expected = {SequenceStatus.RUNNING: "GPU", SequenceStatus.SWAPPED: "CPU"}.get(seq.status)
        if expected is not None and table["blocks"] and table["device"] != expected:
            problems.append(f"sequence {seq_id} is {seq.status.name} but its table is on the {table['device']}")
    for request_id, blocks in snap["cross_tables"].items():
        if any(world.device_of(b) != "GPU" for b in blocks):
            problems.append(f"cross table {request_id!r} is not on the GPU: {blocks}")
    return problems


def _table_blocks(snap: dict[str, Any]) -> Iterable[tuple[Any, list[int]]]:
    for seq_id, table in snap["tables"].items():
        yield seq_id, table["blocks"]
    for request_id, blocks in snap["cross_tables"].items():
        yield ("cross", request_id), blocks


def check_shared_content(tables: Iterable[tuple[Any, list[int]]], world: World, null_block: int | None) -> list[str]:
    """A block shared by two table entries sits at the same depth and holds
    the same content (no prefix hit without equal content)."""
    holders: dict[int, tuple[Any, int, tuple]] = {}
    problems = []
    for owner, blocks in tables:
        for index, block_id in enumerate(blocks):
            if block_id == null_block:
                continue
            content = _content(world, owner, index)
            if content is None:
                continue
            seen = holders.setdefault(block_id, (owner, index, content))
            if seen[0] == owner and seen[1] != index:
                problems.append(f"block {block_id} appears twice in the table of {owner}")
            elif seen[0] != owner and (seen[1], seen[2]) != (index, content):
                problems.append(
                    f"block {block_id} is shared by {seen[0]} (position {seen[1]}) and {owner} "
                    f"(position {index}) with different content"
                )
    return problems


def _content(world: World, owner: Any, index: int) -> tuple | None:
    if isinstance(owner, tuple):
        return world.cross_content(owner[1], index) if owner[1] in world.encoders else None
    if owner not in world.seqs or owner not in world.written or index < world.dropped.get(owner, 0):
        return None  # unknown, or a dropped entry: it points at the shared null block
    return world.content(owner, index)


def _entries_written(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Table entries that hold another block after the call than before it
    (new entries included): the most blocks the call can have taken."""
    old = dict(_table_blocks(before))
    written = 0
    for owner, blocks in _table_blocks(after):
        previous = old.get(owner, [])
        written += sum(1 for i, block in enumerate(blocks) if i >= len(previous) or previous[i] != block)
    return written


class ContentLedger:
    """Remembers the content of every idle cached block, to check that a
    block that comes back from the evictor with *other* content was really
    evicted: that can only happen once no uncached free block was left
    (uncached blocks are always used before any cached one is evicted).

    Within one call, the uncached blocks may be taken and given back: an
    append takes a block for every new slot first and only then fills them,
    and a filled block whose content is cached already is merged into that
    one and freed again (spec §6.5). So blocks free before and after a call
    prove nothing by themselves; a finding needs also that there were at
    least as many uncached free blocks as the call could take."""

    def __init__(self) -> None:
        self._idle: dict[int, tuple] = {}  # block id -> content while it sat idle
        self._held: dict[int, tuple] = {}  # block id -> content of full blocks in use
        self._last: dict[str, Any] | None = None  # the snapshot of the previous step

    def observe(self, after: dict[str, Any], world: World) -> list[str]:
        """Check one step's snapshot against the previous one."""
        before, self._last = self._last, after
        problems = []
        held: dict[int, tuple] = {}
        for owner, blocks in _table_blocks(after):
            for index, block_id in enumerate(blocks):
                content = _content(world, owner, index)
                if content is not None and len(content[0]) == (index + 1) * world.block_size:
                    held[block_id] = content
        for block_id, content in held.items():
            old = self._idle.get(block_id)
            if old is None or old == content or before is None:
                continue
            device = world.device_of(block_id)
            untouched = set(before["free"][device]) & set(after["free"][device])
            if untouched and len(before["free"][device]) >= _entries_written(before, after):
                problems.append(
                    f"idle cached block {block_id} came back with other content although uncached "
                    f"free blocks {sorted(untouched)} were never used"
                )
        evictable = set(after["evictable"]["GPU"]) | set(after["evictable"]["CPU"])
        self._idle = {b: c for b, c in {**self._idle, **self._held}.items() if b in evictable}
        self._held = held
        return problems


def check_nothing_in_use(snap: dict[str, Any]) -> list[str]:
    """After every sequence and cross table is freed, only the sliding-window
    null block (if any) is still referenced."""
    in_use = [b for b, (refcount, *_r) in enumerate(snap["blocks"]) if refcount and b != snap["null_block"]]
    if in_use or snap["tables"] or snap["cross_tables"]:
        return [f"after freeing everything, blocks {in_use} are in use (tables {sorted(snap['tables'])})"]
    return []


# -- from return values alone -------------------------------------------------------
def check_returns(
    tables: dict[int, list[int]], cross: dict[str, list[int]], num_free_gpu: int, num_free_cpu: int, world: World
) -> list[str]:
    """What ``get_block_table``/``get_cross_block_table`` and the free counts
    must satisfy, for managers without ``snapshot()``."""
    problems = []
    G, C = world.num_gpu_blocks, world.num_cpu_blocks
    if not 0 <= num_free_gpu <= G or not 0 <= num_free_cpu <= C:
        problems.append(f"free counts {num_free_gpu}/{num_free_cpu} outside 0..{G} / 0..{C}")
    used: dict[str, set[int]] = defaultdict(set)
    for seq_id, blocks in tables.items():
        seq = world.seqs[seq_id]
        devices = {world.device_of(b) for b in blocks}
        if len(devices) > 1 or any(not 0 <= b < G + C for b in blocks):
            problems.append(f"sequence {seq_id}: table {blocks} mixes devices or leaves the id range")
        expected = {SequenceStatus.RUNNING: "GPU", SequenceStatus.SWAPPED: "CPU"}.get(seq.status)
        if expected is not None and devices - {expected}:
            problems.append(f"sequence {seq_id} is {seq.status.name} but its table is {blocks}")
        if seq_id in world.written:
            problems += _length_problems(f"sequence {seq_id}", len(blocks), world.written[seq_id], world)
        for b in blocks:
            used[world.device_of(b)].add(b)
    for _request_id, blocks in cross.items():
        used["GPU"].update(blocks)
    num_gpu_used = G - num_free_gpu
    extra = num_gpu_used - len(used["GPU"])
    allowed = {0, 1} if world.sliding_window is not None else {0}  # the null block
    if extra not in allowed:
        problems.append(f"GPU: {num_gpu_used} blocks in use, but tables reference {len(used['GPU'])} distinct ids")
    if C - num_free_cpu != len(used["CPU"]):
        problems.append(f"CPU: {C - num_free_cpu} blocks in use, but tables reference {len(used['CPU'])} distinct ids")
    null = None
    if world.sliding_window is not None:  # repeated ids in one table can only be the null block
        repeats = {b for blocks in tables.values() for b, n in Counter(blocks).items() if n > 1}
        null = next(iter(repeats)) if len(repeats) == 1 else None
    pairs = list(tables.items()) + [(("cross", r), b) for r, b in cross.items()]
    problems += check_shared_content(pairs, world, null)
    return problems


# -- call-specific -------------------------------------------------------------------
def check_cow(pairs: list[tuple[int, int]], table: list[int], refcounts: list[int] | None, world: World) -> list[str]:
    """Copy-on-write pairs ``(src, dst)``: both GPU ids, distinct; the new
    block is in the writer's table and referenced by it alone (with caching a
    pair may be stale: the copy was merged into an equal cached block)."""
    problems = []
    for src, dst in pairs:
        if src == dst or not (0 <= src < world.num_gpu_blocks and 0 <= dst < world.num_gpu_blocks):
            problems.append(f"copy-on-write pair {(src, dst)} is not two distinct GPU ids")
            continue
        if dst not in table:
            if not world.enable_caching:
                problems.append(f"copy-on-write destination {dst} is not in the writer's table {table}")
            continue
        if refcounts is not None and refcounts[dst] != 1:
            problems.append(f"copy-on-write destination {dst} has refcount {refcounts[dst]}, expected 1")
    return problems


def check_swap(
    mapping: list[tuple[int, int]],
    before: dict[int, list[int]],
    after: dict[int, list[int]],
    to_cpu: bool,
    world: World,
) -> list[str]:
    """A swap mapping of physical ids ``(src, dst)``: src on the source device
    and dst on the destination; no destination receives two sources; the
    pairs are exactly the old tables' blocks onto the new ones."""
    G = world.num_gpu_blocks
    src_offset, dst_offset = (0, G) if to_cpu else (G, 0)
    src_range = range(G) if to_cpu else range(world.num_cpu_blocks)
    dst_range = range(world.num_cpu_blocks) if to_cpu else range(G)
    problems = []
    sources: dict[int, int] = {}
    for src, dst in mapping:
        if src not in src_range or dst not in dst_range:
            problems.append(f"swap pair {(src, dst)} leaves the device ranges ({src_range}, {dst_range})")
        elif sources.setdefault(dst, src) != src:
            problems.append(f"swap destination {dst} receives two sources {sources[dst]} and {src}")
    expected = []
    for seq_id in before:
        old, new = before[seq_id], after.get(seq_id, [])
        if len(old) != len(new):
            problems.append(f"sequence {seq_id}: {len(old)} blocks before the swap, {len(new)} after")
        expected += [(a - src_offset, b - dst_offset) for a, b in zip(old, new)]
    if sorted(expected) != sorted(mapping):
        problems.append(f"swap mapping {mapping} is not the tables' move {expected}")
    return problems
