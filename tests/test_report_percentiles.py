"""The summary's percentiles (``summary.percentiles``) are numpy's, to the bit:
the report computes them itself only because ``np.percentile``'s checks
cost ~100 us a call, and a fleet's summary makes five for each replica."""

from __future__ import annotations

import numpy as np
import pytest

from blockspace.simulator.summary import SHARES, percentiles


def _samples() -> list[np.ndarray]:
    rng = np.random.default_rng(51)
    samples = [np.array([3.5]), np.array([1.0, 2.0]), np.zeros(7), np.array([2.0, np.nan])]
    for size in (*range(1, 40), 101, 1_000, 4_999):
        samples += [
            rng.exponential(0.3, size),
            rng.integers(0, 4, size).astype(float),
            np.round(rng.normal(2, 1, size), 3),
        ]
    return samples


@pytest.mark.parametrize(
    "shares", [SHARES, SHARES[2:], np.true_divide([0, 25, 100], 100)], ids=["summary", "p99", "ends"]
)
def test_the_percentiles_are_numpys_to_the_bit(shares):
    for values in _samples():
        ours, numpys = percentiles(values, shares), np.percentile(values, shares * 100)
        assert np.array_equal(ours, numpys, equal_nan=True), (values, ours, numpys)
