"""Gibbs (heat-bath) move sets: constraints kept exactly, the stationary law against exact
enumeration, and the L-lag coupling bound against the true TV distance by matrix powers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats as st

from censusdp.estimation.conditioning.diagnostics import meeting_times
from censusdp.estimation.conditioning.estimator import ConditioningProblem
from censusdp.estimation.conditioning.gibbs_moves import GibbsGroupMoves, LineDraws
from censusdp.estimation.integer.lattice_release import lattice_engine
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.discrete import DiscreteGaussian, DiscreteLaplace
from censusdp.mechanisms.lattice import (
    GroupSumLattice,
    IntegerLattice,
    LatticeLaplace,
    table_margins_incidence,
)
from censusdp.mechanisms.laws import Gaussian, Laplace
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.rng import KeyedRNG

ALPHA = 1e-6


def _exact_gibbs_kernel(pts: np.ndarray, logp: np.ndarray, directions, weights) -> np.ndarray:
    """Transition matrix of random-scan Gibbs along ``directions`` on the finite set ``pts``:
    P[s, t] = Σ_k w_k π(t) / Σ_{t' ∈ line_k(s)} π(t') for t on the line through s along b_k."""
    index = {tuple(p): i for i, p in enumerate(pts)}
    n = len(pts)
    P = np.zeros((n, n))
    span = 2 * int(np.abs(pts).max()) + 2
    for s, p in enumerate(pts):
        for b, w in zip(directions, weights, strict=True):
            line = [index.get(tuple(p + u * b)) for u in range(-span, span + 1)]
            line = [t for t in line if t is not None]
            mass = np.exp(logp[line] - logp[line].max())
            P[s, line] += w * mass / mass.sum()
    return P


def _tv_curve(P: np.ndarray, pi: np.ndarray, start: int, ts: np.ndarray) -> np.ndarray:
    dist = np.zeros(len(pi))
    dist[start] = 1.0
    out = []
    for _ in ts:
        out.append(0.5 * np.abs(dist - pi).sum())
        dist = dist @ P
    return np.array(out)


def _bound_dominates(eng, d: int, P, pi, start: int, lag: int, n: int = 3000, seed: int = 5):
    ts = np.arange(0, 30)
    tv_true = _tv_curve(P, pi, start, ts)
    z0 = np.zeros((n, d), np.int64)
    res = meeting_times(eng, z0, z0, lag, np.random.default_rng(seed), max_iterations=10_000)
    assert res.all_met
    terms = np.maximum(0, np.ceil((res.meeting_times[:, None] - lag - ts[None, :]) / lag))
    bound, se = terms.mean(0), terms.std(0, ddof=1) / math.sqrt(n)
    # where the true TV is below ~3/n, n pairs cannot resolve it (the estimate is 0)
    resolvable = tv_true >= 3.0 / n
    assert np.all((bound + 4 * se >= tv_true)[resolvable])
    assert tv_true[2] > 0.05  # not vacuous: the chain starts far from π
    return tv_true, bound


def test_group_sweep_bound_dominates_exact_tv():
    box, eps = 4, 0.4
    lat = GroupSumLattice.from_labels(["a"] * 3)
    pts = np.array([p for p in itertools.product(range(-box, box + 1), repeat=3) if sum(p) == 0])
    law = LatticeLaplace(eps)
    logp = law.log_target(pts)
    # a random matching of 3 cells pairs each unordered pair with probability 1/3
    dirs = [np.array(v) for v in ([1, -1, 0], [1, 0, -1], [0, 1, -1])]
    P = _exact_gibbs_kernel(pts, logp, dirs, [1 / 3] * 3)
    pi = np.exp(logp - logp.max())
    pi /= pi.sum()
    assert np.allclose(pi @ P, pi)
    eng = lattice_engine(lat, law, 0.5, mode="gibbs", box=box)
    # start far from π: from a corner of the box
    corner = np.array([[box, -box, 0]])
    start = int(np.flatnonzero(np.all(pts == corner, axis=1))[0])
    ts = np.arange(0, 30)
    tv_true = _tv_curve(P, pi, start, ts)
    n, lag = 3000, 3
    z0 = np.repeat(corner, n, axis=0)
    res = meeting_times(eng, z0, z0, lag, np.random.default_rng(6), max_iterations=10_000)
    assert res.all_met
    terms = np.maximum(0, np.ceil((res.meeting_times[:, None] - lag - ts[None, :]) / lag))
    bound, se = terms.mean(0), terms.std(0, ddof=1) / math.sqrt(n)
    resolvable = tv_true >= 3.0 / n
    assert np.all((bound + 4 * se >= tv_true)[resolvable])
    assert tv_true[1] > 0.05


def test_basis_gibbs_bound_dominates_exact_tv():
    lat = IntegerLattice.from_incidence(table_margins_incidence(2, 3))
    law, box, lag = LatticeLaplace(0.6, "l1"), 3, 3
    r = 2 * box + 2
    grid = np.stack(np.meshgrid(*[np.arange(-r, r + 1)] * lat.n_directions), -1)
    pts = lat.point(grid.reshape(-1, lat.n_directions))
    pts = np.unique(pts[np.all(np.abs(pts) <= box, axis=1)], axis=0)
    logp = law.log_target(pts)
    k = lat.n_directions
    P = _exact_gibbs_kernel(pts, logp, [lat.basis[:, j] for j in range(k)], [1 / k] * k)
    pi = np.exp(logp - logp.max())
    pi /= pi.sum()
    assert np.allclose(pi @ P, pi)
    eng = lattice_engine(lat, law, 0.5, mode="gibbs", box=box)
    start = int(np.flatnonzero(np.all(pts == 0, axis=1))[0])
    _bound_dominates(eng, lat.dim, P, pi, start, lag)


def test_group_sweeps_keep_every_group_total_and_match_exact_marginal():
    groups = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 2])
    eps = 0.5
    draws = LineDraws(np.full(10, eps), integer=True)
    eng = lattice_engine(GroupSumLattice(groups), LatticeLaplace(eps), 0.5, mode="gibbs")
    assert isinstance(eng.moves, GibbsGroupMoves)
    assert draws.integer
    out = eng.run(eng.init(np.zeros((400, 10), np.int64)), 200, np.random.default_rng(8), thin=20)
    flat = out.reshape(-1, 10)
    assert flat.dtype == np.int64
    for g in range(3):
        assert np.all(flat[:, groups == g].sum(axis=1) == 0)
    # the 2-cell group: z = (k, −k) with P(k) ∝ exp(−2ε|k|) exactly
    k = out[-1][:, 3]
    xs = np.arange(-15, 16)
    pmf = np.exp(-2 * eps * np.abs(xs))
    pmf /= pmf.sum()
    counts = np.array([(k == x).sum() for x in xs])
    keep = pmf * k.size >= 5
    obs = np.append(counts[keep], k.size - counts[keep].sum())
    exp = np.append(pmf[keep], 1 - pmf[keep].sum()) * k.size
    assert st.chisquare(obs, exp).pvalue > ALPHA


def _small_tree_problem(law, nonnegative: bool):
    h = Hierarchy.from_parents(
        ["root", "mid", "leaf"],
        [["R"], ["A", "B"], ["a1", "a2", "b1", "b2"]],
        [None, np.zeros(2, np.int64), np.array([0, 0, 1, 1])],
    )
    x = np.array([[3], [0], [2], [1]])
    lv = h.aggregate(x)
    rng = KeyedRNG.reproducible(3, warn=False)
    plan = [(1, Query.detailed(["n"]), law), (2, Query.detailed(["n"]), law)]
    ms = measure(h.names, lv, plan, rng)
    inv = [invariant(lv, 0, Query.total(["n"]))]
    start = x if nonnegative else None
    return h, lv, ms, inv, ConditioningProblem(h, 1, ms, inv, nonnegative=nonnegative, start=start)


@pytest.mark.parametrize("law", [DiscreteLaplace(2), DiscreteGaussian(2)], ids=["laplace", "gauss"])
def test_tree_sweeps_sample_the_exact_posterior_on_an_enumerable_tree(law):
    """Discrete Laplace / Gaussian at two levels, root total invariant, leaves ≥ 0:
    enumerate π(z)."""
    h, lv, ms, inv, prob = _small_tree_problem(law, nonnegative=True)
    assert prob.kernel == "gibbs"
    total = int(lv[0][0, 0])
    tables = np.array([t for t in itertools.product(range(total + 1), repeat=4) if sum(t) == total])
    logp = np.zeros(len(tables))
    for m in ms:
        z = np.stack([h.aggregate(t[:, None])[m.level][:, 0] for t in tables])
        logp += m.law.log_density(np.asarray(m.values)[:, 0][None, :] - z).sum(axis=1)
    pi = np.exp(logp - logp.max())
    pi /= pi.sum()
    eng = prob.engine
    cs = eng.init(prob.initial_states(4000, np.random.default_rng(1)))
    eng.run(cs, 150, np.random.default_rng(2))
    final = prob.tables(cs.states)[:, :, 0]
    assert np.all(final >= 0) and np.all(final.sum(axis=1) == total)
    index = {tuple(t): i for i, t in enumerate(tables)}
    counts = np.bincount([index[tuple(t)] for t in final], minlength=len(tables))
    exp = pi * len(final)
    keep = exp >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(exp[keep], exp[~keep].sum())
    assert st.chisquare(obs, exp).pvalue > ALPHA


@pytest.mark.parametrize(
    "law", [Laplace(2.0), DiscreteLaplace(2), Gaussian(2.0), DiscreteGaussian(2)]
)
@pytest.mark.parametrize("nonnegative", [False, True])
def test_tree_sweeps_keep_consistency_invariants_and_bounds(law, nonnegative):
    gen = np.random.default_rng(4)
    h = random_hierarchy(gen, [(2, 4), (1, 5), (1, 4)])
    x = gen.integers(0, 20, (h.leaves.size, 2))
    lv = h.aggregate(x)
    rng = KeyedRNG.reproducible(4, warn=False)
    cells = ["a", "b"]
    plan = [(k, Query.detailed(cells), law) for k in range(1, h.depth)]
    ms = measure(h.names, lv, plan, rng)
    inv = [invariant(lv, 1, Query.total(cells))]
    prob = ConditioningProblem(
        h, 2, ms, inv, nonnegative=nonnegative, start=x if nonnegative else None
    )
    assert prob.kernel == "gibbs"
    eng = prob.engine
    cs = eng.init(prob.initial_states(50, gen, spread=prob.default_spread))
    start = prob.tables(cs.states).copy()
    eng.run(cs, 60, gen)
    tables = prob.tables(cs.states)
    assert np.abs(tables - start).max() > 0
    for t in tables:
        levels = h.aggregate(t)
        got = levels[1].sum(axis=1)
        if law.is_integer:
            assert t.dtype == np.int64 and np.array_equal(got, lv[1].sum(axis=1))
        else:
            assert np.abs(got - lv[1].sum(axis=1)).max() < 1e-9
        if nonnegative:
            assert t.min() >= (0 if law.is_integer else -1e-9)
    # the noise coordinates equal y − Q z at every level (consistency of the state)
    noise = prob.layout.noise_blocks(cs.states)
    for m, e in zip(ms, noise, strict=True):
        z = np.stack([h.aggregate(t)[m.level] for t in tables])
        assert np.abs(e - (np.asarray(m.values)[None] - z)).max() < 1e-9
