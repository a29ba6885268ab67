"""A small two-level GLS release (nation → states → counties) shared by the release tests."""

from __future__ import annotations

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.estimation import tree_gls
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.queries import Invariant, Measurement, Query

PRIVACY = PrivacyStatement("zcdp", rho=0.5, invariants=("state: total",))


def two_level(gen, n_states=4, per_state=6, K=2):
    par = np.repeat(np.arange(n_states), per_state)
    h = Hierarchy.from_parents(
        ["nation", "state", "county"],
        [
            ["US"],
            [f"{s:02d}" for s in range(n_states)],
            [f"{p:02d}{i:03d}" for i, p in enumerate(par)],
        ],
        [None, np.zeros(n_states, int), par],
    )
    cells = [f"c{j}" for j in range(K)]
    counts = h.aggregate(gen.integers(0, 500, size=(h.leaves.size, K)))
    return h, cells, counts


def release_for(gen, h, cells, counts, sigma=3.0):
    q, t = Query.detailed(cells), Query.total(cells)
    meas = [
        Measurement(k, q, counts[k] + gen.normal(0, sigma, counts[k].shape), Gaussian(sigma))
        for k in (1, 2)
    ]
    inv = [Invariant(1, t, t.apply(counts[1]).astype(float))]
    return tree_gls(h, cells, meas, inv, PRIVACY)
