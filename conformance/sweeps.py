"""Sweeps: small scripted shapes, each played at every pool size.

The state machine reaches a pool's last free block by chance, and rarely
with the rest of the shape an accounting rule needs there: an append that
writes several blocks, some shared, one filling up to content already
cached; a batch whose rows each take several blocks; a swap of tables that
share a cached block. Each shape here builds one such state in a few calls
and makes the call that counts; the sweep plays it on fresh managers at
every pool size of a range around the margin, so the call meets the pool
dry, one block short, just enough and with room. Every
call is made whether or not the managers' own checks say it fits (it works
or fails cleanly, the same way everywhere) and compared in lockstep.

A divergence's repro is the failing play, logged call by call and then
shortened as the state machine's are (``reduce.py``: every line the failure
does not need deleted): runnable as printed. All of them take a couple of
seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from blockspace.conformance.check import Check, scripted_check
from blockspace.conformance.lockstep import REPRO_HEADING, Divergence, Lockstep
from blockspace.conformance.reduce import shorten
from blockspace.enums import Device, SequenceStatus
from blockspace.sequence import Sequence, SequenceGroup

BLOCK_SIZE = 4
RUNNING = SequenceStatus.RUNNING
SHORTEN_SECONDS = 5.0  # at most, to shorten a failing play's log (reduce.py): well under a second in practice


class Play:
    """One play of a shape: a lockstep of fresh managers and the scheduler's
    side of it (statuses, computed tokens, a clock)."""

    def __init__(self, impls: Mapping[str, Any], **config: Any) -> None:
        self.lock = Lockstep.build(impls, block_size=BLOCK_SIZE, **config)
        self.clock = 0.0

    def admit(self, group: SequenceGroup, count_first: bool = True) -> bool:
        """``can_allocate`` asked, then ``allocate`` made anyway; True if it worked."""
        if count_first:
            for seq in group.get_seqs():
                self.lock.call("get_num_cached_tokens", seq)
        self.lock.call("can_allocate", group)
        if self.lock.call("allocate", group).raised:
            return False
        for seq in group.get_seqs():
            seq.status = RUNNING
            seq.data.update_num_computed_tokens(seq.get_len())
        return True

    def append(self, seq: Sequence, tokens: list[int], lookahead: int = 0) -> bool:
        """``tokens`` decoded by ``seq`` and their slots appended (with
        ``lookahead`` more), asked first; True if it worked."""
        for token in tokens:
            seq.append_token_id(token)
        self.lock.call("can_append_slots", seq.group, lookahead)
        if self.lock.call("append_slots", seq, lookahead).raised:
            return False
        seq.data.update_num_computed_tokens(len(tokens))
        self.clock += 1.0
        self.lock.call("access_all_blocks_in_seq", seq, self.clock)
        return True

    def fork(self, parent: Sequence, child_id: int) -> Sequence | None:
        child = parent.fork(child_id)
        group = parent.group
        assert group is not None, "a sweep's sequences are made in groups"
        group.add(child)
        if self.lock.call("fork", parent, child).raised:
            return None
        return child

    def look(self, *seqs: Sequence) -> None:
        for seq in seqs:
            self.lock.call("get_block_table", seq)
        self.lock.call("get_common_computed_block_ids", list(seqs))
        self.lock.call("get_num_free_gpu_blocks")

    def free(self, *seqs: Sequence) -> None:
        for seq in seqs:
            seq.status = SequenceStatus.FINISHED_STOPPED
            self.lock.call("free", seq)


# -- the shapes ------------------------------------------------------------------------------
def shared_writes(play: Play, span: int, same: bool) -> None:
    """A fork after lookahead slots were reserved shares a half-full block
    and ``span - 1`` empty ones. The child writes the first block (a copy),
    then the parent one append over all ``span``: the first block is its own
    now and fills up (``same``: to the child's content, cached and in use,
    so it is given back), each later one is still shared and needs a copy."""
    parent = Sequence(1, [1, 2])
    if not play.admit(SequenceGroup("a", [parent])) or not play.append(parent, [], span * BLOCK_SIZE - 2):
        return
    child = play.fork(parent, 2)
    if child is None or not play.append(child, [3, 4]):
        return
    play.append(parent, ([3, 4] if same else [9, 9]) + [5] * (BLOCK_SIZE * (span - 1)))
    play.look(parent, child)
    play.free(parent, child)


def copies_in_one_append(play: Play, span: int) -> None:
    """A fork shares ``span`` blocks (lookahead slots reserved); the child's
    first append writes them all: ``span`` copies on write in one call."""
    parent = Sequence(1, [1, 2])
    if not play.admit(SequenceGroup("a", [parent])) or not play.append(parent, [], span * BLOCK_SIZE - 2):
        return
    child = play.fork(parent, 2)
    if child is not None and play.append(child, [3] * (span * BLOCK_SIZE - 2)):
        play.look(parent, child)


def window_jump(play: Play, num_new: int) -> None:
    """A windowed sequence's first append drops the blocks its computed
    prompt left behind the window and takes the null block and several new
    ones, in one call."""
    seq = Sequence(1, list(range(1, 6 * BLOCK_SIZE + 2)))
    if play.admit(SequenceGroup("a", [seq])) and play.append(seq, [7] * num_new):
        play.look(seq)


def common_prefixes(play: Play, first: int, second: int) -> None:
    """Two requests with cached prefixes of ``first`` and ``second`` blocks of
    a finished one: their common computed blocks, asked in both orders and
    with the finished prompt's owner back."""
    bank = list(range(1, 6 * BLOCK_SIZE + 1))
    done = Sequence(1, bank)
    if not play.admit(SequenceGroup("a", [done])):
        return
    play.free(done)
    seqs = [Sequence(2 + i, bank[: n * BLOCK_SIZE] + [50 + i] * BLOCK_SIZE) for i, n in enumerate((first, second))]
    if all(play.admit(SequenceGroup(f"g{seq.seq_id}", [seq])) for seq in seqs):
        again = Sequence(9, bank)
        play.admit(SequenceGroup("again", [again]))
        for order in (seqs, seqs[::-1], [again, *seqs]):
            play.lock.call("get_common_computed_block_ids", order)


