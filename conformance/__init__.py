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
"""

from blockspace.conformance.lockstep import Divergence, Lockstep, Outcome
from blockspace.conformance.script import Script

__all__ = ["Divergence", "Lockstep", "Outcome", "Script"]
