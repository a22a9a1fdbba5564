"""The scheduler's moves, as the explorer enumerates them (spec §16).

``World`` is the scheduler's side of a state: its requests (our own
``SequenceGroup``s, in arrival order), the counts of arrivals and
preemptions the scope bounds, and a clock. ``moves(world, latest_time)``
lists every move enabled in a state, in a fixed order, as plain tuples (a
path of them replays a state); ``make(move, world, lock)`` plays one: the
world changes it makes, then its manager calls through ``lock``, which
compares every answer (``explore.LeanLock`` while exploring, a ``Lockstep``
when a failing path is replayed as a repro).

Each world change goes through one ``World`` method. ``ScriptedWorld``
makes the same changes by executing a line of Python in a ``Script``, so a
replayed path prints as the runnable script of exactly what ran.

The moves (``PLAYS`` maps each name to its play):

* ``arrive(prompt, n[, encoder[, lora[, salt]]])``: a request with one of the
  scope's prompts and ``n`` WAITING sequences (and an encoder prompt, for
  encoder-decoder; a LoRA id of the scope's ``adapters`` other than 0; and
  a cache salt ``"t<salt>"`` of the scope's ``salts`` other than 0, which
  every sequence carries);
* ``admit(request, lookahead)``: (caching) ``get_num_cached_tokens`` of the
  WAITING sequences, ``can_allocate``; OK: ``allocate``, RUNNING; LATER:
  ``remove_seq_from_computed_blocks_tracker``, then all of it once more (the
  next step's asking); NEVER: FINISHED_IGNORED;
  ``force(request)``: ``allocate`` without asking (works or fails cleanly);
  ``abort(request)``: a WAITING request given up;
* ``append(seq, token, lookahead, now[, count])``: the model computes the
  sequence and samples ``token`` (``count`` times: the scope's
  ``new_tokens``; none: a running prefill's later chunk); the next step
  asks ``can_append_slots`` and makes ``append_slots`` whatever the
  answer (it works or fails cleanly); with
  caching it then stamps the sequence at ``now`` (None: a new time, else
  the latest time the state holds, as one step stamps all its sequences
  with one time), asks its group's common computed blocks and marks them;
* ``step(token, lookahead, guarded, way[, count])``: a decode step of every running
  group whose tables are not empty, each sequence sampling ``token``
  (``count`` times: the scope's ``step_tokens``), made
  at once ``way`` (``"rows"``: the row API; ``"batch"``: the batched calls)
  where a manager offers it and through the per-sequence calls elsewhere
  (``steps.py``; ``guarded``: only if every group fits), then with caching
  each group's marking;
* ``fork(seq)``, ``free(seq)``, ``recompute(request)``, ``swap_out(request)``
  (``can_swap_out`` first, then the swap whatever it said) and
  ``swap_in(request, lookahead)`` (likewise with ``can_swap_in``);
* ``reset(device)`` (without caching too, where it answers True); with
  caching and the scope's ``free_calls`` also
  ``access(seq, now)``, ``count(seq)``, ``untrack(seq)``, ``mark(request)``
  and ``common(request)`` (``"*"``: every running sequence) on their own;
* ``illegal(kind)``: a call the protocol forbids (``ILLEGAL``); it must
  raise the same error everywhere and change nothing;
* ``track``: the scheduler starts keeping a device block table, where a
  manager offers one (``table_delta``; ``World.offers_device``). From then
  on, after every move that changes the state, each such manager's deltas
  alone must rebuild its running tables (``keep_device_tables``; a move
  that changes nothing leads nowhere new, as its state is the one before).
  Why a move and not a setting: a table tracked from the start and one
  whose tracking starts on a full pool take different paths (the first
  delta copies every live row), and a scheduler that never tracks must see
  nothing of the write log.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from blockspace.conformance import invariants
from blockspace.conformance.scope import Scope
from blockspace.conformance.script import Script
from blockspace.conformance.steps import WAYS
from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.sequence import Sequence, SequenceGroup

RUNNING, SWAPPED, WAITING = SequenceStatus.RUNNING, SequenceStatus.SWAPPED, SequenceStatus.WAITING
Move = tuple  # ("name", *arguments): plain data, so a path pickles and prints
ILLEGAL = (
    "append_unknown", "table_unknown", "append_swapped", "bad_lookahead", "append_negative",
    "allocate_twin", "allocate_running", "fork_onto_live", "bad_token", "bad_append", "bad_device",
    "encoder_unsupported", "empty_shared", "access_unknown",
)  # fmt: skip
# Prompts that hold a value that is no token id: a negative one, one that is no int, and True (an
# int to Python): short, and long enough (over 32 tokens) for the fast manager's vectorised check.
BAD_PROMPTS: tuple[list[Any], ...] = ([1, -1, 2], [1, 0.5], [True, 2], [2] * 40 + [True])
BAD_LOOKAHEADS = (-1, 1.5)
# New tokens that hold a value that is no token id, appended to a running sequence's: the first of two
# (a check of the last token alone lets it through), two floats (no int among them to send the
# per-token path to the full check), and one bad token alone, as a decode step samples it.
BAD_APPENDS: tuple[list[Any], ...] = ([-1, 2], [0.5, 1.5], [-1])


SEQ_IDS = 10  # request k's sequences are 10k, 10k+1, ... and its encoder 10k+9


def child_id(group: SequenceGroup) -> int:
    """A fork's id: the next of its request's. Why per request: with one
    counter for all, two requests forking in either order would give the
    same state two names."""
    return group.seqs[0].seq_id + len(group.seqs)


class World:
    """The scheduler's side of a state (see the module docstring)."""

    def __init__(self, scope: Scope, offers_device: bool = False) -> None:
        self.scope = scope
        self.offers_device = offers_device  # may the scheduler keep a device table (the ``track`` move)?
        self.tracking = False  # does it keep one now?
        self.groups: dict[str, SequenceGroup] = {}  # unfinished requests, in arrival order
        self.num_requests = 0  # arrivals so far
        self.num_preemptions = 0  # swap-outs and recomputes so far
        self.clock = 1.0  # the next new access time (times only ever grow)
        self.written: dict[int, int] = {}  # seq_id -> tokens its table holds (for the invariants)
        self.dropped: dict[int, int] = {}  # seq_id -> leading entries a sliding window dropped

    # -- the world changes (ScriptedWorld makes each from a line of Python) -------------
    def new_request(
        self, prompt: list[int], n: int, encoder: list[int] | None, lora: int = 0, salt: str | None = None
    ) -> SequenceGroup:
        self.num_requests += 1
        first = SEQ_IDS * self.num_requests
        ids = [first + i for i in range(n)] + ([first + SEQ_IDS - 1] if encoder is not None else [])
        group = self.make_group(f"g{self.num_requests}", ids, prompt, encoder, lora=lora, salt=salt)
        self.groups[group.request_id] = group
        return group

    def make_group(
        self,
        request_id: str,
        ids: list[int],
        prompt: list[int],
        encoder: list[int] | None,
        name: str = "s",
        lora: int = 0,
        salt: str | None = None,
    ) -> SequenceGroup:
        """A group of new sequences (``name``: what a script calls them; a
        throw-away for a forbidden call is ``x<id>``)."""
        decoder_ids = ids[: len(ids) - (encoder is not None)]
        seqs = [Sequence(seq_id, prompt, lora_int_id=lora, cache_salt=salt) for seq_id in decoder_ids]
        return SequenceGroup(request_id, seqs, Sequence(ids[-1], encoder) if encoder is not None else None)

    def set_status(self, seqs: list[Any], status: SequenceStatus, name: str = "s") -> None:
        """``name``: what a script calls the sequences (``ScriptedWorld``)."""
        for seq in seqs:
            seq.status = status

    def sample(self, seq: Any, token: int) -> None:
        """The model step: every token computed, ``token`` sampled."""
        seq.data.update_num_computed_tokens(seq.data.get_num_uncomputed_tokens())
        seq.append_token_id(token)

    def fork_seq(self, parent: Any) -> Any:
        child = parent.fork(child_id(parent.group))
        parent.group.add(child)
        return child

    def reset_for_recompute(self, seq: Any) -> None:
        seq.data.reset_state_for_recompute()

    # -- reading it ------------------------------------------------------------------------
    def seqs(self, *statuses: SequenceStatus) -> list[Any]:
        return [s for g in self.groups.values() for s in g.seqs if s.status in statuses]

    def seq(self, seq_id: int) -> Any:
        return next(s for g in self.groups.values() for s in g.seqs if s.seq_id == seq_id)

    def with_status(self, status: SequenceStatus) -> list[SequenceGroup]:
        return [g for g in self.groups.values() if g.get_seqs(status=status)]

    def row_groups(self) -> list[SequenceGroup]:
        """Running groups whose running sequences all have a non-empty table:
        what an array-level scheduler batches in one step."""
        return [
            g for g in self.with_status(RUNNING) if all(self.written.get(s.seq_id) for s in g.get_seqs(status=RUNNING))
        ]

    def live(self, group: SequenceGroup) -> list[Any]:
        return [s for s in group.seqs if not s.is_finished()]

    def wrote(self, seq: Any) -> None:
        """The table now holds every token of ``seq`` (a sliding window
        dropped the entries before ``computed // bs - window blocks``)."""
        self.written[seq.seq_id] = seq.get_len()
        window = self.scope.sliding_window
        if window is not None:
            drops = seq.data.get_num_computed_tokens() // self.scope.block_size - (window // self.scope.block_size + 2)
            self.dropped[seq.seq_id] = max(self.dropped.get(seq.seq_id, 0), drops)

    def forget(self, seq: Any) -> None:
        self.written.pop(seq.seq_id, None)
        self.dropped.pop(seq.seq_id, None)

    def invariant_world(self) -> invariants.World:
        """The view ``invariants.check_snapshot`` takes."""
        scope = self.scope
        return invariants.World(
            scope.block_size, scope.num_gpu_blocks, scope.num_cpu_blocks, scope.enable_caching, scope.sliding_window,
            max(scope.lookaheads), {s.seq_id: s for s in self.seqs(RUNNING, SWAPPED)}, dict(self.written),
            {g.request_id: g.encoder_seq for g in self.groups.values()
             if g.is_encoder_decoder() and g.get_seqs(status=RUNNING) + g.get_seqs(status=SWAPPED)},
            dict(self.dropped),
        )  # fmt: skip

    def close_if_done(self, group: SequenceGroup, lock: Any) -> None:
        """A request whose sequences have all finished leaves the world
        (its cross table is freed first)."""
        if all(s.is_finished() for s in group.seqs):
            if group.is_encoder_decoder():
                lock.call("free_cross", group)
            del self.groups[group.request_id]

    def state(self) -> tuple:
        """Everything of the world that decides what may happen next (the
        explorer's canonical form takes it whole, beside the snapshot)."""
        requests = tuple(
            (g.request_id, tuple(g.encoder_seq.get_token_ids()) if g.encoder_seq is not None else None,
             tuple((s.seq_id, s.status.value, s.lora_int_id, s.cache_salt, tuple(s.get_token_ids()),
                    s.data._num_computed_tokens, s.data._num_output_tokens, s.data._is_decoding) for s in g.seqs))
            for g in self.groups.values()
        )  # fmt: skip
        return requests, self.num_requests, self.num_preemptions, self.tracking


