"""Projection / GLS estimation on a hierarchy: two passes of Gaussian belief propagation.

The estimate is the weighted least-squares fit of a consistent table (parent = Σ children,
cell by cell) to the noisy measurements, with the invariants as equality constraints:

    minimise Σ_v Σ_q ‖y_{v,q} − Q_q z_v‖² / σ²_{v,q}   over consistent z with H z_v = t_v.

It is linear in the noise (unbiased for any zero-mean noise) and its covariance is exact.
On a tree it costs O(nodes · cells³) in two passes, level by level (no loop over nodes):

* **upward** — a node's belief from below is the sum of its children's (mean Σ m_c,
  covariance S = Σ P_c); its own measurements are folded in (information update,
  P = (I + S J)⁻¹ S, m = (I + S J)⁻¹ (M + S h)); its invariants are folded in as noiseless
  observations, m ← m + P Hᵀ (H P Hᵀ)⁺ (t − H m), P ← P − P Hᵀ (H P Hᵀ)⁺ H P (the
  pseudo-inverse makes redundant invariants — a nation total implied by state totals —
  harmless);
* **downward** — the root keeps its upward estimate; a child is corrected by its share of the
  parent's correction, ẑ_c = m_c + P_c S⁺ (ẑ_v − Σ m_c') and
  P̂_c = P_c − P_c S⁺ P_c + P_c S⁺ P̂_v S⁺ P_c (the Rauch–Tung–Striebel smoother).

**Under-determined subtrees** (a leaf measured by its total only, a level without a
measurement of some cell): a node's belief from below may be flat (infinite variance) along a
subspace. Every node's belief is carried as the *relation* ``z = m + P λ + N w`` between the
node's value and the force λ its parent exerts on it (the KKT multiplier of parent = Σ
children), with ``N`` an orthonormal basis of the flat directions, ``w`` free and ``Nᵀ λ = 0``.
This is the κ → ∞ limit of a Gaussian with covariance ``P + κ N Nᵀ``; nodes with flat
children are solved from the symmetric bordered system of that relation, and the downward
pass uses the exact limit of the RTS formulas: with ``[[S, N], [Nᵀ, 0]]⁺ = [[A, Bᵀ], [B, C]]``,
``ẑ_c = m_c + (P_c A + N_c B_c)(ẑ_v − M)`` and
``P̂_c = P_c − [P_c N_c] [[A, B_cᵀ], [B_c, C_cc]] [P_c N_c]ᵀ + G_c P̂_v G_cᵀ``. The estimate is
identifiable iff the root has no flat direction and no two siblings share one; otherwise a
:class:`~censusdp.errors.SpecError` names the level.

**Diagonal fast path.** When every query and invariant row selects a single cell (identity
queries, one cell), the cells decouple and the passes are elementwise (Hay et al. 2010).

Geometry: ``"weighted"`` uses the measurement variances (Σ⁻¹-weighted projection; for Gaussian
noise this equals conditioning on consistency and the invariants — Gao, Gong & Yu 2022,
Thm. 22 generalised); ``"euclidean"`` uses unit weights (the projection Π_N of the seed, the
same estimate when all scales are equal). See :mod:`censusdp.estimation.gls_sparse` for the
privacy statement of each; the general sparse solver there is the reference these passes are
tested against.

References
----------
Hay, Rastogi, Miklau & Suciu, "Boosting the accuracy of differentially private histograms
through consistency", PVLDB 3(1), 2010 — the two-pass consistency algorithm (one cell).
Rauch, Tung & Striebel, "Maximum likelihood estimates of linear dynamic systems", AIAA J.
3(8), 1965 — the smoother of the downward pass.
Gao, Gong & Yu, "Subspace Differential Privacy", AAAI 2022 — Π_N, Def. 6, Thm. 22.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError, SpecError
from censusdp.estimation.release import Release
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.queries import Invariant, Measurement

__all__ = ["tree_gls", "NodeVarianceMeasurement"]

Geometry = Literal["weighted", "euclidean"]

_RTOL = 1e-11


@dataclass(frozen=True, eq=False)
class NodeVarianceMeasurement(Measurement):
    """A :class:`Measurement` whose noise variance differs by node.

    Attributes
    ----------
    node_variance : numpy.ndarray
        (n_nodes,) variance of every answer of each node (overrides ``law.variance``).
    """

    node_variance: np.ndarray | None = None


# ----------------------------------------------------------------------------- helpers
def _sum_children(h: Hierarchy, k: int, values: np.ndarray) -> np.ndarray:
    """Σ over the children (level k+1) of every node of level k; shared (1, ...) input ok."""
    up = h.levels[k]
    if values.shape[0] == 1 and h.levels[k + 1].size != 1:
        return up.child_count.reshape((-1,) + (1,) * (values.ndim - 1)) * values
    return h.aggregate_up(k + 1, values)


def _pinv_psd(M: np.ndarray, atol: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Batched pseudo-inverse of symmetric matrices; also the projector onto their kernel."""
    ev, V = np.linalg.eigh(M)
    scale = np.abs(ev).max(axis=-1, keepdims=True)
    keep = np.abs(ev) > np.maximum(_RTOL * scale, np.reshape(atol, (-1, 1)))
    inv = np.where(keep, 1.0 / np.where(keep, ev, 1.0), 0.0)
    Vt = V.swapaxes(-1, -2)
    return (V * inv[..., None, :]) @ Vt, (V * (~keep)[..., None, :]) @ Vt


