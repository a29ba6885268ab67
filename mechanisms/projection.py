"""Projections onto the null space N of the invariants, dense and structured.

Π_N = I − Cᵀ(CCᵀ)⁻¹C removes from a noise vector every component the invariants C would see.
For a general C it is applied densely (:func:`dense_projector`, :func:`project_dense`). For
hierarchical invariants — totals of groups of coordinates, or of nested groups — it needs no
matrix at all: with C the indicator rows of a partition into groups, Π_N e subtracts from each
coordinate the mean of its group, in O(n) time and memory (:func:`project_group_totals`). For
nested partitions (nation ⊃ state ⊃ county totals over blocks) the row space of the coarse
indicators lies inside that of the finest ones, so Π_N is the projection for the finest level
alone (:func:`project_nested`). For crossed two-way margins — every row total and every column
total of a table, as in a groups × hours table per building — Π_N is double centering
(:func:`project_row_column_totals`): subtract the row and column means, add back the grand mean.

For iid noise of variance σ², Π_N e has covariance σ²Π_N; on one level of groups its
per-coordinate variance is σ²(1 − 1/|g|) (:func:`group_projection_variances`).

References
----------
Gao, Gong & Yu, "Subspace Differential Privacy", AAAI 2022, Corollary 11 (projection
mechanism A(x) + Π_N e) and Theorem 22 (covariance (cΔ)²Π_N).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from censusdp.errors import HierarchyError, SpecError

__all__ = [
    "dense_projector",
    "group_indicator_matrix",
    "group_projection_variances",
    "nested_projection_variances",
    "null_space_basis",
    "project_dense",
    "project_group_totals",
    "project_nested",
    "project_row_column_totals",
    "row_column_indicator_matrix",
    "row_column_projection_variance",
    "row_column_rank",
    "row_space_basis",
]


def _check_invariants(C: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """C as float64, its singular values and Vᵀ, after checking it has full row rank."""
    C = np.asarray(C, dtype=np.float64)
    if C.ndim != 2:
        raise SpecError(f"the invariant matrix C must be 2-D (n_c × n), got shape {C.shape}")
    if C.shape[0] == 0:
        return C, np.zeros(0), np.zeros((0, C.shape[1]))
    _, s, vt = np.linalg.svd(C, full_matrices=True)
    tol = max(C.shape) * np.finfo(np.float64).eps * (s[0] if s.size else 0.0)
    rank = int((s > tol).sum())
    if rank < C.shape[0]:
        raise SpecError(
            f"the invariant matrix C ({C.shape[0]} × {C.shape[1]}) has rank {rank} < "
            f"{C.shape[0]}: its rows are linearly dependent; drop the redundant invariants "
            "(e.g. a total implied by the totals of its parts)"
        )
    return C, s, vt


def row_space_basis(C: np.ndarray) -> np.ndarray:
    """Orthonormal basis (n × n_c) of the row space R of C (full row rank checked)."""
    C, _, vt = _check_invariants(C)
    return vt[: C.shape[0]].T.copy()


def null_space_basis(C: np.ndarray) -> np.ndarray:
    """Orthonormal basis Q_N (n × (n − n_c)) of the null space N of C (rank checked)."""
    C, _, vt = _check_invariants(C)
    return vt[C.shape[0] :].T.copy()


def dense_projector(C: np.ndarray) -> np.ndarray:
    """Π_N = I − Cᵀ(CCᵀ)⁻¹C as a dense n × n matrix (computed as I − Q_R Q_Rᵀ)."""
    q = row_space_basis(C)
    return np.eye(q.shape[0]) - q @ q.T


def project_dense(e: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Π_N e for a general invariant matrix C, without forming Π_N: e − Q_R(Q_Rᵀe)."""
    q = row_space_basis(C)
    e = np.asarray(e, dtype=np.float64)
    return e - q @ (q.T @ e)