class ScriptedWorld(World):
    """The same world, each change executed from its own line of a ``Script``
    (names ``s<seq_id>`` and the request ids), so a replay prints as what ran."""

    def __init__(self, scope: Scope, script: Script) -> None:
        super().__init__(scope)
        self.script = script

    def make_group(
        self,
        request_id: str,
        ids: list[int],
        prompt: list[int],
        encoder: list[int] | None,
        name: str = "s",
        lora: int = 0,
        salt: str | None = None,
    ) -> SequenceGroup:
        decoder_ids = ids[: len(ids) - (encoder is not None)]
        adapter = (f", lora_int_id={lora}" if lora else "") + (f", cache_salt={salt!r}" if salt is not None else "")
        for seq_id in decoder_ids:
            self.script.do(f"{name}{seq_id} = Sequence({seq_id}, {prompt!r}{adapter})")
        cross = ""
        if encoder is not None:
            self.script.do(f"{name}{ids[-1]} = Sequence({ids[-1]}, {encoder!r})")
            cross = f", {name}{ids[-1]}"
        names = ", ".join(f"{name}{seq_id}" for seq_id in decoder_ids)
        self.script.do(f"{request_id} = SequenceGroup({request_id!r}, [{names}]{cross})")
        return self.script.get(request_id)

    def set_status(self, seqs: list[Any], status: SequenceStatus, name: str = "s") -> None:
        for seq in seqs:
            self.script.do(f"{name}{seq.seq_id}.status = SequenceStatus.{status.name}")

    def sample(self, seq: Any, token: int) -> None:
        uncomputed = seq.data.get_num_uncomputed_tokens()
        self.script.do(f"s{seq.seq_id}.data.update_num_computed_tokens({uncomputed})")
        self.script.do(f"s{seq.seq_id}.append_token_id({token})")

    def fork_seq(self, parent: Any) -> Any:
        new_id = child_id(parent.group)
        self.script.do(f"s{new_id} = s{parent.seq_id}.fork({new_id}); {parent.group.request_id}.add(s{new_id})")
        return self.script.get(f"s{new_id}")

    def reset_for_recompute(self, seq: Any) -> None:
        self.script.do(f"s{seq.seq_id}.data.reset_state_for_recompute()")