def cross_rows(play: Play, cross_first: bool) -> None:
    """Encoder-decoder requests finishing and arriving, so that tables are
    built in rows freed in either order (a cross table can land in the
    first row), each new one at the pool's margin."""
    for i in range(3):
        seq, encoder = Sequence(2 * i + 1, [1] * (i + 2)), Sequence(2 * i + 2, [2] * (2 * BLOCK_SIZE + i))
        group = SequenceGroup(f"e{i}", [seq], encoder)
        if not play.admit(group, count_first=False):
            return
        play.lock.call("get_cross_block_table", group)
        play.lock.call("get_block_table", seq)
        seq.status = SequenceStatus.FINISHED_STOPPED
        if cross_first:
            play.lock.call("free_cross", group)
        play.lock.call("free", seq)
        if not cross_first:
            play.lock.call("free_cross", group)


def adapter_rows(play: Play, count_first: bool) -> None:
    """A LoRA request in the row a longer request of another adapter left,
    its one block filling up in a row step to the tokens of that request's
    first block, cached and computed under the other adapter; beside it in
    the step, after it, a request the tracker holds (the first one it holds
    only if ``count_first``). Their computed blocks, from the row step and
    per sequence."""
    old = Sequence(1, [5] * (2 * BLOCK_SIZE), lora_int_id=2)
    if not play.admit(SequenceGroup("old", [old])):
        return
    play.lock.call("mark_blocks_as_computed", old.group, old.get_len())
    play.free(old)
    new, other = Sequence(2, [5] * (BLOCK_SIZE - 1), lora_int_id=1), Sequence(3, [6] * (BLOCK_SIZE + 1))
    groups = [SequenceGroup("new", [new]), SequenceGroup("other", [other])]
    if play.admit(groups[0], count_first=count_first) and play.admit(groups[1]):
        new.append_token_id(5)
        other.append_token_id(6)
        play.lock.row_step(groups, 0, 9.0)
        play.look(new, other)


