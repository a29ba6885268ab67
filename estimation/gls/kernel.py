"""The GLS kernel: Gaussian belief propagation on a forest, dense per-node matrices.

One kernel with two front ends: :mod:`censusdp.estimation.gls.tree` (a flat table of K cells,
one cell included: no elementwise special case) and
:mod:`censusdp.estimation.gls.structured` (the blocks of a marginal workload, each a problem
of this kind with copies); :mod:`censusdp.estimation.gls.areas`,
:mod:`censusdp.estimation.gls.area_measurements` and :mod:`censusdp.estimation.gls.predict` run it
on the same inputs to get covariances. A front end turns its measurements and invariants
into per-level :class:`LevelInputs` (scaled information ``J, h``, invariant rows ``H`` and
values ``t``); the kernel computes the estimate

    minimise Σ_v ½ zᵥᵀ Jᵥ zᵥ − hᵥᵀ zᵥ   over consistent z (parent = Σ children) with Hᵥ zᵥ = tᵥ,

and its error covariance (exact when ``Cov(hᵥ) = Jᵥ``), level by level, no loop over nodes:

* :func:`general_up` — leaves first, a node's belief from below is the sum of its
  children's (mean ``M = Σ m_c``, covariance ``S = Σ P_c``); its own information is folded
  in, ``P = (I + S J)⁻¹ S``, ``m = (I + S J)⁻¹ (M + S h)``, then its invariants as noiseless
  observations, ``m ← m + P Hᵀ (H P Hᵀ)⁺ (t − H m)``, ``P ← P − P Hᵀ (H P Hᵀ)⁺ H P``.
  A belief that is flat (infinite variance) along a subspace is carried as the relation
  ``z = m + P λ + N w`` with ``N`` an orthonormal basis of the flat directions (the κ → ∞
  limit of covariance ``P + κ N Nᵀ``), solved from the symmetric bordered system
  (:class:`UpwardBelief`).
* :func:`general_down` — the Rauch–Tung–Striebel smoother from the root's estimate: a
  child is corrected by its share of the parent's correction, ``ẑ_c = m_c + G_c (ẑ_v − M)``,
  ``P̂_c = P_c − P_c S⁺ P_c + G_c P̂_v G_cᵀ`` with ``G_c = P_c S⁺`` (the family inverse
  :func:`family_inverse_plain`), or its exact limit with flat children
  (:func:`family_inverse_bordered`).
* :func:`concat_messages` — the cut level's messages of partitions, concatenated: the
  passes split on sub-forests (:class:`~censusdp.hierarchy.forest.Forest`), and every
  operation is per node (elementwise ufuncs, ``np.add.reduceat`` over a node's children,
  stacked ``matmul`` / ``solve`` / ``eigh``), so a partitioned run equals the whole one bit
  for bit.

The stacked products, solves and eigensystems are those of
:mod:`censusdp.estimation.gls.block_kernels` (compiled, one fixed order of operations per entry,
no BLAS/LAPACK), so the values — and a run's digest — do not depend on the BLAS build, its
core type or the machine either (issue 36: OpenBLAS's Haswell and Sandybridge kernels gave
different digests before); ``np.einsum`` products (numpy's own loops) and elementwise ufuncs
never call BLAS.

Structural zeros (``LevelInputs.Z``, per node 0/1 over the K coordinates) are noiseless
observations ``z[i] = 0``: extra rows of the bordered systems at the leaves (solved once per
distinct (J, Z) pattern) and of the relation with flat children, and a conditioning step
``m ← m − P D (D P D)⁺ D m``, ``P ← P − P D (D P D)⁺ D P`` after the information update;
held coordinates are set to exactly 0, so every gain has zero rows there and the smoothed
estimates are ``== 0``.

Means, information vectors and invariant values may carry a copy axis — ``h`` (n, C, K),
``t`` (n, C, n_H) — for C problems that share every matrix (docs/design.md § The structured algebra: the blocks of a
marginal workload repeated over within-group contrasts); matrices stay per node, and with no
copy axis every operation is the one of a single problem, bit for bit.

The estimate is identifiable iff the root has no flat direction (:func:`root_start`, where
the downward pass starts) and no two siblings share one (:func:`general_up` and
:func:`general_down` raise :func:`not_identifiable`).

References
----------
Hay, Rastogi, Miklau & Suciu, "Boosting the accuracy of differentially private histograms
through consistency", PVLDB 3(1), 2010, §4 — the two-pass algorithm (one cell).
Rauch, Tung & Striebel, "Maximum likelihood estimates of linear dynamic systems", AIAA J.
3(8), 1965 — the smoother of the downward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls.block_kernels import eigh, eigvalsh, matmul, solve
from censusdp.hierarchy.forest import Forest

__all__ = [
    "PSEUDO_INVERSE_RTOL",
    "LevelInputs",
    "UpwardBelief",
    "concat_messages",
    "family_inverse_bordered",
    "family_inverse_plain",
    "general_down",
    "general_up",
    "not_identifiable",
    "root_start",
]

#: Eigenvalues below this fraction of a matrix's largest are treated as zero.
PSEUDO_INVERSE_RTOL = 1e-11


# ----------------------------------------------------------------------------- helpers
def _mv(A: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Batched matrix–vector product ``A[n] @ x[n]`` (``A`` may be one shared matrix).

    ``x`` is (n, K), or (n, C, K) with C copies that each meet the node's one matrix (see
    :func:`general_up`).
    """
    if x.ndim > 2:
        if A.shape[-1] == 1 and x.shape[-1] == 1:  # 1 × 1 blocks: the one product, no BLAS call
            return x * A
        return matmul(x, A.swapaxes(-1, -2))
    if A.shape[0] == 1:
        return np.einsum("bij,nj->ni", A, x)
    return np.einsum("nij,nj->ni", A, x)