# -- which moves are enabled --------------------------------------------------------------------
def moves(world: World, latest_time: float | None) -> list[Move]:
    """Every move enabled in this state, in a fixed order. ``latest_time``:
    the latest access time the managers' state holds (None: none), which an
    ``access`` may tie with. Why from the state and not the clock: the
    latest time handed out may have left the state (its blocks evicted),
    and two states the explorer merges must offer the same moves."""
    scope = world.scope
    return [
        *_arrivals(world, scope),
        *_admissions(world, scope),
        *_running_moves(world, scope, latest_time),
        *_steps(world, scope),
        *_swapped_moves(world, scope),
        *_pool_moves(world, scope),
    ]


def _arrivals(world: World, scope: Scope) -> Iterator[Move]:
    """A request of every kind the scope makes, while it bounds them."""
    if world.num_requests >= scope.max_requests:
        return
    encoders = range(len(scope.prompts)) if scope.encoder_decoder else (None,)
    for p, n, e, lora, salt in itertools.product(range(len(scope.prompts)), scope.samples, encoders, scope.adapters,
                                                scope.salts):  # fmt: skip
        tail: tuple[Any, ...] = (e, lora, salt)
        while tail and tail[-1] == ARRIVE_DEFAULTS[len(tail) - 1]:  # the defaults left off, as a path prints
            tail = tail[:-1]
        yield ("arrive", p, n, *tail)


