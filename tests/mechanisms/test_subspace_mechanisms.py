"""Subspace (invariant-respecting) mechanisms: invariants hold exactly, unbiasedness and
covariance over 20,000 draws, extended ≤ projected (hypothesis), correlated Gaussian vs
projected Gaussian, Algorithm 4 bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.errors import SpecError
from censusdp.mechanisms.laws import Gaussian, Laplace
from censusdp.mechanisms.projection import group_indicator_matrix
from censusdp.mechanisms.subspace import (
    ProjectionOptions,
    correlated_gaussian,
    distributed_projected,
    extended_gaussian,
    extended_laplace,
    l1_sensitivity,
    projected_gaussian,
    projected_laplace,
)
from censusdp.rng import KeyedRNG

R = 20_000


def workload():
    """6 answers on 5 cells (per-cell counts and two sums), invariants: two totals."""
    A = np.array(
        [
            [1.0, 0, 0, 0, 0],
            [0, 1, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 0, 1, 1],
            [1, 1, 0, 0, 0],
            [0, 0, 1, 1, 1],
        ]
    )
    h = np.array([12.0, 7, 30, 4, 9])
    C = np.array([[1.0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1]])
    return A, h, C


MECHS = {
    "projected_laplace": lambda A, h, C, rng, **kw: projected_laplace(A, h, C, 0.7, rng, **kw),
    "extended_laplace": lambda A, h, C, rng, **kw: extended_laplace(A, h, C, 0.7, rng, **kw),
    "projected_gaussian": lambda A, h, C, rng, **kw: projected_gaussian(
        A, h, C, 0.7, 1e-6, rng, **kw
    ),
    "extended_gaussian": lambda A, h, C, rng, **kw: extended_gaussian(
        A, h, C, 0.7, 1e-6, rng, **kw
    ),
    "correlated_gaussian": lambda A, h, C, rng, **kw: correlated_gaussian(
        A, h, C, 0.7, 1e-6, rng, **kw
    ),
}


@pytest.mark.parametrize("name", sorted(MECHS))
def test_invariants_unbiased_and_covariance(rng, name):
    A, h, C = workload()
    truth = A @ h
    res = MECHS[name](A, h, C, rng, repeats=R)
    assert res.release.shape == (R, 6)
    # invariants exactly (to rounding)
    np.testing.assert_allclose(res.release @ C.T, np.tile(C @ truth, (R, 1)), rtol=1e-9)
    err = res.release - truth
    se = np.sqrt(res.variances / R)
    assert np.all(np.abs(err.mean(axis=0)) < 4 * se + 1e-12), (err.mean(axis=0), se)
    emp = np.cov(err, rowvar=False)
    rel = np.linalg.norm(emp - res.covariance) / np.linalg.norm(res.covariance)
    assert rel < 0.05, rel
    assert res.mse == pytest.approx(np.trace(res.covariance), rel=1e-10)
    assert res.mse == pytest.approx((err**2).sum(axis=1).mean(), rel=0.05)
    np.testing.assert_allclose(np.diag(res.covariance), res.variances, rtol=1e-12)
    assert res.privacy.guarantee == "induced subspace differential privacy"
    assert res.privacy.invariants


def test_single_release_matches_first_stream_and_invariants(rng):
    A, h, C = workload()
    for name, mech in MECHS.items():
        res = mech(A, h, C, rng, label=f"one/{name}")
        assert res.release.shape == (6,)
        np.testing.assert_allclose(C @ res.release, C @ A @ h, rtol=1e-9)


def test_correlated_gaussian_beats_projected_on_skewed_workload(rng):
    # one heavily weighted answer among 8 (e.g. a total measured with a large weight),
    # invariant: the plain sum of the 8 answers
    A = np.diag([20.0, 1, 1, 1, 1, 1, 1, 1])
    h = np.arange(8.0)
    C = np.ones((1, 8))
    cg = correlated_gaussian(A, h, C, 0.5, 1e-6, rng)
    pg = projected_gaussian(A, h, C, 0.5, 1e-6, rng)
    eg = extended_gaussian(A, h, C, 0.5, 1e-6, rng)
    print(
        f"\nMSE on diag(20,1,…,1) with sum invariant: correlated {cg.mse:.1f}, "
        f"extended {eg.mse:.1f}, projected {pg.mse:.1f} (k = {cg.details['k']})"
    )
    assert cg.details["projected_gaussian_mse"] == pytest.approx(pg.mse)
    assert cg.mse <= pg.mse
    assert cg.privacy.rho == pytest.approx(pg.privacy.rho)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 7),
    st.integers(1, 6),
    st.integers(1, 3),
    st.integers(0, 100_000),
)
def test_extended_never_worse_than_projected(n, d, n_c, seed):
    n_c = min(n_c, n - 1)
    gen = np.random.default_rng(seed)
    A = gen.normal(size=(n, d)) * gen.integers(1, 5)
    h = gen.normal(size=d)
    C = gen.normal(size=(n_c, n))
    rng = KeyedRNG.reproducible(seed, warn=False)
    pl = projected_laplace(A, h, C, 0.9, rng)
    el = extended_laplace(A, h, C, 0.9, rng)
    assert el.mse <= pl.mse * (1 + 1e-12)
    pg = projected_gaussian(A, h, C, 0.9, 1e-5, rng)
    eg = extended_gaussian(A, h, C, 0.9, 1e-5, rng)
    assert eg.mse <= pg.mse * (1 + 1e-12)
    np.testing.assert_allclose(C @ el.release, C @ A @ h, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(C @ eg.release, C @ A @ h, rtol=1e-9, atol=1e-9)


def test_extended_laplace_uses_extension_when_it_helps(rng):
    A = np.eye(4) * np.array([[1.0, 1, 1, 1]]).T
    A = np.hstack([A, np.ones((4, 1))])  # one individual can change all four answers
    C = np.array([[1.0, -1, 0, 0]])
    res = extended_laplace(A, np.ones(5), C, 1.0, rng)
    assert res.details["route"] == "extended"
    assert res.sensitivity < l1_sensitivity(A)


@pytest.mark.parametrize("route", ["dense", "groups"])
def test_distributed_algorithm4_bit_for_bit(rng, route):
    gen = np.random.default_rng(1)
    sizes = gen.integers(1, 6, size=9)
    groups = np.repeat(np.arange(9), sizes)
    n = groups.size
    h = gen.integers(0, 100, size=n).astype(float)
    if route == "dense":
        kw = {"C": group_indicator_matrix(groups)}
        single = projected_laplace(None, h, kw["C"], 0.5, rng, label="alg4")
    else:
        kw = {"groups": groups}
        single = projected_laplace(None, h, None, 0.5, rng, groups=groups, label="alg4")
    law = Laplace(1.0 / 0.5)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    partitions = [
        [np.arange(n)],
        [np.arange(bounds[i], bounds[i + 1]) for i in range(9)],  # one agent per group
        [np.arange(0, bounds[4]), np.arange(bounds[4], n)],
        [np.arange(bounds[2], bounds[7]), np.arange(0, bounds[2]), np.arange(bounds[7], n)],
    ]
    if route == "dense":
        partitions.append(list(np.array_split(gen.permutation(n), 4)))  # arbitrary sets
        partitions.append([np.array([i]) for i in range(n)])
    for part in partitions:
        out = distributed_projected(None, h, law, rng, part, label="alg4", **kw)
        assert np.array_equal(out.release, single.release)
        assert np.array_equal(np.concatenate(out.outputs), single.release[np.concatenate(part)])
    with pytest.raises(SpecError):
        distributed_projected(None, h, law, rng, [np.arange(n - 1)], label="alg4", **kw)


def test_groups_route_equals_dense_route(rng):
    groups = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    h = np.arange(9.0)
    g = ProjectionOptions(groups=groups, label="g")
    a = projected_gaussian(None, h, None, 0.5, 1e-6, rng, options=g)
    C = group_indicator_matrix(groups)
    b = projected_gaussian(None, h, C, 0.5, 1e-6, rng, options=ProjectionOptions(label="g"))
    # the same names given one by one, as before ProjectionOptions (accepted for one release)
    legacy = projected_gaussian(None, h, None, 0.5, 1e-6, rng, groups=groups, label="g")
    assert np.array_equal(legacy.release, a.release)
    with pytest.raises(TypeError, match="'group'; its options are the fields of Projection"):
        projected_gaussian(None, h, None, 0.5, 1e-6, rng, group=groups)
    np.testing.assert_allclose(a.release, b.release, atol=1e-10)
    np.testing.assert_allclose(a.covariance, b.covariance, atol=1e-10)
    assert a.mse == pytest.approx(b.mse)


def test_input_checks(rng):
    A, h, C = workload()
    with pytest.raises(SpecError, match="rank"):
        projected_laplace(A, h, np.vstack([C, C[0]]), 1.0, rng)
    with pytest.raises(SpecError):
        projected_laplace(A, h[:3], C, 1.0, rng)
    with pytest.raises(SpecError):
        projected_laplace(A, h, C[:, :3], 1.0, rng)


def test_no_invariants_is_plain_dp(rng):
    A, h, _ = workload()
    res = projected_gaussian(A, h, None, 1.0, 1e-6, rng)
    assert res.privacy.guarantee == "differential privacy"
    assert isinstance(Gaussian(res.noise_scale), Gaussian)


@pytest.mark.parametrize("name", sorted(MECHS))
def test_a_query_object_gives_the_same_release_as_its_matrix(name):
    """The one query protocol: a mechanism given a ``Query`` (or any LinearQuery) releases
    exactly what it releases from the query's matrix."""
    from censusdp.mechanisms.queries import Query

    A, h, C = workload()
    q = Query("w", A.astype(np.int64), tuple(f"r{i}" for i in range(A.shape[0])))
    assert l1_sensitivity(q) == l1_sensitivity(A)
    a = MECHS[name](A, h, C, KeyedRNG.reproducible(4, warn=False))
    b = MECHS[name](q, h, C, KeyedRNG.reproducible(4, warn=False))
    np.testing.assert_array_equal(a.release, b.release)
    assert a.privacy == b.privacy
