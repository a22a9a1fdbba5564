"""A Hypothesis state machine that plays the v0 scheduler against N managers.

The rules follow the scheduler's legal call protocol (spec §16): admission
(``get_num_cached_tokens`` -> ``can_allocate`` -> ``allocate``), decode and
chunked-prefill steps (``can_append_slots`` -> ``append_slots`` with and
without lookahead -> ``get_block_table``/``access_all_blocks_in_seq`` ->
``get_common_computed_block_ids`` -> ``mark_blocks_as_computed``), forks
(n>1 sampling, beam search), preemption by recompute and by swap (with and
without asking ``can_swap_*`` first), finishing and aborting, plus cache
queries, hit rates and resets. ``illegal`` makes calls the protocol forbids;
they must fail with the same error everywhere and change nothing.

Every call goes through a ``Lockstep`` (same answers, same state) and every
step ends with the invariants of ``invariants.py``. The scheduler's world
(sequences, statuses, tokens) lives in a ``Script``, so a failure prints the
shrunk run as a runnable snippet.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from blockspace.conformance import invariants
from blockspace.conformance.configs import Config, family_configs
from blockspace.conformance.lockstep import REPRO_HEADING, Divergence, Lockstep
from blockspace.conformance.protocol import BAD_APPENDS, BAD_LOOKAHEADS, BAD_PROMPTS
from blockspace.conformance.script import Script
from blockspace.conformance.steps import WAYS, calls_step
from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.errors import NoFreeBlocksError

RUNNING, SWAPPED, WAITING = SequenceStatus.RUNNING, SequenceStatus.SWAPPED, SequenceStatus.WAITING
MAX_LIVE_GROUPS = 4

# Prompts are prefixes of a few fixed token lists, so that with prefix caching
# requests share full blocks at every block size.
PROMPT_BANK = (
    [(7 * i) % 5 for i in range(96)],
    [(7 * i) % 5 for i in range(20)] + [(3 * i) % 4 for i in range(76)],
    [1] * 96,
)


def appending(seq: Any) -> Callable[[Any, int], Any]:
    """``append(manager, slots)`` of ``seq``, for ``ConformanceMachine.edge_lookahead``."""
    return lambda trial, slots: trial.append_slots(seq, slots)


class ConformanceMachine(RuleBasedStateMachine):
    """Base machine; ``machine_for`` makes a runnable subclass with the
    implementations and the configuration family filled in."""

    impls: Mapping[str, Any] = {}
    runs: list[Config] = []  # configurations of the examples run (shared per subclass)
    on_failure: Any = None  # called with the message of every failure found (check.run_machine)

    def __init__(self) -> None:
        super().__init__()
        # Made by setup, the machine's initialize rule (Hypothesis runs it before any other rule;
        # only the invariants and teardown look before it): read through the properties below.
        self._lock: Lockstep | None = None
        self._script: Script | None = None
        self._config: Config | None = None
        self._world: invariants.World | None = None
        self.groups: dict[str, Any] = {}  # request_id -> unfinished SequenceGroup
        self.all_seqs: list[Any] = []
        self.ledgers: dict[str, invariants.ContentLedger] = {}
        self.clock = 1.0
        self.num_seqs = 0
        self.num_groups = 0
        self.num_scratch = 0
        self.forbidden_step = False  # the last rule made only calls that must fail and change nothing

    # -- setup -------------------------------------------------------------------------
    def setup(self, config: Config) -> None:
        self._config = config
        kwargs = config.manager_kwargs()
        self._script = Script(self.impls, kwargs)
        self._lock = Lockstep.build(self.impls, self._script, **kwargs)
        self._lock.on_failure = type(self).on_failure
        self._world = invariants.World(
            config.block_size,
            config.num_gpu_blocks,
            config.num_cpu_blocks,
            config.enable_caching,
            config.sliding_window,
            config.max_lookahead,
        )
        self.ledgers = {name: invariants.ContentLedger() for name in self._lock.snapshotting}
        type(self).runs.append(config)

    @property
    def lock(self) -> Lockstep:
        assert self._lock is not None, "setup() has not run"
        return self._lock

    @property
    def script(self) -> Script:
        assert self._script is not None, "setup() has not run"
        return self._script

    @property
    def config(self) -> Config:
        assert self._config is not None, "setup() has not run"
        return self._config

    @property
    def world(self) -> invariants.World:
        assert self._world is not None, "setup() has not run"
        return self._world

    # -- the world (every change goes through the script) ------------------------------
    def do(self, code: str) -> None:
        self.script.do(code)

    def seq(self, seq_id: int) -> Any:
        return self.script.get(f"s{seq_id}")

    def set_status(self, seqs: list[Any], status: SequenceStatus) -> None:
        for seq in seqs:
            self.do(f"s{seq.seq_id}.status = SequenceStatus.{status.name}")

    def new_seq(self, tokens: list[int], lora: int = 0, salt: str | None = None) -> Any:
        self.num_seqs += 1
        seq_id = self.num_seqs
        options = (f", lora_int_id={lora}" if lora else "") + (f", cache_salt={salt!r}" if salt else "")
        self.do(f"s{seq_id} = Sequence({seq_id}, {tokens!r}{options})")
        self.all_seqs.append(self.seq(seq_id))
        return self.seq(seq_id)

    def scratch(self, code: str) -> Any:
        """A throw-away object for an illegal call, named ``x<n>`` in the script."""
        self.num_scratch += 1
        self.do(f"x{self.num_scratch} = {code}")
        return self.script.get(f"x{self.num_scratch}")

    def live(self, *statuses: SequenceStatus) -> list[Any]:
        return [s for g in self.groups.values() for s in g.get_seqs() if s.status in statuses]

    def groups_with(self, status: SequenceStatus) -> list[Any]:
        return [g for g in self.groups.values() if g.get_seqs(status=status)]

    def forget(self, seq: Any) -> None:
        self.world.seqs.pop(seq.seq_id, None)
        self.world.written.pop(seq.seq_id, None)
        self.world.dropped.pop(seq.seq_id, None)

    def finish_group_if_done(self, group: Any) -> None:
        if all(s.is_finished() for s in group.get_seqs()):
            if group.is_encoder_decoder():
                self.free_cross(group)
            del self.groups[group.request_id]

    def free_cross(self, group: Any) -> None:
        self.lock.call("free_cross", group)
        self.world.encoders.pop(group.request_id, None)

    def lookahead(self, data: st.DataObject) -> int:
        return data.draw(st.integers(0, self.config.max_lookahead), label="lookahead")

    @property
    def caching(self) -> bool:
        return self.config.enable_caching

    # -- admission -------------------------------------------------------------------------
    @precondition(lambda self: len(self.groups) < MAX_LIVE_GROUPS)
    @rule(data=st.data())
    def new_request(self, data: st.DataObject) -> None:
        bs = self.config.block_size
        bank = data.draw(st.integers(0, len(PROMPT_BANK) - 1), label="bank")
        empty = data.draw(st.integers(0, 15), label="empty prompt") == 0
        shortest, longest = 1, 3 * bs + 1
        if self.config.sliding_window is not None and data.draw(st.booleans(), label="long"):
            shortest, longest = 3 * bs, 5 * bs + 1  # long enough for the window to drop blocks
        length = 0 if empty else data.draw(st.integers(shortest, longest), label="prompt length")
        prompt = PROMPT_BANK[bank][:length]
        if length and data.draw(st.booleans(), label="diverge"):
            prompt[data.draw(st.integers(0, length - 1), label="at")] = 9
        n = data.draw(st.sampled_from((1, 1, 1, 2, 3)), label="n")
        lora = data.draw(st.sampled_from((0, 0, 1)), label="lora") if self.caching else 0
        salt = data.draw(st.sampled_from((None, None, "tenant-a", "tenant-b")), label="salt") if self.caching else None
        seqs = [self.new_seq(prompt, lora, salt) for _ in range(n)]
        encoder = None
        if self.config.encoder_decoder and data.draw(st.booleans(), label="encoder"):
            encoder = self.new_seq([5 + (i % 3) for i in range(data.draw(st.integers(0, 2 * bs + 1)))])
        self.num_groups += 1
        request_id = f"g{self.num_groups}"
        names = ", ".join(f"s{s.seq_id}" for s in seqs)
        encoder_text = f", s{encoder.seq_id}" if encoder is not None else ""
        self.do(f"{request_id} = SequenceGroup({request_id!r}, [{names}]{encoder_text})")
        self.groups[request_id] = self.script.get(request_id)

    def admitted(self, group: Any) -> None:
        waiting = group.get_seqs(status=WAITING)
        for s in waiting:
            self.world.seqs[s.seq_id] = s
            self.world.written[s.seq_id] = len(waiting[0].get_token_ids())
        if group.is_encoder_decoder():
            self.world.encoders[group.request_id] = group.get_encoder_seq()
        self.set_status(waiting, RUNNING)

    @precondition(lambda self: self.groups_with(WAITING))
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        """Admission as the scheduler does it."""
        group = data.draw(st.sampled_from(self.groups_with(WAITING)), label="group")
        waiting = group.get_seqs(status=WAITING)
        # vLLM always asks; others may not
        asked = self.caching and data.draw(st.integers(0, 4), label="ask the cache") > 0
        if asked:
            for s in waiting:
                self.lock.call("get_num_cached_tokens", s)
        if data.draw(st.integers(0, 5), label="unchecked") == 0:
            if not self.lock.call("allocate", group).raised:  # without asking: works or fails cleanly
                self.admitted(group)
            return
        lookahead = self.lookahead(data)
        if lookahead == 0 and data.draw(st.booleans(), label="default lookahead"):
            status = self.lock.call("can_allocate", group)  # vLLM's default argument
        else:
            status = self.lock.call("can_allocate", group, lookahead)
        if status.raised:
            return
        if status.value == AllocStatus.OK:
            if not self.lock.call("allocate", group).raised:
                self.admitted(group)
            return
        if asked:
            for s in waiting:
                self.lock.call("remove_seq_from_computed_blocks_tracker", s)
        if status.value == AllocStatus.NEVER:
            self.set_status(waiting, SequenceStatus.FINISHED_IGNORED)
            self.finish_group_if_done(group)

    # -- decoding ---------------------------------------------------------------------------
    @precondition(lambda self: self.groups_with(RUNNING))
    @rule(data=st.data())
    def schedule(self, data: st.DataObject) -> None:
        """One scheduler step over every running group, then one model step."""
        lookahead = self.lookahead(data)
        chunk = data.draw(st.integers(1, 2 * self.config.block_size), label="chunk")
        checked = data.draw(st.sampled_from((True, True, True, False)), label="checked")
        scheduled = []
        for group in self.groups_with(RUNNING):
            running = group.get_seqs(status=RUNNING)
            if checked and not self.lock.value("can_append_slots", group, lookahead):
                self.preempt_latest()  # as vLLM does: the latest admitted group makes room
                continue
            at_the_edge = not checked and data.draw(st.booleans(), label="at the edge")
            for s in running:
                if at_the_edge:
                    self.append(s, self.edge_lookahead(appending(s), data))
                else:
                    self.append(s, lookahead)
            for s in running:
                self.lock.call("get_block_table", s)
                self.lock.call("access_all_blocks_in_seq", s, self.clock)
            if self.caching:
                self.lock.call("get_common_computed_block_ids", running)
            scheduled.append(group)
        if self.caching and len(scheduled) > 1:  # across groups: prefixes that differ
            self.lock.call("get_common_computed_block_ids", [s for g in scheduled for s in g.get_seqs(status=RUNNING)])
        for group in scheduled:
            self.lock.call("mark_blocks_as_computed", group, chunk)
        for group in scheduled:  # the model step
            for s in group.get_seqs(status=RUNNING):
                self.model_step(s, chunk, data)
        self.clock += 1.0

    def row_groups(self) -> list[Any]:
        """Running groups whose running sequences all have a non-empty
        table: what an array-level scheduler batches (forked groups too,
        whose shared blocks make the batch copy on write)."""
        return [
            g for g in self.groups_with(RUNNING)
            if all(self.world.written.get(s.seq_id) for s in g.get_seqs(status=RUNNING))
        ]  # fmt: skip

    @precondition(lambda self: self._lock is not None and self._lock.offers_rows and self.row_groups())
    @rule(data=st.data())
    def row_step(self, data: st.DataObject) -> None:
        """A decode step of those groups through the row API or the batched
        calls where a manager offers them (``Lockstep.row_step``), sometimes
        without asking whether it fits first, then the model step."""
        groups = self.row_groups()
        if data.draw(st.integers(0, 3), label="misuse") == 0:
            self.lock.row_misuse([s for g in groups for s in g.get_seqs(status=RUNNING)])
        lookahead = self.lookahead(data)
        guarded = data.draw(st.sampled_from((True, True, False)), label="guarded")
        if not guarded and data.draw(st.booleans(), label="at the edge"):
            lookahead = self.edge_lookahead(lambda trial, slots: calls_step(trial, groups, slots, 0.0, False), data)
        way = data.draw(st.sampled_from(sorted(WAYS)), label="way")
        outcome = self.lock.row_step(groups, lookahead, self.clock, guarded, way)
        if outcome.raised or not outcome.value[0]:
            return
        for group in groups:
            for s in group.get_seqs(status=RUNNING):
                self.appended(s)
        for group in groups:
            self.lock.call("mark_blocks_as_computed", group, 1)
            for s in group.get_seqs(status=RUNNING):
                self.model_step(s, 1, data)
        self.clock += 1.0

    def model_step(self, seq: Any, chunk: int, data: st.DataObject) -> None:
        """Prefill advances by ``chunk``; decode computes the last token and
        samples one new token (sometimes several: speculative decoding)."""
        uncomputed = seq.data.get_num_uncomputed_tokens()
        self.do(f"s{seq.seq_id}.data.update_num_computed_tokens({min(chunk, uncomputed)})")
        if seq.is_prefill():
            return
        bs = self.config.block_size
        num_tokens = data.draw(st.sampled_from((1, 1, 1, 2, bs + 1, 2 * bs + 1)), label="new tokens")
        if data.draw(st.integers(0, 2), label="as a prompt goes on") == 0:
            # The tokens a longer prompt of the bank has here (a chat's next turn
            # repeats this one's output): blocks that fill may already be cached.
            bank = PROMPT_BANK[data.draw(st.integers(0, len(PROMPT_BANK) - 1), label="bank")]
            tokens = (bank[seq.get_len() :] + [1] * num_tokens)[:num_tokens]
        else:
            tokens = [data.draw(st.integers(0, 3), label="token") for _ in range(num_tokens)]  # 0 is a token id too
        for token in tokens:
            self.do(f"s{seq.seq_id}.append_token_id({token})")

    def edge_lookahead(self, append: Callable[[Any, int], Any], data: st.DataObject) -> int:
        """Lookahead slots for an append (``append(manager, slots)``) that
        takes the pool's last free block, or one block more than there is:
        the yardstick tries a block more at a time on copies of itself. The
        walk over a step's block traffic (drops, new blocks, copies on
        write, blocks a promotion gives back) and a batch's bounds are only
        wrong at that margin."""
        bs = self.config.block_size

        def fits(k: int) -> bool:
            try:
                append(copy.deepcopy(self.lock.reference), k * bs)
            except NoFreeBlocksError:
                return False
            return True

        try:
            if fits(0):  # more slots never fit better: find the first k that fails by halving
                low, high = 0, self.config.num_gpu_blocks + 2
                if fits(high):
                    return 0
                while high - low > 1:
                    low, high = ((low + high) // 2, high) if fits((low + high) // 2) else (low, (low + high) // 2)
                first_fail = high
            else:
                first_fail = 0
        except Exception:  # noqa: BLE001 - a call every manager must refuse: made with no lookahead
            return 0
        slots = max(0, first_fail - data.draw(st.integers(0, 1), label="the last block or one more")) * bs
        self.world.max_lookahead = max(self.world.max_lookahead, slots)  # tables may be that much longer
        return slots

    def appended(self, seq: Any) -> None:
        """The world after an append: the table holds every token, and the
        sliding window dropped the entries before computed // bs - W (spec §11)."""
        self.world.written[seq.seq_id] = len(seq.get_token_ids())
        if self.config.sliding_window is not None:
            window_blocks = self.config.sliding_window // self.config.block_size + 2
            drops = seq.data.get_num_computed_tokens() // self.config.block_size - window_blocks
            self.world.dropped[seq.seq_id] = max(self.world.dropped.get(seq.seq_id, 0), drops)

    def append(self, seq: Any, lookahead: int) -> None:
        outcome = self.lock.call("append_slots", seq, lookahead)
        if outcome.raised:
            return
        self.appended(seq)
        table = self.lock.value("get_block_table", seq, quiet=True)
        if not self.lock.snapshotting:
            self.require(invariants.check_cow(outcome.value, table, None, self.world))
        for name, snap in self.lock.snapshots.items():
            refcounts = [block[0] for block in snap["blocks"]]
            problems = invariants.check_cow(outcome.value, snap["tables"][seq.seq_id]["blocks"], refcounts, self.world)
            self.require(problems, name)

    @precondition(lambda self: self.live(RUNNING, SWAPPED))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        """n>1 sampling / beam search: a child sharing the parent's blocks."""
        parent = data.draw(st.sampled_from(self.live(RUNNING, SWAPPED)), label="parent")
        group = next(g for g in self.groups.values() if parent in g.get_seqs())
        self.num_seqs += 1
        child_id = self.num_seqs
        self.do(f"s{child_id} = s{parent.seq_id}.fork({child_id})")
        child = self.seq(child_id)
        self.all_seqs.append(child)
        self.do(f"{group.request_id}.add(s{child_id})")
        if self.lock.call("fork", parent, child).raised:
            self.set_status([child], SequenceStatus.FINISHED_ABORTED)
            return
        self.world.seqs[child_id] = child
        self.world.written[child_id] = self.world.written[parent.seq_id]
        self.world.dropped[child_id] = self.world.dropped.get(parent.seq_id, 0)
        if self.caching:
            self.lock.call("get_num_cached_tokens", child)

    # -- finishing and preemption -----------------------------------------------------------
    @precondition(lambda self: self.groups)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """A sequence stops (or a whole request is aborted): free its blocks."""
        live = self.live(RUNNING, SWAPPED)
        if bool(live) and data.draw(st.booleans(), label="one sequence"):  # bool(live): else mypy wants a list drawn
            seqs = [data.draw(st.sampled_from(live), label="seq")]
        else:
            group = data.draw(st.sampled_from(sorted(self.groups.values(), key=lambda g: g.request_id)), label="group")
            seqs = [s for s in group.get_seqs() if not s.is_finished()]
        groups = {g.request_id: g for g in self.groups.values() for s in seqs if s in g.get_seqs()}
        self.set_status(seqs, SequenceStatus.FINISHED_STOPPED)
        for s in seqs:
            self.lock.call("free", s)
            self.forget(s)
        for group in groups.values():
            self.finish_group_if_done(group)

    def recomputable(self, group: Any) -> bool:
        return len([s for s in group.get_seqs() if not s.is_finished()]) == 1

    @precondition(lambda self: self.groups_with(RUNNING))
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        """Recompute (single-sequence groups) or swap out (asking
        ``can_swap_out`` first, or not)."""
        group = data.draw(st.sampled_from(self.groups_with(RUNNING)), label="group")
        how = data.draw(st.sampled_from(("recompute", "swap", "swap", "swap unchecked")), label="how")
        if how == "recompute" and self.recomputable(group):
            self.recompute(group)
            return
        if how != "swap unchecked" and not self.lock.value("can_swap_out", group):
            return
        self.swap(group, "swap_out", RUNNING, SWAPPED)

    def preempt_latest(self) -> None:
        """Preempt the most recently admitted running group: recompute a
        single sequence, swap out several (if ``can_swap_out`` allows)."""
        group = self.groups_with(RUNNING)[-1]
        if self.recomputable(group):
            self.recompute(group)
        elif self.lock.value("can_swap_out", group):
            self.swap(group, "swap_out", RUNNING, SWAPPED)

    def recompute(self, group: Any) -> None:
        seq = group.get_seqs(status=RUNNING)[0]
        self.set_status([seq], WAITING)
        self.lock.call("free", seq)
        self.forget(seq)
        self.do(f"s{seq.seq_id}.data.reset_state_for_recompute()")
        if group.is_encoder_decoder():
            self.free_cross(group)

    def swap(self, group: Any, method: str, status: SequenceStatus, new_status: SequenceStatus) -> None:
        seqs = group.get_seqs(status=status)
        before = {s.seq_id: self.lock.value("get_block_table", s, quiet=True) for s in seqs}
        outcome = self.lock.call(method, group)
        if outcome.raised:
            return
        self.set_status(seqs, new_status)
        after = {s.seq_id: self.lock.value("get_block_table", s, quiet=True) for s in seqs}
        self.require(invariants.check_swap(outcome.value, before, after, method == "swap_out", self.world))

    @precondition(lambda self: self.groups_with(SWAPPED))
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        group = data.draw(st.sampled_from(self.groups_with(SWAPPED)), label="group")
        lookahead = self.lookahead(data)
        if data.draw(st.sampled_from((True, True, True, False)), label="checked"):
            if self.lock.value("can_swap_in", group, lookahead) != AllocStatus.OK:
                return
        self.swap(group, "swap_in", SWAPPED, RUNNING)

    # -- prefix-cache queries ---------------------------------------------------------------
    @rule(data=st.data(), what=st.integers(0, 5))
    def cache_calls(self, data: st.DataObject, what: int) -> None:
        """Tracker, access-time, hit-rate, reset and mark calls at any moment."""
        live = self.live(RUNNING, SWAPPED)
        if what == 0 and self.all_seqs:
            seq = data.draw(st.sampled_from(self.all_seqs), label="seq")
            method = data.draw(st.sampled_from(("get_num_cached_tokens", "access", "remove")), label="method")
            if method == "access":
                self.lock.call("access_all_blocks_in_seq", seq, self.clock)
            elif method == "remove":
                if self.caching:
                    self.lock.call("remove_seq_from_computed_blocks_tracker", seq)
            else:
                self.lock.call(method, seq)
        elif what == 1:
            seqs = data.draw(st.lists(st.sampled_from(live), max_size=3), label="seqs") if live else []
            self.lock.call("get_common_computed_block_ids", seqs)
        elif what == 2:
            self.lock.call("get_prefix_cache_hit_rate", data.draw(st.sampled_from((Device.GPU, Device.CPU, "gpu"))))
        elif what == 3:
            device = data.draw(st.sampled_from(("none", None, Device.GPU, Device.CPU)), label="device")
            if device == "none":
                self.lock.call("reset_prefix_cache")
            else:
                self.lock.call("reset_prefix_cache", device)
        elif what == 4 and self.groups:
            group = data.draw(st.sampled_from(sorted(self.groups.values(), key=lambda g: g.request_id)), label="group")
            self.lock.call("mark_blocks_as_computed", group, data.draw(st.integers(0, 8), label="chunk"))

    # -- calls the protocol forbids -------------------------------------------------------------
    @rule(data=st.data(), kind=st.integers(0, 10))
    def illegal(self, data: st.DataObject, kind: int) -> None:
        """A forbidden call: the same error everywhere, and no change."""
        self.forbidden_step = True
        fresh_id = 10_000 + self.num_scratch
        live = self.live(RUNNING, SWAPPED)
        if kind == 0:
            self.lock.call("append_slots", self.scratch(f"Sequence({fresh_id}, [1, 2])"), 0)
        elif kind == 1:
            self.lock.call("get_block_table", self.scratch(f"Sequence({fresh_id}, [1])"))
        elif kind == 2 and self.live(SWAPPED):
            self.lock.call("append_slots", data.draw(st.sampled_from(self.live(SWAPPED))), 0)
        elif kind == 3:
            method = data.draw(st.sampled_from(("can_allocate", "can_append_slots", "can_swap_in")))
            groups = sorted(self.groups.values(), key=lambda g: g.request_id)
            if groups:
                self.lock.call(method, data.draw(st.sampled_from(groups)), -1)
        elif kind == 4 and live:
            seq = data.draw(st.sampled_from(live))
            self.lock.call("append_slots", seq, data.draw(st.sampled_from(BAD_LOOKAHEADS)))
        elif kind == 5 and live:
            seq = data.draw(st.sampled_from(live))
            self.scratch(f"Sequence({seq.seq_id}, {list(seq.get_token_ids())!r})")
            self.lock.call("allocate", self.scratch(f"SequenceGroup('dup{self.num_scratch}', [x{self.num_scratch}])"))
        elif kind == 6 and self.groups_with(RUNNING):
            group = data.draw(st.sampled_from(self.groups_with(RUNNING)))
            if not group.get_seqs(status=WAITING):
                self.lock.call("allocate", group)
        elif kind == 7 and len(live) >= 2:
            parent, child = data.draw(st.permutations(live))[:2]
            self.lock.call("fork", parent, child)
        elif kind == 8:
            prompt = data.draw(st.sampled_from(BAD_PROMPTS))
            bad = self.scratch(f"SequenceGroup('bad{self.num_scratch}', [Sequence({fresh_id}, {prompt!r})])")
            self.lock.call("allocate", bad)
        elif kind == 9:
            self.lock.call("get_prefix_cache_hit_rate", "tpu")
        elif kind == 10 and self.live(RUNNING):  # a twin of a running sequence with bad new tokens
            seq = data.draw(st.sampled_from(self.live(RUNNING)))
            tokens = list(seq.get_token_ids()) + data.draw(st.sampled_from(BAD_APPENDS))
            twin = self.scratch(f"Sequence({seq.seq_id}, {tokens!r}, status=SequenceStatus.RUNNING)")
            if data.draw(st.booleans(), label="batched"):
                group = self.scratch(f"SequenceGroup('bad{self.num_scratch}', [x{self.num_scratch}])")
                self.lock.row_step([group], 0, 1.0, False, "batch")
            else:
                self.lock.call("append_slots", twin, 0)
        self.illegal_encoder_decoder(data, fresh_id)

    def illegal_encoder_decoder(self, data: st.DataObject, fresh_id: int) -> None:
        """Encoder-decoder requests where they are not supported."""
        if not (self.caching or self.config.sliding_window is not None):
            return
        if not data.draw(st.booleans(), label="encoder-decoder"):
            return
        group = self.scratch(
            f"SequenceGroup('ed{self.num_scratch}', [Sequence({fresh_id + 1}, [1, 2])], Sequence({fresh_id + 2}, [3]))"
        )
        self.lock.call(data.draw(st.sampled_from(("can_allocate", "allocate"))), group)

    # -- after every step -------------------------------------------------------------------------
    def require(self, problems: list[str], where: str = "") -> None:
        self.lock.require(problems, where)

    @invariant()
    def invariants_hold(self) -> None:
        if self._lock is None:
            return
        self.observe()
        try:
            self.lock.verify(self.world, self.groups)
        except Divergence as failure:  # the repro ends with the check that failed, so it fails as printed
            self.script.add(f"lock.verify({self.world_source()}, {self.script.render_value(dict(self.groups))})")
            self.lock.fail(str(failure).partition(REPRO_HEADING)[0])
        if self.caching:
            for name, snap in self.lock.snapshots.items():
                self.require(
                    self.ledgers[name].observe(snap, self.world), f"{name} (the content ledger, over the whole run)"
                )

    def world_source(self) -> str:
        """The scheduler's view now, as a ``World(...)`` expression of the script."""
        return invariants.world_source(self.world, self.script.render_value)

    def observe(self) -> None:
        """Ask every question that changes nothing, of every group: the
        admission and swap answers sit on boundaries (``free - need ==
        watermark``) that only many questions reach. Observations join the
        repro only when they disagree."""
        # After a forbidden call nothing changed (the lockstep checks it), so
        # the edges and arrays asked after the step before still stand.
        unchanged, self.forbidden_step = self.forbidden_step, False
        for group in self.groups_with(WAITING):
            self.at_the_edges("can_allocate", group, unchanged)
        for group in self.groups_with(RUNNING):
            self.lock.call("can_append_slots", group, self.config.max_lookahead, quiet=True)
            self.at_the_edges("can_append_slots", group, unchanged)
            self.lock.call("can_swap_out", group, quiet=True)
        for group in self.groups_with(SWAPPED):
            self.at_the_edges("can_swap_in", group, unchanged)
        for device in (Device.GPU, Device.CPU):
            self.lock.call("get_prefix_cache_hit_rate", device, quiet=True)
        if self.lock.offers_rows and not unchanged:  # the tables as one array: all, and the empty ones alone (or none)
            live = self.live(RUNNING, SWAPPED)
            if live:
                self.lock.table_arrays(live, quiet=True)
            self.lock.table_arrays([s for s in live if not self.world.written.get(s.seq_id)], quiet=True)

    def at_the_edges(self, method: str, group: Any, unchanged: bool = False) -> None:
        """Ask ``method`` on both sides of each place its answer changes as
        the lookahead grows a block at a time (with 0 slots if it never does).
        The answer is a step function of the blocks needed: a manager that
        counts one block too many or too few (a cached block it does not
        see, a copy on write it forgets) changes its answer one step early
        or late, seen only at the step. The yardstick alone finds the steps."""
        if unchanged:
            self.lock.call(method, group, 0, quiet=True)
            return
        ask, bs = getattr(self.lock.reference, method), self.config.block_size
        answers: list[Any] = []
        try:
            for k in range(self.config.num_gpu_blocks + 3):
                answers.append(ask(group, k * bs))
                if answers[-1] is False or answers[-1] is AllocStatus.NEVER:
                    break  # the answer for more slots stays the same
        except Exception:  # noqa: BLE001 - a call every manager must refuse: asked once, below
            answers = []
        edges = {k for k in range(1, len(answers)) if answers[k] != answers[k - 1]}
        for k in sorted({k - 1 for k in edges} | edges) or [0]:
            self.lock.call(method, group, k * bs, quiet=True)

    def teardown(self) -> None:
        """Free everything, one sequence at a time, trying a reset after each:
        then nothing may be in use, and a reset works."""
        if self._lock is None or self._lock.failed:
            return
        for group in list(self.groups.values()):
            for s in group.get_seqs():
                if not s.is_finished():
                    self.set_status([s], SequenceStatus.FINISHED_ABORTED)
                    self.lock.call("free", s)
                    self.forget(s)
                    self.lock.call("reset_prefix_cache")  # fails until the last block is free
            if group.is_encoder_decoder():
                self.free_cross(group)
        self.groups.clear()
        for name, snap in self.lock.snapshots.items():
            self.require(invariants.check_nothing_in_use(snap), name)
        null = 1 if self.config.sliding_window is not None else 0
        free_gpu = self.lock.value("get_num_free_gpu_blocks")
        free_cpu = self.lock.value("get_num_free_cpu_blocks")
        if free_cpu != self.config.num_cpu_blocks or free_gpu not in range(
            self.config.num_gpu_blocks - null, self.config.num_gpu_blocks + 1
        ):
            self.require([f"after freeing everything {free_gpu} GPU / {free_cpu} CPU blocks are free"])
        done = self.lock.value("reset_prefix_cache")
        if free_gpu == self.config.num_gpu_blocks and done is not True:
            self.require(["reset_prefix_cache() with nothing in use did not succeed"])


def machine_for(impls: Mapping[str, Any], family: str) -> type[ConformanceMachine]:
    """A state machine class over ``impls`` (name -> class or version name;
    the first is the yardstick) for one configuration family."""

    class Machine(ConformanceMachine):
        @initialize(config=family_configs(family))
        def build(self, config: Config) -> None:
            self.setup(config)

    Machine.__name__ = Machine.__qualname__ = f"Conformance_{family}"
    Machine.impls = dict(impls)
    Machine.runs = []
    return Machine
