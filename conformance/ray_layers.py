"""The explorer's layers on a Ray cluster (``--executor ray``): the twin of
``explore.expand_layer``, whose forked processes expand a layer on one
machine. Both give the same report, state for state.

**Design: the seen set replicated, merged once a layer.** Each worker is a
Ray actor, made once per command and kept over its scopes, with one
manager per implementation (``explore.Keeper``) and its own copy of the
seen set. A layer goes like this:

1. The driver sends every worker the digests the last layer added (one
   object in Ray's store, 16 bytes a state, read by all) and the
   situations reached so far.
2. The frontier goes out in the fork pool's chunks (``explore.CHUNK``),
   in order, each to the next free worker, two in flight per worker so
   none waits for its next chunk; a worker's chunks are therefore in
   increasing order, which is what its ``found`` counter relies on
   (``explore.expand``).
3. The driver merges the chunks' results in chunk order, exactly as the
   fork pool's are merged (``Search.advance``): the same states, the same
   first history of each, the same first failure.

Why not a seen set sharded over actors by fingerprint: a worker must know,
for each of a state's about twenty successors, whether it is new before it
packs it (packing is 8 % of a state's time, and most successors are not
new); a sharded set makes that a round trip per successor, or ships every
successor to the shards. Replicated, the question is a local lookup, and
the cost is the set's memory in every worker (``docs/conformance.md``,
*Past one machine*), paid once a layer by the digests' broadcast.

**Code on the nodes.** A worker imports the implementations by their
module; blockspace must be installed on every node, and a module of the
user's that is not installed (``--impl mymod:MyManager`` from a file or a
folder) is shipped with Ray's runtime environment (``py_modules``).

**Ctrl-C** (or a failure in the driver): every worker is killed at once,
its running chunk with it, and the next search makes new ones.
"""

from __future__ import annotations

import sys
import sysconfig
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from blockspace.conformance.explore import CHUNK, Expansion, Keeper, expand
from blockspace.conformance.scope import Scope
from blockspace.errors import ClusterError, InvalidArgumentError
from blockspace.interfaces import load_manager_class
from blockspace.ray_cluster import cpus, join

IN_FLIGHT = 2  # chunks sent to a worker at a time: one runs, the next waits in its queue
_WORKERS: dict[int, list[Any]] = {}  # how many -> this command's workers, kept over its searches


