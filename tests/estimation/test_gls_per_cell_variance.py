"""Per-cell check of GLS's exact variances over 20,000 noise draws (slow: ~30 s)."""

from __future__ import annotations

import numpy as np
import pytest

from censusdp.budget import PrivacyStatement
from censusdp.estimation.gls.tree import tree_gls
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.queries import Invariant, Measurement, Query


@pytest.mark.slow
def test_every_cell_variance_within_5_percent_over_20000_draws():
    h = Hierarchy.from_parents(
        ["n", "s", "c"],
        [["US"], ["a", "b"], ["a1", "a2", "a3", "b1", "b2"]],
        [None, [0, 0], [0, 0, 0, 1, 1]],
    )
    cells = ["x", "y"]
    counts = h.aggregate(np.array([[5, 9], [1, 0], [30, 2], [7, 7], [0, 4]]))
    laws = [Gaussian(2.0), Gaussian(1.5), Gaussian(1.0)]
    privacy = PrivacyStatement("zcdp", rho=1.0, invariants=("n: total",))
    inv = [Invariant(0, Query.total(cells), counts[0].sum(1, keepdims=True))]
    gen = np.random.default_rng(0)  # test noise, not a release
    draws = []
    for _ in range(20_000):
        meas = [
            Measurement(
                k, Query.detailed(cells), counts[k] + gen.normal(0, law.sigma, counts[k].shape), law
            )
            for k, law in enumerate(laws)
        ]
        rel = tree_gls(h, cells, meas, inv, privacy)
        draws.append(np.concatenate([e.ravel() for e in rel.estimates]))
    draws = np.array(draws)
    var = np.concatenate([v.ravel() for v in rel.variances])
    truth = np.concatenate([c.ravel() for c in counts])
    free = var > 1e-12  # the invariant root total has variance 0
    assert np.all(np.abs(draws.var(axis=0)[free] / var[free] - 1) < 0.05)
    assert np.all(
        np.abs(draws.mean(axis=0)[free] - truth[free]) < 4 * np.sqrt(var[free] / len(draws))
    )