def prompt_hits(play: Play, num_tokens: int, count_first: bool) -> None:
    """A request whose prompt's full blocks are all in use by a running
    one (from the pool's first block on), admitted beside it (its cached
    tokens counted first, or not: then ``allocate`` keys the prompt itself):
    it takes a block only for a partial last block."""
    prompt = list(range(1, 3 * BLOCK_SIZE + 1))
    first = Sequence(1, prompt + [9])
    if play.admit(SequenceGroup("first", [first])):
        second = Sequence(2, (prompt + [8])[:num_tokens])
        if play.admit(SequenceGroup("second", [second]), count_first):
            play.look(first, second)


def batch_margin(play: Play, num_new: tuple[int, ...], forked: bool) -> None:
    """Running requests, the last one ``forked`` (two tables sharing its
    blocks), then one unguarded step appending ``num_new[i]`` tokens and
    lookahead slots to request ``i``: the batch takes a different number of
    blocks a row, all or none."""
    groups = [SequenceGroup(f"g{i}", [Sequence(i + 1, [i + 1] * (2 * i + 1))]) for i in range(len(num_new))]
    if not all(play.admit(group) for group in groups):
        return
    last = groups[-1].seqs[0]
    if forked and play.fork(last, len(groups) + 1) is None:
        return
    for group, count in zip(groups, num_new):
        for seq in group.seqs:
            for _ in range(count):
                seq.append_token_id(seq.seq_id)
    play.lock.row_step(groups, BLOCK_SIZE + 1, 5.0, guarded=False)
    play.look(*(seq for group in groups for seq in group.seqs))


def swap_shared(play: Play, how: str) -> None:
    """A request holding the run's first content key, its blocks accessed,
    swapped out and in (``aborted``: freed while swapped out), at the margin
    of the CPU pool (swept with the GPU one): ``alone``; ``forked`` (two
    tables sharing full cached blocks); ``twin`` (another request with the
    same prompt swapped out after it, onto its blocks cached there)."""
    prompt = [1] * (2 * BLOCK_SIZE) + [2]
    seq = Sequence(1, list(prompt))
    groups = [SequenceGroup("a", [seq])]
    if not play.admit(groups[0]):
        return
    play.lock.call("access_all_blocks_in_seq", seq, 1.0)
    if how == "forked" and play.fork(seq, 2) is None:
        return
    if how == "twin":
        groups.append(SequenceGroup("b", [Sequence(3, list(prompt))]))
        if not play.admit(groups[1]):
            return
    swapped = []
    for group in groups:
        play.lock.call("can_swap_out", group)
        if play.lock.call("swap_out", group).raised:
            break
        for s in group.seqs:
            s.status = SequenceStatus.SWAPPED
        swapped.append(group)
        play.lock.call("get_num_free_cpu_blocks")
    for group in swapped:
        if how == "aborted":
            play.free(*group.seqs)
            continue
        play.lock.call("can_swap_in", group, 0)
        if not play.lock.call("swap_in", group).raised:
            for s in group.seqs:
                s.status = RUNNING
            play.look(*group.seqs)


def salts(play: Play, order: int) -> None:
    """One prompt from two tenants and from no tenant, admitted in turn
    (``order`` rotates who comes first): the yardstick gives each its own
    blocks, and every manager must give the same tables."""
    prompt = [3] * (2 * BLOCK_SIZE)
    tenants = ["t1", "t2", None]
    tenants = tenants[order:] + tenants[:order]
    seqs = []
    for i, salt in enumerate(tenants):
        seq = Sequence(i + 1, list(prompt), cache_salt=salt)
        if not play.admit(SequenceGroup(f"r{i}", [seq])):
            return
        seqs.append(seq)
    play.look(*seqs)
    play.lock.call("get_prefix_cache_hit_rate", Device.GPU)


