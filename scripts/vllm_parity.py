"""Differential fuzzer: blockspace's reference manager against vLLM 0.9.2's v0
``SelfAttnBlockSpaceManager``, driven by the same random scheduler-like call
sequences (spec ``semantics.md`` §16).

Why: the reference is the executable specification; this script is how we
know it says what vLLM does. Every return value, every block and cross table,
both free counts and both hit rates are compared after every call, and (unless
``--shallow``) the whole ``snapshot()`` of the reference against the same view
built from vLLM's internals (free-list order, refcounts, cached/computed flags,
access times, evictor order, touched set, hit statistics, tracker).

vLLM is never a dependency of blockspace: it is imported only when this
script runs, from an environment you set up by hand.

Setting up an environment with vLLM 0.9.2 (CPU only, ~1 minute)
------------------------------------------------------------------
The manager (``vllm/core``) needs only the standard library, but
``import vllm`` pulls in torch, CUDA kernels and dozens of packages. So unzip
the wheel, keep ``vllm/core`` and give it five tiny stand-in modules::

    pip download vllm==0.9.2 --no-deps -d /tmp/vllmwheel
    mkdir -p /tmp/vllmsrc && unzip -q /tmp/vllmwheel/vllm-0.9.2-*.whl 'vllm/core/*' -d /tmp/vllmsrc
    mkdir -p /tmp/vllmstub/vllm/platforms && ln -s /tmp/vllmsrc/vllm/core /tmp/vllmstub/vllm/core

and in ``/tmp/vllmstub/vllm`` write:

* ``__init__.py``: empty.
* ``utils.py``: ``class Device(enum.Enum): GPU = enum.auto(); CPU = enum.auto()``,
  ``cdiv(a, b) = -(a // -b)``, ``chunk_list(lst, n)`` (yields ``lst[i:i+n]``),
  and the strings ``STR_NOT_IMPL_ENC_DEC_SWA`` / ``STR_NOT_IMPL_ENC_DEC_PREFIX_CACHE``
  (any text).
* ``sequence.py``: an ``IntEnum SequenceStatus`` with WAITING=0, RUNNING=1,
  SWAPPED=2, FINISHED_STOPPED=3 ... FINISHED_IGNORED=6, and empty classes
  ``Sequence`` and ``SequenceGroup`` (type hints only: the manager is
  duck-typed, this script hands it blockspace's own sequence objects).
* ``logger.py``: ``init_logger(name) = logging.getLogger(name)``.
* ``platforms/__init__.py``: ``current_platform`` with ``is_hpu()`` returning False.

Then make a venv that sees both the stand-in package and blockspace::

    python3 -m venv /tmp/vllmenv
    echo /tmp/vllmstub > /tmp/vllmenv/lib/python3.11/site-packages/vllmstub.pth
    /tmp/vllmenv/bin/pip install -e . --no-deps      # from the repository root
    /tmp/vllmenv/bin/python scripts/vllm_parity.py --seconds 600 --jobs 2

The reference needs nothing else but the kit's view of vLLM's state
(``blockspace.conformance.vllm_manager``, the ``[conformance]`` extra: drop
``--no-deps`` and install ``-e '.[conformance]'``), and numpy and numba for
``--impl fast``. The CPU venv of docs/performance.md, with the real vLLM
0.9.2's wheel, serves as well.

Usage
-----
``--seconds``/``--runs`` bound the campaign, ``--jobs`` the worker processes;
``--only plain|caching|window|encdec`` restricts the configurations;
``--seed N --show`` replays one run and prints its call trace (pass the same
``--only`` as the campaign: the seed picks the family among those given);
``--impl fast`` (or ``package.module:Class``) checks another implementation
instead of the reference (the snapshot comparison needs its ``snapshot()``).
A disagreement is minimised (delta debugging over the calls) and printed as
a short call sequence; ``--report FILE`` writes the summary and repros as
JSON. The exit status is 1 if any run disagreed.

What the generator avoids (spec §14/§15/§16): vLLM's crashes and half-done
operations, and the places where blockspace deliberately differs. A run ends
(and counts as "stopped", not as a disagreement) when both raise an error
that leaves vLLM half-changed (NoFreeBlocksError from an append, swap or
allocate; a swap can run out after ``can_swap_*`` said yes, §14.6), or when
vLLM hits one of its crash corners: the evictor stale-entry assertion (§6.3,
§14.10, hash-seed dependent) or the block-pool IndexError after ``free`` of
a swapped-out sequence (docs/vllm-parity.md). ``free`` of a swapped-out
sequence with an access time and prefix caching (§14.11) is never called;
every sequence is queried by the tracker before ``free`` (§14.12);
``reset_prefix_cache()`` without a device only when the CPU reset cannot
fail (§14.13); ``''`` from ``get_common_computed_block_ids`` is read as
``[]`` (§14.7); tables are copied (§14.16); no fork/swap after a
sliding-window drop (§14.4), no ``allocate`` of a prompt longer than the
free blocks with a sliding window (§14.2). Prefix caching with sliding window
and encoder-decoder with either are only probed for the NotImplementedError
of ``can_allocate``. ``Harness._check_legal`` enforces these rules on every
call, so minimised traces cannot wander into them either.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import random
import sys
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from blockspace.conformance.vllm_manager import vllm_snapshot  # the kit's view of vLLM's state
from blockspace.enums import Device, SequenceStatus
from blockspace.errors import InvariantError
from blockspace.interfaces import load_manager_class
from blockspace.sequence import Sequence, SequenceData, SequenceGroup
from blockspace.snapshot import diff

WAITING, RUNNING, SWAPPED = SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.SWAPPED
FINISHED, IGNORED = SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_IGNORED


def load_vllm() -> tuple[type, type]:
    """vLLM's manager class and Device enum, imported only now."""
    try:
        from vllm.core.block_manager import SelfAttnBlockSpaceManager
        from vllm.utils import Device as VllmDevice
    except ImportError as exc:  # pragma: no cover - depends on the environment
        sys.exit(f"cannot import vLLM's v0 block manager ({exc}); see the set-up notes at the top of {__file__}")
    logging.getLogger("vllm").setLevel(logging.ERROR)  # "Failed to reset prefix cache ..." on every refusal
    return SelfAttnBlockSpaceManager, VllmDevice


