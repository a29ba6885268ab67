"""Contract tests over the estimator registry: what every estimator promises, checked on each.

Every registered estimator (``pipelines.estimators.ESTIMATORS``), on one small problem
(nation → 2 states → 6 counties, two cells, discrete Gaussian measurements of every level's
cells, the state totals invariant), run through :func:`run_estimator` as the pipeline runs it:

- consistency: every level is the sum of its children, cell by cell (exact for integers);
- invariants: exact (``==`` after the integer step);
- privacy: the statement is the one derived from the measurements, names the invariants, and a
  claim below the spend is refused;
- ``integer``: integer output from the estimator itself;
- ``unbiased``: the mean error over independent releases is within 4 standard errors of 0 at
  every node and cell, a test that a planted shift of 0.3 of a release's standard deviation fails
  (power);
- ``standard_errors``: the reported SEs are finite and equal the spread of the errors
  (χ² at α = 1e-6), a test that SEs 30% too small or too large fail (power).

An estimator registered later is picked up by the parametrisation with no edit here. MCMC
conditioning (15 s per release here) runs its one-release checks behind ``slow``; its
repeated-release checks (300 releases) are skipped, said so in the skip reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from censusdp.budget import PrivacyStatement
from censusdp.errors import BudgetError
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.privacy import derive_statement
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.pipelines.estimators import ESTIMATORS, run_estimator
from censusdp.pipelines.spec import EstimatorSpec, McmcSpec
from censusdp.rng import KeyedRNG

CELLS = ("a", "b")
SIGMA = 2.0
ALPHA = 1e-6
#: Estimators whose one release takes seconds (MCMC: 15 s here): their contract runs under ``slow``.
SLOW_TO_REPEAT = {"conditioning"}


def _problem():
    h = Hierarchy.from_parents(
        ["nation", "state", "county"],
        [["US"], ["01", "02"], [f"c{i}" for i in range(6)]],
        [None, np.array([0, 0]), np.array([0, 0, 0, 1, 1, 1])],
    )
    leaves = np.array([[40, 3], [12, 0], [25, 7], [60, 2], [9, 1], [30, 5]])
    counts = h.aggregate(leaves)
    plan = [(k, Query.detailed(CELLS), DiscreteGaussian(SIGMA**2)) for k in range(3)]
    invariants = [invariant(counts, 1, Query.total(CELLS))]
    return h, counts, plan, invariants


def _release(name: str, seed: int, integer: str = "none", privacy=None):
    h, counts, plan, invariants = _problem()
    rng = KeyedRNG.from_seed(seed)
    meas = measure(h.names, counts, plan, rng.child("measure"))
    mcmc = McmcSpec(tv_bound=0.05, chains=4)
    opts = EstimatorSpec(run=(name,), integer=integer, mcmc=mcmc)
    rel = run_estimator(name, h, CELLS, meas, invariants, privacy, rng.child("est"), opts)
    return h, counts, plan, invariants, rel


def _one_release(name: str):
    marks = [pytest.mark.slow] if name in SLOW_TO_REPEAT else []
    return pytest.param(name, marks=marks)


def _repeatable(name: str):
    marks = (
        [pytest.mark.skip(reason=f"{name}: 300 releases of seconds each are out of reach here")]
        if name in SLOW_TO_REPEAT
        else []
    )
    return pytest.param(name, marks=marks)


@pytest.mark.parametrize("name", [_one_release(n) for n in ESTIMATORS.names()])
def test_every_estimator_is_consistent_exact_on_invariants_and_derives_its_statement(name):
    est = ESTIMATORS.get(name)
    h, counts, plan, invariants, rel = _release(name, seed=11, integer="round")
    leaves = rel.level(h.depth - 1)
    for k in range(h.depth):
        np.testing.assert_array_equal(rel.level(k), h.aggregate(leaves)[k])
        assert np.all(rel.level(k) == np.round(rel.level(k))), f"{name}: level {k} not integer"
    np.testing.assert_array_equal(rel.level(1).sum(axis=1), counts[1].sum(axis=1))
    spent = derive_statement(h.names, plan, invariants)
    got = rel.privacy
    assert (got.accounting, got.rho, got.epsilon) == (spent.accounting, spent.rho, spent.epsilon)
    assert got.invariants == spent.invariants == ("state: total",)
    assert spent.notes[0] in got.notes
    if est.integer:
        _, _, _, _, raw = _release(name, seed=11, integer="none")
        assert raw.integer and np.all(raw.level(2) == np.round(raw.level(2)))


@pytest.mark.parametrize("name", ESTIMATORS.names())
def test_every_estimator_refuses_a_claim_below_what_its_measurements_spend(name):
    h, counts, plan, invariants = _problem()
    spent = derive_statement(h.names, plan, invariants)
    claim = PrivacyStatement("zcdp", rho=spent.rho * 0.5, invariants=spent.invariants)
    with pytest.raises(BudgetError):
        _release(name, seed=12, privacy=claim)


def _errors(name: str, runs: int, shift: float = 0.0):
    """(runs, n_nodes_all_levels, cells) errors of the real-valued release, and its SEs."""
    errs, ses = [], None
    for r in range(runs):
        h, counts, _, _, rel = _release(name, seed=1000 + r)
        est = np.concatenate([rel.level(k) for k in range(h.depth)])
        truth = np.concatenate(counts)
        if ses is None and rel.variances is not None:
            ses = np.sqrt(np.concatenate([rel.variances[k] for k in range(h.depth)]))
        errs.append(est - truth)
    errs = np.asarray(errs)
    if shift:
        errs = errs + shift * errs.std(axis=0, ddof=1)
    return errs, ses


def _unbiased(errs: np.ndarray) -> bool:
    """Mean error within 4 standard errors of 0 wherever the error is random (invariant
    cells have none)."""
    sd = errs.std(axis=0, ddof=1)
    random = sd > 1e-9
    z = errs.mean(axis=0)[random] / (sd[random] / np.sqrt(errs.shape[0]))
    return bool(np.all(np.abs(z) < 4.0)) and bool(np.all(np.abs(errs[:, ~random]) < 1e-6))


@pytest.mark.parametrize(
    "name", [_repeatable(n) for n in ESTIMATORS.names() if ESTIMATORS.get(n).unbiased]
)
def test_estimators_promising_unbiasedness_are_unbiased_and_the_test_has_power(name):
    errs, _ = _errors(name, runs=300)
    assert _unbiased(errs)
    assert not _unbiased(errs + 0.3 * errs.std(axis=0, ddof=1))


def _scale_pvalue(errs: np.ndarray, ses: np.ndarray) -> float:
    """Two-sided χ² test that the errors have the reported SEs (random cells only)."""
    random = ses > 1e-9
    z2 = (errs[:, random] / ses[random]) ** 2
    # the cells of one node (and nodes of one tree) are correlated: test each cell's own
    # χ²(runs) and combine the two-sided p-values by Bonferroni
    df = errs.shape[0]
    stat = z2.sum(axis=0)
    p = 2 * np.minimum(stats.chi2.cdf(stat, df), stats.chi2.sf(stat, df))
    return float(min(1.0, p.min() * p.size))


@pytest.mark.parametrize(
    "name", [_repeatable(n) for n in ESTIMATORS.names() if ESTIMATORS.get(n).standard_errors]
)
def test_estimators_promising_standard_errors_report_the_spread_of_their_errors(name):
    errs, ses = _errors(name, runs=300)
    assert ses is not None and np.all(np.isfinite(ses))
    assert _scale_pvalue(errs, ses) > ALPHA
    assert _scale_pvalue(errs, ses * 0.7) < ALPHA
    assert _scale_pvalue(errs, ses * 1.3) < ALPHA