@dataclass(frozen=True)
class Sweep:
    """A shape, the arguments of each of its plays, and the pools it is played on."""

    shape: Callable[..., None]
    variants: list[tuple]  # the shape's arguments, one play each
    config: dict[str, Any]  # the managers' configuration beside the pool sizes
    gpu_sizes: range
    cpu_sizes: range | tuple[int, ...] = (0,)
    needs: str | None = None  # the capability it needs


CACHING = {"enable_caching": True}
SWEEPS = {
    "sweep[shared_writes]": Sweep(shared_writes, [(s, m) for s in (2, 3) for m in (True, False)], CACHING, range(1, 8),
                                  needs="supports_caching"),
    "sweep[shared_writes_plain]": Sweep(shared_writes, [(2, False), (3, False)], {}, range(1, 7)),
    "sweep[copies_in_one_append]": Sweep(copies_in_one_append, [(2,), (3,)], {}, range(1, 8)),
    "sweep[window_jump]": Sweep(window_jump, [(4,), (8,), (9,)], {"sliding_window": 2 * BLOCK_SIZE}, range(6, 13),
                                needs="supports_sliding_window"),
    "sweep[common_prefixes]": Sweep(common_prefixes, [(a, b) for a in (1, 2, 3) for b in (2, 3, 4, 5) if a < b],
                                    CACHING, range(12, 13), needs="supports_caching"),
    "sweep[cross_rows]": Sweep(cross_rows, [(True,), (False,)], {}, range(2, 8), needs="supports_encoder_decoder"),
    "sweep[adapter_rows]": Sweep(adapter_rows, [(True,), (False,)], CACHING, range(5, 7), needs="supports_caching"),
    "sweep[prompt_hits]": Sweep(prompt_hits, [(n, c) for n in (BLOCK_SIZE, 3 * BLOCK_SIZE, 3 * BLOCK_SIZE + 1)
                                              for c in (True, False)], CACHING, range(3, 7), needs="supports_caching"),
    "sweep[batch_margin]": Sweep(batch_margin, [((1, 1, 1), False), ((6, 6, 6), False), ((40, 40, 1), False),
                                                ((40, 40, 1), True)], {}, range(3, 31)),
    "sweep[swap_shared]": Sweep(swap_shared, [("alone",), ("forked",), ("twin",), ("aborted",)], CACHING, range(3, 6),
                                range(0, 6), needs="supports_caching"),
    "sweep[salts]": Sweep(salts, [(0,), (1,), (2,)], CACHING, range(6, 7), needs="supports_caching"),
}  # fmt: skip


def sweep(impls: Mapping[str, Any], name: str) -> int:
    """Every play of the sweep ``name``; returns the number of calls. A
    divergence names the play (its repro is that play alone)."""
    spec = SWEEPS[name]
    num_calls = 0
    for num_gpu_blocks in spec.gpu_sizes:
        for num_cpu_blocks in spec.cpu_sizes:
            for variant in spec.variants:
                play = Play(
                    impls, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks, watermark=0.0, **spec.config
                )
                try:
                    spec.shape(play, *variant)
                except Divergence as failure:
                    where = f"{spec.shape.__name__}{variant} with {num_gpu_blocks} GPU and {num_cpu_blocks} CPU blocks"
                    message, repro = shorten(failure, SHORTEN_SECONDS)
                    raise Divergence(f"in {where}: {message}{REPRO_HEADING}{repro}") from None
                num_calls += play.lock.num_calls
    return num_calls


def sweep_check(impls: Mapping[str, Any], capabilities: Mapping[str, bool], name: str) -> Check:
    """The sweep ``name`` of ``SWEEPS`` as a check; its examples are its plays."""
    spec = SWEEPS[name]
    num_plays = len(spec.gpu_sizes) * len(spec.cpu_sizes) * len(spec.variants)
    return scripted_check(name, spec.needs, capabilities, num_plays, lambda: sweep(impls, name))


def sweep_checks(impls: Mapping[str, Any], capabilities: Mapping[str, bool]) -> list[Check]:
    return [sweep_check(impls, capabilities, name) for name in SWEEPS]