def _admissions(world: World, scope: Scope) -> Iterator[Move]:
    for group in world.with_status(WAITING):
        yield from (("admit", group.request_id, la) for la in scope.lookaheads)
        yield ("force", group.request_id)
        yield ("abort", group.request_id)


def _running_moves(world: World, scope: Scope, latest_time: float | None) -> Iterator[Move]:
    """Each running group's: its sequences' moves, then the group's own."""
    free_calls = scope.enable_caching and scope.free_calls
    can_preempt = world.num_preemptions < scope.max_preemptions
    for group in world.with_status(RUNNING):
        for seq in group.get_seqs(status=RUNNING):
            yield from _appends(seq, scope, latest_time)
            if free_calls:
                yield from _free_calls(seq, latest_time)
            if len(group.seqs) < scope.max_seqs:
                yield ("fork", seq.seq_id)
            yield ("free", seq.seq_id)
        if free_calls:
            yield ("mark", group.request_id)
            yield ("common", group.request_id)
        if can_preempt and scope.num_cpu_blocks:
            yield ("swap_out", group.request_id)
        if can_preempt and len(world.live(group)) == 1:
            yield ("recompute", group.request_id)


def _appends(seq: Sequence, scope: Scope, latest_time: float | None) -> Iterator[Move]:
    """A running sequence's appends: each count of new tokens that stays within ``max_len``."""
    times = (None, latest_time) if scope.enable_caching and latest_time is not None else (None,)
    for count in (k for k in scope.new_tokens if seq.get_len() + k <= scope.max_len):
        tokens = scope.alphabet if count else scope.alphabet[:1]  # sampling none, the token is not read
        yield from (("append", seq.seq_id, t, la, now, *((count,) if count != 1 else ()))
                    for t in tokens for la in scope.lookaheads for now in times)  # fmt: skip