# -- configurations ---------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One manager configuration plus the shape of the workload driving it."""

    family: str  # plain | caching | window | encdec
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    watermark: float
    sliding_window: int | None
    enable_caching: bool
    max_lookahead: int
    max_n: int
    chunked_prefill: bool
    timestamps: bool  # call access_all_blocks_in_seq every step
    vocab: int
    num_steps: int

    def manager_kwargs(self) -> dict[str, Any]:
        return dict(
            block_size=self.block_size,
            num_gpu_blocks=self.num_gpu_blocks,
            num_cpu_blocks=self.num_cpu_blocks,
            watermark=self.watermark,
            sliding_window=self.sliding_window,
            enable_caching=self.enable_caching,
        )


FAMILIES = ("plain", "caching", "window", "encdec")


def random_config(rng: random.Random, family: str) -> Config:
    """One in ten runs is long (400-600 steps, small blocks, a big pool) so
    that the hit rate crosses vLLM's 1000-query buckets (§6.7)."""
    long_run = rng.random() < 0.1
    bs = rng.choice([1, 2] if long_run else [1, 2, 3, 4, 16])
    return Config(
        family=family,
        block_size=bs,
        num_gpu_blocks=rng.randint(12, 24) if long_run else rng.randint(2, 24),
        num_cpu_blocks=rng.choice([0, rng.randint(1, 16), rng.randint(1, 16)]),
        watermark=rng.choice([0.0, 0.01, 0.01, 0.1, 0.29, 0.5]),
        sliding_window=rng.randint(1, 3 * bs + 2) if family == "window" else None,
        enable_caching=family == "caching",
        max_lookahead=rng.choice([0, 0, 1, bs, 2 * bs + 1]),
        max_n=rng.choice([1, 2, 3]),
        chunked_prefill=rng.random() < 0.5,
        timestamps=rng.random() < 0.8,
        vocab=rng.choice([2, 3, 5, 50]),
        num_steps=rng.randint(400, 600) if long_run else rng.randint(10, 60),
    )


# -- the sequences both managers read ------------------------------------------------


class StagedData(SequenceData):
    """vLLM's SequenceData has a prefill/decode *stage*: it turns to decode
    when every token is computed and stays there when a sampled token is
    appended (blockspace's ``Sequence.is_prefill`` compares the counts
    instead, which says "prefill" again after each sampled token). The
    tracker freezes its count during prefill (§10), so the stage matters."""

    def __init__(self, token_ids: list[int]) -> None:
        super().__init__(token_ids)
        self.prefill = True

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        super().update_num_computed_tokens(num_new_computed_tokens)
        if self.get_num_uncomputed_tokens() == 0:
            self.prefill = False

    def reset_state_for_recompute(self) -> None:
        super().reset_state_for_recompute()
        self.prefill = True


class StagedSequence(Sequence):
    """A Sequence whose ``is_prefill`` follows vLLM's stage."""

    def __init__(self, seq_id: int, token_ids: list[int], lora_int_id: int = 0) -> None:
        super().__init__(seq_id, token_ids, lora_int_id=lora_int_id)
        self.data = StagedData(list(token_ids))

    def is_prefill(self) -> bool:
        return self.data.prefill


class World:
    """The sequences and groups of one run: blockspace's own duck-typed
    objects, handed to both managers (neither mutates them)."""

    def __init__(self) -> None:
        self.seqs: dict[int, Sequence] = {}
        self.groups: dict[str, SequenceGroup] = {}

    def apply(self, event: tuple) -> None:
        kind = event[0]
        if kind == "group":
            _, request_id, seq_ids, prompt, lora, encoder = event
            seqs = [StagedSequence(i, prompt, lora) for i in seq_ids]
            encoder_seq = StagedSequence(seq_ids[-1] + 1000000, encoder) if encoder is not None else None
            for seq in seqs:
                self.seqs[seq.seq_id] = seq
            self.groups[request_id] = SequenceGroup(request_id, seqs, encoder_seq)
        elif kind == "child":
            _, request_id, parent_id, child_id = event
            parent = self.seqs[parent_id]
            child = StagedSequence(child_id, parent.get_token_ids(), parent.lora_int_id)
            child.status = parent.status
            child.data.update_num_computed_tokens(parent.data.get_num_computed_tokens())
            child.data.prefill = parent.data.prefill
            self.seqs[child_id] = child
            self.groups[request_id].add(child)
        elif kind == "status":
            self.seqs[event[1]].status = SequenceStatus(event[2])
        elif kind == "tokens":
            for token in event[2]:
                self.seqs[event[1]].append_token_id(token)
        elif kind == "computed":
            self.seqs[event[1]].data.update_num_computed_tokens(event[2])
        elif kind == "recompute":
            self.seqs[event[1]].data.reset_state_for_recompute()
        else:
            raise ValueError(f"unknown event {event!r}")


# -- comparing the two managers --------------------------------------------------------


