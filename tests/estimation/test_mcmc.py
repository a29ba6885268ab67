"""Tests of the constraint-preserving MH engine: exact constraints, Gaussian covariance."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import null_space

from censusdp.estimation.conditioning.estimator import ConditioningProblem
from censusdp.estimation.conditioning.mcmc import (
    BasisMoves,
    DoubleGeometricStep,
    GaussianStep,
    MetropolisHastings,
    ProductTarget,
)
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.discrete import DiscreteLaplace
from censusdp.mechanisms.laws import Gaussian, Laplace
from censusdp.mechanisms.queries import Query, invariant, measure

CELLS = ["a", "b", "c"]


def _tree() -> Hierarchy:
    return Hierarchy.from_parents(
        ["nation", "state", "county"],
        [["US"], ["A", "B"], [f"k{i}" for i in range(7)]],
        [None, np.zeros(2), np.array([0, 0, 0, 1, 1, 1, 1])],
    )


def _problem(rng, law, *, nonnegative=False):
    h = _tree()
    x = np.arange(21).reshape(7, 3) % 5 + 1
    lv = h.aggregate(x)
    plan = [(k, Query.detailed(CELLS), law) for k in range(3)] + [(1, Query.total(CELLS), law)]
    ms = measure(h.names, lv, plan, rng)
    inv = [invariant(lv, 0, Query.total(CELLS)), invariant(lv, 1, Query.total(CELLS))]
    start = x if nonnegative else None  # a feasible non-negative start (test only)
    return ConditioningProblem(h, 3, ms, inv, nonnegative=nonnegative, start=start), lv


def _check_constraints(prob, states, lv, exact):
    """Recompute every residual: e = y − Q z for every measurement, invariants."""
    z = prob.tables(states)
    for n in range(states.shape[0]):
        levels = prob.hierarchy.aggregate(z[n])
        for m, e in zip(
            prob.measurements, prob.layout.noise_blocks(states[n : n + 1]), strict=True
        ):
            resid = m.values - m.query.apply(levels[m.level]) - e[0]
            if exact:
                assert np.array_equal(resid, np.zeros_like(resid))
            else:
                assert np.max(np.abs(resid)) < 1e-9
        for inv in prob.invariants:
            got = inv.query.apply(levels[inv.level])
            if exact:
                assert np.array_equal(got, inv.values)
            else:
                assert np.max(np.abs(got - inv.values)) < 1e-9


@pytest.mark.parametrize("law", [Laplace(2.0), DiscreteLaplace(2)])
def test_tree_moves_keep_every_constraint(rng, law):
    prob, lv = _problem(rng, law)
    gen = rng.generator("test/moves")
    cs = prob.engine.init(prob.initial_states(16, gen, spread=30))
    _check_constraints(prob, cs.states, lv, law.is_integer)
    for _ in range(300):
        prob.engine.step(cs, gen)
    assert cs.acceptance_rate.mean() > 0.1
    assert np.any(prob.layout.leaf_offsets(cs.states) != 0)
    _check_constraints(prob, cs.states, lv, law.is_integer)
    if law.is_integer:
        assert cs.states.dtype == np.int64


def test_nonnegativity_is_respected(rng):
    prob, lv = _problem(rng, Laplace(5.0), nonnegative=True)
    gen = rng.generator("test/nonneg")
    cs = prob.engine.init(prob.initial_states(16, gen, spread=30))
    for _ in range(300):
        prob.engine.step(cs, gen)
    assert np.all(prob.tables(cs.states) >= 0)


@pytest.mark.parametrize("integer", [False, True])
def test_basis_moves_keep_linear_constraints(rng, integer):
    C = np.array([[1, 1, 0, 0, 1], [0, 1, 1, 1, 0]])
    if integer:
        B = np.array([[1, 0, 0, 0, -1], [0, 0, 1, -1, 0], [1, -1, 1, 0, 0]]).T
        assert np.all(C @ B == 0)
        moves = BasisMoves(B, DoubleGeometricStep(0.5), mode="all")
    else:
        moves = BasisMoves(null_space(C), GaussianStep(1.0))
    target = ProductTarget([Laplace(1.0)], np.zeros(5, dtype=np.int64))
    eng = MetropolisHastings(target, moves)
    gen = rng.generator("test/basis")
    cs = eng.init(np.zeros((32, 5)))
    for _ in range(200):
        eng.step(cs, gen)
    resid = cs.states @ C.T
    if integer:
        assert np.array_equal(resid, np.zeros_like(resid))
    else:
        assert np.max(np.abs(resid)) < 1e-9
    assert np.any(cs.states != 0)


def test_gaussian_target_matches_exact_conditional_covariance(rng):
    """Posterior of z ∝ Π N(y − Q z) on a 3-leaf tree with a root measurement: covariance
    (Mᵀ Σ⁻¹ M)⁻¹, M = [1ᵀ; I], against the MCMC's empirical covariance (within 5%)."""
    h = Hierarchy.from_parents(["r", "l"], [["R"], ["a", "b", "c"]], [None, np.zeros(3)])
    x = np.array([[3.0], [1.0], [4.0]])
    lv = h.aggregate(x)
    plan = [(0, Query.detailed(["n"]), Gaussian(0.7)), (1, Query.detailed(["n"]), Gaussian(1.0))]
    ms = measure(h.names, lv, plan, rng)
    prob = ConditioningProblem(h, 1, ms, [], step_scale=1.5)
    gen = rng.generator("test/gauss")
    cs = prob.engine.init(prob.initial_states(2000, gen, spread=6))
    prob.engine.run(cs, 300, gen, thin=300)
    draws = prob.engine.run(cs, 400, gen, thin=10, keep=slice(prob.layout.w_offset, None))
    emp = np.cov(draws.reshape(-1, 3).T)
    M = np.vstack([np.ones((1, 3)), np.eye(3)])
    prec = M.T @ np.diag([1 / 0.49, 1, 1, 1]) @ M
    exact = np.linalg.inv(prec)
    assert np.max(np.abs(emp - exact)) < 0.05 * np.max(np.abs(exact))
    np.testing.assert_allclose(np.diag(emp), np.diag(exact), rtol=0.05)