def _free_calls(seq: Sequence, latest_time: float | None) -> Iterator[Move]:
    """The calls a scope with ``free_calls`` makes on a running sequence on their own."""
    yield ("access", seq.seq_id, None)
    if latest_time is not None:
        yield ("access", seq.seq_id, latest_time)
    yield ("count", seq.seq_id)
    yield ("untrack", seq.seq_id)


def _steps(world: World, scope: Scope) -> Iterator[Move]:
    """Decode steps of every running group at once, while the longest sequence stays within ``max_len``."""
    row_groups = world.row_groups()
    longest = max((s.get_len() for g in row_groups for s in g.get_seqs(status=RUNNING)), default=None)
    if longest is None:
        return
    for count in (k for k in scope.step_tokens if longest + k <= scope.max_len):
        tokens = scope.alphabet if count else scope.alphabet[:1]
        yield from (("step", t, la, guarded, way, *((count,) if count != 1 else ())) for t in tokens
                    for la in scope.lookaheads for guarded in (True, False) for way in WAYS)  # fmt: skip


def _swapped_moves(world: World, scope: Scope) -> Iterator[Move]:
    for group in world.with_status(SWAPPED):
        yield from (("swap_in", group.request_id, la) for la in scope.lookaheads)
        for seq in group.get_seqs(status=SWAPPED):
            if len(group.seqs) < scope.max_seqs:
                yield ("fork", seq.seq_id)
            yield ("free", seq.seq_id)


def _pool_moves(world: World, scope: Scope) -> Iterator[Move]:
    """The moves on no one request: the common blocks of all, the resets, the forbidden calls, the tracking."""
    if scope.enable_caching and scope.free_calls and len(world.seqs(RUNNING)) > 1:
        yield ("common", "*")
    yield from (("reset", device) for device in (None, "GPU", "CPU"))  # without caching too: it answers True
    yield from (("illegal", kind) for kind in ILLEGAL if _illegal_enabled(world, kind))
    if world.offers_device and not world.tracking:
        yield ("track",)


ARRIVE_DEFAULTS = (None, 0, 0)  # ``arrive``'s encoder, LoRA id and salt when left off


def _illegal_enabled(world: World, kind: str) -> bool:
    scope = world.scope
    if kind == "append_swapped":
        return bool(world.seqs(SWAPPED))
    if kind in ("append_negative", "allocate_twin", "bad_append"):
        return bool(world.seqs(RUNNING))
    if kind == "bad_lookahead":
        return bool(world.groups)
    if kind == "allocate_running":
        return any(not g.get_seqs(status=WAITING) for g in world.with_status(RUNNING))
    if kind == "fork_onto_live":
        return len(world.seqs(RUNNING, SWAPPED)) >= 2
    if kind == "encoder_unsupported":
        return scope.enable_caching or scope.sliding_window is not None
    return True


# -- playing one ----------------------------------------------------------------------------
def make(move: Move, world: World, lock: Any) -> None:
    """Play ``move``: its world changes, and its manager calls through ``lock``."""
    name, *args = move
    PLAYS[name](world, lock, *args)


def keep_device_tables(world: World, lock: Any) -> None:
    """After a move, once the scheduler keeps device tables (``track``):
    each manager's deltas must rebuild its running tables."""
    if world.tracking:
        lock.device_tables(world.with_status(RUNNING))


def _arrive(
    world: World, lock: Any, prompt: int, n: int, encoder: int | None = None, lora: int = 0, salt: int = 0
) -> None:
    prompts = world.scope.prompts
    world.new_request(
        prompts[prompt], n, prompts[encoder] if encoder is not None else None, lora, f"t{salt}" if salt else None
    )


