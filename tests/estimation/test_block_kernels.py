"""The BLAS-free kernels (censusdp.estimation.gls.block_kernels) against slow references.

* ``matmul`` equals, bit for bit, the plain Python sum in ascending k of correctly rounded
  products (so: a fixed order and no fused multiply–add), and numpy's product to rounding;
* ``solve`` solves (residual to rounding) and agrees with ``numpy.linalg.solve``;
* ``eigh`` agrees with ``numpy.linalg.eigvalsh``, returns an orthonormal basis that
  diagonalises the matrix, and reads the lower triangle only;
* every kernel gives a matrix of a stack the bits it gets alone (batch independence).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from censusdp.estimation.gls.block_kernels import (
    MAX_DIM,
    MAX_DIM_EIGH,
    eigh,
    eigvalsh,
    matmul,
    solve,
)

FLOATS = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=64)


def _reference_product(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """The obviously correct product: Python floats, one rounded product and one rounded sum
    at a time, k ascending from 0.0."""
    p, q = A.shape
    r = B.shape[1]
    out = np.empty((p, r))
    for a in range(p):
        for c in range(r):
            acc = 0.0
            for k in range(q):
                acc = acc + float(A[a, k]) * float(B[k, c])
            out[a, c] = acc
    return out


@st.composite
def stacks(draw, square: bool = False):
    n = draw(st.integers(1, 4))
    p = draw(st.integers(1, 6))
    q = p if square else draw(st.integers(1, 6))
    r = draw(st.integers(1, 5))
    A = draw(arrays(np.float64, (n, p, q), elements=FLOATS))
    B = draw(arrays(np.float64, (n, q, r), elements=FLOATS))
    return A, B


@settings(max_examples=60, deadline=None)
@given(stacks())
def test_matmul_is_the_ascending_sum_bit_for_bit(ab) -> None:
    A, B = ab
    got = matmul(A, B)
    for i in range(A.shape[0]):
        ref = _reference_product(A[i], B[i])
        assert np.array_equal(got[i], ref)
        assert np.array_equal(matmul(A[i], B[i]), ref)  # alone: the same bits
    scale = np.abs(A) @ np.abs(B) + 1e-300
    assert np.all(np.abs(got - A @ B) <= 1e-13 * scale)


def test_matmul_sees_a_fused_multiply_add() -> None:
    """Power: ``−r + x·x`` with ``r = fl(x·x)`` is 0 when the product is rounded first and
    2⁻¹⁰⁴ (the rounding error) under a fused multiply–add, so the bit-for-bit reference
    would catch a kernel compiled with contraction."""
    x = 1.0 + 2.0**-52
    r = x * x
    A = np.array([[-1.0, x]])
    B = np.array([[r], [x]])
    assert _reference_product(A, B)[0, 0] == 0.0
    assert matmul(A, B)[0, 0] == 0.0


def test_matmul_broadcasts_like_numpy() -> None:
    g = np.random.default_rng(1)
    A, B = g.normal(size=(3, 1, 4, 5)), g.normal(size=(2, 5, 2))
    assert matmul(A, B).shape == (A @ B).shape == (3, 2, 4, 2)
    assert np.allclose(matmul(A, B), A @ B, rtol=1e-14, atol=1e-14)
    assert np.allclose(matmul(A[0, 0], B), A[0, 0] @ B, rtol=1e-14, atol=1e-14)
    assert matmul(np.zeros((0, 2, 3)), np.ones((3, 4))).shape == (0, 2, 4)
    with pytest.raises(ValueError):
        matmul(np.ones((2, 3)), np.ones((2, 3)))


@settings(max_examples=60, deadline=None)
@given(stacks(square=True), st.integers(0, 2**31))
def test_solve_against_numpy_and_alone(ab, seed) -> None:
    A, B = ab
    g = np.random.default_rng(seed)
    # well conditioned: a dominant diagonal, as I + S J is (S, J PSD)
    X = A / 1e3 + np.eye(A.shape[1]) * (1.0 + A.shape[1]) * g.choice([-1.0, 1.0])
    got = solve(X, B)
    ref = np.linalg.solve(X, B)
    assert np.all(np.abs(got - ref) <= 1e-11 * (1.0 + np.abs(ref)))
    for i in range(X.shape[0]):
        assert np.array_equal(solve(X[i : i + 1], B[i : i + 1])[0], got[i])
    assert np.array_equal(solve(X[:1], B), solve(np.broadcast_to(X[:1], X.shape), B))


def test_solve_pivots_and_refuses_a_singular_matrix() -> None:
    X = np.array([[[0.0, 1.0], [1.0, 0.0]]])  # needs a row exchange
    assert np.array_equal(solve(X, np.array([[[2.0], [3.0]]])), np.array([[[3.0], [2.0]]]))
    with pytest.raises(np.linalg.LinAlgError, match="matrix 1"):
        solve(np.array([np.eye(2), [[1.0, 2.0], [2.0, 4.0]]]), np.ones((2, 2, 1)))


@st.composite
def symmetric(draw):
    n = draw(st.integers(1, 3))
    k = draw(st.integers(1, 9))
    A = draw(arrays(np.float64, (n, k, k), elements=FLOATS))
    rank = draw(st.integers(0, k))
    M = A + A.swapaxes(1, 2)
    if draw(st.booleans()):  # rank-deficient PSD: the pseudo-inverses' case
        F = A[:, :, :rank]
        M = F @ F.swapaxes(1, 2)
    if draw(st.booleans()):  # a zero diagonal block, as in the bordered systems
        M[:, k // 2 :, k // 2 :] = 0.0
    return M


@settings(max_examples=80, deadline=None)
@given(symmetric())
def test_eigh_against_numpy_and_alone(M) -> None:
    ev, V = eigh(M)
    k = M.shape[-1]
    norm = k * np.abs(M).max(axis=(1, 2))[:, None]  # no underflow for tiny entries
    assert np.all(np.abs(ev - np.linalg.eigvalsh(M)) <= 1e-12 * norm)
    assert np.all(np.diff(ev, axis=1) >= 0)
    assert np.allclose(V.swapaxes(1, 2) @ V, np.eye(k), rtol=0, atol=1e-13)
    rebuilt = V @ (ev[:, :, None] * V.swapaxes(1, 2))
    assert np.all(np.abs(rebuilt - M) <= 1e-12 * norm[:, :, None])
    for i in range(M.shape[0]):
        e1, v1 = eigh(M[i])
        assert np.array_equal(e1, ev[i]) and np.array_equal(v1, V[i])
    assert np.array_equal(eigvalsh(M), ev)


def test_eigh_reads_the_lower_triangle() -> None:
    g = np.random.default_rng(3)
    A = g.normal(size=(2, 5, 5))
    L = np.tril(A)
    sym = L + np.tril(L, -1).swapaxes(1, 2)
    assert np.array_equal(eigh(A)[0], eigh(sym)[0])
    assert np.allclose(eigh(A)[0], np.linalg.eigvalsh(A), atol=1e-12)  # UPLO='L' too
    assert not np.allclose(eigh(A)[0], np.linalg.eigvalsh(A, UPLO="U"), atol=1e-6)


def test_large_matrices_go_to_numpy_and_small_ones_do_not() -> None:
    """The dispatch is by shape: above the limits the values are numpy's exactly; at the
    limit they are the kernels' (the ascending sum, which numpy's BLAS does not give here)."""
    g = np.random.default_rng(5)
    big = g.normal(size=(2, MAX_DIM + 1, MAX_DIM + 1))
    assert np.array_equal(matmul(big, big), np.matmul(big, big))
    rhs = g.normal(size=(2, MAX_DIM + 1, 1))
    assert np.array_equal(solve(big, rhs), np.linalg.solve(big, rhs))
    sym = big[:, : MAX_DIM_EIGH + 1, : MAX_DIM_EIGH + 1]
    assert np.array_equal(eigh(sym)[0], np.linalg.eigh(sym)[0])
    A = g.normal(size=(MAX_DIM, MAX_DIM))
    got = matmul(A, A)
    assert np.array_equal(got[:2, :2], _reference_product(A[:2], A[:, :2]))
    assert not np.array_equal(got, np.matmul(A, A))