class Disagreement(Exception):
    """The two managers differ; ``kind`` says where (for minimisation)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


class RunEnded(Exception):
    """The run cannot go on comparing (vLLM's state is half-changed, or a
    known corner was hit); ``reason`` is a short label for the statistics."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class Illegal(Exception):
    """A call the generator must not make: one of vLLM's crash corners or a
    place where blockspace deliberately differs (§14). Replaying a shortened
    trace can produce one; such a candidate is discarded."""


def _builtin_base(exc: BaseException) -> type:
    return next(t for t in type(exc).__mro__ if t.__module__ == "builtins")


def _is_evictor_corner(exc: BaseException) -> bool:
    """vLLM's AssertionError after its evictor returned a stale entry (§6.3)."""
    if not isinstance(exc, AssertionError):
        return False
    names = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
    return "_maybe_allocate_evicted_block_id" in names


def _is_pool_corner(exc: BaseException) -> bool:
    """vLLM's IndexError from a block-object pool: ``free`` of a swapped-out
    sequence returns its block objects, with their GPU pool indices, to the
    CPU pool; a later CPU allocation indexes past the end of the CPU pool
    (docs/vllm-parity.md, finding 2)."""
    names = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
    return isinstance(exc, IndexError) and "init_block" in names


def _normalise(name: str, value: Any) -> Any:
    """Plain data for comparing: enum members by name, pairs as tuples,
    ``''`` from get_common_computed_block_ids as ``[]`` (§14.7)."""
    if hasattr(value, "name") and hasattr(value, "value"):
        return ("enum", type(value).__name__, value.name)
    if name == "get_common_computed_block_ids" and value == "":
        return []
    if isinstance(value, list):
        return [tuple(v) if isinstance(v, tuple) else v for v in value]
    return value