class Digests:
    """A worker's copy of the seen set, at 17 bytes a state: the 16-byte
    digests sorted in one array, and how many histories of each were kept;
    ``digests[key]`` answers as the driver's ``Counter`` does (0 for a key
    never added). Why not a ``Counter`` as in the driver: there a digest
    costs 91 bytes (the bytes object and its slot), and every worker holds
    a copy. Merged once a layer (``add``); a lookup is a binary search.
    NumPy's ``S16`` drops trailing zero bytes when it hands an item out, so
    a key is compared without them (16 bytes long, the stripped form is
    still one per digest)."""

    def __init__(self) -> None:
        self.keys = np.empty(0, "S16")
        self.counts = np.empty(0, np.uint8)

    def add(self, added: bytes) -> None:
        """The digests of ``added`` (16 bytes each, a digest once for each history kept)."""
        if not added:
            return
        keys = np.concatenate([self.keys, np.frombuffer(added, "S16")])
        counts = np.concatenate([self.counts, np.ones(len(added) // 16, np.uint8)])
        order = np.argsort(keys, kind="stable")
        keys, counts = keys[order], counts[order]
        self.keys, starts = np.unique(keys, return_index=True)
        self.counts = np.add.reduceat(counts, starts).astype(np.uint8)

    def __getitem__(self, key: bytes) -> int:
        at = int(np.searchsorted(self.keys, np.array(key, "S16")))
        return int(self.counts[at]) if at < len(self.keys) and self.keys[at] == key.rstrip(b"\x00") else 0

    def __len__(self) -> int:
        return len(self.keys)


class LayerWorker:
    """One Ray worker's part of a search: its managers (``Keeper``), its
    copy of the seen set (``Digests``), and the layer's ``found`` and
    situations, as a forked worker inherits them (``explore._expand_chunk``)."""

    def __init__(self) -> None:
        self.keeper: Keeper | None = None
        self.seen = Digests()
        self.found: Counter[bytes] = Counter()
        self.reached: dict[str, int] = {}

    def begin(self, impls: Mapping[str, Any], scope: Scope) -> None:
        """A new search: fresh managers, and nothing seen."""
        self.keeper, self.seen = Keeper(impls, scope), Digests()

    def learn(self, added: bytes, reached: Mapping[str, int]) -> None:
        """A new layer: the digests the last one added (16 bytes each, once
        for each history kept), and the situations reached so far."""
        self.seen.add(added)
        self.found, self.reached = Counter(), dict(reached)

    def expand(self, chunk: list[tuple[bytes, tuple]], successors: bool, histories: int) -> Expansion:
        assert self.keeper is not None
        out = expand(chunk, self.seen, self.keeper, successors, histories, self.found, self.reached)
        self.reached.update(out.situations)
        return out


def shipped_modules(impls: Mapping[str, Any]) -> tuple[str, ...]:
    """The files or folders of the implementations' top-level modules that
    are not installed (not the standard library's, site-packages' or
    blockspace's own): a worker on another node imports them from there."""
    installed = [Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "purelib", "platlib")]
    places = []
    for impl in impls.values():
        cls = load_manager_class(impl) if isinstance(impl, str) else impl
        top = cls.__module__.partition(".")[0]
        module = sys.modules.get(top)
        where = getattr(module, "__file__", None)
        if top in ("blockspace", "__main__") or where is None:  # __main__'s classes travel pickled by value
            continue
        place = Path(where).resolve()
        place = place.parent if place.name == "__init__.py" else place
        if not any(place.is_relative_to(root) for root in installed):
            places.append(str(place))
    return tuple(sorted(set(places)))


def ray_workers(workers: int | None) -> int:
    """How many workers: ``workers`` (at most the cluster's CPUs, since each
    takes one and more would wait for ever), default one a CPU."""
    available = cpus()
    if workers is not None and workers > available:
        raise InvalidArgumentError(f"--workers {workers}: the Ray cluster has {available} CPU(s), one a worker")
    return workers or available


class RayLayers:
    """A search's layers expanded by Ray workers (module docstring); the
    same ``expand_layer`` answers as the fork pool's."""

    def __init__(self, impls: Mapping[str, Any], scope: Scope, workers: int | None) -> None:
        self.ray = ray = join(shipped_modules(impls))
        self.workers = ray_workers(workers)
        if self.workers not in _WORKERS:
            actor = ray.remote(num_cpus=1)(LayerWorker)
            _WORKERS[self.workers] = [actor.remote() for _ in range(self.workers)]
        self.actors = _WORKERS[self.workers]
        self.guarded(lambda: ray.get([actor.begin.remote(dict(impls), scope) for actor in self.actors]))

    def expand_layer(
        self,
        frontier: list[tuple[bytes, tuple]],
        added: list[bytes],
        successors: bool,
        histories: int,
        reached: Mapping[str, int],
    ) -> list[Expansion]:
        """The frontier's chunks expanded, in order (``added``: the digests
        the seen set gained since the last layer)."""
        return self.guarded(lambda: self._layer(frontier, added, successors, histories, dict(reached)))

    def _layer(
        self, frontier: list[tuple[bytes, tuple]], added: list[bytes], successors: bool, histories: int, reached: dict
    ) -> list[Expansion]:
        ray = self.ray
        news = ray.put(b"".join(added))
        for actor in self.actors:  # an actor runs its calls in the order they were made: before its chunks
            actor.learn.remote(news, reached)
        jobs = [frontier[i : i + CHUNK] for i in range(0, len(frontier), CHUNK)]
        results: list[Expansion | None] = [None] * len(jobs)
        running: dict[Any, tuple[int, Any]] = {}  # a chunk's result -> (its index, its worker)
        idle = [actor for _ in range(IN_FLIGHT) for actor in self.actors]
        sent = 0
        while sent < len(jobs) or running:
            while idle and sent < len(jobs):
                actor = idle.pop(0)
                running[actor.expand.remote(jobs[sent], successors, histories)] = (sent, actor)
                sent += 1
            done, _ = ray.wait(list(running), num_returns=1, timeout=0.5)  # a timeout: Ctrl-C is heard meanwhile
            for ref in done:
                index, actor = running.pop(ref)
                results[index] = ray.get(ref)
                idle.append(actor)
        return [result for result in results if result is not None]

    def guarded(self, work: Any) -> Any:
        """``work()``; on Ctrl-C or an error, every worker killed first (their
        chunks with them) and forgotten, so nothing runs on after. A
        worker's failure is ``ClusterError``, its cause's last line said."""
        ray = self.ray
        try:
            return work()
        except BaseException as error:
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            _WORKERS.pop(self.workers, None)
            if isinstance(error, ray.exceptions.RayError):
                said = str(error).strip().splitlines()
                raise ClusterError(f"a Ray worker failed: {said[-1] if said else type(error).__name__}") from None
            raise


__all__ = ["Digests", "LayerWorker", "RayLayers", "shipped_modules"]
