"""Reported variances after rounding against simulation, at every level, and unbiasedness.

The rounding variance of a sum (a node's cell, its total, a marginal row) is the variance of
the sum of the rounding errors under the dependent scheme; these tests draw many releases
with fixed seeds and compare, level by level, the empirical variance of every node's sums
with the reported one (pooled over the level's nodes: within 5%), and the means with the
real values (within 4 reported standard errors). The fast form draws 2,000 copies of one tree
at once (copies under an extra root: given its own root bit, which is Bernoulli(f) as in a
lone release, a copy's rounding is that of a lone release); the slow form draws lone releases.
"""

from __future__ import annotations

import numpy as np
import pytest
from rounding_fixtures import copies

from censusdp.budget import PrivacyStatement
from censusdp.estimation.integer.laminar import (
    RoundingPlan,
    round_release,
    round_tree,
    rounding_variance,
    rounding_variances,
)
from censusdp.estimation.release import Release
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.queries import Invariant, Query
from censusdp.rng import KeyedRNG

PRIVACY = PrivacyStatement("pure", epsilon=1.0)
CELLS = ["m0", "m1", "f0", "f1"]
SEX = Query.marginal("sex", CELLS, {"male": "m*", "female": "f*"})
CONFIGS = [
    ("cells", None),
    ("totals", None),
    ("totals", Query.total(CELLS)),
    ("cells", Query.total(CELLS)),
    ("cells", SEX),
    ("totals", SEX),
]


def tree_values(seed: int, fanouts) -> tuple[Hierarchy, np.ndarray]:
    gen = np.random.default_rng(seed)
    h = random_hierarchy(gen, fanouts)
    return h, gen.uniform(0, 12, (h.leaves.size, len(CELLS)))


def held(h: Hierarchy, x: np.ndarray, query: Query | None, level: int) -> np.ndarray:
    """``x`` shifted inside each node of ``level`` so that ``query``'s rows sum to integers
    there (as a release meeting that invariant does)."""
    if query is None:
        return x
    x = x.copy()
    anc = h.ancestor_index(h.depth - 1, level)
    first = np.r_[0, np.cumsum(np.bincount(anc))[:-1]]
    for row in np.asarray(query.matrix).astype(bool):
        s = np.bincount(anc, x[:, row].sum(axis=1), minlength=h.levels[level].size)
        x[first, np.argmax(row)] -= s - np.floor(s)
    return x


def sums(level_values: np.ndarray) -> np.ndarray:
    """Every tracked sum of a level's nodes: cells, total, the two sex margins."""
    return np.hstack(
        [level_values, level_values.sum(axis=1, keepdims=True), SEX.apply(level_values)]
    )


def reported(var: np.ndarray, plan: RoundingPlan) -> np.ndarray:
    """The reported variances in the order of :func:`sums`."""
    idx = list(range(len(CELLS) + 1))
    for row in np.asarray(SEX.matrix).astype(bool):
        idx.append(int(np.flatnonzero((plan.masks == row).all(axis=1))[0]))
    return var[:, idx]


def check_level(
    draws: np.ndarray, real: np.ndarray, rep: np.ndarray, where: str, within: float | None = 0.05
) -> None:
    """draws (R, nodes, sums): pooled variance within 5% (``within``; None: a z-test at
    α = 1e-6 on the pooled variance, for fewer draws), means within 4 SE."""
    emp = draws.var(axis=0, ddof=1)
    live = rep > 1e-12
    assert np.all(emp[~live] == 0), f"{where}: a sum reported exact varies"
    if live.any() and within is not None:
        ratio = emp[live].sum() / rep[live].sum()
        assert abs(ratio - 1) < within, f"{where}: empirical/reported variance {ratio:.4f}"
    elif live.any():
        Y = ((draws - draws.mean(axis=0)) ** 2)[:, live].sum(axis=1)
        z = (Y.mean() - rep[live].sum()) / (Y.std(ddof=1) / np.sqrt(Y.size))
        assert abs(z) < 4.89, f"{where}: pooled variance {z:.1f} SE off the reported"
    se = np.sqrt(rep / draws.shape[0])
    z = np.abs(draws.mean(axis=0) - real)[live] / se[live]
    assert z.max(initial=0.0) < 4, f"{where}: a mean is {z.max():.1f} SE off"


def invariants_for(h: Hierarchy, x: np.ndarray, query: Query | None, level: int):
    if query is None:
        return []
    return [Invariant(level, query, np.rint(query.apply(h.aggregate(x)[level])))]


