"""General generalized least squares with linear equality constraints (sparse KKT).

For any measurement matrix ``A`` (m × n, sparse), noisy answers ``y = A x + e`` with
independent noise of variances ``v`` and exact invariants ``C x = c``, the estimator is

    x̂ = argmin_x (y − A x)ᵀ W (y − A x)   subject to   C x = c,

computed from the sparse KKT system ``[[Aᵀ W A, Cᵀ], [C, 0]] [x; ν] = [Aᵀ W y; c]``.

Two geometries:

* ``"weighted"`` — ``W = Σ⁻¹ = diag(1/v)``: the Gauss–Markov (BLUE) estimate; for Gaussian
  noise it equals the conditional mean given the invariants (Gao, Gong & Yu 2022, Thm. 22,
  generalised). Its covariance is the top-left block of the KKT inverse. Privacy: the released
  noise is a projection of the noise in the Σ⁻¹-weighted geometry, so the guarantee is
  *induced subspace DP in that geometry* (post-processing of the measurements plus the
  invariants).
* ``"euclidean"`` — ``W = I``: the Euclidean projection Π_N of the subspace-DP paper (exactly
  the seed's projected mechanism when the noise scales are equal). Its covariance is the
  sandwich ``G Aᵀ Σ A G`` with ``G`` that block; it is unbiased but not minimum-variance when
  the noise scales differ. Privacy: induced subspace DP in the Euclidean geometry.

Both are linear in the noise, hence unbiased for any zero-mean noise, and their covariance is
exact. This module is the slow, obviously-correct reference against which the tree solver
(:mod:`censusdp.estimation.gls.tree`) is tested, and the solver for non-hierarchical constraint
sets (contingency-table margins, time series).

References
----------
Gao, Gong & Yu, "Subspace Differential Privacy", AAAI 2022 — projection Π_N, Def. 6 (induced
subspace DP), Thm. 22 (projection equals conditioning for spherical Gaussian noise).
Aitken (1935), generalized least squares; Boyd & Vandenberghe (2004), §10.1.1, the KKT system
of equality-constrained least squares.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from censusdp.errors import DataError, SpecError
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.queries import Invariant, Measurement

__all__ = ["general_gls", "hierarchy_to_sparse", "independent_rows", "level_aggregator"]

Geometry = Literal["weighted", "euclidean"]


def independent_rows(
    C: sp.spmatrix | np.ndarray, c: np.ndarray, *, tol: float = 1e-9
) -> tuple[np.ndarray, np.ndarray]:
    """Drop redundant constraint rows (dense rank-revealing QR); check they are consistent.

    Returns
    -------
    C_indep, c_indep : numpy.ndarray
        Linearly independent rows of ``C`` and the matching entries of ``c``.

    Raises
    ------
    DataError
        When a dropped row is not implied by the kept ones with the same right-hand side
        (the invariants contradict each other).
    """
    Cd = C.toarray() if sp.issparse(C) else np.asarray(C, dtype=float)
    c = np.asarray(c, dtype=float).reshape(-1)
    if Cd.shape[0] == 0:
        return Cd, c
    _, r, piv = scipy.linalg.qr(Cd.T, mode="economic", pivoting=True)
    diag = np.abs(np.diag(r))
    rank = int(np.sum(diag > tol * max(diag.max(initial=0.0), 1.0)))
    keep = np.sort(piv[:rank])
    Ck, ck = Cd[keep], c[keep]
    coef, *_ = np.linalg.lstsq(Ck.T, Cd.T, rcond=None)
    resid = coef.T @ ck - c
    scale = max(1.0, float(np.abs(c).max(initial=0.0)))
    if np.abs(resid).max(initial=0.0) > 1e-7 * scale:
        raise DataError(
            "the invariants contradict each other: a constraint implied by the others has a "
            "different exact value; check the invariant values (parent = sum of children)"
        )
    return Ck, ck


def general_gls(
    A: sp.spmatrix | np.ndarray,
    y: np.ndarray,
    variances: np.ndarray | float,
    C: sp.spmatrix | np.ndarray | None = None,
    c: np.ndarray | None = None,
    geometry: Geometry = "weighted",
    *,
    covariance: Literal["full", "diag", "none"] = "full",
) -> tuple[np.ndarray, np.ndarray | None]:
    """Equality-constrained (generalized) least squares through the sparse KKT system.

    Parameters
    ----------
    A : sparse or dense (m, n)
        Measurement matrix.
    y : (m,)
        Noisy answers.
    variances : float or (m,)
        Noise variance of every answer (independent noise).
    C, c : (n_c, n) and (n_c,), optional
        Exact invariants ``C x = c``; redundant rows are allowed (they are dropped after a
        consistency check).
    geometry : {"weighted", "euclidean"}
        Weights ``1/variances`` (GLS) or unit weights (Euclidean projection Π_N).
    covariance : {"full", "diag", "none"}
        Return the full (n, n) covariance of ``x̂``, its diagonal, or nothing. Both are dense
        computations (n solves): meant for reference use on small problems.

    Returns
    -------
    x_hat : (n,)
    cov : (n, n), (n,) or None
        Exact covariance (or per-coordinate variances) of ``x̂ − x``.

    Raises
    ------
    SpecError
        When ``x`` is not identifiable (``Aᵀ W A`` singular on the null space of ``C``).
    DataError
        When the invariants contradict each other.

    References
    ----------
    Gao, Gong & Yu (2022), Def. 6 and Thm. 22; Boyd & Vandenberghe (2004), §10.1.1.
    """
    if geometry not in ("weighted", "euclidean"):
        raise SpecError(f"geometry must be 'weighted' or 'euclidean', got {geometry!r}")
    A = sp.csr_matrix(A, dtype=float)
    m, n = A.shape
    y = np.asarray(y, dtype=float).reshape(-1)
    v = np.broadcast_to(np.asarray(variances, dtype=float), (m,))
    if y.shape != (m,):
        raise SpecError(f"y has {y.size} entries but A has {m} rows")
    if np.any(v <= 0):
        raise SpecError("every measurement variance must be positive")
    w = 1.0 / v if geometry == "weighted" else np.ones(m)
    AtW = A.T.multiply(w).tocsr()
    F = (AtW @ A).tocsc()
    rhs_x = AtW @ y
    if C is not None and sp.csr_matrix(C).shape[0] > 0:
        Ck, ck = independent_rows(C, np.asarray(c))
        Ck = sp.csr_matrix(Ck)
    else:
        Ck, ck = sp.csr_matrix((0, n)), np.zeros(0)
    nc = Ck.shape[0]
    K = sp.bmat([[F, Ck.T], [Ck, None]], format="csc") if nc else F
    try:
        lu = spla.splu(K)
    except RuntimeError as exc:
        raise SpecError(
            "the estimate is not identifiable: the measurements and invariants do not "
            "determine every coordinate (singular KKT system); add a measurement"
        ) from exc
    sol = lu.solve(np.concatenate([rhs_x, ck]))
    x_hat = sol[:n]
    if not np.all(np.isfinite(x_hat)):
        raise SpecError("the estimate is not identifiable (singular KKT system)")
    if covariance == "none":
        return x_hat, None
    G = lu.solve(np.eye(n + nc, n))[:n]  # top-left block of the KKT inverse
    G = 0.5 * (G + G.T)
    if geometry == "weighted":
        cov = G
    else:
        AG = A @ G
        cov = AG.T @ (AG * v[:, None])
    return x_hat, (cov if covariance == "full" else np.diag(cov).copy())


def level_aggregator(hierarchy: Hierarchy, level: int) -> sp.csr_matrix:
    """The 0/1 matrix (n_nodes(level) × n_leaves) summing leaves into the nodes of ``level``."""
    anc = hierarchy.ancestor_index(hierarchy.depth - 1, level)
    n_leaves = hierarchy.leaves.size
    return sp.csr_matrix(
        (np.ones(n_leaves), (anc, np.arange(n_leaves))),
        shape=(hierarchy.levels[level].size, n_leaves),
    )


def hierarchy_to_sparse(
    hierarchy: Hierarchy,
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant] = (),
    *,
    n_cells: int | None = None,
) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray, sp.csr_matrix, np.ndarray]:
    """The flat problem of a hierarchy: unknowns are the leaf cells ``x`` (leaf-major).

    Returns
    -------
    A, y, variances, C, c
        For :func:`general_gls`; ``x`` has ``n_leaves * n_cells`` entries, leaf ``i`` cell
        ``j`` at ``i * n_cells + j``.
    """
    items = list(measurements) + list(invariants)
    if n_cells is None:
        if not items:
            raise SpecError("no measurements: give n_cells")
        n_cells = items[0].query.n_cells
    blocks, ys, vs, cblocks, cs = [], [], [], [], []
    for meas in measurements:
        G = level_aggregator(hierarchy, meas.level)
        blocks.append(sp.kron(G, sp.csr_matrix(meas.query.matrix, dtype=float)))
        vals = np.asarray(meas.values, dtype=float)
        ys.append(vals.reshape(-1))
        var = getattr(meas, "node_variance", None)
        var = np.asarray(meas.variance if var is None else var, dtype=float)
        vs.append(np.broadcast_to(var.reshape(-1, 1) if var.ndim else var, vals.shape).ravel())
    for inv in invariants:
        G = level_aggregator(hierarchy, inv.level)
        cblocks.append(sp.kron(G, sp.csr_matrix(inv.query.matrix, dtype=float)))
        cs.append(np.asarray(inv.values, dtype=float).reshape(-1))
    n = hierarchy.leaves.size * n_cells
    A = sp.vstack(blocks).tocsr() if blocks else sp.csr_matrix((0, n))
    C = sp.vstack(cblocks).tocsr() if cblocks else sp.csr_matrix((0, n))
    return (
        A,
        np.concatenate(ys) if ys else np.zeros(0),
        np.concatenate(vs) if vs else np.zeros(0),
        C,
        np.concatenate(cs) if cs else np.zeros(0),
    )
