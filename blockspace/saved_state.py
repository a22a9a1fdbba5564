"""``save_state()`` and ``restore_state()``: a manager's whole state kept
aside and put back, the cloning the conformance explorer needs.

The explorer plays every move from every state it reaches, so before each
move that changes a state it must have the state back. Pickling does it
for any manager; both of ours also keep a state aside themselves
(``save_state()``) and put it back into the very manager that holds a
later one (``restore_state(saved)``), which for the fast manager means
copying bytes into the arrays it already has, several times cheaper than
loading a pickle. What comes back must be the same manager in every way a
caller can see: ``tests/test_saved_state.py`` runs restored managers in
lockstep with copies pickled when they were saved.

A ``SavedState`` names the implementation and the configuration it was
saved from; restoring it into another implementation or configuration is
refused (``InvalidArgumentError``, ``validation.check_saved``) before
anything changes. It is not compared between implementations (its ``data`` is each one's own), and a
manager may restore the same one any number of times.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class SavedState(NamedTuple):
    """A manager's state, as ``save_state()`` gives it."""

    implementation: str  # "reference" or "fast"
    config: tuple  # (block size, GPU blocks, CPU blocks, watermark, sliding window, caching)
    data: Any  # the implementation's own form


def config_of(manager: Any) -> tuple:
    """The constructor's arguments, as a ``SavedState`` records them."""
    return (manager.block_size, manager.num_total_gpu_blocks, manager.num_total_cpu_blocks, manager.watermark,
            manager.sliding_window, bool(manager.enable_caching))  # fmt: skip