def _admit(world: World, lock: Any, request_id: str, lookahead: int) -> None:
    """Admission as vLLM's scheduler asks it, and a request turned away
    (LATER) asked once more, as the next step asks it with nothing changed
    between. Why in one move: the state after LATER is the state before the
    asking (the tracker forgets the request), so the explorer would merge
    the two and never ask again from what the first asking left behind
    (the fast manager parks the request's tracker row for that second
    asking)."""
    group = world.groups[request_id]
    waiting = group.get_seqs(status=WAITING)
    for _ in range(2):
        if world.scope.enable_caching:
            for seq in waiting:
                lock.call("get_num_cached_tokens", seq)
        status = lock.call("can_allocate", group, lookahead)
        if status.raised:
            return
        if status.value == AllocStatus.OK:
            _allocate(world, lock, group)
            return
        if world.scope.enable_caching:
            for seq in waiting:
                lock.call("remove_seq_from_computed_blocks_tracker", seq)
        if status.value == AllocStatus.NEVER:
            world.set_status(waiting, SequenceStatus.FINISHED_IGNORED)
            world.close_if_done(group, lock)
            return


def _allocate(world: World, lock: Any, group: SequenceGroup) -> None:
    waiting = group.get_seqs(status=WAITING)
    if not lock.call("allocate", group).raised:
        world.set_status(waiting, RUNNING)
        for seq in waiting:
            world.wrote(seq)


def _force(world: World, lock: Any, request_id: str) -> None:
    _allocate(world, lock, world.groups[request_id])


def _abort(world: World, lock: Any, request_id: str) -> None:
    group = world.groups[request_id]
    live = world.live(group)
    world.set_status(live, SequenceStatus.FINISHED_ABORTED)
    for seq in live:
        lock.call("free", seq)
        world.forget(seq)
    world.close_if_done(group, lock)


def _append(
    world: World, lock: Any, seq_id: int, token: int, lookahead: int, now: float | None, count: int = 1
) -> None:
    """One decode step of one sequence, as vLLM's scheduler makes it; with
    caching also its access at a new time or at the state's latest one
    (``now``: a step stamps all its sequences with one time), its group's
    common computed blocks, and their marking."""
    seq = world.seq(seq_id)
    for _ in range(count):
        world.sample(seq, token)
    lock.call("can_append_slots", seq.group, lookahead)
    if lock.call("append_slots", seq, lookahead).raised:
        return
    world.wrote(seq)
    lock.call("get_block_table", seq)
    if world.scope.enable_caching:
        _access(world, lock, seq_id, now)
        _common(world, lock, seq.group.request_id)
        _mark(world, lock, seq.group.request_id)


def _step(world: World, lock: Any, token: int, lookahead: int, guarded: bool, way: str, count: int = 1) -> None:
    """One decode step of the row groups, as an array-level scheduler makes
    it (``Lockstep.row_step``), at a new time; each sequence samples
    ``count`` tokens (none: a running prefill's later chunk)."""
    groups = world.row_groups()
    seqs = [s for g in groups for s in g.get_seqs(status=RUNNING)]
    for seq in seqs:
        for _ in range(count):
            world.sample(seq, token)
    now, world.clock = world.clock, world.clock + 1.0
    outcome = lock.row_step(groups, lookahead, now, guarded, way)
    if outcome.raised or not outcome.value[0]:
        return
    for seq in seqs:
        world.wrote(seq)
    if world.scope.enable_caching:
        for group in groups:
            _mark(world, lock, group.request_id)


def _access(world: World, lock: Any, seq_id: int, tie: float | None) -> None:
    now = tie
    if now is None:
        now, world.clock = world.clock, world.clock + 1.0
    lock.call("access_all_blocks_in_seq", world.seq(seq_id), now)


def _fork(world: World, lock: Any, seq_id: int) -> None:
    parent = world.seq(seq_id)
    child = world.fork_seq(parent)
    if lock.call("fork", parent, child).raised:
        world.set_status([child], SequenceStatus.FINISHED_ABORTED)
        return
    if parent.seq_id in world.written:
        world.written[child.seq_id] = world.written[parent.seq_id]
        world.dropped[child.seq_id] = world.dropped.get(parent.seq_id, 0)
    if world.scope.enable_caching:
        lock.call("get_num_cached_tokens", child)


