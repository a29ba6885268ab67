"""Compiled kernel of the transportation projection of the non-negative product.

:func:`~censusdp.estimation.integer.nonnegative.project_transport` projects each parent's
(children × cells) matrix ``z`` onto ``{X ≥ 0, Σ_c X_ic = r_i, Σ_i X_ic = s_c}`` by exact
dual block-coordinate ascent (Ohuchi & Kaji 1984; Gaffke & Mathar 1989; linear
convergence, Luo & Tseng 1993): ``X = max(0, z_ic + α_i + β_c)``, every row's ``α_i`` then
every column's ``β_c`` a simplex threshold (Held, Wolfe & Crowder 1974; Duchi et al. 2008),
sweep after sweep until every row sum is within the problem's tolerance.

:func:`transport_batch` runs each problem of a padded batch to its *own* convergence, one
problem after another, on its valid rows × columns only (no work on padding nor on
problems that have converged), with the same floating-point operations in the same order
as the vectorised sweeps did: each lane's values sorted descending (values only — ties do
not change the sorted values), running sums left to right, the same ``css / j`` tests, the
same threshold ``css[k−1] / k``, the same ``X`` and the same freeze test on its sequential
row sums. Its results are therefore bit for bit those of the batched numpy sweeps (tested
against them in ``tests/estimation/test_transport_kernel.py``), and do not depend on the
batch.

References
----------
Held, M., Wolfe, P. & Crowder, H. P. (1974). Validation of subgradient optimization. Math.
    Programming 6.
Duchi, J., Shalev-Shwartz, S., Singer, Y. & Chandra, T. (2008). Efficient projections onto
    the ℓ1-ball for learning in high dimensions. ICML.
Ohuchi, A. & Kaji, I. (1984). Lagrangian dual coordinatewise maximization algorithm for
    network transportation problems with quadratic costs. Networks 14(4).
Gaffke, N. & Mathar, R. (1989). A cyclic projection algorithm via duality. Metrika 36.
Luo, Z.-Q. & Tseng, P. (1993). On the convergence rate of dual ascent methods for linearly
    constrained convex minimization. Math. Oper. Res. 18(4).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["simplex_threshold", "sort_descending", "transport_batch", "transport_problem"]


@njit(cache=True, nogil=True)
def simplex_threshold(u: np.ndarray, total: float, css: np.ndarray) -> float:
    """The simplex threshold ``θ`` with ``Σ max(u − θ, 0) = total`` (Held et al. 1974;
    Duchi et al. 2008, Fig. 1) of finite values ``u`` in descending order: with
    ``css_j = (u_1 + … + u_j) − total`` (summed left to right) and
    ``k = max(1, #{j : u_j − css_j / j > 0})``, ``θ = css_k / k`` (``total = 0``:
    ``θ = u_1``). ``css`` is scratch of at least ``u.size`` floats."""
    s = 0.0
    k = 0
    for j in range(u.size):
        s = u[j] if j == 0 else s + u[j]
        c = s - total
        css[j] = c
        if u[j] - c / (j + 1.0) > 0.0:
            k += 1
    k = max(k, 1)
    return css[k - 1] / k


@njit(cache=True, nogil=True)
def sort_descending(v: np.ndarray, perm: np.ndarray) -> None:
    """Sort ``v`` descending in place, ``perm`` moved along: insertion sort, linear on the
    nearly sorted lanes of a converging sweep (the previous sweep's order), a full sort
    once it has shifted more than ``4 · size + 16`` values (only the sorted *values* are
    used, and those do not depend on the algorithm)."""
    m = v.size
    budget = 4 * m + 16
    shifts = 0
    for j in range(1, m):
        key = v[j]
        if v[j - 1] >= key:
            continue
        kp = perm[j]
        i = j - 1
        while i >= 0 and v[i] < key:
            v[i + 1] = v[i]
            perm[i + 1] = perm[i]
            i -= 1
        shifts += j - 1 - i
        v[i + 1] = key
        perm[i + 1] = kp
        if shifts > budget:
            order = np.argsort(-v)
            v[:] = v[order]
            perm[:] = perm[order]
            return


@njit(cache=True, nogil=True)
def transport_problem(
    z: np.ndarray, r: np.ndarray, s: np.ndarray, tol: float, max_sweeps: int, x: np.ndarray
) -> int:
    """Project one ``(n, k)`` matrix ``z`` onto ``{X ≥ 0, rows = r, columns = s}`` into ``x``.

    Sweeps of exact dual block-coordinate ascent (Ohuchi & Kaji 1984): every row's
    ``α_i = −θ(z_i· + β, r_i)``, then every column's ``β_c = −θ(z_·c + α, s_c)``
    (:func:`simplex_threshold`; each lane kept in its previous sweep's order and re-sorted
    by :func:`sort_descending`), then ``X = max((z + β) + α, 0)``; stops once
    ``max_i |Σ_c X_ic − r_i| ≤ tol`` (sums left to right). Returns the sweeps taken, 0 if
    not within ``tol`` after ``max_sweeps`` (``x`` then holds the last sweep's ``X``).
    """
    n, k = z.shape
    zt = np.ascontiguousarray(z.T)
    a = np.zeros(n)
    b = np.zeros(k)
    row = np.empty(k)
    col = np.empty(n)
    css = np.empty(max(n, k))
    pr = np.empty((n, k), np.int64)
    pc = np.empty((k, n), np.int64)
    for i in range(n):
        pr[i] = np.arange(k)
    for c in range(k):
        pc[c] = np.arange(n)
    for sweep in range(1, max_sweeps + 1):
        for i in range(n):
            p = pr[i]
            for t in range(k):
                row[t] = z[i, p[t]] + b[p[t]]
            sort_descending(row, p)
            a[i] = -simplex_threshold(row, r[i], css)
        for c in range(k):
            p = pc[c]
            for t in range(n):
                col[t] = zt[c, p[t]] + a[p[t]]
            sort_descending(col, p)
            b[c] = -simplex_threshold(col, s[c], css)
        res = 0.0
        nan = False
        for i in range(n):
            acc = 0.0
            for c in range(k):
                v = z[i, c] + b[c] + a[i]
                v = v if v > 0.0 else 0.0
                x[i, c] = v
                acc = v if c == 0 else acc + v
            d = abs(acc - r[i])
            if np.isnan(d):
                nan = True
            elif d > res:
                res = d
        if not nan and res <= tol:
            return sweep
    return 0


@njit(cache=True, nogil=True)
def transport_batch(
    z: np.ndarray,
    r: np.ndarray,
    s: np.ndarray,
    tol: np.ndarray,
    n_rows: np.ndarray,
    n_cols: np.ndarray,
    max_sweeps: int,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`transport_problem` for every problem of a padded batch.

    Parameters
    ----------
    z : (B, n, k) float
        Problem ``p`` is ``z[p, :n_rows[p], :n_cols[p]]`` (finite); the rest is padding,
        never read.
    r : (B, n) float
        Row targets (positive on each problem's rows).
    s : (B, k) float
        Column targets (positive on each problem's columns).
    tol : (B,) float
        Absolute tolerance of each problem's row sums.
    n_rows, n_cols : (B,) int
        Each problem's rows and columns.
    max_sweeps : int

    Returns
    -------
    X : (B, n, k) float
        Each problem's projection, 0 on padding (and on a problem not within its tolerance).
    sweeps : (B,) int64
        Sweeps each problem took (0: not within its tolerance after ``max_sweeps``).
    """
    B = z.shape[0]
    x = np.zeros(z.shape)
    sweeps = np.zeros(B, np.int64)
    for p in range(B):
        n, k = n_rows[p], n_cols[p]
        xp = np.empty((n, k))
        sweeps[p] = transport_problem(
            np.ascontiguousarray(z[p, :n, :k]), r[p, :n], s[p, :k], tol[p], max_sweeps, xp
        )
        if sweeps[p] > 0:
            x[p, :n, :k] = xp
    return x, sweeps