class Harness:
    """Both managers over one World; every call goes to both and is compared.

    ``log`` records every event and call, so a run can be replayed (and
    minimised) without the generator."""

    def __init__(self, config: Config, deep: bool = True, impl: str = "reference") -> None:
        vllm_class, self.vllm_device = load_vllm()
        self.config = config
        self.deep = deep
        self.vllm = vllm_class(**config.manager_kwargs())
        self.ref = load_manager_class(impl)(**config.manager_kwargs())  # "ref": the implementation under test
        self.world = World()
        self.log: list[tuple] = []
        self.num_calls = 0
        self.coverage: Counter = Counter()  # what the run exercised, for the summary

    def event(self, *event: Any) -> None:
        self.log.append(event)
        self.world.apply(event)

    def _resolve(self, arg: tuple, side: str) -> Any:
        kind, value = arg
        if kind == "S":
            return self.world.seqs[value]
        if kind == "G":
            return self.world.groups[value]
        if kind == "L":
            return [self.world.seqs[i] for i in value]
        if kind == "D":
            if value is None:
                return None
            return self.vllm_device[value] if side == "vllm" else Device[value]
        return value

    def call(self, name: str, *args: tuple, probe: bool = False) -> Any:
        """Call ``name`` on both managers with the encoded ``args`` (("S", seq_id),
        ("G", request_id), ("L", [seq_ids]), ("D", "GPU"), ("V", value)).
        ``probe``: an error is expected and fine if both raise the same kind."""
        self.log.append(("call", name, args, probe))
        self.num_calls += 1
        self._check_legal(name, args, probe)
        results = {}
        for side, manager in (("vllm", self.vllm), ("ref", self.ref)):
            try:
                results[side] = (getattr(manager, name)(*[self._resolve(a, side) for a in args]), None)
            except Exception as exc:  # noqa: BLE001 - we compare whatever either side raises
                results[side] = (None, exc)
        (v_value, v_exc), (r_value, r_exc) = results["vllm"], results["ref"]
        if v_exc is not None and _is_evictor_corner(v_exc):
            raise RunEnded("vLLM evictor stale entry (§6.3)", repr(v_exc))
        if v_exc is not None and _is_pool_corner(v_exc):
            raise RunEnded("vLLM block-pool IndexError after freeing a swapped sequence", repr(v_exc))
        if v_exc is not None and r_exc is not None:
            same_kind = isinstance(r_exc, _builtin_base(v_exc))
            if probe and same_kind:
                self.compare_state(name)
                return None
            if not same_kind:
                raise Disagreement(f"{name}:error", f"vLLM {v_exc!r} / reference {r_exc!r}")
            raise RunEnded(f"both raised {type(v_exc).__name__} in {name}", f"vLLM {v_exc!r} / reference {r_exc!r}")
        if v_exc is not None:
            raise Disagreement(f"{name}:raised", f"only vLLM raised {v_exc!r}")
        if r_exc is not None:
            raise Disagreement(f"{name}:raised", f"only the reference raised {r_exc!r}")
        if name == "get_block_table":
            v_value = list(v_value)  # vLLM returns its live list (§14.16)
        v_norm, r_norm = _normalise(name, v_value), _normalise(name, r_value)
        if v_norm != r_norm or (type(v_value) is not type(r_value) and not isinstance(v_norm, tuple)):
            if not (name == "get_common_computed_block_ids" and v_value == "" and r_value == []):
                raise Disagreement(f"{name}:return", f"vLLM {v_value!r} / reference {r_value!r}")
        self.compare_state(name)
        self._count(name, v_value, args)
        return v_value

    def _count(self, name: str, value: Any, args: tuple) -> None:
        self.coverage[name] += 1
        if name in ("can_allocate", "can_swap_in", "reset_prefix_cache", "can_append_slots", "can_swap_out"):
            self.coverage[f"{name} -> {getattr(value, 'name', value)}"] += 1
        elif name in ("append_slots", "swap_in", "swap_out") and value:
            self.coverage[f"{name} -> non-empty"] += 1
        elif name == "get_common_computed_block_ids":
            self.coverage[f"{name} -> {'empty string' if value == '' else 'non-empty' if value else '[]'}"] += 1
        elif name == "get_num_cached_tokens" and value:
            self.coverage[f"{name} -> non-zero"] += 1
        if name in ("append_slots", "can_append_slots", "can_swap_in") and args[-1][1]:
            self.coverage[f"{name} with lookahead"] += 1

    def _check_legal(self, name: str, args: tuple, probe: bool) -> None:
        """Refuse the corners of §14/§15 that the comparison must avoid."""
        vllm = self.vllm
        caching = self.config.enable_caching
        null = vllm.block_allocator._null_block
        null_id = None if null is None else null.block_id

        def dropped(seq_id: int) -> bool:
            table = vllm.block_tables.get(seq_id)
            return table is not None and null_id is not None and null_id in table.physical_block_ids

        def why() -> str | None:
            if name == "reset_prefix_cache" and args[0][1] is None and caching:
                if vllm.get_num_free_cpu_blocks() != self.config.num_cpu_blocks:
                    return "reset_prefix_cache() with CPU blocks in use (§14.13)"
            if name == "free" and caching and args[0][1] in vllm.block_tables:
                seq_id = args[0][1]
                if seq_id not in vllm._computed_blocks_tracker._seq_id_to_num_tokens_computed:
                    return "free of a sequence the tracker does not know (§14.12)"
                ids = vllm.block_tables[seq_id].physical_block_ids
                swapped = ids and ids[-1] >= self.config.num_gpu_blocks
                if swapped and vllm._last_access_blocks_tracker._seq_last_access.get(seq_id) is not None:
                    return "free of a swapped-out sequence with an access time (§14.11)"
            if name == "fork" and (dropped(args[0][1]) or args[1][1] in vllm.block_tables):
                return "fork after a sliding-window drop or onto a tracked child (§14.4, §15)"
            if name in ("swap_in", "swap_out"):
                group = self.world.groups[args[0][1]]
                if any(dropped(seq.seq_id) for seq in group.get_seqs()):
                    return "swap after a sliding-window drop (§14.4)"
            if name == "allocate":
                waiting = self.world.groups[args[0][1]].get_seqs(status=WAITING)
                if len(waiting) > 1 and not waiting[0].get_token_ids():
                    return "allocate of an empty prompt for several sequences (§15)"
                if any(seq.seq_id in vllm.block_tables for seq in waiting):
                    return "allocate onto an existing table (§15)"
            if not probe and name in ("append_slots", "get_block_table", "access_all_blocks_in_seq", "fork"):
                if args[0][1] not in vllm.block_tables:
                    return "a sequence without a table"
            status = {"can_append_slots": RUNNING, "can_swap_out": RUNNING, "swap_out": RUNNING}.get(name)
            status = {"can_swap_in": SWAPPED, "swap_in": SWAPPED}.get(name, status)
            if status is not None:
                group = self.world.groups[args[0][1]]
                if any(seq.seq_id not in vllm.block_tables for seq in group.get_seqs(status=status)):
                    return f"a {status.name} sequence without a table"
            if name == "remove_seq_from_computed_blocks_tracker" and caching and not probe:
                if args[0][1] not in vllm._computed_blocks_tracker._seq_id_to_num_tokens_computed:
                    return "removal of an untracked sequence"
            return None

        reason = why()
        if reason is not None:
            raise Illegal(f"{name}{args}: {reason}")

    def _hit_rate(self, manager: Any, device: str, side: str) -> tuple[str, float]:
        rate = manager.get_prefix_cache_hit_rate(self._resolve(("D", device), side))
        return type(rate).__name__, rate  # the plain allocator's is the int -1

    def compare_state(self, after: str) -> None:
        """Free counts, hit rates and vLLM's block tables through the public
        API of both; then (deep) the whole snapshot, if the implementation
        under test has ``snapshot()``."""
        vllm, ref = self.vllm, self.ref
        views = {}
        for side, manager in (("vllm", vllm), ("ref", ref)):
            views[side] = (
                manager.get_num_free_gpu_blocks(),
                manager.get_num_free_cpu_blocks(),
                [self._hit_rate(manager, device, side) for device in ("GPU", "CPU")],
                {i: list(manager.get_block_table(self.world.seqs[i])) for i in vllm.block_tables},
            )
        if views["vllm"] != views["ref"]:
            raise Disagreement(f"{after}:state", f"vLLM {views['vllm']!r} / reference {views['ref']!r}")
        if self.deep and hasattr(ref, "snapshot"):
            problems = diff(vllm_snapshot(vllm, self.vllm_device), ref.snapshot())
            if problems:
                raise Disagreement(f"{after}:snapshot", "; ".join(problems[:6]))
        if self.deep and hasattr(ref, "check_invariants"):
            ref.check_invariants()


# -- the scheduler-like generator -----------------------------------------------------


