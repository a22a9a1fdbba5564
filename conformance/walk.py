"""A seeded random walk of the scheduler protocol (spec §16), for any driver.

The walk plays a small continuous-batching scheduler: admissions
(``can_allocate``/``allocate``), decode steps with and without lookahead,
forks, recompute and swap preemption, finishing, access times, computed
marks, common computed ids, cached tokens, hit rates, resets, and
deliberately illegal calls, on pools small enough that LATER, NEVER,
eviction and swapping all happen. It talks to managers only through a
*driver*: ``m(name, *args)`` makes a call (raising what it raises) and
``m.attempt(name, *args)`` makes a call that may legitimately fail and says
whether it succeeded. A lockstep driver compares implementations call for
call; ``Solo`` drives one manager (the soak).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from blockspace import AllocStatus, Device, Sequence, SequenceGroup, SequenceStatus
from blockspace.conformance.pool_config import ManagerConfig
from blockspace.errors import BlockSpaceError


class Driver(Protocol):
    def __call__(self, name: str, *args: Any) -> Any: ...

    def attempt(self, name: str, *args: Any) -> bool: ...


class Attempting:
    """A driver's ``attempt``, from its ``__call__``."""

    def __call__(self, name: str, *args: Any) -> Any:
        raise NotImplementedError

    def attempt(self, name: str, *args: Any) -> bool:
        """A call that may legitimately fail: did it succeed?"""
        try:
            self(name, *args)
        except BlockSpaceError:
            return False
        return True


class Solo(Attempting):
    """Drives one manager; counts calls; ``on_call`` runs after each one."""

    def __init__(self, manager: Any, on_call: Any = None) -> None:
        self.manager = manager
        self.num_calls = 0
        self.on_call = on_call

    def __call__(self, name: str, *args: Any) -> Any:
        self.num_calls += 1
        try:
            return getattr(self.manager, name)(*args)
        finally:
            if self.on_call is not None:
                self.on_call(self)


@dataclass(frozen=True)
class Config(ManagerConfig):
    lookahead: tuple[int, ...] = (0,)  # lookahead slots drawn from these
    max_prompt: int = 24


@dataclass
class World:
    """The scheduler's view: queues of groups, a clock, id counters."""

    rng: random.Random
    waiting: list[SequenceGroup] = field(default_factory=list)
    running: list[SequenceGroup] = field(default_factory=list)
    swapped: list[SequenceGroup] = field(default_factory=list)
    next_id: int = 0
    clock: float = 0.0

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id


PREFIXES = [[7] * 40, list(range(40)), [3, 1, 4, 1, 5, 9, 2, 6] * 5]


def _prompt(world: World, config: Config) -> list[int]:
    rng = world.rng
    length = rng.randint(0 if not config.encoder_decoder else 1, config.max_prompt)
    if rng.random() < 0.03:  # larger than the GPU: NEVER
        length = config.num_gpu_blocks * config.block_size + 1
    base = rng.choice(PREFIXES)[: rng.randint(0, length)]
    return base + [rng.randrange(4) for _ in range(length - len(base))]


def _new_group(world: World, config: Config) -> SequenceGroup:
    rng = world.rng
    n = rng.choice([1, 1, 1, 2, 3])
    prompt = _prompt(world, config)
    if not prompt:
        n = 1
    first = world.new_id()
    world.next_id += n
    return SequenceGroup.from_prompt(
        f"r{first}",
        prompt,
        n=n,
        first_seq_id=first,
        lora_int_id=rng.choice([0, 0, 0, 5]),
        cache_salt=rng.choice([None, None, None, "tenant"]),
        encoder_prompt=_prompt(world, config) if config.encoder_decoder else None,
    )


def _finish(m: Driver, group: SequenceGroup, seq: Sequence, status: SequenceStatus) -> None:
    m("free", seq)
    seq.status = status
    if group.is_encoder_decoder() and all(s.is_finished() for s in group.seqs):
        m("free_cross", group)


def _preempt(m: Driver, world: World, group: SequenceGroup) -> None:
    """Swap a multi-sequence group out if it can be, else recompute (or abort)."""
    running = group.get_seqs(status=SequenceStatus.RUNNING)
    if len(running) > 1 or world.rng.random() < 0.3:
        if m("can_swap_out", group) and m.attempt("swap_out", group):
            for seq in running:
                seq.status = SequenceStatus.SWAPPED
            if group in world.running:
                world.running.remove(group)
            world.swapped.append(group)
            return
    if len(running) == 1 and len(group.seqs) == 1:
        seq = running[0]
        m("free", seq)
        seq.status = SequenceStatus.WAITING
        seq.data.reset_state_for_recompute()
        if group.is_encoder_decoder():
            m("free_cross", group)
        world.waiting.insert(0, group)
        return
    for seq in running:
        _finish(m, group, seq, SequenceStatus.FINISHED_ABORTED)


def _admit(m: Driver, world: World, config: Config, lookahead: int) -> None:
    while world.waiting:
        group = world.waiting[0]
        seqs = group.get_seqs(status=SequenceStatus.WAITING)
        if config.enable_caching:
            for seq in seqs:
                m("get_num_cached_tokens", seq)
        status = m("can_allocate", group, lookahead)
        if status != AllocStatus.OK:
            if config.enable_caching:
                for seq in seqs:
                    m("remove_seq_from_computed_blocks_tracker", seq)
            if status == AllocStatus.NEVER:
                world.waiting.pop(0)
                for seq in seqs:
                    seq.status = SequenceStatus.FINISHED_IGNORED
            return
        if not m.attempt("allocate", group):  # the worst-case estimate said OK, the exact check may not
            if config.enable_caching:
                for seq in seqs:
                    m("remove_seq_from_computed_blocks_tracker", seq)
            return
        world.waiting.pop(0)
        for seq in seqs:
            seq.status = SequenceStatus.RUNNING
        world.running.append(group)


