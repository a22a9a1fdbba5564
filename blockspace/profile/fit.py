"""The step-time model's coefficients, fitted to timed steps.

The simulator charges a step (``StepTimeModel``)::

    overhead + prefill_token x prefill tokens + decode_seq x decoding sequences
             + kv_token_read x context tokens of the decoding sequences

so each timed step is one linear equation in those four unknowns, and a
few dozen steps of different sizes settle them by least squares
(``numpy.linalg.lstsq``). Two choices make the answer sensible:

- Each equation is divided by its measured time, so the fit minimises
  relative errors: a 4 ms step counts as much as a 60 ms one. Otherwise the
  largest steps decide everything, and the overhead, which only the small
  steps show, comes out as whatever their residuals leave.
- No cost can be negative. A coefficient that comes out below 0 (noise, or
  a cost too small to see at these sizes) is set to 0 and the others are
  fitted again without it, until none is negative.

The fifth coefficient, a block swap, is timed on its own (``measure.swap_ms``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from blockspace.profile.plan import Step
from blockspace.simulator.gpu import StepTimeModel


@dataclass(frozen=True)
class StepFit:
    """Milliseconds per step, per prefill token, per decoding sequence and per context token."""

    overhead_ms: float
    prefill_token_ms: float
    decode_seq_ms: float
    context_token_ms: float

    def predict_ms(self, step: Step) -> float:
        return float(np.dot(terms(step), self.coefficients()))

    def coefficients(self) -> list[float]:
        return [self.overhead_ms, self.prefill_token_ms, self.decode_seq_ms, self.context_token_ms]

    def step_time_model(self, swap_block_ms: float) -> StepTimeModel:
        """The simulator's model, in its units (ms, us, us, ns, us)."""
        return StepTimeModel(
            step_overhead_ms=self.overhead_ms,
            prefill_token_us=self.prefill_token_ms * 1e3,
            decode_seq_us=self.decode_seq_ms * 1e3,
            kv_token_read_ns=self.context_token_ms * 1e6,
            swap_block_us=swap_block_ms * 1e3,
        )


def terms(step: Step) -> list[float]:
    """What each coefficient multiplies in ``step``'s time."""
    return [1.0, step.prefill_tokens, step.decode_seqs, step.decode_seqs * step.context]


def fit_steps(steps: Sequence[Step], times_ms: Sequence[float]) -> StepFit:
    """The non-negative coefficients whose predictions are closest to
    ``times_ms`` (each > 0), in relative terms (see the module docstring)."""
    measured = np.asarray(times_ms, dtype=float)
    rows = np.array([terms(step) for step in steps]) / measured[:, None]
    scale = rows.max(axis=0)  # each column to at most 1, so that lstsq sees columns of like size
    kept = [column for column in range(rows.shape[1]) if scale[column] > 0]  # a cost no step incurs stays 0
    found = np.zeros(rows.shape[1])
    while kept:
        solution = np.linalg.lstsq(rows[:, kept] / scale[kept], np.ones(len(measured)), rcond=None)[0]
        if (solution >= 0).all():
            found[kept] = solution / scale[kept]
            break
        del kept[int(np.argmin(solution))]
    return StepFit(*(float(value) for value in found))


def relative_errors(fit: StepFit, steps: Sequence[Step], times_ms: Sequence[float]) -> list[float]:
    """How far each prediction is from its measurement, as a share of the measurement."""
    return [abs(fit.predict_ms(step) - time) / time for step, time in zip(steps, times_ms)]


__all__ = ["StepFit", "fit_steps", "relative_errors", "terms"]
