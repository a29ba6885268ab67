"""The fused per-fibre kernels of the basis moves (issue 36) against their unfused forms.

* the Householder reflection of :mod:`censusdp.estimation.gls.marginal_basis` (one compiled
  pass: the dot product, then the update) equals, bit for bit, the two steps it fuses — a
  :func:`~censusdp.estimation.gls.block_kernels.matmul` dot in ascending order and numpy's
  elementwise update — and the dense reflection ``H y`` to rounding;
* a node's bits do not depend on its batch, and a strided (non-contiguous) input gives the
  bits of its contiguous copy.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from censusdp.estimation.gls import marginal_basis as mb
from censusdp.estimation.gls.block_kernels import matmul

FLOATS = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=64)


def _unfused_reflect(y: np.ndarray) -> np.ndarray:
    """The reflection as it was computed before the fusion: ``matmul`` dot, then update."""
    pre, n, post = y.shape
    w = -np.full(n, 1.0 / np.sqrt(n))
    w[0] += 1.0
    c = w * (2.0 / float(np.sum(w * w)))
    if post == 1:
        dot = matmul(y.reshape(pre, 1, n), c[:, None]).reshape(pre, 1, 1)
    else:
        dot = matmul(c[None, :], y)
    return y - w[None, :, None] * dot


@st.composite
def _fibres(draw):
    pre = draw(st.integers(1, 5))
    n = draw(st.integers(2, 70))
    post = draw(st.sampled_from([1, 1, 2, 3, 7]))
    return draw(arrays(np.float64, (pre, n, post), elements=FLOATS))


@settings(max_examples=60, deadline=None)
@given(_fibres())
def test_fused_reflection_equals_the_unfused_steps_bit_for_bit(y):
    got = mb._reflect(y)
    assert np.array_equal(got, _unfused_reflect(y))
    n = y.shape[1]
    w = -np.full(n, 1.0 / np.sqrt(n))
    w[0] += 1.0
    H = np.eye(n) - 2.0 * np.outer(w, w) / (w @ w)
    dense = np.einsum("ab,ibp->iap", H, y)
    assert np.abs(got - dense).max() <= 1e-12 * max(1.0, float(np.abs(y).max())) * n


def test_fused_reflection_of_a_fibre_does_not_depend_on_its_batch_or_strides():
    gen = np.random.default_rng(5)
    y = gen.normal(size=(9, 63, 4)) * 100.0
    whole = mb._reflect(y)
    for i in range(9):
        assert np.array_equal(mb._reflect(y[i : i + 1]), whole[i : i + 1])
    strided = np.asfortranarray(y)[:, :, ::2]
    assert np.array_equal(mb._reflect(strided), mb._reflect(np.ascontiguousarray(strided)))
    # power: the kernel is not the identity, and the reflection is its own inverse
    assert not np.allclose(whole, y)
    assert np.abs(mb._reflect(whole) - y).max() <= 1e-12 * np.abs(y).max()


def test_cenrace_moves_round_trip_and_match_the_dense_basis():
    """The pl94 cenrace axis (63 values, one group) is moved by the fused reflection; its
    coefficients equal the dense ``Bᵀ x`` to rounding and move back to ``x``."""
    ax = mb.AxisBasis.from_elements("cenrace", 63, [])
    gen = np.random.default_rng(2)
    x = gen.poisson(3.0, size=(11, 4, 63)).astype(np.float64)
    coef = ax.coefficients(x, 2)
    assert np.abs(coef - x @ ax.basis).max() <= 1e-12 * 63 * np.abs(x).max()
    assert np.abs(ax.values(coef, 2) - x).max() <= 1e-12 * 63 * np.abs(x).max()


@st.composite
def _bordered(draw):
    """Leaf systems ``[J Hᵀ; H 0]`` with a rank-deficient ``J`` (flat directions), C copies."""
    K = draw(st.integers(1, 6))
    rank = draw(st.integers(0, K))
    nH = draw(st.integers(0, 2))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = np.random.default_rng(seed)
    B = gen.normal(size=(K, rank))
    J = B @ B.T
    H = gen.normal(size=(nH, K))
    Mat = np.zeros((1, K + nH, K + nH))
    Mat[0, :K, :K], Mat[0, :K, K:], Mat[0, K:, :K] = J, H.T, H
    rhs = gen.normal(size=(draw(st.integers(1, 4)), draw(st.integers(1, 3)), K + nH)) * 10.0
    return Mat, rhs, K


@settings(max_examples=60, deadline=None)
@given(_bordered())
def test_fused_bordered_gain_equals_the_two_step_solve(case):
    """The leaf's mean as one product with the shape class's gain ``Π M⁺[:K, :]`` equals
    ``Π (M⁺ rhs)[:K]`` (the unfused steps, numpy's pseudo-inverse) to 1e-12."""
    from censusdp.estimation.gls import kernel

    Mat, rhs, K = case
    m, P, N, r = kernel._solve_bordered(Mat, rhs, K)
    Minv = np.linalg.pinv(Mat[0], rcond=1e-11, hermitian=True)
    ev, V = np.linalg.eigh(Mat[0])
    null = V[:, np.abs(ev) <= 1e-11 * np.abs(ev).max(initial=0.0)]
    Nref = null[:K] @ null[:K].T  # projector onto the flat directions, up to its scale
    ev2, V2 = np.linalg.eigh(0.5 * (Nref + Nref.T))
    flat = V2[:, ev2 > 1e-8]
    Pi = np.eye(K) - flat @ flat.T
    want = np.einsum("ab,ncb->nca", Pi, np.einsum("ab,ncb->nca", Minv, rhs)[..., :K])
    scale = max(1.0, float(np.abs(want).max()))
    assert int(r[0]) == flat.shape[1]
    assert np.abs(m - want).max() <= 1e-12 * scale * max(1.0, float(np.abs(Minv).max()))
    assert np.abs(P[0] - Pi @ Minv[:K, :K] @ Pi).max() <= 1e-12 * max(
        1.0, float(np.abs(Minv).max())
    )