def _sym(M: np.ndarray) -> np.ndarray:
    return 0.5 * (M + M.swapaxes(-1, -2))


def _unit_rows(matrix: np.ndarray) -> bool:
    m = np.asarray(matrix)
    return bool(np.all((m == 0) | (m == 1)) and np.all(m.sum(axis=1) == 1))


@dataclass
class _Level:
    """Per-level inputs, in scaled units (variances divided by τ²)."""

    J: np.ndarray  # (1|n, K, K) information matrix of the node's own measurements
    h: np.ndarray  # (n, K) information vector
    H: np.ndarray  # (n_H, K) invariant rows
    t: np.ndarray  # (n, n_H) invariant values
    diag_J: np.ndarray | None = None  # (1|n, K) diagonal path
    diag_h: np.ndarray | None = None


def _collect(
    hierarchy: Hierarchy,
    K: int,
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
    geometry: str,
    tau2: float,
    tau: float,
    diagonal: bool,
) -> list[_Level]:
    levels = []
    for k, lv in enumerate(hierarchy.levels):
        n = lv.size
        J = np.zeros((1, K, K))
        h = np.zeros((n, K))
        for m in measurements:
            if hierarchy.level_index(m.level) != k:
                continue
            Q = np.asarray(m.query.matrix, dtype=float)
            nv = getattr(m, "node_variance", None)
            if geometry == "euclidean":
                w = np.ones(1)
            elif nv is not None:
                w = tau2 / np.asarray(nv, dtype=float).reshape(-1)
                if w.shape != (n,) or not np.all(np.isfinite(w) & (w > 0)):
                    raise SpecError(
                        f"level {lv.name!r}, query {m.query.name!r}: node_variance must be "
                        f"({n},) positive finite values"
                    )
            else:
                w = np.full(1, tau2 / m.variance)
            J = J + w[:, None, None] * (Q.T @ Q)[None]
            h += (np.asarray(m.values, dtype=float) / tau @ Q) * w[:, None]
        rows = [np.asarray(i.query.matrix, float) for i in invariants if i.level == k]
        vals = [np.asarray(i.values, float) / tau for i in invariants if i.level == k]
        H = np.vstack(rows) if rows else np.zeros((0, K))
        t = np.hstack(vals) if vals else np.zeros((n, 0))
        item = _Level(J, h, H, t)
        if diagonal:
            item.diag_J = np.diagonal(J, axis1=1, axis2=2).copy()
            item.diag_h = h
        levels.append(item)
    return levels