def _free(world: World, lock: Any, seq_id: int) -> None:
    seq = world.seq(seq_id)
    world.set_status([seq], SequenceStatus.FINISHED_STOPPED)
    lock.call("free", seq)
    world.forget(seq)
    world.close_if_done(seq.group, lock)


def _recompute(world: World, lock: Any, request_id: str) -> None:
    group = world.groups[request_id]
    seq = group.get_seqs(status=RUNNING)[0]
    world.num_preemptions += 1
    world.set_status([seq], WAITING)
    lock.call("free", seq)
    world.forget(seq)
    world.reset_for_recompute(seq)
    if group.is_encoder_decoder():
        lock.call("free_cross", group)


def _swap(
    world: World, lock: Any, group: SequenceGroup, method: str, status: SequenceStatus, to: SequenceStatus
) -> None:
    seqs = group.get_seqs(status=status)
    if not lock.call(method, group).raised:
        world.set_status(seqs, to)


def _swap_out(world: World, lock: Any, request_id: str) -> None:
    group = world.groups[request_id]
    world.num_preemptions += 1
    lock.call("can_swap_out", group)
    _swap(world, lock, group, "swap_out", RUNNING, SWAPPED)


def _swap_in(world: World, lock: Any, request_id: str, lookahead: int) -> None:
    group = world.groups[request_id]
    lock.call("can_swap_in", group, lookahead)
    _swap(world, lock, group, "swap_in", SWAPPED, RUNNING)


def _mark(world: World, lock: Any, request_id: str) -> None:
    lock.call("mark_blocks_as_computed", world.groups[request_id], 1)


def _common(world: World, lock: Any, request_id: str) -> None:
    seqs = world.seqs(RUNNING) if request_id == "*" else world.groups[request_id].get_seqs(status=RUNNING)
    lock.call("get_common_computed_block_ids", seqs)


def _count(world: World, lock: Any, seq_id: int) -> None:
    lock.call("get_num_cached_tokens", world.seq(seq_id))


def _untrack(world: World, lock: Any, seq_id: int) -> None:
    lock.call("remove_seq_from_computed_blocks_tracker", world.seq(seq_id))


def _reset(world: World, lock: Any, device: str | None) -> None:
    if device is None:
        lock.call("reset_prefix_cache")
    else:
        lock.call("reset_prefix_cache", Device[device])


def _illegal(world: World, lock: Any, kind: str) -> None:
    """A call the protocol forbids, on throw-away objects where it needs one
    (they get ids no request of the scope reaches)."""
    running, swapped = world.seqs(RUNNING), world.seqs(SWAPPED)
    stranger = 10_000
    if kind == "append_unknown":
        lock.call("append_slots", world.make_group("bad", [stranger], [1, 2], None, "x").seqs[0], 0)
    elif kind == "table_unknown":
        lock.call("get_block_table", world.make_group("bad", [stranger], [1], None, "x").seqs[0])
    elif kind == "append_swapped":
        lock.call("append_slots", swapped[0], 0)
    elif kind == "bad_lookahead":  # each question's own check (fast's skips it for a plain int >= 0)
        group = next(iter(world.groups.values()))
        for method in ("can_allocate", "can_append_slots", "can_swap_in"):
            for lookahead in BAD_LOOKAHEADS:
                lock.call(method, group, lookahead)
    elif kind == "append_negative":
        for lookahead in BAD_LOOKAHEADS:
            lock.call("append_slots", running[0], lookahead)
    elif kind == "allocate_twin":
        twin = running[0]
        lock.call("allocate", world.make_group("bad", [twin.seq_id], list(twin.get_token_ids()), None, "x"))
    elif kind == "allocate_running":
        lock.call("allocate", next(g for g in world.with_status(RUNNING) if not g.get_seqs(status=WAITING)))
    elif kind == "fork_onto_live":
        parent, child = world.seqs(RUNNING, SWAPPED)[:2]
        lock.call("fork", parent, child)
    elif kind == "bad_token":
        for prompt in BAD_PROMPTS:
            lock.call("allocate", world.make_group("bad", [stranger], prompt, None, "x"))
    elif kind == "bad_append":  # a twin of a running sequence, its tokens and bad new ones, on its table
        seq = running[0]
        for tokens in BAD_APPENDS:
            twin = world.make_group("bad", [seq.seq_id], list(seq.get_token_ids()) + tokens, None, "x")
            lock.call("append_slots", twin.seqs[0], 0)
        world.set_status(twin.seqs, RUNNING, "x")  # the last, one bad token: a decode step, batched too
        lock.row_step([twin], 0, world.clock, False, "batch")
    elif kind == "bad_device":
        lock.call("get_prefix_cache_hit_rate", "tpu")
    elif kind == "encoder_unsupported":
        group = world.make_group("bad", [stranger, stranger + 1], [1, 2], [3], "x")
        lock.call("can_allocate", group)
        lock.call("allocate", group)
    elif kind == "empty_shared":  # one table cannot be shared when it has no block
        lock.call("allocate", world.make_group("bad", [stranger, stranger + 1], [], None, "x"))
    elif kind == "access_unknown":
        lock.call("access_all_blocks_in_seq", world.make_group("bad", [stranger], [1], None, "x").seqs[0], 0.5)


