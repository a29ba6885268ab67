"""Linear-query workloads over an ordered domain, as scipy ``LinearOperator``s.

* I_k: the histogram (identity);
* C_k: the cumulative histogram (row j sums x_0 … x_j);
* R_k: all k(k+1)/2 one-dimensional ranges [l, r], 0 ≤ l ≤ r < k, in the order of
  ``numpy.triu_indices(k)``;
* R_{k²}: all two-dimensional ranges, the Kronecker product R_k ⊗ R_k acting on the k × k
  grid in row-major order.

A range is a difference of prefix sums, [l, r] = s_{r+1} − s_l with s_i = Σ_{t<i} x_t, so
R_k x costs O(k²) (its output size) and the adjoint Rᵀ y is a scatter-add followed by a
reversed cumulative sum; R_k is never stored as a matrix (k = 4,096 has 8.4 million rows).
Use :func:`dense` on small k only.

References
----------
Haney, Machanavajjhala & Ding, PVLDB 9(4), 2015 (seed ``policy_aware_dp_blowfish``), §2
(I_k, C_k, Figure 1) and §5.1 (R_k, R_{k^d}).
Ektelo (Zhang et al., SIGMOD 2018) for workloads as linear operators.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse.linalg import LinearOperator

from censusdp.errors import SpecError

__all__ = [
    "histogram",
    "cumulative",
    "ranges",
    "ranges_2d",
    "range_bounds",
    "dense",
    "n_ranges",
]


def _check(k: int) -> int:
    if int(k) != k or k < 1:
        raise SpecError(f"the domain size k must be a positive integer, got {k!r}")
    return int(k)


def n_ranges(k: int) -> int:
    """k(k+1)/2, the number of one-dimensional ranges (single cells included)."""
    return k * (k + 1) // 2


def range_bounds(k: int) -> tuple[np.ndarray, np.ndarray]:
    """(l, r) of every range of R_k, in row order."""
    return np.triu_indices(_check(k))


def histogram(k: int) -> LinearOperator:
    """I_k."""
    k = _check(k)
    return LinearOperator(
        (k, k),
        matvec=lambda x: np.asarray(x, float).ravel().copy(),
        rmatvec=lambda y: np.asarray(y, float).ravel().copy(),
        dtype=float,
    )


def cumulative(k: int) -> LinearOperator:
    """C_k: lower-triangular ones."""
    k = _check(k)

    def mv(x: np.ndarray) -> np.ndarray:
        return np.cumsum(np.asarray(x, float).ravel())

    def rmv(y: np.ndarray) -> np.ndarray:
        return np.cumsum(np.asarray(y, float).ravel()[::-1])[::-1]

    return LinearOperator((k, k), matvec=mv, rmatvec=rmv, dtype=float)


def ranges(k: int) -> LinearOperator:
    """R_k, all ranges, through prefix sums."""
    k = _check(k)
    lo, hi = range_bounds(k)

    def mv(x: np.ndarray) -> np.ndarray:
        s = np.concatenate([[0.0], np.cumsum(np.asarray(x, float).ravel())])
        return s[hi + 1] - s[lo]

    def rmv(y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, float).ravel()
        z = np.bincount(hi + 1, weights=y, minlength=k + 1) - np.bincount(
            lo, weights=y, minlength=k + 1
        )
        # x_t enters s_i for every i > t: the adjoint of the prefix map is a reversed cumsum.
        return np.cumsum(z[::-1])[::-1][1:]

    return LinearOperator((lo.size, k), matvec=mv, rmatvec=rmv, dtype=float)


def ranges_2d(k: int) -> LinearOperator:
    """R_{k²} = R_k ⊗ R_k on a k × k grid flattened in row-major order."""
    k = _check(k)
    r = ranges(k)
    q = r.shape[0]

    def mv(x: np.ndarray) -> np.ndarray:
        g = np.asarray(x, float).reshape(k, k)
        rows = np.column_stack([r.matvec(g[:, j]) for j in range(k)])  # (q, k)
        return np.vstack([r.matvec(rows[i]) for i in range(q)]).ravel()

    def rmv(y: np.ndarray) -> np.ndarray:
        g = np.asarray(y, float).reshape(q, q)
        cols = np.vstack([r.rmatvec(g[i]) for i in range(q)])  # (q, k)
        return np.column_stack([r.rmatvec(cols[:, j]) for j in range(k)]).ravel()

    return LinearOperator((q * q, k * k), matvec=mv, rmatvec=rmv, dtype=float)


def dense(op: LinearOperator, max_entries: int = 20_000_000) -> np.ndarray:
    """The explicit matrix of a small workload operator."""
    rows, cols = op.shape
    if rows * cols > max_entries:
        raise SpecError(
            f"refusing to materialise a {rows} × {cols} workload; use the operator or the "
            "analytic error functions for large domains"
        )
    return op.matmat(np.eye(cols))
