"""The compiled row sums of the rounding's variance bounds give numpy's bits: the pairwise
sum against ``numpy.sum`` and the totals' bound against its array expressions."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.estimation.integer.controlled import (
    fresh_variance_bound,
    pairwise_sum,
    total_variance_bound,
)


def _scratch():
    return np.empty((64, 3), np.int64), np.empty(64)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 5000), st.integers(0, 2**32 - 1), st.integers(0, 7))
def test_pairwise_sum_is_numpys_sum(n, seed, lo):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n + lo) * 10.0 ** rng.integers(-8, 8, n + lo)
    assert pairwise_sum(a, lo, n, *_scratch()) == a[lo:].sum()


def test_pairwise_sum_is_not_a_plain_loop():
    # power: values where left-to-right addition and numpy's pairwise order differ
    a = np.random.default_rng(3).standard_normal(2016) * 1e8
    a[::7] = 1e-3
    loop = 0.0
    for v in a:
        loop += v
    assert loop != a.sum()
    assert pairwise_sum(a, 0, a.size, *_scratch()) == a.sum()


def reference(A, v, sd_parent, psi, negative):
    """The bound's array expressions (module docstring), summed by numpy."""
    S0 = v.sum(axis=1)
    S1 = (A * v).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        abar = np.where(S0 > 0.0, S1 / np.where(S0 > 0.0, S0, 1.0), 0.0)
    if negative:
        S2 = (A * A * v).sum(axis=1)
        d = A - abar[:, None]
        P = (np.maximum(d, 0.0) ** 2 * v).sum(axis=1)
        M = (np.minimum(d, 0.0) ** 2 * v).sum(axis=1)
        vy = np.minimum(S2, (abar * sd_parent + np.sqrt(P) + np.sqrt(M)) ** 2)
    else:
        sd = np.sqrt(v)
        vy = np.minimum(
            ((A * sd).sum(axis=1)) ** 2,
            (abar * sd_parent + (np.abs(A - abar[:, None]) * sd).sum(axis=1)) ** 2,
        )
    return vy + fresh_variance_bound(psi, vy)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 6), st.integers(1, 400), st.integers(0, 2**32 - 1), st.booleans(),
    st.booleans(),
)  # fmt: skip
def test_total_bound_is_the_array_expressions(n, K, seed, negative, rows):
    rng = np.random.default_rng(seed)
    A = rng.uniform(0.0, 1.0, (n, K))
    A[rng.random((n, K)) < 0.2] = 0.0
    phi = rng.uniform(0.0, 1.0, (3, K))
    v = phi * (1.0 - phi)
    v[rng.random((3, K)) < 0.3] = 0.0
    if rng.random() < 0.2:
        v[:] = 0.0  # S0 = 0: no ancestor variance
    sd = rng.uniform(0.0, 5.0, n)
    psi = rng.uniform(0.0, 1.0, n)
    r = rng.integers(0, 3, n)
    want = reference(A, v[r], sd, psi, negative)
    got = (
        total_variance_bound(A, v, sd, psi, negative, v_rows=r)
        if rows
        else total_variance_bound(A, v[r], sd, psi, negative)
    )
    assert np.array_equal(got, want)
    # a view with strided rows (the one-level-down spreads) gives the same bits
    W = np.empty((n, 2, K))
    W[:, 0] = A
    assert np.array_equal(total_variance_bound(W[:, 0], v[r], sd, psi, negative), want)
