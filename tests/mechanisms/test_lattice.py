"""Lattices of invariant-preserving integer noise: SNF, bases, targets, exact sampler."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from censusdp.errors import DataError
from censusdp.mechanisms.lattice import (
    GroupSumLattice,
    IntegerLattice,
    LatticeGaussian,
    LatticeLaplace,
    incidence_matrix,
    sample_group_laplace_l1,
    smith_normal_form,
    table_margins_incidence,
)


def _random_matrices(seed: int, n: int):
    g = np.random.default_rng(seed)
    for _ in range(n):
        m, d = int(g.integers(1, 6)), int(g.integers(1, 8))
        yield g.integers(-4, 5, size=(m, d))


def test_smith_form_exact_and_matches_sympy():
    # imported here, not at collection: sympy costs every pytest worker about a second
    from sympy import Matrix
    from sympy.matrices.normalforms import smith_normal_decomp

    for a in _random_matrices(0, 40):
        f = smith_normal_form(a)
        assert np.array_equal(f.U.dot(a.astype(object)).dot(f.V), f.D)
        assert np.array_equal(f.V.dot(f.V_inv), np.eye(a.shape[1], dtype=np.int64))
        d_sym, _, _ = smith_normal_decomp(Matrix(a.tolist()))
        ours = [int(f.D[i, i]) for i in range(min(a.shape))]
        theirs = [abs(int(d_sym[i, i])) for i in range(min(a.shape))]
        assert ours == theirs


def test_table_lattice_basis_spans_kernel():
    a = table_margins_incidence(4, 4)
    for reduce in (True, False):
        lat = IntegerLattice.from_incidence(a, reduce=reduce)
        assert lat.rank == 7 and lat.n_directions == 9
        assert np.all(a @ lat.basis == 0)
        assert np.array_equal(lat.coords @ lat.basis, np.eye(9, dtype=np.int64))
    # every integer kernel vector (here: random ±1 swaps) has integer coordinates
    g = np.random.default_rng(1)
    w = g.integers(-5, 6, size=(50, 9))
    z = lat.point(w)
    assert np.all(lat.contains(z))
    assert np.array_equal(lat.point(lat.coordinates(z)), z)
    # a vector with a non-zero margin is not on the lattice
    bad = z.copy()
    bad[:, 0] += 1
    assert not np.any(lat.contains(bad))


def test_reduced_basis_is_short():
    lat = IntegerLattice.from_incidence(table_margins_incidence(4, 4))
    assert np.abs(lat.basis).sum(axis=0).max() == 4  # 2 × 2 swaps


def test_full_rank_invariants_refused():
    with pytest.raises(DataError, match="full column rank"):
        IntegerLattice.from_incidence(np.eye(3, dtype=np.int64))
    with pytest.raises(DataError):
        incidence_matrix([[0, 5]], 3)


def test_group_sum_lattice():
    lat = GroupSumLattice.from_labels(["17", "17", "18", "18", "18"])
    assert lat.n_directions == 3
    assert np.array_equal(lat.incidence, [[1, 1, 0, 0, 0], [0, 0, 1, 1, 1]])
    z = np.array([[1, -1, 2, -1, -1], [1, 0, 0, 0, -1]])
    assert lat.contains(z).tolist() == [True, False]
    with pytest.raises(DataError, match="single cell"):
        GroupSumLattice(np.array([0, 0, 1]))


def test_targets_and_statements():
    z = np.array([[3, -4, 1]])
    assert LatticeLaplace(0.5, "l1").log_target(z)[0] == -4.0
    assert LatticeLaplace(0.5, "l2").log_target(z)[0] == pytest.approx(-0.5 * math.sqrt(26))
    assert LatticeGaussian(2.0).log_target(z)[0] == pytest.approx(-26 / 8)
    st = LatticeLaplace(0.5).privacy_statement(["row totals"])
    assert st.epsilon == 0.5 and st.invariants == ("row totals",)
    assert "share the invariants" in st.text() and "Def. 2" in st.text()
    assert LatticeGaussian(2.0).privacy_statement(["t"]).rho == pytest.approx(1 / 8)


def _exact_marginal(eps: float, n: int, vmax: int = 80) -> dict[int, float]:
    """P(z_0 = v) for exp(−ε‖z‖₁) on {z ∈ Z^n : Σ z = 0}, by convolution (n ≥ 2)."""
    p1 = np.exp(-eps * np.abs(np.arange(-vmax, vmax + 1)))
    rest = p1
    for _ in range(n - 2):
        rest = np.convolve(rest, p1)
    off = (rest.size - 1) // 2
    out = {}
    for a in range(-vmax, vmax + 1):
        j = off - a  # rest must sum to −a
        out[a] = math.exp(-eps * abs(a)) * (rest[j] if 0 <= j < rest.size else 0.0)
    s = sum(out.values())
    return {k: w / s for k, w in out.items()}


def test_exact_group_sampler_law_and_invariants():
    lat = GroupSumLattice(np.array([0, 0, 0, 1, 1, 1, 1]))
    g = np.random.default_rng(7)
    z = sample_group_laplace_l1(lat, 0.5, g, 20000)
    assert np.all(lat.contains(z))
    se = z.std(axis=0, ddof=1) / math.sqrt(z.shape[0])
    assert np.all(np.abs(z.mean(axis=0)) < 4 * se)
    # chi-square of the first cell's marginal against exact convolution (alpha = 1e-6)
    ref = _exact_marginal(0.5, 3)
    cells = np.arange(-6, 7)
    probs = np.array([ref[int(c)] for c in cells])
    obs = np.array([(z[:, 0] == c).sum() for c in cells])
    probs = np.append(probs, 1 - probs.sum())
    obs = np.append(obs, z.shape[0] - obs.sum())
    assert stats.chisquare(obs, probs * z.shape[0]).pvalue > 1e-6
    # power: the law at 0.7 ε is rejected
    wrong = _exact_marginal(0.35, 3)
    pw = np.array([wrong[int(c)] for c in cells])
    pw = np.append(pw, 1 - pw.sum())
    assert stats.chisquare(obs, pw * z.shape[0]).pvalue < 1e-6