def _node_mv(spec: str, A: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The per-node product ``einsum(spec, A, x)`` of (n, K) vectors; for (n, C, K) copies
    the same product as one batched ``matmul`` per node."""
    if x.ndim == 2:
        return np.einsum(spec, A, x)
    if A.shape[-1] == 1 and x.shape[-1] == 1 and A.shape[-2] == 1:
        return x * A
    return matmul(x, A.swapaxes(-1, -2))


def _solve_vec(X: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``X[n]⁻¹ b[n]`` for (n, K) ``b`` or (n, C, K) copies (one factorisation per node)."""
    if b.ndim == 2:
        return solve(X, b[..., None])[..., 0]
    return solve(X, b.swapaxes(-1, -2)).swapaxes(-1, -2)


def _node_max(x: np.ndarray) -> np.ndarray:
    """Largest entry of every node's vector (over its copies too)."""
    return x.reshape(x.shape[0], -1).max(axis=1)


def _pinv_psd(M: np.ndarray, atol: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Batched pseudo-inverse of symmetric matrices; also the projector onto their kernel."""
    ev, V = eigh(M)
    scale = np.abs(ev).max(axis=-1, keepdims=True)
    keep = np.abs(ev) > np.maximum(PSEUDO_INVERSE_RTOL * scale, np.reshape(atol, (-1, 1)))
    inv = np.where(keep, 1.0 / np.where(keep, ev, 1.0), 0.0)
    Vt = V.swapaxes(-1, -2)
    return matmul(V * inv[..., None, :], Vt), matmul(V * (~keep)[..., None, :], Vt)


def _sym(M: np.ndarray) -> np.ndarray:
    return 0.5 * (M + M.swapaxes(-1, -2))


def _subset(mask: np.ndarray) -> slice | np.ndarray:
    """Index of the True entries (a plain slice when all are: no copies)."""
    return slice(None) if mask.all() else np.flatnonzero(mask)


@dataclass
class LevelInputs:
    """What one level of a front end brings to the kernel, in scaled units (variances / τ²).

    Attributes
    ----------
    J : numpy.ndarray
        (1|n, K, K) information matrix ``Σ_q w_q Q_qᵀ Q_q`` of each node's own measurements
        (one shared matrix when ``shared``).
    h : numpy.ndarray
        (n, K) information vector ``Σ_q w_q Q_qᵀ y_q``, or (n, C, K) for C copies.
    H : numpy.ndarray
        (n_H, K) invariant rows, the same at every node of the level.
    t : numpy.ndarray
        (n, n_H) invariant values, or (n, C, n_H) for C copies.
    shared : bool
        ``J`` is one matrix for every node (no per-node variances).
    Z : numpy.ndarray or None
        (n, K) 0/1 per node: coordinates held at exactly 0 at that node (structural zeros,
        docs/design.md § The Noisy Measurement File) — noiseless observations ``zᵥ[i] = 0``, i.e. the node's belief is
        conditioned onto the coordinate subspace of its unmasked cells. None: no zeros (the
        kernel is then the plain one, bit for bit).
    """

    J: np.ndarray
    h: np.ndarray
    H: np.ndarray
    t: np.ndarray
    shared: bool = True
    Z: np.ndarray | None = None

    def rows(self, idx: slice | np.ndarray) -> LevelInputs:
        """The inputs of the nodes ``idx`` of the level."""
        return LevelInputs(
            self.J if self.J.shape[0] == 1 else self.J[idx], self.h[idx], self.H, self.t[idx],
            Z=None if self.Z is None else self.Z[idx],
        )  # fmt: skip


def not_identifiable(level: str, what: str) -> SpecError:
    """The error for an estimate that is not identifiable at ``level`` (``what``: why)."""
    return SpecError(
        f"the GLS estimate is not identifiable at level {level!r}: {what}. Add a measurement "
        "(e.g. the detailed query) or an invariant that determines these cells"
    )


# ----------------------------------------------------------------------------- general path
@dataclass
class UpwardBelief:
    """The belief from below of the nodes of one level: the relation ``z = m + P λ + N w``.

    ``λ`` is the force the parent exerts on the node (the multiplier of parent = Σ children),
    ``w`` is free and ``Nᵀ λ = 0``: the κ → ∞ limit of a Gaussian with mean ``m`` and
    covariance ``P + κ N Nᵀ``. :meth:`message` is what the nodes send to the level above;
    the children summaries are what :func:`general_down` needs on the way back.

    Attributes
    ----------
    m : numpy.ndarray
        (n, K) mean, or (n, C, K): C copies sharing every matrix below.
    P : numpy.ndarray
        (1|n, K, K) covariance (one matrix for every node when ``shared``).
    N : numpy.ndarray or None
        (n, K, K) orthonormal flat basis, columns ``[0, r)`` valid and the rest +0.0; None:
        no node of the level is flat.
    r : numpy.ndarray or None
        (n,) number of flat directions.
    shared : bool
        ``P`` is one (1, K, K) matrix for every node.
    M, S : numpy.ndarray or None
        Internal levels: the sums of the children's means and covariances.
    Nc : numpy.ndarray or None
        (n, K, K) the children's flat directions packed side by side.
    rc : numpy.ndarray or None
        (n,) number of packed columns (0: plain information update).
    off : numpy.ndarray or None
        Per child: offset of its columns in the parent's pack.
    """

    m: np.ndarray
    P: np.ndarray
    N: np.ndarray | None = None
    r: np.ndarray | None = None
    shared: bool = False
    M: np.ndarray | None = None
    S: np.ndarray | None = None
    Nc: np.ndarray | None = None
    rc: np.ndarray | None = None
    off: np.ndarray | None = None

    def message(self) -> UpwardBelief:
        """The relation alone (``m, P, N, r``): what the nodes send to the level above."""
        return UpwardBelief(self.m, self.P, self.N, self.r, self.shared)


def _flat_basis(Pz: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal basis (columns first) of the range of a PSD projector-like matrix."""
    ev, V = eigh(_sym(Pz))
    keep = ev > 1e-8
    order = np.argsort(~keep, axis=-1, kind="stable")
    V = np.take_along_axis(V, order[..., None, :], axis=-1)
    keep = np.take_along_axis(keep, order, axis=-1)
    return np.where(keep[..., None, :], V, 0.0), keep.sum(axis=-1)


def _bordered_gain(
    Mat: np.ndarray, K: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pseudo-solve the node relation of each matrix once (z: its first K coordinates).

    Returns the mean's gain ``A = Π M⁺[:K, :]`` (b, K, Dm) — the mean is ``A rhs``, one
    product per node and copy instead of ``Π (M⁺ rhs)``'s two: the matrix of a shape class
    computed once (issue 36) — the covariance P (b, K, K), the flat basis N (b, K, K) and
    its rank r (b,).
    """
    Minv, Null = _pinv_psd(Mat)
    N, r = _flat_basis(Null[..., :K, :K], K)
    Pi = np.eye(K) - matmul(N, N.swapaxes(-1, -2))
    A = matmul(Pi, Minv[..., :K, :])
    P = _sym(matmul(matmul(Pi, Minv[..., :K, :K]), Pi))
    return A, P, N, r


def _solve_bordered(
    Mat: np.ndarray, rhs: np.ndarray, K: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_bordered_gain` applied: m (n, K), P (b, K, K), N (b, K, K), r (b,)."""
    A, P, N, r = _bordered_gain(Mat, K)
    return _mv(A, rhs), P, N, r


def _zero_rows(Z: np.ndarray) -> np.ndarray:
    """``diag(Z)`` per node, (n, K, K): the rows of the noiseless observations ``z[i] = 0``
    (all-zero rows where a coordinate is free: trivial equations the pseudo-inverse drops)."""
    return Z[:, :, None] * np.eye(Z.shape[1])


def _clear(Z: np.ndarray | None, m: np.ndarray, P: np.ndarray, N: np.ndarray | None = None):
    """Set the held coordinates of means, covariances (and flat bases) to exactly 0: the
    conditioning makes them 0 up to rounding; exact zeros keep ``== 0`` through the passes
    (a zero row of ``P`` gives a zero row of every gain)."""
    if Z is None:
        return m, P, N
    held = Z > 0
    m = np.where(held[:, None, :] if m.ndim == 3 else held, 0.0, m)
    P = np.where(held[:, :, None] | held[:, None, :], 0.0, P)
    if N is not None:
        N = np.where(held[:, :, None], 0.0, N)
    return m, P, N


def _patterns(L: LevelInputs) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (information matrix, zeros) pairs of a level's nodes: the index of one node
    of each, and every node's pattern. Leaves share few (the variances are per level and a
    handful of masks recur), so their bordered systems are solved once per pattern."""
    n = L.Z.shape[0]
    zkey = np.ascontiguousarray(L.Z).view(np.dtype((np.void, L.Z.shape[1] * 8))).reshape(n)
    _, zid = np.unique(zkey, return_inverse=True)
    if L.J.shape[0] == 1:
        key = zid.reshape(-1)
    else:
        J = np.ascontiguousarray(L.J).reshape(n, -1)
        jkey = J.view(np.dtype((np.void, J.shape[1] * 8))).reshape(n)
        _, jid = np.unique(jkey, return_inverse=True)
        key = jid.reshape(-1).astype(np.int64) * (int(zid.max(initial=0)) + 1) + zid.reshape(-1)
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    return first, inv.reshape(-1)


def _leaf_up_zeros(L: LevelInputs, K: int) -> UpwardBelief:
    """Leaves with structural zeros: per (J, zeros) pattern the bordered system
    ``[J Hᵀ D; H 0 0; D 0 0]`` (``D = diag(Z)``) is pseudo-solved once
    (:func:`_bordered_gain`); each leaf's mean is its pattern's gain applied to its
    own ``h`` and ``t``, node by node."""
    nH = L.H.shape[0]
    first, inv = _patterns(L)
    U = first.size
    Dm = 2 * K + nH
    Mat = np.zeros((U, Dm, Dm))
    Mat[:, :K, :K] = L.J if L.J.shape[0] == 1 else L.J[first]
    Mat[:, :K, K : K + nH] = L.H.T
    Mat[:, K : K + nH, :K] = L.H
    D = _zero_rows(L.Z[first])
    Mat[:, :K, K + nH :] = D
    Mat[:, K + nH :, :K] = D
    A, P, N, r = _bordered_gain(Mat, K)
    rhs = np.concatenate([L.h, L.t], axis=-1)
    m = _mv(A[inv, :, : K + nH], rhs)  # the gain on (h, t); the zeros' values are 0
    Pn = P[inv]
    m, Pn, _ = _clear(L.Z, m, Pn)
    if not np.any(r):
        return UpwardBelief(m, Pn, shared=False)
    Nn = np.where((L.Z > 0)[:, :, None], 0.0, N[inv])
    return UpwardBelief(m, Pn, Nn, r[inv].copy(), shared=False)


def _leaf_up(L: LevelInputs, K: int) -> UpwardBelief:
    nH = L.H.shape[0]
    if L.Z is not None:  # per-node zeros: the bordered system [J Hᵀ D; H; D] per node
        return _leaf_up_zeros(L, K)
    b = L.J.shape[0]
    Mat = np.zeros((b, K + nH, K + nH))
    Mat[:, :K, :K] = L.J
    Mat[:, :K, K:] = L.H.T
    Mat[:, K:, :K] = L.H
    rhs = np.concatenate([L.h, L.t], axis=-1)
    m, P, N, r = _solve_bordered(Mat, rhs, K)
    if not np.any(r):
        return UpwardBelief(m, P, shared=L.shared)
    n = L.h.shape[0]
    return UpwardBelief(
        m,
        P,
        np.broadcast_to(N, (n, K, K)).copy(),
        np.broadcast_to(r, (n,)).copy(),
        shared=L.shared,
    )


def _pack_children(
    f: Forest, j: int, child: UpwardBelief, K: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate the children's flat bases into one (K, K) block per parent."""
    n_par = f.sizes[j]
    par = f.parent(j + 1)
    rc = np.bincount(par, weights=child.r, minlength=n_par).astype(np.int64)
    if np.any(rc > K):
        node = int(np.argmax(rc > K))
        raise not_identifiable(
            f.names[j + 1],
            f"the children of {f.names[j]} {f.code(j, node)!r} have more "
            "undetermined directions than there are cells",
        )
    start = np.cumsum(child.r) - child.r
    first = f.child_start(j)[par]
    off = start - start[first]
    ci, c = np.nonzero(np.arange(K)[None, :] < child.r[:, None])
    packed = np.zeros((n_par, K, K))
    packed[par[ci], :, off[ci] + c] = child.N[ci, :, c]
    return packed, rc, off


def _plain_update(
    f: Forest, j: int, L: LevelInputs, S: np.ndarray, M: np.ndarray, idx: slice | np.ndarray, K: int
) -> tuple[np.ndarray, np.ndarray]:
    """Information update with the node's measurements, then its invariants (no flat child)."""
    X = np.eye(K) + matmul(S, L.J)
    P0 = _sym(solve(X, S))
    m0 = _solve_vec(X, M + _node_mv("nij,nj->ni", S, L.h))
    if L.Z is not None:
        m0, P0 = _zero_update(f, j, L, m0, P0, S, idx)
    if not L.H.shape[0]:
        return m0, P0
    HP = np.einsum("ak,nkl->nal", L.H, P0)
    R = _sym(matmul(HP, L.H.T))
    atol = 1e-11 * (1.0 + np.trace(S, axis1=1, axis2=2)) * float((L.H**2).sum())
    Rinv, Rnull = _pinv_psd(R, atol)
    res = L.t - np.einsum(
        "n...k,ak->n...a", m0, L.H
    )  # not m0 @ H.T: a 2-D BLAS product rounds by its blocking
    bad = _node_max(np.abs(_node_mv("nab,nb->na", Rnull, res)))
    if np.any(bad > 1e-7 * (1.0 + _node_max(np.abs(L.t)))):
        node = int(np.arange(f.sizes[j])[idx][int(np.argmax(bad))])
        raise DataError(
            f"the invariants at level {f.names[j]!r} (node {f.code(j, node)!r}) contradict "
            "the invariants below it: parent totals must equal the sums of their children's"
        )
    Kg = matmul(HP.swapaxes(1, 2), Rinv)
    return m0 + _node_mv("nka,na->nk", Kg, res), _sym(P0 - matmul(Kg, HP))


def _zero_update(
    f: Forest,
    j: int,
    L: LevelInputs,
    m0: np.ndarray,
    P0: np.ndarray,
    S: np.ndarray,
    idx: slice | np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Condition the nodes' beliefs ``(m0, P0)`` on their structural zeros ``D z = 0``
    (``D = diag(Z)``): ``m ← m − P D (D P D)⁺ D m``, ``P ← P − P D (D P D)⁺ D P``, the
    noiseless-observation update of :func:`_plain_update`'s invariants with per-node rows.
    Zeros already held below (children held at 0 there) leave ``D P D`` singular along
    them: the pseudo-inverse skips them and their mean must already be 0, else the zeros
    contradict the invariants (DataError)."""
    D = _zero_rows(L.Z)
    PD = matmul(P0, D)
    R = _sym(matmul(D, PD))
    atol = 1e-11 * (1.0 + np.trace(S, axis1=1, axis2=2))
    Rinv, Rnull = _pinv_psd(R, atol)
    res = -(m0 * (L.Z[:, None, :] if m0.ndim == 3 else L.Z))
    bad = _node_max(np.abs(_node_mv("nab,nb->na", Rnull, res)))
    if np.any(bad > 1e-7 * (1.0 + _node_max(np.abs(m0)))):
        node = int(np.arange(f.sizes[j])[idx][int(np.argmax(bad))])
        raise DataError(
            f"the structural zeros at level {f.names[j]!r} (node {f.code(j, node)!r}) "
            "contradict the invariants below it: held cells would need a nonzero sum"
        )
    Kg = matmul(PD, Rinv)
    m = m0 + _node_mv("nka,na->nk", Kg, res)
    P = _sym(P0 - matmul(Kg, PD.swapaxes(1, 2)))
    m, P, _ = _clear(L.Z, m, P)
    return m, P


def _bordered_update(
    L: LevelInputs, S: np.ndarray, M: np.ndarray, Nc: np.ndarray, rc: np.ndarray, K: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Relation of nodes with flat children: variables (z, λ, w, μ); see the module doc.
    Structural zeros (``L.Z``) add ``K`` rows ``diag(Z) z = 0`` after the invariants'."""
    n, nH = S.shape[0], L.H.shape[0]
    nz = 0 if L.Z is None else K  # the zero rows, after the invariants'
    Dm = 3 * K + nH + nz
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
    Mat[:, :K, 3 * K : 3 * K + nH] = L.H.T
    Mat[:, 3 * K : 3 * K + nH, :K] = L.H
    rhs = [L.h, M, np.zeros(M.shape), L.t]
    if L.Z is None:
        return _solve_bordered(Mat, np.concatenate(rhs, axis=-1), K)
    D = _zero_rows(L.Z)
    Mat[:, :K, 3 * K + nH :] = D
    Mat[:, 3 * K + nH :, :K] = D
    rhs.append(np.zeros((*M.shape[:-1], K)))
    m, P, N, r = _solve_bordered(Mat, np.concatenate(rhs, axis=-1), K)
    m, P, N = _clear(L.Z, m, P, N)
    return m, P, N, r


def _internal_up(f: Forest, j: int, L: LevelInputs, ch: UpwardBelief, K: int) -> UpwardBelief:
    """One internal level: the plain update where no child is flat, the relation elsewhere."""
    n = f.sizes[j]
    M = f.sum_children(j, ch.m)
    S = _sym(f.sum_children(j, ch.P, shared=ch.shared))
    u = UpwardBelief(np.empty(M.shape), np.empty((n, K, K)), M=M, S=S, rc=np.zeros(n, np.int64))
    if ch.N is not None:
        u.Nc, u.rc, u.off = _pack_children(f, j, ch, K)
    bord = u.rc > 0
    if not bord.all():
        s = _subset(~bord)
        u.m[s], u.P[s] = _plain_update(f, j, L.rows(s), S[s], M[s], s, K)
    if bord.any():
        b = np.flatnonzero(bord)
        m, P, N, r = _bordered_update(L.rows(b), S[b], M[b], u.Nc[b], u.rc[b], K)
        u.m[b], u.P[b] = m, P
        if np.any(r):
            u.N, u.r = np.zeros((n, K, K)), np.zeros(n, np.int64)
            u.N[b], u.r[b] = N, r
    return u


def general_up(
    f: Forest, lv: Sequence[LevelInputs | None], K: int, bottom: UpwardBelief | None
) -> list[UpwardBelief]:
    """Upward pass over a forest, leaves first: every level's belief from below.

    Parameters
    ----------
    f : Forest
        The levels of the pass (a whole tree, or one partition's sub-forest).
    lv : sequence of LevelInputs
        One per level of ``f``; the last may be None when ``bottom`` is given.
    K : int
        Number of cells of a node.
    bottom : UpwardBelief or None
        The last level's messages from a pass below (:meth:`UpwardBelief.message`, or
        :func:`concat_messages` of several partitions' messages), used instead of that
        level's own inputs.

    Returns
    -------
    list of UpwardBelief
        Top level first; ``[0].message()`` is what the forest sends up, and the whole list
        is what :func:`general_down` smooths.

    Raises
    ------
    SpecError
        The children of a node leave more directions undetermined than there are cells.
    DataError
        A level's invariants contradict those below it.

    Notes
    -----
    Means, information vectors and invariant values may carry copy axes — ``h`` (n, C, K),
    ``t`` (n, C, n_H) — for C problems on one tree that share every matrix (J, H, variances):
    the blocks of a marginal workload repeated over within-group contrasts
    (:mod:`censusdp.estimation.gls.structured`). Matrices (P, S, N, gains) stay per node;
    with no copy axis every operation is the one of a single problem, bit for bit.

    References
    ----------
    Hay et al. (2010), §4 (upward pass); Rauch, Tung & Striebel (1965).
    """
    D = f.depth
    up: list = [None] * D
    up[D - 1] = bottom if bottom is not None else _leaf_up(lv[D - 1], K)
    for j in range(D - 2, -1, -1):
        up[j] = _internal_up(f, j, lv[j], up[j + 1], K)
    return up


def family_inverse_plain(S: np.ndarray) -> np.ndarray:
    """``S⁺`` for the parents whose children have no flat direction: the smoother's family
    inverse (``G_c = P_c S⁺``; the children's errors given the parent have covariance
    ``δ_cc' P_c − P_c S⁺ P_c'``)."""
    A, _ = _pinv_psd(S, 1e-13 * np.trace(S, axis1=1, axis2=2))
    return A


def family_inverse_bordered(
    f: Forest, j: int, u: UpwardBelief, pb: np.ndarray, K: int
) -> np.ndarray:
    """The bordered family inverse ``(2K, 2K)`` of parents ``pb`` (level ``j``) with flat
    children: the pseudo-inverse of ``[[S, N], [Nᵀ, pad]]`` with ``N`` the children's packed
    flat directions. With ``F_c = [P_c, Ñ_c]`` (``Ñ_c``: child c's flat directions in its
    packed columns) the gain is ``F_c Y[:, :K]`` and the children's errors given the parent
    have covariance ``δ_cc' P_c − F_c Y F_c'ᵀ``.

    Raises
    ------
    SpecError
        Two children share a flat direction (the split is not identifiable).
    """
    Nc, rc = u.Nc[pb], u.rc[pb]
    pad = np.arange(K)[None, :] >= rc[:, None]
    gram = matmul(Nc.swapaxes(1, 2), Nc) + pad[:, :, None] * np.eye(K)
    low = eigvalsh(gram)[:, 0]
    if np.any(low < 1e-8):
        node = int(pb[int(np.argmin(low))])
        raise not_identifiable(
            f.names[j + 1],
            f"two children of {f.names[j]} {f.code(j, node)!r} share "
            "a combination of cells that is measured neither at their level nor below",
        )
    Y = np.zeros((pb.size, 2 * K, 2 * K))
    Y[:, :K, :K] = u.S[pb]
    Y[:, :K, K:] = Nc
    Y[:, K:, :K] = Nc.swapaxes(1, 2)
    Y[:, K:, K:] = pad[:, :, None] * np.eye(K)
    Yinv, _ = _pinv_psd(Y)
    return Yinv


def root_start(
    ups: Sequence[UpwardBelief],
    K: int,
    level: str,
    what: str = "some combination of cells is measured nowhere",
) -> tuple[np.ndarray, np.ndarray]:
    """The smoothed root: its upward mean and covariance ``(1|n, K, K)`` copied to
    ``(1, K, K)``, where :func:`general_down` starts from the root.

    Parameters
    ----------
    ups : sequence of UpwardBelief
        :func:`general_up` of a forest that starts at the root (level ``level``).
    K : int
        Number of cells of a node.
    level, what : str
        The root level's name, and why it would not be identifiable (for the message).

    Raises
    ------
    SpecError
        The root has a flat direction: some combination of cells is determined by no
        measurement and no invariant.
    """
    root = ups[0]
    if root.N is not None and np.any(root.r):
        raise not_identifiable(level, what)
    return root.m, np.broadcast_to(root.P, (1, K, K)).copy()


def general_down(
    f: Forest, up: list[UpwardBelief], K: int, z0: np.ndarray, P0: np.ndarray
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """RTS smoothing of a forest from the smoothed estimate of its top level.

    Parameters
    ----------
    f : Forest
        The forest of the upward pass.
    up : list of UpwardBelief
        :func:`general_up` over ``f``.
    K : int
        Number of cells of a node.
    z0, P0 : numpy.ndarray
        Smoothed estimate (n, K) or (n, C, K) and covariance (1|n, K, K) of the top level:
        at the root, its upward ``m`` and ``P`` (after checking that ``r`` is 0).

    Returns
    -------
    zhat, Phat : lists of numpy.ndarray
        Smoothed estimates and covariances of every level, the top level (as given) first;
        per node plain or bordered (flat children) formulas (module docstring).

    Raises
    ------
    SpecError
        Two children of a node share a flat direction (the split is not identifiable).

    References
    ----------
    Rauch, Tung & Striebel (1965).
    """
    zhat, Phat = [z0], [P0]
    for j in range(f.depth - 1):
        u, ch = up[j], up[j + 1]
        par = f.parent(j + 1)
        n_c = f.sizes[j + 1]
        d = zhat[j] - u.M
        Pc = np.broadcast_to(ch.P, (n_c, K, K))
        G = np.empty((n_c, K, K))
        Dc = np.empty((n_c, K, K))
        bord = u.rc > 0
        cb = bord[par]
        if not cb.all():  # children of parents without flat children
            ps, cs = _subset(~bord), _subset(~cb)
            A = family_inverse_plain(u.S[ps])
            pos = np.cumsum(~bord) - 1
            Pcs = Pc[cs]
            Gs = matmul(Pcs, A[pos[par[cs]]])
            G[cs], Dc[cs] = Gs, Pcs - matmul(Gs, Pcs)
        if cb.any():
            pb, cbi = np.flatnonzero(bord), np.flatnonzero(cb)
            Yinv = family_inverse_bordered(f, j, u, pb, K)
            A, B, Cw = Yinv[:, :K, :K], Yinv[:, K:, :K], Yinv[:, K:, K:]
            pp = (np.cumsum(bord) - 1)[par[cbi]]
            Ap = A[pp]
            # child c's block of the packed w: rows off_c .. off_c + r_c of B, Cw.
            Nch, rch = ch.N[cbi], ch.r[cbi]
            sel = np.arange(K)[None, :] < rch[:, None]
            idx = np.where(sel, u.off[cbi][:, None] + np.arange(K)[None, :], 0)
            Bc = B[pp[:, None], idx] * sel[:, :, None]
            Cc = Cw[pp[:, None, None], idx[:, :, None], idx[:, None, :]]
            Cc = Cc * (sel[:, :, None] & sel[:, None, :])
            Pcb = Pc[cbi]
            Gb = matmul(Pcb, Ap) + matmul(Nch, Bc)
            F = np.concatenate([Pcb, Nch], axis=2)
            Yc = np.concatenate(
                [
                    np.concatenate([Ap, Bc.swapaxes(1, 2)], axis=2),
                    np.concatenate([Bc, Cc], axis=2),
                ],
                axis=1,
            )
            G[cbi], Dc[cbi] = Gb, Pcb - matmul(matmul(F, Yc), F.swapaxes(1, 2))
        zhat.append(ch.m + _node_mv("nij,nj->ni", G, d[par]))
        Pk = Phat[j] if Phat[j].shape[0] > 1 else np.broadcast_to(Phat[j], (f.sizes[j], K, K))
        Phat.append(_sym(Dc + matmul(matmul(G, Pk[par]), G.swapaxes(1, 2))))
    return zhat, Phat


def concat_messages(parts: Sequence[UpwardBelief], K: int) -> UpwardBelief:
    """The cut level's messages of several partitions, in partition (node) order.

    The messages of consecutive node ranges concatenate into the message of their union
    (every array is per node; a shared covariance stays shared), so the concatenation is
    associative and the levels above see the same message as from one upward pass over the
    union (:func:`general_up` with it as ``bottom``).
    """
    sizes = [p.m.shape[0] for p in parts]
    m = np.concatenate([p.m for p in parts])
    # a partition's covariance is "shared" also when it has one node with a matrix of its
    # own (per-node variances): the union shares it only if every partition holds the same
    shared = all(p.shared and np.array_equal(p.P, parts[0].P) for p in parts)
    if shared:  # the same (1, K, K) matrix in every partition
        P = parts[0].P
    else:
        P = np.concatenate(
            [np.broadcast_to(p.P, (s, K, K)) for p, s in zip(parts, sizes, strict=True)]
        )
    N = r = None
    if any(p.N is not None for p in parts):
        N = np.concatenate(
            [np.zeros((s, K, K)) if p.N is None else p.N for p, s in zip(parts, sizes, strict=True)]
        )
        r = np.concatenate(
            [
                np.zeros(s, np.int64) if p.r is None else p.r
                for p, s in zip(parts, sizes, strict=True)
            ]
        )
    return UpwardBelief(m, P, N, r, shared)