def _groups(group_index: np.ndarray, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    g = np.asarray(group_index)
    if g.ndim != 1 or not np.issubdtype(g.dtype, np.integer):
        raise HierarchyError("group_index must be a 1-D integer array (one group per coordinate)")
    if n is not None and g.shape[0] != n:
        raise HierarchyError(
            f"group_index has {g.shape[0]} entries but the vector has {n} coordinates"
        )
    if g.size and g.min() < 0:
        raise HierarchyError("group_index must be non-negative (group numbers 0, 1, …)")
    sizes = np.bincount(g)
    return g, sizes


def project_group_totals(e: np.ndarray, group_index: np.ndarray) -> np.ndarray:
    """Π_N e for the invariants "the total of every group": subtract each group's mean.

    O(n) time and memory. The group sums are accumulated in coordinate order
    (:func:`numpy.bincount`), so projecting a contiguous run of whole groups on its own gives
    the same bits as projecting the full vector (used by the distributed Algorithm 4).

    Parameters
    ----------
    e : numpy.ndarray
        Vector of shape (n,).
    group_index : numpy.ndarray
        Integer group of every coordinate, shape (n,).

    Returns
    -------
    numpy.ndarray
        float64 vector whose sum over every group is zero (up to rounding).
    """
    e = np.asarray(e, dtype=np.float64)
    g, sizes = _groups(group_index, e.shape[0])
    sums = np.bincount(g, weights=e, minlength=sizes.size)
    means = np.divide(sums, sizes, out=np.zeros_like(sums), where=sizes > 0)
    out = np.take(means, g)
    return np.subtract(e, out, out=out)


def _finest(levels: Sequence[np.ndarray], n: int) -> np.ndarray:
    if not levels:
        raise HierarchyError("project_nested needs at least one level of groups")
    checked = [_groups(g, n)[0] for g in levels]
    for coarse, fine in zip(checked[:-1], checked[1:], strict=True):
        parent = np.full(int(fine.max()) + 1 if fine.size else 0, -1, dtype=np.int64)
        parent[fine] = coarse
        if not np.array_equal(parent[fine], coarse):
            raise HierarchyError(
                "levels do not nest: some group of a finer level spans several groups of the "
                "level above; list the levels coarse → fine with every fine group inside one "
                "coarse group (use project_dense for crossed margins)"
            )
    return checked[-1]


def project_nested(e: np.ndarray, levels: Sequence[np.ndarray]) -> np.ndarray:
    """Π_N e for the totals of nested groups (e.g. nation and state totals over blocks).

    ``levels`` lists one group index per level, coarse → fine; nesting is checked. Each
    coarse indicator is a sum of fine indicators, so the invariants span the row space of the
    finest level alone and Π_N is :func:`project_group_totals` on it.
    """
    e = np.asarray(e, dtype=np.float64)
    return project_group_totals(e, _finest(levels, e.shape[0]))


def group_projection_variances(group_index: np.ndarray, variance: float) -> np.ndarray:
    """Per-coordinate variance σ²(1 − 1/|g|) of Π_N e for iid e of variance σ²."""
    g, sizes = _groups(group_index)
    return float(variance) * (1.0 - 1.0 / sizes[g])


def nested_projection_variances(levels: Sequence[np.ndarray], variance: float) -> np.ndarray:
    """Per-coordinate variances of :func:`project_nested` (σ²(1 − 1/|finest g|))."""
    n = np.asarray(levels[0]).shape[0] if levels else 0
    return group_projection_variances(_finest(levels, n), variance)


def group_indicator_matrix(group_index: np.ndarray) -> np.ndarray:
    """The dense invariant matrix C (groups × n) of group totals, for small checks."""
    g, sizes = _groups(group_index)
    C = np.zeros((sizes.size, g.size))
    C[g, np.arange(g.size)] = 1.0
    return C[sizes > 0]


def _table_shape(shape: Sequence[int]) -> tuple[int, int]:
    if len(shape) < 2:
        raise SpecError(f"a row/column table needs at least 2 axes, got shape {tuple(shape)}")
    r, c = int(shape[-2]), int(shape[-1])
    if r < 1 or c < 1:
        raise SpecError(f"a row/column table needs at least one row and column, got {(r, c)}")
    return r, c


def project_row_column_totals(e: np.ndarray) -> np.ndarray:
    """Π_N e for the invariants "every row total and every column total" of each table.

    The crossed (two-way) margins of an R × C table: the null space N holds the tables whose
    rows and columns all sum to zero, and Π_N is double centering,
    ``e − row means − column means + grand mean`` (the interaction term of the two-way
    analysis-of-variance decomposition). Leading axes index independent tables (e.g. one
    groups × hours table per building). O(n) time and memory, no matrix.

    Parameters
    ----------
    e : numpy.ndarray
        Shape (..., R, C): any number of leading axes of separate tables.

    Returns
    -------
    numpy.ndarray
        float64, same shape; every row and every column of every table sums to zero (up to
        rounding).

    Notes
    -----
    The R + C margins of one table have rank R + C − 1 (the row totals and the column totals
    share the grand total): see :func:`row_column_rank`. For iid noise of variance σ² every
    coordinate of Π_N e has variance σ²(1 − 1/R)(1 − 1/C)
    (:func:`row_column_projection_variance`).

    References
    ----------
    Gao, Gong & Yu, "Subspace Differential Privacy", AAAI 2022, Corollary 11 (Π_N) and §5.2
    (the spatio-temporal example: per building, group × hour totals over groups and over
    the day).
    """
    e = np.asarray(e, dtype=np.float64)
    _table_shape(e.shape)
    row_mean = e.mean(axis=-1, keepdims=True)
    col_mean = e.mean(axis=-2, keepdims=True)
    grand = row_mean.mean(axis=-2, keepdims=True)
    return e - row_mean - col_mean + grand


def row_column_rank(n_rows: int, n_cols: int, n_tables: int = 1) -> int:
    """Rank of the row- and column-total invariants: ``n_tables · (R + C − 1)``."""
    r, c = _table_shape((n_rows, n_cols))
    return int(n_tables) * (r + c - 1)


def row_column_projection_variance(n_rows: int, n_cols: int, variance: float = 1.0) -> float:
    """Per-coordinate variance σ²(1 − 1/R)(1 − 1/C) of :func:`project_row_column_totals`.

    The diagonal of Π_N is 1 − 1/C − 1/R + 1/(RC) (the hat values of the two-way additive
    model), the same for every coordinate.
    """
    r, c = _table_shape((n_rows, n_cols))
    return float(variance) * (1.0 - 1.0 / r) * (1.0 - 1.0 / c)


def row_column_indicator_matrix(n_rows: int, n_cols: int) -> np.ndarray:
    """Dense invariant matrix ((R + C) × RC) of the row then column totals of one table.

    Coordinates in row-major order (``e.reshape(-1)`` of an R × C table). The rows are
    linearly dependent (rank R + C − 1); drop one before :func:`project_dense`. For small
    checks only.
    """
    r, c = _table_shape((n_rows, n_cols))
    idx = np.arange(r * c)
    C = np.zeros((r + c, r * c))
    C[idx // c, idx] = 1.0
    C[r + idx % c, idx] = 1.0
    return C