@pytest.mark.parametrize("mode,query", CONFIGS)
def test_reported_rounding_variances_match_simulation_at_every_level(mode, query):
    h0, x0 = tree_values(11, [(3, 3), (2, 4)])
    x0 = held(h0, x0, query, 1)
    C, R = 2000, 2
    h = copies(h0, C)
    x = np.tile(x0, (C, 1))
    invs = invariants_for(h, x, query, 2)  # the states of every copy
    plan = RoundingPlan.build(h.names, CELLS, mode, invs, [SEX])
    var = rounding_variances(h, x, plan)
    real = h0.aggregate(x0)
    draws = [[] for _ in range(h0.depth)]
    for r in range(R):
        got = round_tree(h, x, KeyedRNG.reproducible(100 + r, warn=False), plan=plan)
        for k in range(h0.depth):
            n = h0.levels[k].size
            draws[k].append(sums(got[k + 1]).reshape(C, n, -1))
    for k in range(h0.depth):
        rep = reported(var[k + 1], plan).reshape(C, h0.levels[k].size, -1)
        assert np.allclose(rep, rep[:1])  # every copy reports the same
        check_level(
            np.concatenate(draws[k]),
            sums(real[k]),
            rep[0],
            f"{mode}/{query and query.name}/{h0.names[k]}",
        )


def test_the_old_rule_fails_the_same_check():
    """Power: summing leaf variances (f(1 − f) of each reported value) is far off above the
    leaves in "totals" mode, so the simulation check rejects it (and a 30% wrong scale)."""
    h0, x0 = tree_values(11, [(3, 3), (2, 4)])
    C = 2000
    h = copies(h0, C)
    x = np.tile(x0, (C, 1))
    plan = RoundingPlan.build(h.names, CELLS, "totals", [], [SEX])
    got = round_tree(h, x, KeyedRNG.reproducible(100, warn=False), plan=plan)[1]  # nations
    emp = got.var(axis=0, ddof=1).sum()
    old = rounding_variance(h0.aggregate(x0)[0]).sum()
    new = reported(rounding_variances(h, x, plan)[1], plan)[:, :4].sum(axis=1).mean()
    assert abs(emp / new - 1) < 0.08  # one round of 2,000 copies
    assert abs(emp / old - 1) > 0.3
    assert abs(emp / (1.3 * new) - 1) > 0.08 and abs(emp / (0.7 * new) - 1) > 0.08


@pytest.mark.parametrize("mode", ["cells", "totals"])
def test_lone_releases_are_unbiased_at_the_root(mode):
    """500 lone releases: every level's cells and totals have mean the real value — the root
    leftover included (a rounding that floors it is short by its fraction every time)."""
    h, x = tree_values(12, [(2, 2), (2, 2)])
    x[0, 0] += 0.5 - (x.sum() % 1.0)  # the nation total's fraction is 1/2
    plan = RoundingPlan.build(h.names, CELLS, mode, [], [SEX])
    var = rounding_variances(h, x, plan)
    real = h.aggregate(x)
    R = 500
    outs = [round_tree(h, x, KeyedRNG.reproducible(r, warn=False), plan=plan) for r in range(R)]
    for k in range(h.depth):
        d = np.stack([sums(o[k]) for o in outs])
        check_level(d, sums(real[k]), reported(var[k], plan), f"{mode}/{h.names[k]}", None)


@pytest.mark.slow
@pytest.mark.parametrize("mode,query", CONFIGS)
def test_reported_rounding_variances_match_simulation_slow(mode, query):
    """20,000 draws of a larger tree (4,000 copies, 5 rounds) and 2,000 lone releases."""
    h0, x0 = tree_values(13, [(4, 4), (3, 5)])
    x0 = held(h0, x0, query, 1)
    C, R = 4000, 5
    h = copies(h0, C)
    x = np.tile(x0, (C, 1))
    plan = RoundingPlan.build(h.names, CELLS, mode, invariants_for(h, x, query, 2), [SEX])
    var = rounding_variances(h, x, plan)
    real = h0.aggregate(x0)
    draws = [[] for _ in range(h0.depth)]
    for r in range(R):
        got = round_tree(h, x, KeyedRNG.reproducible(200 + r, warn=False), plan=plan)
        for k in range(h0.depth):
            draws[k].append(sums(got[k + 1]).reshape(C, h0.levels[k].size, -1))
    for k in range(h0.depth):
        rep = reported(var[k + 1], plan).reshape(C, h0.levels[k].size, -1)[0]
        check_level(np.concatenate(draws[k]), sums(real[k]), rep, f"{mode}/{h0.names[k]}")
    invs = invariants_for(h0, x0, query, 1)
    rel = Release("gls", h0, CELLS, h0.aggregate(x0), None, PRIVACY)
    outs = [
        round_release(
            rel, KeyedRNG.reproducible(r, warn=False), method=mode, invariants=invs, queries=[SEX]
        )
        for r in range(2000)
    ]
    for k in range(h0.depth):
        d = np.stack([sums(o.estimates[k]) for o in outs])
        rep = np.hstack(
            [outs[0].sums.rounding[k][:, :5], outs[0].sum_variances(k, SEX, rounding_only=True)]
        )
        check_level(d, sums(real[k]), rep, f"lone {mode}/{h0.names[k]}", None)
