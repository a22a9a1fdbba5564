"""blockspace.conformance: a kit that proves two block managers agree.

* ``Lockstep``: drive N managers with the same calls, compare every answer
  (value and type) and, where offered, every ``snapshot()``.
* ``invariants``: what must hold after every step, from snapshots or from
  return values alone.
* ``machine_for``: a Hypothesis state machine playing vLLM's v0 scheduler
  (legal protocol plus illegal calls) over several configuration families.
* ``ManagerConformance``: a pytest base class for your own manager.
* ``replay_trace``: a Mooncake trace replayed in lockstep.
* ``blockspace conformance``: the command line (``cli.py``).

It needs the ``[conformance]`` extra (Hypothesis, CrossHair, pytest, rich);
without it, importing the kit raises ``MissingExtraError`` naming the extra.
"""

from blockspace.conformance.lockstep import Divergence, Lockstep, Outcome
from blockspace.conformance.script import Script
from blockspace.extras import require

# Every module of the kit is imported through this package, so this runs
# before any of them needs Hypothesis (the two above do not).
require("conformance", "the conformance kit (blockspace.conformance)")

__all__ = ["Divergence", "Lockstep", "Outcome", "Script"]