def _track(world: World, lock: Any) -> None:
    world.tracking = True  # the first ``device_tables`` (``keep_device_tables``) starts each manager's deltas


def edge_lookaheads(scope: Scope, num_tokens: int) -> list[int]:
    """The scope's lookaheads, and those that bring ``num_tokens`` tokens to
    exactly 1, 2, ... blocks, up to one block past the GPU pool: every need
    an answer can turn on (the watermark's NEVER, the free blocks' LATER),
    asked without adding a state."""
    bs = scope.block_size
    edges = (k * bs - num_tokens for k in range(1, scope.num_gpu_blocks + 2))
    return sorted(set(scope.lookaheads).union(la for la in edges if la >= 0))


PLAYS: dict[str, Callable[..., None]] = {  # a move's name -> its play (world, lock, *its arguments)
    "arrive": _arrive, "admit": _admit, "force": _force, "abort": _abort, "append": _append, "step": _step,
    "access": _access, "fork": _fork, "free": _free, "recompute": _recompute, "swap_out": _swap_out,
    "swap_in": _swap_in, "mark": _mark, "common": _common, "count": _count, "untrack": _untrack,
    "reset": _reset, "illegal": _illegal, "track": _track,
}  # fmt: skip


def observe(world: World, lock: Any) -> None:
    """Every question that changes nothing, asked in a state when it is first
    reached: admission, append and swap answers at each lookahead and at
    the pool's edges (``edge_lookaheads``), admission also with the
    lookahead left to its default, tables (one by one and as one
    array of the running ones), hit rates, without caching the tracker's
    calls (then 0 and nothing; with caching they change the tracker, and
    are moves: ``count``, ``untrack``), and the
    row API at its edges where a manager offers it (the free counts come
    with the invariants: ``explore.check_state``, ``Lockstep.verify``)."""
    for status, question in ((WAITING, "can_allocate"), (RUNNING, "can_append_slots"), (SWAPPED, "can_swap_in")):
        for group in world.with_status(status):
            if question == "can_allocate":  # the one of the three whose lookahead has a default (none)
                lock.call(question, group, quiet=True)
            for la in edge_lookaheads(world.scope, max(s.get_len() for s in group.get_seqs(status=status))):
                lock.call(question, group, la, quiet=True)
            if status == RUNNING:
                lock.call("can_swap_out", group, quiet=True)
    for seq in world.seqs(RUNNING, SWAPPED):
        lock.call("get_block_table", seq, quiet=True)
        if not world.scope.enable_caching:
            lock.call("get_num_cached_tokens", seq, quiet=True)
            lock.call("remove_seq_from_computed_blocks_tracker", seq, quiet=True)
    if running := world.seqs(RUNNING):
        lock.table_arrays(running, quiet=True)
    for request_id in world.invariant_world().encoders:
        lock.call("get_cross_block_table", world.groups[request_id], quiet=True)
    for device in (Device.GPU, Device.CPU):
        lock.call("get_prefix_cache_hit_rate", device, quiet=True)
    if lock.offers_rows and (row_groups := world.row_groups()):
        lock.row_misuse([s for g in row_groups for s in g.get_seqs(status=RUNNING)])