class Driver:
    """Plays the v0 scheduler (spec §16) against a Harness with random choices."""

    def __init__(self, harness: Harness, rng: random.Random) -> None:
        self.h = harness
        self.c = harness.config
        self.rng = rng
        self.next_seq_id = 0
        self.next_request = 0
        self.waiting: list[str] = []
        self.running: list[str] = []
        self.swapped: list[str] = []
        self.tracked: set[int] = set()  # sequences the caching tracker knows
        self.dropped: set[str] = set()  # groups with a sliding-window drop (§14.4)
        self.clock = 0.0
        self.prompts: list[list[int]] = []
        self.num_seqs = 0

    # helpers
    def seqs(self, request_id: str, status: SequenceStatus) -> list[Sequence]:
        return self.h.world.groups[request_id].get_seqs(status=status)

    def query(self, seq: Sequence) -> None:
        self.h.call("get_num_cached_tokens", ("S", seq.seq_id))
        self.tracked.add(seq.seq_id)

    def free(self, seq: Sequence, status: SequenceStatus = FINISHED) -> None:
        """Free like the scheduler does: the tracker knows every sequence by then (§14.12)."""
        if self.c.enable_caching and seq.seq_id not in self.tracked:
            self.query(seq)
        self.h.event("status", seq.seq_id, int(status))
        has_table = seq.seq_id in self.h.vllm.block_tables
        self.h.call("free", ("S", seq.seq_id))
        if has_table:
            self.tracked.discard(seq.seq_id)

    def new_prompt(self) -> list[int]:
        rng, bs = self.rng, self.c.block_size
        if self.prompts and rng.random() < 0.6:
            base = rng.choice(self.prompts)
            prompt = base[: rng.randint(0, len(base))] if rng.random() < 0.7 else list(base)
        else:
            prompt = []
        limit = self.c.num_gpu_blocks * bs
        length = rng.choice([rng.randint(0, 3 * bs), rng.randint(0, limit // 2 + 1), rng.randint(0, limit + bs)])
        prompt += [rng.randrange(self.c.vocab) for _ in range(max(0, length - len(prompt)))]
        if len(prompt) == 0 and rng.random() < 0.7:
            prompt = [rng.randrange(self.c.vocab)]
        self.prompts.append(prompt)
        return prompt

    def arrive(self) -> None:
        n = self.rng.randint(1, self.c.max_n)
        prompt = self.new_prompt()
        if not prompt:
            n = 1  # several WAITING sequences on an empty prompt crash vLLM halfway (§15)
        encoder = None
        if self.c.family == "encdec":
            encoder = [self.rng.randrange(self.c.vocab) for _ in range(self.rng.randint(0, 2 * self.c.block_size + 1))]
        lora = self.rng.choice([0, 0, 0, 1]) if self.c.family != "encdec" else 0
        request_id = f"r{self.next_request}"
        self.next_request += 1
        seq_ids = list(range(self.next_seq_id, self.next_seq_id + n))
        self.next_seq_id += n
        self.num_seqs += n
        self.h.event("group", request_id, seq_ids, prompt, lora, encoder)
        self.waiting.append(request_id)

    def lookahead(self) -> int:
        return self.rng.randint(0, self.c.max_lookahead)

    # the scheduling step
    def step(self) -> None:
        rng = self.rng
        self.clock += 1.0
        for _ in range(rng.choice([0, 0, 1, 1, 2])):
            self.arrive()
        self.probes()
        scheduled: list[tuple[str, int]] = []  # (request_id, token chunk)
        num_lookahead = self.lookahead()
        for request_id in list(self.running):
            if request_id not in self.running:
                continue  # preempted by an earlier group of this step
            while request_id in self.running and not self.h.call(
                "can_append_slots", ("G", request_id), ("V", num_lookahead)
            ):
                self.preempt(self.running[-1])
            if request_id in self.running:
                scheduled.append((request_id, self.append(request_id, num_lookahead)))
        for request_id in list(self.swapped):
            status = self.h.call("can_swap_in", ("G", request_id), ("V", num_lookahead))
            if status.name == "NEVER" and not (self.c.enable_caching and self.c.timestamps):
                # give up on it; with caching only if it has no access time (§14.11)
                self.abort(request_id, SWAPPED)
                continue
            if status.name != "OK":
                break
            self.h.call("swap_in", ("G", request_id))
            for seq in self.seqs(request_id, SWAPPED):
                self.h.event("status", seq.seq_id, int(RUNNING))
            self.swapped.remove(request_id)
            self.running.append(request_id)
            scheduled.append((request_id, self.append(request_id, num_lookahead)))
        for request_id in list(self.waiting):
            chunk = self.admit(request_id)
            if chunk is None:
                break
            if chunk >= 0:
                scheduled.append((request_id, chunk))
        for request_id, _ in scheduled:
            running = self.seqs(request_id, RUNNING)
            for seq in running:
                self.h.call("get_block_table", ("S", seq.seq_id))
                if self.c.timestamps:
                    self.h.call("access_all_blocks_in_seq", ("S", seq.seq_id), ("V", self.clock))
            if self.c.enable_caching:
                self.h.call("get_common_computed_block_ids", ("L", [s.seq_id for s in running]))
                self.tracked.update(s.seq_id for s in running)
            if self.c.family == "encdec":
                self.h.call("get_cross_block_table", ("G", request_id))
        for request_id, chunk in scheduled:
            self.h.call("mark_blocks_as_computed", ("G", request_id), ("V", chunk))
        for request_id, chunk in scheduled:
            self.model_step(request_id, chunk, num_lookahead)

    def probes(self) -> None:
        """Calls the scheduler makes at odd moments, and errors that §15 says
        are raised before any change (both must raise the same kind)."""
        rng, h = self.rng, self.h
        world = h.world
        if rng.random() < 0.2 and world.seqs:
            seq = world.seqs[rng.choice(list(world.seqs))]
            self.query(seq)
        if rng.random() < 0.05 and self.tracked:
            seq_id = rng.choice(sorted(self.tracked))
            h.call("remove_seq_from_computed_blocks_tracker", ("S", seq_id))
            self.tracked.discard(seq_id)
        if rng.random() < 0.1:
            with_tables = sorted(h.vllm.block_tables)
            chosen = rng.sample(with_tables, min(len(with_tables), rng.randint(0, 4)))
            h.call("get_common_computed_block_ids", ("L", chosen))
            if self.c.enable_caching:
                self.tracked.update(chosen)
        if rng.random() < 0.1:
            device = rng.choice(["GPU", "CPU", None])
            if device is None and h.vllm.get_num_free_cpu_blocks() != self.c.num_cpu_blocks:
                device = "GPU"  # vLLM stops after a failed CPU reset (§14.13)
            h.call("reset_prefix_cache", ("D", device))
        if rng.random() < 0.05 and world.seqs:
            seq_id = rng.choice(list(world.seqs))
            if seq_id not in h.vllm.block_tables:
                h.call("get_block_table", ("S", seq_id), probe=True)
        if rng.random() < 0.05 and world.groups:
            request_id = rng.choice(list(world.groups))
            if request_id not in h.vllm.cross_block_tables:
                h.call("get_cross_block_table", ("G", request_id), probe=True)
            if not self.seqs(request_id, WAITING):
                h.call("can_allocate", ("G", request_id), ("V", 0), probe=True)

    def admit(self, request_id: str) -> int | None:
        """Admission (§16); the first chunk, -1 if not scheduled, None to stop admitting."""
        waiting = self.seqs(request_id, WAITING)
        if self.c.enable_caching:
            for seq in waiting:
                self.query(seq)
        num_lookahead = self.rng.choice([0, 0, 0, self.lookahead()])
        status = self.h.call("can_allocate", ("G", request_id), ("V", num_lookahead)).name
        if status == "OK" and self.c.sliding_window is not None:
            # can_allocate caps at the window but allocate takes every block (§14.2): wait instead of crashing
            need = -(-waiting[0].get_len() // self.c.block_size)
            if need > self.h.vllm.get_num_free_gpu_blocks():
                status = "LATER"
        if status != "OK":
            if self.c.enable_caching:
                for seq in waiting:
                    self.h.call("remove_seq_from_computed_blocks_tracker", ("S", seq.seq_id))
                    self.tracked.discard(seq.seq_id)
            if status == "LATER":
                return None
            self.waiting.remove(request_id)
            for seq in waiting:
                self.free(seq, IGNORED)  # no table: a no-op, as in the scheduler
            return -1
        self.h.call("allocate", ("G", request_id))
        self.waiting.remove(request_id)
        for seq in waiting:
            self.h.event("status", seq.seq_id, int(RUNNING))
        prompt_len = waiting[0].get_len()
        if prompt_len == 0:
            seq = waiting[0]
            self.h.call("append_slots", ("S", seq.seq_id), ("V", 0), probe=True)  # empty table (§8.6)
            self.free(seq)
            self.h.call("free_cross", ("G", request_id))
            return -1
        self.running.append(request_id)
        return self.chunk(waiting[0])

    def chunk(self, seq: Sequence) -> int:
        remaining = seq.get_len() - seq.data.get_num_computed_tokens()
        return self.rng.randint(1, remaining) if self.c.chunked_prefill else remaining

    def append(self, request_id: str, num_lookahead: int) -> int:
        """append_slots for every RUNNING sequence; returns the token chunk."""
        running = self.seqs(request_id, RUNNING)
        window = self.h.vllm.max_block_sliding_window
        for seq in running:
            if window is not None and seq.data.get_num_computed_tokens() // self.c.block_size - window > 0:
                self.dropped.add(request_id)
                self.h.coverage["append_slots with a sliding-window drop"] += 1
            self.h.call("append_slots", ("S", seq.seq_id), ("V", num_lookahead))
        seq = running[0]
        return self.chunk(seq) if seq.is_prefill() else seq.get_len() - seq.data.get_num_computed_tokens()

    def model_step(self, request_id: str, chunk: int, num_lookahead: int) -> None:
        """Sequences gain tokens, finish, or fork (beam search / n>1)."""
        rng = self.rng
        for seq in self.seqs(request_id, RUNNING):
            computed = seq.data.get_num_computed_tokens()
            was_prefill = seq.is_prefill()
            new_computed = min(seq.get_len(), computed + chunk) if was_prefill else seq.get_len()
            self.h.event("computed", seq.seq_id, new_computed - computed)
            if new_computed < seq.get_len():
                continue  # more prefill chunks to go
            num_new = rng.randint(1, min(3, num_lookahead + 1))
            self.h.event("tokens", seq.seq_id, [rng.randrange(self.c.vocab) for _ in range(num_new)])
            if rng.random() < 0.04 or seq.get_len() > self.c.num_gpu_blocks * self.c.block_size:
                self.free(seq)
        running = self.seqs(request_id, RUNNING)
        group = self.h.world.groups[request_id]
        if (
            running
            and request_id not in self.dropped
            and rng.random() < 0.15
            and len(group.seqs) < 4
            and not running[0].is_prefill()
        ):
            parent = rng.choice(running)
            child_id = self.next_seq_id
            self.next_seq_id += 1
            self.num_seqs += 1
            self.h.event("child", request_id, parent.seq_id, child_id)
            self.h.call("fork", ("S", parent.seq_id), ("S", child_id))
            if self.c.enable_caching:
                self.query(self.h.world.seqs[child_id])  # as the scheduler does (§16)
        if not self.seqs(request_id, RUNNING):
            self.running.remove(request_id)
            self.h.call("free_cross", ("G", request_id))

    def preempt(self, request_id: str) -> None:
        running = self.seqs(request_id, RUNNING)
        swappable = request_id not in self.dropped and self.c.num_cpu_blocks > 0
        if swappable and (len(running) > 1 or self.rng.random() < 0.4):
            if self.h.call("can_swap_out", ("G", request_id)):
                self.h.call("swap_out", ("G", request_id))
                for seq in running:
                    self.h.event("status", seq.seq_id, int(SWAPPED))
                self.running.remove(request_id)
                self.swapped.append(request_id)
                return
        if len(running) > 1:
            self.abort(request_id, RUNNING)
            return
        seq = running[0]  # recompute
        self.free(seq, WAITING)
        self.h.event("recompute", seq.seq_id)
        self.h.call("free_cross", ("G", request_id))
        self.running.remove(request_id)
        self.waiting.insert(0, request_id)

    def abort(self, request_id: str, status: SequenceStatus) -> None:
        for seq in self.seqs(request_id, status):
            self.free(seq, SequenceStatus.FINISHED_ABORTED)
        self.h.call("free_cross", ("G", request_id))
        for queue in (self.running, self.swapped):
            if request_id in queue:
                queue.remove(request_id)

    def run(self) -> None:
        if self.c.family in ("caching", "window"):
            # encoder-decoder with caching or sliding window: both must refuse
            self.h.event("group", "enc", [-2], [1, 2], 0, [1])
            self.h.call("can_allocate", ("G", "enc"), ("V", 0), probe=True)
        for _ in range(self.c.num_steps):
            self.step()


# -- runs, replay, minimisation ---------------------------------------------------------------


def run_one(seed: int, family: str, deep: bool = True, impl: str = "reference") -> dict[str, Any]:
    rng = random.Random(seed)
    config = random_config(rng, family)
    harness = Harness(config, deep, impl)
    driver = Driver(harness, rng)
    outcome, detail, kind = "completed", "", None
    try:
        driver.run()
    except RunEnded as end:
        outcome, detail = "stopped", end.reason
    except Disagreement as problem:
        outcome, detail, kind = "disagreement", str(problem), problem.kind
    except InvariantError as problem:
        outcome, detail, kind = "disagreement", f"reference invariant: {problem}", "invariants"
    except Exception as problem:  # noqa: BLE001 - a bug of this script, or an Illegal call
        outcome, detail = "driver error", f"{type(problem).__name__}: {problem}"
        detail += "\n" + traceback.format_exc(limit=4)
    if config.enable_caching:
        for name in ("GPU", "CPU"):
            metric = harness.vllm.block_allocator._allocators[harness.vllm_device[name]].metric_data
            if metric.num_completed_blocks:
                harness.coverage[f"runs with a full 1000-query hit-rate bucket on the {name}"] += 1
    return {
        "seed": seed,
        "config": asdict(config),
        "outcome": outcome,
        "detail": detail,
        "kind": kind,
        "num_seqs": driver.num_seqs,
        "num_calls": harness.num_calls,
        "trace": harness.log if outcome == "disagreement" else None,
        "coverage": dict(harness.coverage),
    }


def replay(config: Config, trace: list[tuple], impl: str = "reference") -> Disagreement | None:
    """Run a recorded trace; the Disagreement it ends in, or None. Any other
    error (a call made illegal by removing earlier ones) also gives None."""
    harness = Harness(config, True, impl)
    try:
        for entry in trace:
            if entry[0] == "call":
                _, name, args, probe = entry
                harness.call(name, *args, probe=probe)
            else:
                harness.event(*entry)
    except Disagreement as problem:
        return problem
    except Exception:  # noqa: BLE001 - an illegal candidate
        return None
    return None


def minimise(
    config: Config, trace: list[tuple], problem: Disagreement, impl: str = "reference", budget_s: float = 180.0
) -> list[tuple]:
    """Delta debugging over the calls (the sequences' own history is kept, so
    it stays coherent), then drop the history of groups no call mentions.
    A candidate counts if it ends in the same kind of disagreement (for
    "only one side raised": the same error)."""
    deadline = time.monotonic() + budget_s
    trace = [tuple(e) for e in trace]

    def still_fails(candidate: list[tuple]) -> bool:
        found = replay(config, candidate, impl)
        if found is None or found.kind != problem.kind:
            return False
        return not problem.kind.endswith((":raised", ":error")) or found.detail == problem.detail

    size = max(1, len(trace) // 2)
    while size >= 1 and time.monotonic() < deadline:
        changed = False
        i = 0
        while i < len(trace) and time.monotonic() < deadline:
            chunk = trace[i : i + size]
            if all(entry[0] != "call" for entry in chunk):
                i += size
                continue
            candidate = trace[:i] + [e for e in chunk if e[0] != "call"] + trace[i + size :]
            if still_fails(candidate):
                trace = candidate
                changed = True
            else:
                i += size
        if not changed:
            size //= 2
    # the history of groups that no remaining call mentions
    named: set = set()
    for entry in trace:
        if entry[0] == "call":
            for kind, value in entry[2]:
                named.update(value if kind == "L" else [value])
    groups = {e[1]: e[2] for e in trace if e[0] == "group"}
    groups.update({e[1]: groups.get(e[1], []) + [e[3]] for e in trace if e[0] == "child"})
    unused = {r for r, ids in groups.items() if r not in named and not named & set(ids)}
    unused_seqs = {i for r in unused for i in groups[r]}
    candidate = [
        e
        for e in trace
        if not (e[0] in ("group", "child") and e[1] in unused)
        and not (e[0] in ("status", "tokens", "computed", "recompute") and e[1] in unused_seqs)
    ]
    return candidate if still_fails(candidate) else trace


def format_trace(config: Config, trace: list[tuple]) -> str:
    lines = [f"SelfAttnBlockSpaceManager({', '.join(f'{k}={v!r}' for k, v in config.manager_kwargs().items())})"]
    for entry in trace:
        if entry[0] == "call":
            _, name, args, probe = entry
            shown = ", ".join(
                f"seq{a[1]}"
                if a[0] == "S"
                else f"[{', '.join(f'seq{i}' for i in a[1])}]"
                if a[0] == "L"
                else repr(a[1])
                for a in args
            )
            lines.append(f"  {name}({shown}){'   # expected to raise' if probe else ''}")
        elif entry[0] == "group":
            _, request_id, seq_ids, prompt, lora, encoder = entry
            extra = f", lora={lora}" if lora else ""
            extra += f", encoder={encoder}" if encoder is not None else ""
            lines.append(f"  # group {request_id!r}: seqs {seq_ids} WAITING, prompt {prompt}{extra}")
        elif entry[0] == "child":
            lines.append(f"  # seq{entry[3]} = copy of seq{entry[2]} in group {entry[1]!r}")
        elif entry[0] == "status":
            lines.append(f"  # seq{entry[1]}.status = {SequenceStatus(entry[2]).name}")
        elif entry[0] == "tokens":
            lines.append(f"  # seq{entry[1]} += {entry[2]}")
        elif entry[0] == "computed":
            lines.append(f"  # seq{entry[1]}.data.update_num_computed_tokens({entry[2]})")
        elif entry[0] == "recompute":
            lines.append(f"  # seq{entry[1]}.data.reset_state_for_recompute()")
    return "\n".join(lines)


def _worker(args: tuple) -> dict[str, Any]:
    worker, num_jobs, first_seed, deadline, max_runs, families, deep, impl = args
    stats: dict[str, Counter] = {f: Counter() for f in families}
    problems = []
    k = 0
    while time.time() < deadline and k < max_runs:
        # each worker takes blocks of consecutive seeds, one seed per family
        num_families = len(families)
        seed = first_seed + (k // num_families) * num_families * num_jobs + worker * num_families + k % num_families
        family = families[seed % num_families]
        k += 1
        result = run_one(seed, family, deep, impl)
        s = stats[family]
        s["runs"] += 1
        s["sequences"] += result["num_seqs"]
        s["calls"] += result["num_calls"]
        s[f"outcome: {result['outcome']}"] += 1
        if result["outcome"] == "stopped":
            s[f"stopped: {result['detail']}"] += 1
        if result["outcome"] == "driver error" and len(problems) < 20:
            problems.append(result)
        s[f"bs={result['config']['block_size']}"] += 1
        s.update({f"call {k}": v for k, v in result["coverage"].items()})
        if result["outcome"] == "disagreement" and len(problems) < 20:
            problems.append(result)
    return {"stats": {f: dict(c) for f, c in stats.items()}, "problems": problems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="wall-clock budget of the campaign")
    parser.add_argument("--runs", type=int, default=10**9, help="at most this many runs per job")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--only", choices=FAMILIES, action="append", help="restrict to these families")
    parser.add_argument(
        "--impl", default="reference", help='implementation under test: "reference", "fast" or package.module:Class'
    )
    parser.add_argument("--shallow", action="store_true", help="skip the snapshot comparison (faster)")
    parser.add_argument("--show", action="store_true", help="replay --seed and print its trace")
    parser.add_argument("--report", help="write the summary and minimised repros to this JSON file")
    options = parser.parse_args(argv)
    load_vllm()
    families = tuple(options.only or FAMILIES)
    deep = not options.shallow

    if options.show:
        family = families[options.seed % len(families)]
        rng = random.Random(options.seed)
        config = random_config(rng, family)
        harness = Harness(config, deep, options.impl)
        ending = "completed"
        try:
            Driver(harness, rng).run()
        except (RunEnded, Disagreement) as end:
            ending = str(end)
        print(format_trace(config, harness.log))
        print(f"# {family} run, seed {options.seed}: {ending}")
        return 0

    deadline = time.time() + options.seconds
    jobs = [
        (w, options.jobs, options.seed, deadline, options.runs, families, deep, options.impl)
        for w in range(options.jobs)
    ]
    with multiprocessing.Pool(options.jobs) as pool:
        parts = pool.map(_worker, jobs)
    totals: dict[str, Counter] = {f: Counter() for f in families}
    problems = []
    for part in parts:
        for family, counts in part["stats"].items():
            totals[family].update(counts)
        problems += part["problems"]
    for family in families:
        counts = totals[family]
        print(f"== {family}: {counts['runs']} runs, {counts['sequences']} sequences, {counts['calls']} calls")
        for key in sorted(k for k in counts if k not in ("runs", "sequences", "calls")):
            print(f"   {key}: {counts[key]}")
    repros = []
    seen_kinds: set[str] = set()
    for problem in problems:
        if problem["kind"] in seen_kinds:
            continue
        seen_kinds.add(problem["kind"])
        config = Config(**problem["config"])
        original = replay(config, [tuple(e) for e in problem["trace"]], options.impl)
        if original is None:
            print(f"\n!! seed {problem['seed']} did not replay: {problem['detail']}")
            continue
        trace = minimise(config, [tuple(e) for e in problem["trace"]], original, options.impl)
        ending = replay(config, trace, options.impl)
        text = format_trace(config, trace)
        print(f"\n!! disagreement (seed {problem['seed']}, {problem['kind']}): {ending}\n{text}")
        repros.append({"seed": problem["seed"], "kind": problem["kind"], "detail": str(ending), "repro": text})
    print(f"\n{sum(len(p['problems']) for p in parts)} disagreeing runs, {len(repros)} distinct kinds")
    if options.report:
        with open(options.report, "w") as out:
            json.dump({"stats": {f: dict(c) for f, c in totals.items()}, "repros": repros}, out, indent=1)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