def _validate(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
) -> None:
    K = len(cells)
    for kind, items in (("measurement", measurements), ("invariant", invariants)):
        for it in items:
            k = hierarchy.level_index(it.level)
            name = hierarchy.names[k]
            if it.query.n_cells != K:
                raise SpecError(
                    f"{kind} {it.query.name!r} at level {name!r} is on {it.query.n_cells} "
                    f"cells but the table has {K}"
                )
            shape = (hierarchy.levels[k].size, it.query.n_rows)
            if np.shape(it.values) != shape:
                raise SpecError(
                    f"{kind} {it.query.name!r} at level {name!r}: values have shape "
                    f"{np.shape(it.values)}, expected {shape}"
                )
            if not np.all(np.isfinite(it.values)):
                raise DataError(f"{kind} {it.query.name!r} at level {name!r} has non-finite values")


def _not_identifiable(level: str, what: str) -> SpecError:
    return SpecError(
        f"the GLS estimate is not identifiable at level {level!r}: {what}. Add a measurement "
        "(e.g. the detailed query) or an invariant that determines these cells"
    )


# ----------------------------------------------------------------------------- diagonal path
def _diagonal(
    h: Hierarchy, lv: list[_Level], want_cov: bool
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Elementwise two-pass algorithm; cells are independent one-cell problems."""
    D = h.depth
    m: list = [None] * D
    P: list = [None] * D
    flat: list = [None] * D
    Msum: list = [None] * D
    Ssum: list = [None] * D
    nflat: list = [None] * D
    for k in range(D - 1, -1, -1):
        n, K = h.levels[k].size, lv[k].h.shape[1]
        Jd = np.broadcast_to(lv[k].diag_J, (n, K))
        hd = lv[k].diag_h
        pos = Jd > 0
        if k == D - 1:
            Pk = np.where(pos, 1.0 / np.where(pos, Jd, 1.0), 0.0)
            mk = Pk * hd
            fk = ~pos
        else:
            nf = _sum_children(h, k, flat[k + 1].astype(np.int64))
            M = _sum_children(h, k, m[k + 1])
            S = _sum_children(h, k, P[k + 1])
            Msum[k], Ssum[k], nflat[k] = M, S, nf
            cf = nf > 0
            den = 1.0 + S * Jd
            Pk = np.where(cf, np.where(pos, 1.0 / np.where(pos, Jd, 1.0), 0.0), S / den)
            mk = np.where(cf, Pk * hd, (M + S * hd) / den)
            fk = cf & ~pos
        if lv[k].H.shape[0]:
            cell = np.argmax(lv[k].H, axis=1)
            mk, Pk, fk = mk.copy(), Pk.copy(), fk.copy()
            mk[:, cell] = lv[k].t
            Pk[:, cell] = 0.0
            fk[:, cell] = False
        m[k], P[k], flat[k] = mk, Pk, fk
    if flat[0].any():
        raise _not_identifiable(h.names[0], "some cell is measured at no level")
    zhat = [m[0]]
    Phat = [P[0]]
    for k in range(D - 1):
        par = h.levels[k + 1].parent
        nf = nflat[k]
        if np.any(nf > 1):
            node = int(np.argwhere(nf > 1)[0, 0])
            raise _not_identifiable(
                h.names[k + 1],
                f"two or more children of {h.names[k]} {str(h.levels[k].codes[node])!r} "
                "have a cell that is measured neither at their level nor below",
            )
        S = Ssum[k]
        d = zhat[k] - Msum[k]
        A = np.where(S > 0, 1.0 / np.where(S > 0, S, 1.0), 0.0)
        cf = (nf > 0)[par]
        Pc = P[k + 1]
        G = np.where(cf, flat[k + 1].astype(float), Pc * A[par])
        Dc = np.where(cf, np.where(flat[k + 1], S[par], Pc), Pc - G * Pc)
        zhat.append(m[k + 1] + G * d[par])
        Phat.append(Dc + G * G * Phat[k][par])
    return zhat, Phat


# ----------------------------------------------------------------------------- general path
@dataclass
class _Up:
    m: np.ndarray  # (n, K)
    P: np.ndarray  # (1|n, K, K)
    N: np.ndarray | None = None  # (n, K, K) flat basis (columns [0, r) valid), or None
    r: np.ndarray | None = None  # (n,) number of flat directions
    # children summaries (internal levels)
    M: np.ndarray | None = None
    S: np.ndarray | None = None
    Nc: np.ndarray | None = None  # packed flat directions of the children (n, K, K)
    rc: np.ndarray | None = None  # (n,) number of packed columns
    off: np.ndarray | None = None  # per child: offset of its columns in the parent's pack


def _flat_basis(Pz: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal basis (columns first) of the range of a PSD projector-like matrix."""
    ev, V = np.linalg.eigh(_sym(Pz))
    keep = ev > 1e-8
    order = np.argsort(~keep, axis=-1, kind="stable")
    V = np.take_along_axis(V, order[..., None, :], axis=-1)
    keep = np.take_along_axis(keep, order, axis=-1)
    return V * keep[..., None, :], keep.sum(axis=-1)


def _solve_bordered(
    Mat: np.ndarray, rhs: np.ndarray, K: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pseudo-solve the node relation; z occupies the first K coordinates.

    Returns m (n, K), P (b, K, K), the flat basis N (b, K, K) and its rank r (b,).
    """
    Minv, Null = _pinv_psd(Mat)
    N, r = _flat_basis(Null[..., :K, :K], K)
    Pi = np.eye(K) - N @ N.swapaxes(-1, -2)
    x = (
        np.einsum("bij,nj->ni", Minv, rhs)
        if Minv.shape[0] == 1
        else np.einsum("nij,nj->ni", Minv, rhs)
    )
    m = (
        np.einsum("bij,nj->ni", Pi, x[:, :K])
        if Pi.shape[0] == 1
        else np.einsum("nij,nj->ni", Pi, x[:, :K])
    )
    P = _sym(Pi @ Minv[..., :K, :K] @ Pi)
    return m, P, N, r


def _leaf_up(L: _Level, K: int) -> _Up:
    nH = L.H.shape[0]
    b = L.J.shape[0]
    Mat = np.zeros((b, K + nH, K + nH))
    Mat[:, :K, :K] = L.J
    Mat[:, :K, K:] = L.H.T
    Mat[:, K:, :K] = L.H
    rhs = np.concatenate([L.h, L.t], axis=1)
    m, P, N, r = _solve_bordered(Mat, rhs, K)
    if not np.any(r):
        return _Up(m, P)
    n = L.h.shape[0]
    return _Up(m, P, np.broadcast_to(N, (n, K, K)).copy(), np.broadcast_to(r, (n,)).copy())


def _pack_children(
    h: Hierarchy, k: int, child: _Up, K: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate the children's flat bases into one (K, K) block per parent."""
    n_par = h.levels[k].size
    par = h.levels[k + 1].parent
    rc = np.bincount(par, weights=child.r, minlength=n_par).astype(np.int64)
    if np.any(rc > K):
        node = int(np.argmax(rc > K))
        raise _not_identifiable(
            h.names[k + 1],
            f"the children of {h.names[k]} {str(h.levels[k].codes[node])!r} have more "
            "undetermined directions than there are cells",
        )
    start = np.cumsum(child.r) - child.r
    first = h.levels[k].child_start[par]
    off = start - (np.cumsum(child.r) - child.r)[first]
    ci, j = np.nonzero(np.arange(K)[None, :] < child.r[:, None])
    packed = np.zeros((n_par, K, K))
    packed[par[ci], :, off[ci] + j] = child.N[ci, :, j]
    return packed, rc, off


def _general_up(h: Hierarchy, lv: list[_Level], K: int) -> list[_Up]:
    D = h.depth
    up: list = [None] * D
    up[D - 1] = _leaf_up(lv[D - 1], K)
    for k in range(D - 2, -1, -1):
        L, ch = lv[k], up[k + 1]
        n = h.levels[k].size
        M = _sum_children(h, k, ch.m)
        S = _sym(_sum_children(h, k, ch.P))
        nH = L.H.shape[0]
        if ch.N is None:
            X = np.eye(K) + S @ L.J
            P0 = _sym(np.linalg.solve(X, S))
            m0 = np.linalg.solve(X, (M + np.einsum("nij,nj->ni", S, L.h))[..., None])[..., 0]
            if nH:
                HP = np.einsum("ak,nkl->nal", L.H, P0)
                R = _sym(HP @ L.H.T)
                atol = 1e-11 * (1.0 + np.trace(S, axis1=1, axis2=2)) * float((L.H**2).sum())
                Rinv, Rnull = _pinv_psd(R, atol)
                res = L.t - m0 @ L.H.T
                bad = np.abs(np.einsum("nab,nb->na", Rnull, res)).max(axis=1)
                if np.any(bad > 1e-7 * (1.0 + np.abs(L.t).max(axis=1))):
                    node = int(np.argmax(bad))
                    raise DataError(
                        f"the invariants at level {h.names[k]!r} (node "
                        f"{str(h.levels[k].codes[node])!r}) contradict the invariants below "
                        "it: parent totals must equal the sums of their children's"
                    )
                Kg = HP.swapaxes(1, 2) @ Rinv
                m0 = m0 + np.einsum("nka,na->nk", Kg, res)
                P0 = _sym(P0 - Kg @ HP)
            up[k] = _Up(m0, P0, M=M, S=S)
            continue
        Nc, rc, off = _pack_children(h, k, ch, K)
        # Relation of node k: variables (z, λ, w, μ); see the module docstring.
        Dm = 3 * K + nH
        Mat = np.zeros((n, Dm, Dm))
        I = np.eye(K)
        Mat[:, :K, :K] = L.J
        Mat[:, :K, K : 2 * K] = I
        Mat[:, K : 2 * K, :K] = I
        Mat[:, K : 2 * K, K : 2 * K] = -S
        Mat[:, K : 2 * K, 2 * K : 3 * K] = -Nc
        Mat[:, 2 * K : 3 * K, K : 2 * K] = -Nc.swapaxes(1, 2)
        pad = np.arange(K)[None, :] >= rc[:, None]
        Mat[:, 2 * K : 3 * K, 2 * K : 3 * K] = pad[:, :, None] * np.eye(K)
        Mat[:, :K, 3 * K :] = L.H.T
        Mat[:, 3 * K :, :K] = L.H
        rhs = np.concatenate([L.h, M, np.zeros((n, K)), L.t], axis=1)
        m, P, N, r = _solve_bordered(Mat, rhs, K)
        u = _Up(m, P, M=M, S=S, Nc=Nc, rc=rc, off=off)
        if np.any(r):
            u.N, u.r = N, r
        up[k] = u
    return up


def _general_down(h: Hierarchy, up: list[_Up], K: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    root = up[0]
    if root.N is not None and np.any(root.r):
        raise _not_identifiable(
            h.names[0],
            "some combination of cells is measured at no level and held invariant nowhere",
        )
    zhat = [root.m]
    Phat = [np.broadcast_to(root.P, (1, K, K)).copy()]
    for k in range(h.depth - 1):
        u, ch = up[k], up[k + 1]
        par = h.levels[k + 1].parent
        n_c = h.levels[k + 1].size
        d = zhat[k] - u.M
        Pc = np.broadcast_to(ch.P, (n_c, K, K))
        if u.Nc is None:
            scale = np.trace(u.S, axis1=1, axis2=2)
            A, _ = _pinv_psd(u.S, 1e-13 * scale)
            G = Pc @ A[par]
            Dc = Pc - G @ Pc
        else:
            gram = u.Nc.swapaxes(1, 2) @ u.Nc
            pad = np.arange(K)[None, :] >= u.rc[:, None]
            gram = gram + pad[:, :, None] * np.eye(K)
            if np.any(np.linalg.eigvalsh(gram)[:, 0] < 1e-8):
                node = int(np.argmin(np.linalg.eigvalsh(gram)[:, 0]))
                raise _not_identifiable(
                    h.names[k + 1],
                    f"two children of {h.names[k]} {str(h.levels[k].codes[node])!r} share "
                    "a combination of cells that is measured neither at their level nor below",
                )
            Y = np.zeros((u.S.shape[0], 2 * K, 2 * K))
            Y[:, :K, :K] = u.S
            Y[:, :K, K:] = u.Nc
            Y[:, K:, :K] = u.Nc.swapaxes(1, 2)
            Y[:, K:, K:] = pad[:, :, None] * np.eye(K)
            Yinv, _ = _pinv_psd(Y)
            A, B, Cw = Yinv[:, :K, :K], Yinv[:, K:, :K], Yinv[:, K:, K:]
            Ap = A[par]
            if ch.N is None:
                G = Pc @ Ap
                Dc = Pc - G @ Pc
            else:
                # child c's block of the packed w: rows off_c .. off_c + r_c of B, Cw.
                sel = np.arange(K)[None, :] < ch.r[:, None]
                idx = np.where(sel, u.off[:, None] + np.arange(K)[None, :], 0)
                Bc = B[par[:, None], idx] * sel[:, :, None]
                Cc = Cw[par[:, None, None], idx[:, :, None], idx[:, None, :]]
                Cc = Cc * (sel[:, :, None] & sel[:, None, :])
                G = Pc @ Ap + ch.N @ Bc
                F = np.concatenate([Pc, ch.N], axis=2)
                Yc = np.concatenate(
                    [
                        np.concatenate([Ap, Bc.swapaxes(1, 2)], axis=2),
                        np.concatenate([Bc, Cc], axis=2),
                    ],
                    axis=1,
                )
                Dc = Pc - F @ Yc @ F.swapaxes(1, 2)
        zhat.append(ch.m + np.einsum("nij,nj->ni", G, d[par]))
        Pk = Phat[k] if Phat[k].shape[0] > 1 else np.broadcast_to(Phat[k], (u.M.shape[0], K, K))
        Phat.append(_sym(Dc + G @ Pk[par] @ G.swapaxes(1, 2)))
    return zhat, Phat


# ----------------------------------------------------------------------------- public API
def tree_gls(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
    privacy: PrivacyStatement,
    *,
    covariance: bool = False,
    geometry: Geometry = "weighted",
) -> Release:
    """The GLS (projection) estimate of a consistent, invariant-respecting table.

    Parameters
    ----------
    hierarchy : Hierarchy
    cells : sequence of str
        Cell names (K of them).
    measurements : sequence of Measurement
        Noisy answers ``values`` (n_nodes, k) of ``query`` at every node of ``level``; the
        noise variance is ``law.variance`` (or ``node_variance`` of a
        :class:`NodeVarianceMeasurement`).
    invariants : sequence of Invariant
        Exact answers at every node of a level (totals, histograms, marginals).
    privacy : PrivacyStatement
        The statement of the measurements; returned with ``geometry`` set.
    covariance : bool
        Also return the (n_nodes, K, K) error covariance of every node.
    geometry : {"weighted", "euclidean"}
        Σ⁻¹-weighted projection (GLS, minimum variance) or unit weights (Euclidean Π_N).

    Returns
    -------
    Release
        ``estimates`` per level (root first), exact per-cell ``variances`` (None for
        ``"euclidean"`` with unequal noise scales, where the tree passes do not give the
        sandwich covariance), optional ``covariances`` and ``diagnostics`` (path, timings,
        largest consistency and invariant residuals).

    Raises
    ------
    SpecError
        Shapes that do not match the hierarchy, or an estimate that is not identifiable
        (the message names the level).
    DataError
        Invariants that contradict each other.

    References
    ----------
    Hay, Rastogi, Miklau & Suciu (2010), §4 (the one-cell algorithm); Rauch, Tung & Striebel
    (1965); Gao, Gong & Yu (2022), Thm. 22.
    """
    t0 = time.perf_counter()
    if geometry not in ("weighted", "euclidean"):
        raise SpecError(f"geometry must be 'weighted' or 'euclidean', got {geometry!r}")
    cells = tuple(cells)
    K = len(cells)
    measurements = [
        dataclasses.replace(m, level=hierarchy.level_index(m.level)) for m in measurements
    ]
    invariants = [dataclasses.replace(i, level=hierarchy.level_index(i.level)) for i in invariants]
    _validate(hierarchy, cells, measurements, invariants)
    var_all = []
    for m in measurements:
        nv = getattr(m, "node_variance", None)
        var_all.append(np.asarray(m.variance if nv is None else nv, dtype=float).reshape(-1))
    var_all = np.concatenate(var_all) if var_all else np.ones(1)
    equal_scales = bool(np.all(var_all == var_all[0]))
    tau2 = float(np.median(var_all)) if geometry == "weighted" else 1.0
    tau = float(np.sqrt(tau2))
    diagonal = all(_unit_rows(x.query.matrix) for x in [*measurements, *invariants])
    lv = _collect(hierarchy, K, measurements, invariants, geometry, tau2, tau, diagonal)
    t1 = time.perf_counter()
    if diagonal:
        zhat, Phat = _diagonal(hierarchy, lv, covariance)
        Pd = Phat
        covs = [np.einsum("nk,kl->nkl", p, np.eye(K)) for p in Phat] if covariance else None
    else:
        up = _general_up(hierarchy, lv, K)
        zhat, Phat = _general_down(hierarchy, up, K)
        Pd = [np.diagonal(p, axis1=1, axis2=2).copy() for p in Phat]
        covs = Phat if covariance else None
    t2 = time.perf_counter()
    # back to data units; Euclidean variances are exact only with equal noise scales
    vscale = tau2 if geometry == "weighted" else (float(var_all[0]) if equal_scales else None)
    estimates = [z * tau for z in zhat]
    variances = None if vscale is None else [np.maximum(p, 0.0) * vscale for p in Pd]
    if covs is not None:
        covs = None if vscale is None else [c * vscale for c in covs]
    diag = {
        "path": "diagonal" if diagonal else "general",
        "geometry": geometry,
        "seconds_setup": t1 - t0,
        "seconds_solve": t2 - t1,
    }
    diag.update(_residuals(hierarchy, estimates, invariants))
    if diag["max_invariant_residual"] > 1e-6 * (1.0 + diag["max_invariant_value"]):
        raise DataError(
            "the invariants contradict each other (they cannot all hold with parent = sum of "
            f"children); largest violation at level {diag['worst_invariant_level']!r}"
        )
    if vscale is None:
        diag["note"] = (
            "euclidean geometry with unequal noise scales: the tree passes give the estimate "
            "but not its sandwich covariance; use gls_sparse.general_gls for it"
        )
    stmt = dataclasses.replace(privacy, geometry=geometry)
    return Release(
        estimator="gls",
        hierarchy=hierarchy,
        cells=cells,
        estimates=estimates,
        variances=variances,
        privacy=stmt,
        integer=False,
        diagnostics=diag,
        covariances=covs,
    )


def _residuals(h: Hierarchy, estimates: list[np.ndarray], invariants: Sequence[Invariant]) -> dict:
    cons = 0.0
    for k in range(h.depth - 1):
        cons = max(
            cons, float(np.abs(h.aggregate_up(k + 1, estimates[k + 1]) - estimates[k]).max())
        )
    inv, val, worst = 0.0, 0.0, ""
    for i in invariants:
        r = float(np.abs(i.query.apply(estimates[i.level]) - i.values).max(initial=0.0))
        val = max(val, float(np.abs(i.values).max(initial=0.0)))
        if r >= inv:
            inv, worst = r, h.names[i.level]
    return {
        "max_consistency_residual": cons,
        "max_invariant_residual": inv,
        "max_invariant_value": val,
        "worst_invariant_level": worst,
    }