def _illegal(m: Driver, world: World) -> None:
    """A call the protocol forbids: both must raise the same error and change nothing."""
    rng = world.rng
    stranger = Sequence(10**6 + world.new_id(), [1, 2, 3], status=SequenceStatus.RUNNING)
    choices = [
        lambda: m.attempt("append_slots", stranger, 0),
        lambda: m.attempt("get_block_table", stranger),
        lambda: m.attempt("can_allocate", SequenceGroup("empty", [stranger]), 0),
        lambda: m.attempt("append_slots", stranger, -1),
        lambda: m.attempt("remove_seq_from_computed_blocks_tracker", stranger),
        lambda: m.attempt("get_cross_block_table", SequenceGroup("none", [stranger])),
        lambda: m.attempt("get_prefix_cache_hit_rate", "TPU"),
        lambda: m("free", stranger),
    ]
    running = [g for g in world.running if g.get_seqs(status=SequenceStatus.RUNNING)]
    if running:
        group = rng.choice(running)
        seq = group.get_seqs(status=SequenceStatus.RUNNING)[0]
        choices += [
            lambda: m.attempt("fork", seq, seq),
            lambda: m.attempt("swap_in", group),
            lambda: m.attempt("allocate", SequenceGroup("again", [Sequence(seq.seq_id, [1])])),
        ]

        def bad_token() -> None:
            seq.append_token_id(-5)
            m.attempt("append_slots", seq, 0)
            seq.data.get_token_ids().pop()  # the scheduler would never have produced it

        choices.append(bad_token)
    if world.swapped:
        group = rng.choice(world.swapped)
        seq = group.get_seqs(status=SequenceStatus.SWAPPED)[0]
        choices.append(lambda: m.attempt("append_slots", seq, 0))
    rng.choice(choices)()


def step(m: Driver, world: World, config: Config) -> None:
    rng = world.rng
    lookahead = rng.choice(config.lookahead)
    world.clock += 1.0
    if rng.random() < 0.5:
        world.waiting.append(_new_group(world, config))

    for group in list(world.swapped):
        if m("can_swap_in", group, lookahead) == AllocStatus.OK and m.attempt("swap_in", group):
            world.swapped.remove(group)
            for seq in group.get_seqs(status=SequenceStatus.SWAPPED):
                seq.status = SequenceStatus.RUNNING
            world.running.append(group)
    _admit(m, world, config, lookahead)

    for group in list(world.running):
        if group not in world.running:
            continue
        while not m("can_append_slots", group, lookahead):
            victim = world.running.pop()
            _preempt(m, world, victim)
            if victim is group:
                break
        if group not in world.running:
            continue
        running = group.get_seqs(status=SequenceStatus.RUNNING)
        for seq in running:
            if not m.attempt("append_slots", seq, lookahead):  # the estimate passed, the exact check did not
                break
        for seq in running:
            m("get_block_table", seq)
            m("access_all_blocks_in_seq", seq, world.clock)
        if config.enable_caching:
            m("get_common_computed_block_ids", running)
        m("mark_blocks_as_computed", group, 1)

    # the model step: every running sequence computed its tokens and gained one
    for group in list(world.running):
        for seq in group.get_seqs(status=SequenceStatus.RUNNING):
            seq.data.update_num_computed_tokens(seq.get_len() - seq.data.get_num_computed_tokens())
            seq.append_token_id(rng.randrange(4))
            roll = rng.random()
            if roll < 0.06:
                _finish(m, group, seq, SequenceStatus.FINISHED_STOPPED)
            elif roll < 0.10:
                child = seq.fork(world.new_id())
                group.add(child)
                if not m.attempt("fork", seq, child):  # e.g. an empty table: the child never runs
                    child.status = SequenceStatus.FINISHED_ABORTED
                elif config.enable_caching:
                    m("get_num_cached_tokens", child)
        if not group.get_seqs(status=SequenceStatus.RUNNING):
            world.running.remove(group)

    roll = rng.random()
    if roll < 0.1:
        m("get_prefix_cache_hit_rate", rng.choice([Device.GPU, Device.CPU, "gpu"]))
    elif roll < 0.14:
        m("reset_prefix_cache", rng.choice([None, Device.GPU, Device.CPU]))
    elif roll < 0.2:
        m("get_num_free_gpu_blocks")
        m("get_num_free_cpu_blocks")
    elif roll < 0.3:
        _illegal(m, world)
    if config.enable_caching and world.running and rng.random() < 0.3:
        for seq in rng.choice(world.running).get_seqs(status=SequenceStatus.RUNNING):
            m("get_num_cached_tokens", seq)
    if config.encoder_decoder and world.running and rng.random() < 0.2:
        m("get_cross_block_table", rng.choice(world.running))


def drain(m: Driver, world: World) -> None:
    """Finish every live sequence, so every block can come back."""
    for group in world.running + world.swapped:
        for seq in group.seqs:
            if not seq.is_finished():
                _finish(m, group, seq, SequenceStatus.FINISHED_ABORTED)
    world.running.clear()
    world.swapped.clear()
    m("reset_prefix_cache")


def walk(m: Driver, config: Config, seed: int, num_steps: int) -> World:
    """``num_steps`` scheduler steps, then everything finished."""
    world = World(random.Random(seed))
    for _ in range(num_steps):
        step(m, world, config)
    drain(m, world)
    return world
