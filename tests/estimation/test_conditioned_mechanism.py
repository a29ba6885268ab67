"""ℳ_MH, the curator-side conditioned noise mechanism: its noise has the conditioned law
(exact enumeration, chi-square at α = 1e-6 with power against a 30% wrong scale), the chains
never see the data, the Gaussian case is the GLS projection, and bad tables are refused."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from stattests import chi2_pvalue

from censusdp.errors import DataError, SpecError
from censusdp.estimation.conditioning.mechanism import (
    ChainOptions,
    conditioned_mechanism,
    conditioned_noise,
    conditioned_releases,
)
from censusdp.estimation.gls.tree import tree_gls
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.discrete import DiscreteLaplace
from censusdp.mechanisms.laws import Gaussian, Laplace
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.rng import KeyedRNG

ALPHA = 1e-6
CELLS = ["n"]
Q = Query.total(CELLS)


def _tree() -> Hierarchy:
    """root → 2 tracts → 2 blocks each."""
    return Hierarchy.from_parents(
        ["root", "tract", "block"],
        [["R"], ["t0", "t1"], ["b0", "b1", "b2", "b3"]],
        [None, np.zeros(2), np.array([0, 0, 1, 1])],
    )


def _table(h: Hierarchy, blocks) -> list[np.ndarray]:
    return h.aggregate(np.asarray(blocks, dtype=np.int64).reshape(-1, 1))


def _rng(seed: int) -> KeyedRNG:
    return KeyedRNG.reproducible(seed, warn=False)


def _exact_marginals(t_block: float, t_tract: float, window: int = 30):
    """Exact pmfs of block 0's and tract 0's noise under the discrete Laplace noise of the
    blocks (scale ``t_block``) and tracts (``t_tract``), conditioned on a zero root total:
    enumeration of (b0, b1, b2) with b3 = −b0 − b1 − b2."""
    r = np.arange(-window, window + 1)
    b0, b1, b2 = np.meshgrid(r, r, r, indexing="ij")
    b3 = -(b0 + b1 + b2)
    t0, t1 = b0 + b1, b2 + b3
    logw = -(abs(b0) + abs(b1) + abs(b2) + abs(b3)) / t_block - (abs(t0) + abs(t1)) / t_tract
    w = np.exp(logw - logw.max())
    w /= w.sum()
    block = np.array([w[b0 == v].sum() for v in r])
    tract = np.array([w[t0 == v].sum() for v in r])
    return r, np.log(block), np.log(tract)


def test_integer_noise_has_the_conditioned_law():
    h = _tree()
    plan = [(1, Q, DiscreteLaplace(3)), (2, Q, DiscreteLaplace(2))]
    inv = [invariant(_table(h, [5, 1, 0, 7]), 0, Q)]
    opts = ChainOptions(n_coupled_pairs=100)
    noise, draws = conditioned_noise(h, CELLS, plan, inv, _rng(3), n_tables=4000, options=opts)
    assert draws.diagnostics["tv_bound"] < 0.01 and draws.diagnostics["integer"]
    assert noise.shape == (4000, 4, 1) and np.array_equal(noise, np.round(noise))
    assert np.all(noise.sum(axis=(1, 2)) == 0)  # the invariant: zero noise at the root
    block, tract = noise[:, 0, 0], noise[:, 0, 0] + noise[:, 1, 0]
    xs, log_block, log_tract = _exact_marginals(2.0, 3.0)
    assert chi2_pvalue(block, log_block, xs) > ALPHA
    assert chi2_pvalue(tract, log_tract, xs) > ALPHA
    _, wrong_block, wrong_tract = _exact_marginals(2.6, 3.9)  # power: 30% wider laws
    assert chi2_pvalue(block, wrong_block, xs) < ALPHA
    assert chi2_pvalue(tract, wrong_tract, xs) < ALPHA


def test_continuous_laplace_noise_has_the_conditioned_variance():
    """Sum invariant over 3 cells: the conditioned Laplace(λ) noise has variance 5/6 λ² per
    cell (against 4/3 λ² projected), its mean is 0; each within 4 standard errors."""
    h = Hierarchy.from_parents(["root", "cell"], [["R"], ["a", "b", "c"]], [None, np.zeros(3)])
    lam = 2.0
    inv = [invariant(_table(h, [3, 0, 8]), 0, Q)]
    noise, _ = conditioned_noise(h, CELLS, [(1, Q, Laplace(lam))], inv, _rng(5), n_tables=4000)
    e = noise[:, :, 0].ravel()
    n = noise.shape[0]
    np.testing.assert_allclose(noise.sum(axis=(1, 2)), 0.0, atol=1e-9)
    assert abs(e.mean()) < 4 * e.std() / np.sqrt(n)
    var = noise[:, 0, 0].var()
    se = np.sqrt((np.mean(noise[:, 0, 0] ** 4) - var**2) / n)
    assert abs(var - 5 / 6 * lam**2) < 4 * se
    assert abs(var - 1.69 * 5 / 6 * lam**2) > 4 * se  # power: 30% wider noise is told apart


@pytest.mark.parametrize("law", [Laplace(1.5), DiscreteLaplace(2)])
def test_the_chains_never_see_the_data(law):
    """Same key, two tables sharing nothing: the released noise is identical, so nothing in
    the sampling (burn-in, certificate, draw) depends on the confidential counts."""
    h = _tree()
    plan = [(1, Q, law), (2, Q, law)]
    out = []
    for blocks in ([5, 1, 0, 7], [40, 0, 2, 19]):
        x = _table(h, blocks)
        rel = conditioned_mechanism(h, CELLS, x, plan, [invariant(x, 0, Q)], None, _rng(9))
        if law.is_integer:  # the invariant: exact for integer noise, to rounding otherwise
            assert np.array_equal(rel.estimates[0], x[0])
        else:
            np.testing.assert_allclose(rel.estimates[0], x[0], rtol=0, atol=1e-9)
        for k in (1, 2):  # consistent
            np.testing.assert_allclose(h.aggregate_up(k, rel.estimates[k]), rel.estimates[k - 1])
        assert rel.integer == law.is_integer
        assert rel.estimates[2].dtype == (np.int64 if law.is_integer else np.float64)
        out.append(([e - v for e, v in zip(rel.estimates, x, strict=True)], rel))
    (noise_a, rel_a), (noise_b, rel_b) = out
    for a, b in zip(noise_a, noise_b, strict=True):  # (x + e) − x is e up to rounding
        np.testing.assert_allclose(a, b, rtol=0, atol=0 if law.is_integer else 1e-9)
    assert rel_a.diagnostics == rel_b.diagnostics
    assert rel_a.estimator == "conditioned_mechanism"
    assert rel_a.privacy.guarantee == "induced subspace differential privacy"
    assert not rel_a.privacy.data_dependent
    assert any("curator-side" in n for n in rel_a.privacy.notes)
    assert any("never see the data" in n for n in rel_a.privacy.notes)
    assert rel_a.variances[0][0, 0] == pytest.approx(0.0, abs=1e-12)
    assert np.all(rel_a.variances[2] > 0)


def test_gaussian_noise_is_the_projection_of_one_measurement():
    h = _tree()
    x = _table(h, [5, 1, 0, 7])
    plan = [(1, Q, Gaussian(2.0)), (2, Q, Gaussian(1.0))]
    inv = [invariant(x, 0, Q)]
    rel = conditioned_mechanism(h, CELLS, x, plan, inv, None, _rng(4))
    ref = tree_gls(h, CELLS, measure(h.names, x, plan, _rng(4).child("release/0")), inv, None)
    for got, want in itertools.chain(
        zip(rel.estimates, ref.estimates, strict=True),
        zip(rel.variances, ref.variances, strict=True),
    ):
        assert np.array_equal(got, want)
    assert rel.estimator == "conditioned_mechanism"
    assert any("curator-side" in n for n in rel.privacy.notes)


def test_tables_the_guarantee_does_not_cover_are_refused():
    h = _tree()
    x = _table(h, [5, 1, 0, 7])
    plan = [(2, Q, Laplace(1.0))]
    bad = [a.copy() for a in x]
    bad[1][0, 0] += 1
    with pytest.raises(DataError, match="level 'tract' are not the sums"):
        conditioned_mechanism(h, CELLS, bad, plan, [], None, _rng(1))
    other = invariant(_table(h, [5, 1, 0, 8]), 0, Q)
    with pytest.raises(DataError, match="invariant 'total' at level 'root' does not hold"):
        conditioned_mechanism(h, CELLS, x, plan, [other], None, _rng(1))
    with pytest.raises(DataError, match="2 count arrays for a hierarchy of 3 levels"):
        conditioned_mechanism(h, CELLS, x[:2], plan, [], None, _rng(1))
    with pytest.raises(SpecError, match="n_releases must be at least 1, not 0"):
        conditioned_releases(h, CELLS, x, plan, [], None, _rng(1), n_releases=0)


def test_releases_from_one_certificate_are_independent_draws():
    h = _tree()
    x = _table(h, [5, 1, 0, 7])
    plan = [(1, Q, DiscreteLaplace(2)), (2, Q, DiscreteLaplace(2))]
    inv = [invariant(x, 0, Q)]
    many = conditioned_releases(h, CELLS, x, plan, inv, None, _rng(2), n_releases=3)
    one = conditioned_mechanism(h, CELLS, x, plan, inv, None, _rng(2))
    assert all(np.array_equal(a, b) for a, b in zip(many[0].estimates, one.estimates, strict=True))
    for rel in many:
        assert np.array_equal(rel.estimates[0], x[0])
        assert rel.diagnostics["burn_in"] == one.diagnostics["burn_in"]  # one certificate
    leaves = [rel.estimates[2] for rel in many]
    assert not any(np.array_equal(a, b) for a, b in itertools.combinations(leaves, 2))


def test_chain_options_given_one_by_one_as_before_equal_chain_options():
    """The pre-ChainOptions keyword arguments still run (one release), over ``options``,
    through conditioned_mechanism too; an unknown keyword is refused."""
    h = _tree()
    x = _table(h, [5, 1, 0, 7])
    plan = [(1, Q, DiscreteLaplace(2)), (2, Q, DiscreteLaplace(2))]
    inv = [invariant(x, 0, Q)]
    opts = ChainOptions(n_coupled_pairs=100, tv_bound=0.02)
    a = conditioned_mechanism(h, CELLS, x, plan, inv, None, _rng(6), options=opts)
    b = conditioned_mechanism(h, CELLS, x, plan, inv, None, _rng(6), n_coupled_pairs=100,
                              tv_bound=0.02)  # fmt: skip
    assert all(np.array_equal(p, q) for p, q in zip(a.estimates, b.estimates, strict=True))
    assert a.diagnostics["burn_in"] == b.diagnostics["burn_in"]
    with pytest.raises(TypeError, match="'n_draws'; its options are the fields of ChainOptions"):
        conditioned_releases(h, CELLS, x, plan, inv, None, _rng(6), n_releases=1, n_draws=2)
