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

**Copies.** The general path's matrices do not depend on the data, so problems that share
them — the blocks of a marginal workload repeated over within-group contrasts, DESIGN §10 —
run in one pass with a copy axis on every mean and information vector (``(n, C, K)``) and
one set of per-node matrices (:mod:`censusdp.estimation.structured_gls`).

**Diagonal fast path.** When every query and invariant row selects a single cell (identity
queries, one cell), the cells decouple and the passes are elementwise (Hay et al. 2010).

**Total/deviation kernel of the general path.** When every query's Gram matrix is
``αI + β11ᵀ`` (the total and detailed queries, alone or stacked) and every level's invariants
fix the node total or the whole node, every node matrix of both passes (J, P, S, gains) is
``x_E E + x_F F`` with ``E = 11ᵀ/K`` and ``F = I − E``. The passes then carry two eigenvalues
per node instead of a K × K matrix and a vector as its cell mean and deviations; every product
is elementwise (the diagonal path's formulas with E and F as two "cells", a flat direction
being a whole channel), O(nodes · K) in all. Estimates, exact per-cell variances
``(x_E + (K − 1) x_F) / K`` and covariances ``x_F I + (x_E − x_F) 11ᵀ/K`` are those of the
dense kernel (to rounding); ``diagnostics["kernel"]`` says which kernel ran.

Geometry: ``"weighted"`` uses the measurement variances (Σ⁻¹-weighted projection; for Gaussian
noise this equals conditioning on consistency and the invariants — Gao, Gong & Yu 2022,
Thm. 22 generalised); ``"euclidean"`` uses unit weights (the projection Π_N of the seed, the
same estimate when all scales are equal). See :mod:`censusdp.estimation.gls_sparse` for the
privacy statement of each; the general sparse solver there is the reference these passes are
tested against.

**Partitions.** Both passes are per node given the level above or below, so they split on a
*sub-forest* (the subtrees below a run of cut-level nodes): :func:`gls_upward` runs the
upward pass over levels cut .. leaf of one partition and yields each cut-level node's message
(its relation ``m, P, N``); :func:`gls_top` runs levels 0 .. cut with those messages as leaves
(they play the role of the children of the level above) and smooths down to the cut;
:func:`gls_downward` smooths one partition below the cut. :func:`tree_gls` is the one-partition
case (cut at the root), so there is one implementation of the math. Every batched operation
is per node — elementwise ufuncs, ``np.add.reduceat`` over a node's children, and stacked
``matmul``/``solve``/``eigh``, which call BLAS/LAPACK once per node matrix — and every branch
(plain information update or bordered relation) is chosen per node, so a node's numbers do
not depend on which other nodes share its batch: the partitioned result equals the
single-process one bit for bit.

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

from censusdp.budget import PrivacyStatement, invariant_labels, with_invariants
from censusdp.errors import DataError, SpecError
from censusdp.estimation.release import Release
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.core import exact_int64
from censusdp.mechanisms.privacy import checked_statement
from censusdp.mechanisms.queries import (
    Invariant,
    Measurement,
    check_float_exact,
    exact_matrix,
    guard_exact_release,
)

__all__ = [
    "tree_gls",
    "NodeVarianceMeasurement",
    "Forest",
    "GLSPlan",
    "UpwardState",
    "gls_plan",
    "check_invariants",
    "gls_upward",
    "gls_top",
    "gls_downward",
    "gls_finish",
    "gls_release",
    "gls_diagnostics",
    "forest_residuals",
    "merge_residuals",
    "restrict",
    "whole_forest",
]

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


# ----------------------------------------------------------------------------- sub-forests
class Forest:
    """Levels ``first, first + 1, ...`` of a contiguous run of subtrees, with local indices.

    Nodes are sorted by parent at every level, so the child counts of the levels above the
    last one determine everything else (``child_start`` is their running sum, ``parent`` their
    repeat); that is all a partition has to receive. ``codes`` (levels above the last) name
    nodes in error messages.

    Parameters
    ----------
    first : int
        Hierarchy index of the top level of the forest.
    names : sequence of str
        Names of the forest's levels.
    sizes : sequence of int
        Number of nodes of each level in the forest.
    child_count : sequence of int arrays
        For every level but the last, the number of children of each node.
    codes : sequence of arrays
        For every level but the last, the codes of its nodes.
    """

    __slots__ = ("first", "names", "sizes", "child_count", "codes", "_cache")

    def __init__(
        self,
        first: int,
        names: Sequence[str],
        sizes: Sequence[int],
        child_count: Sequence[np.ndarray],
        codes: Sequence[np.ndarray],
    ) -> None:
        self.first = int(first)
        self.names = tuple(names)
        self.sizes = tuple(int(s) for s in sizes)
        self.child_count = tuple(np.asarray(c, dtype=np.int64) for c in child_count)
        self.codes = tuple(codes)
        self._cache: dict = {}

    def __getstate__(self) -> tuple:
        return (self.first, self.names, self.sizes, self.child_count, self.codes)

    def __setstate__(self, state: tuple) -> None:
        self.first, self.names, self.sizes, self.child_count, self.codes = state
        self._cache = {}

    @classmethod
    def of(cls, hierarchy: Hierarchy, first: int, ranges: Sequence[tuple[int, int]]) -> Forest:
        """The forest of node ranges ``ranges[j]`` at levels ``first + j`` (nested ranges)."""
        lv = hierarchy.levels
        return cls(
            first,
            hierarchy.names[first : first + len(ranges)],
            [hi - lo for lo, hi in ranges],
            [lv[first + j].child_count[lo:hi] for j, (lo, hi) in enumerate(ranges[:-1])],
            [lv[first + j].codes[lo:hi] for j, (lo, hi) in enumerate(ranges[:-1])],
        )

    def without_codes(self) -> Forest:
        """The same forest without node codes (smaller to send; messages then use indices)."""
        return Forest(self.first, self.names, self.sizes, self.child_count, ())

    @property
    def depth(self) -> int:
        return len(self.sizes)

    def child_start(self, j: int) -> np.ndarray:
        """Local index of the first child of every node of forest level ``j``."""
        key = ("start", j)
        if key not in self._cache:
            c = self.child_count[j]
            self._cache[key] = np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64)
        return self._cache[key]

    def parent(self, j: int) -> np.ndarray:
        """Local parent index of every node of forest level ``j`` ≥ 1."""
        key = ("parent", j)
        if key not in self._cache:
            self._cache[key] = np.repeat(
                np.arange(self.sizes[j - 1], dtype=np.int64), self.child_count[j - 1]
            )
        return self._cache[key]

    def sum_children(self, j: int, values: np.ndarray, shared: bool = False) -> np.ndarray:
        """Σ over the children of every node of level ``j``; ``shared``: one row for all.

        The same ``np.add.reduceat`` over each node's contiguous children as
        :meth:`Hierarchy.aggregate_up`, so a node's sum depends on its children only.
        """
        count = self.child_count[j]
        if shared:
            return count.reshape((-1,) + (1,) * (values.ndim - 1)) * values
        out = np.zeros((self.sizes[j],) + values.shape[1:], dtype=values.dtype)
        nz = count > 0
        if values.shape[0]:
            out[nz] = np.add.reduceat(values, self.child_start(j)[nz], axis=0)
        return out

    def aggregate(self, leaf_values: np.ndarray) -> list[np.ndarray]:
        """Sum the last level's values to every level of the forest, first level first
        (per node the sums of :meth:`Hierarchy.aggregate`)."""
        out = [np.asarray(leaf_values)]
        for j in range(self.depth - 2, -1, -1):
            out.append(self.sum_children(j, out[-1]))
        return out[::-1]

    def code(self, j: int, node: int) -> str:
        return str(self.codes[j][node]) if self.codes else f"#{node}"


def whole_forest(hierarchy: Hierarchy, first: int = 0, last: int | None = None) -> Forest:
    """Every node of levels ``first .. last`` (default: to the leaves) as one forest."""
    last = hierarchy.depth - 1 if last is None else last
    return Forest.of(
        hierarchy, first, [(0, hierarchy.levels[k].size) for k in range(first, last + 1)]
    )


# ----------------------------------------------------------------------------- helpers
def _mv(A: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Batched matrix–vector product ``A[n] @ x[n]`` (``A`` may be one shared matrix).

    ``x`` is (n, K), or (n, C, K) with C copies that each meet the node's one matrix (see
    :func:`_general_up`).
    """
    if x.ndim > 2:
        if A.shape[-1] == 1 and x.shape[-1] == 1:  # 1 × 1 blocks: the one product, no BLAS call
            return x * A
        return x @ A.swapaxes(-1, -2)
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
    return x @ A.swapaxes(-1, -2)


def _solve_vec(X: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``X[n]⁻¹ b[n]`` for (n, K) ``b`` or (n, C, K) copies (one factorisation per node)."""
    if b.ndim == 2:
        return np.linalg.solve(X, b[..., None])[..., 0]
    return np.linalg.solve(X, b.swapaxes(-1, -2)).swapaxes(-1, -2)


def _node_max(x: np.ndarray) -> np.ndarray:
    """Largest entry of every node's vector (over its copies too)."""
    return x.reshape(x.shape[0], -1).max(axis=1)


def _rowmul(X: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """``X @ Q`` for (n, q) X and a small (q, K) Q, row by row in a fixed order.

    A 2-D ``X @ Q`` is one BLAS ``gemm`` over all rows, which rounds a row differently
    depending on where it falls in the blocking of the whole matrix (measured: slices of
    ``X @ Q`` differ from ``X[lo:hi] @ Q`` for q ≥ 3); this product does not. Stacked
    ``matmul``, ``einsum``, ``solve`` and ``eigh`` are per node and need no change.
    """
    out = np.zeros((X.shape[0], Q.shape[1]))
    for r in range(Q.shape[0]):
        out = out + X[:, r : r + 1] * Q[r]
    return out


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


def _subset(mask: np.ndarray) -> slice | np.ndarray:
    """Index of the True entries (a plain slice when all are: no copies)."""
    return slice(None) if mask.all() else np.flatnonzero(mask)


@dataclass
class _Level:
    """Per-level inputs, in scaled units (variances divided by τ²)."""

    J: np.ndarray  # (1|n, K, K) information matrix of the node's own measurements
    h: np.ndarray  # (n, K) information vector; general path: or (n, C, K), C copies
    H: np.ndarray  # (n_H, K) invariant rows
    t: np.ndarray  # (n, n_H) invariant values; general path: or (n, C, n_H)
    shared: bool = True  # J is one matrix for every node (no per-node variances)
    diag_J: np.ndarray | None = None  # (1|n, K) diagonal path
    diag_h: np.ndarray | None = None

    def rows(self, idx: slice | np.ndarray) -> _Level:
        return _Level(
            self.J if self.J.shape[0] == 1 else self.J[idx], self.h[idx], self.H, self.t[idx]
        )


@dataclass(frozen=True)
class GLSPlan:
    """What every partition must agree on: cells, scaling, path and geometry.

    Attributes
    ----------
    cells : tuple of str
    names : tuple of str
        The hierarchy's level names.
    geometry : {"weighted", "euclidean"}
    tau2, tau : float
        Scale of the computation (median noise variance, weighted geometry).
    diagonal : bool
        Every query and invariant row selects one cell: the elementwise path.
    vscale : float or None
        Factor from scaled to data-unit variances (None: not defined, Euclidean geometry
        with unequal noise scales).
    two_channel : bool
        Not diagonal, and every query's Gram matrix is ``αI + β11ᵀ`` and every level's
        invariants fix the node total or the whole node: the total/deviation kernel of the
        general path (two eigenvalues per node instead of a K × K matrix).
    """

    cells: tuple[str, ...]
    names: tuple[str, ...]
    geometry: str
    tau2: float
    tau: float
    diagonal: bool
    vscale: float | None
    two_channel: bool = False

    @property
    def K(self) -> int:
        return len(self.cells)


def gls_plan(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
    geometry: Geometry = "weighted",
    *,
    privacy: PrivacyStatement | None = None,
) -> tuple[GLSPlan, list[Measurement], list[Invariant]]:
    """Validate the inputs and fix the global choices of a GLS run.

    Returns the plan and the measurements and invariants with integer levels. The
    invariants are checked against each other exactly (:func:`check_invariants`) before
    anything is estimated; with ``privacy``, invariants that determine every measured value
    of a level are refused unless the statement acknowledges it
    (:func:`~censusdp.mechanisms.queries.guard_exact_release`).

    Raises
    ------
    SpecError
        Unknown geometry, shapes that do not match the hierarchy, or an unacknowledged
        exact release.
    DataError
        Non-finite values, invariants beyond 2⁵³ or contradicting each other.
    """
    if geometry not in ("weighted", "euclidean"):
        raise SpecError(f"geometry must be 'weighted' or 'euclidean', got {geometry!r}")
    cells = tuple(cells)
    meas = [dataclasses.replace(m, level=hierarchy.level_index(m.level)) for m in measurements]
    invs = [dataclasses.replace(i, level=hierarchy.level_index(i.level)) for i in invariants]
    _validate(hierarchy, cells, meas, invs)
    check_invariants(hierarchy, invs)
    if privacy is not None:
        guard_exact_release(
            hierarchy.names,
            [(m.level, m.query) for m in meas],
            [(i.level, i.query) for i in invs],
            privacy,
        )
    var_all = []
    for m in meas:
        nv = getattr(m, "node_variance", None)
        var_all.append(np.asarray(m.variance if nv is None else nv, dtype=float).reshape(-1))
    var_all = np.concatenate(var_all) if var_all else np.ones(1)
    equal_scales = bool(np.all(var_all == var_all[0]))
    tau2 = float(np.median(var_all)) if geometry == "weighted" else 1.0
    # Euclidean variances are exact only with equal noise scales
    vscale = tau2 if geometry == "weighted" else (float(var_all[0]) if equal_scales else None)
    diagonal = all(_unit_rows(x.query.matrix) for x in [*meas, *invs])
    two_channel = (
        not diagonal
        and len(cells) >= 2
        and all(_tc_gram(m.query.matrix) is not None for m in meas)
        and all(_tc_invariant_kind(i.query.matrix) is not None for i in invs)
    )
    plan = GLSPlan(
        cells=cells,
        names=hierarchy.names,
        geometry=geometry,
        tau2=tau2,
        tau=float(np.sqrt(tau2)),
        diagonal=diagonal,
        vscale=vscale,
        two_channel=two_channel,
    )
    return plan, meas, invs


def restrict(
    items: Sequence[Measurement | Invariant], first: int, ranges: Sequence[tuple[int, int]]
) -> list:
    """The measurements (or invariants) of levels ``first ..`` cut to node ranges ``ranges``.

    Items of other levels are dropped; a :class:`NodeVarianceMeasurement` keeps the node
    variances of its range.
    """
    out = []
    for it in items:
        j = it.level - first
        if not 0 <= j < len(ranges):
            continue
        lo, hi = ranges[j]
        changes: dict = {"values": it.values[lo:hi]}
        nv = getattr(it, "node_variance", None)
        if nv is not None:
            changes["node_variance"] = np.asarray(nv).reshape(-1)[lo:hi]
        out.append(dataclasses.replace(it, **changes))
    return out


def _weights(forest: Forest, j: int, plan: GLSPlan, m: Measurement) -> np.ndarray:
    """Scaled information weight τ²/σ² of a measurement: (1,), or (n,) for node variances."""
    nv = getattr(m, "node_variance", None)
    if plan.geometry == "euclidean":
        return np.ones(1)
    if nv is None:
        return np.full(1, plan.tau2 / m.variance)
    n = forest.sizes[j]
    w = plan.tau2 / np.asarray(nv, dtype=float).reshape(-1)
    if w.shape != (n,) or not np.all(np.isfinite(w) & (w > 0)):
        raise SpecError(
            f"level {forest.names[j]!r}, query {m.query.name!r}: node_variance "
            f"must be ({n},) positive finite values"
        )
    return w


def _collect(
    forest: Forest,
    plan: GLSPlan,
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
) -> list[_Level]:
    K, tau = plan.K, plan.tau
    levels = []
    for j in range(forest.depth):
        k, n = forest.first + j, forest.sizes[j]
        J = np.zeros((1, K, K))
        h = np.zeros((n, K))
        shared = True
        for m in measurements:
            if m.level != k:
                continue
            Q = np.asarray(m.query.matrix, dtype=float)
            w = _weights(forest, j, plan, m)
            shared = shared and w.shape[0] == 1
            J = J + w[:, None, None] * (Q.T @ Q)[None]
            h += _rowmul(np.asarray(m.values, dtype=float) / tau, Q) * w[:, None]
        rows = [np.asarray(i.query.matrix, float) for i in invariants if i.level == k]
        vals = [np.asarray(i.values, float) / tau for i in invariants if i.level == k]
        H = np.vstack(rows) if rows else np.zeros((0, K))
        t = np.hstack(vals) if vals else np.zeros((n, 0))
        item = _Level(J, h, H, t, shared)
        if plan.diagonal:
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


def _integral(values: np.ndarray) -> np.ndarray | None:
    """Invariant values as int64 when they are integers (exact), else None."""
    v = np.asarray(values)
    if v.dtype.kind in "iu":
        return v.astype(np.int64, copy=False)
    if bool(np.all(v == np.round(v))):  # finite and at most 2^53: checked before
        return v.astype(np.int64)
    return None


def check_invariants(hierarchy: Hierarchy, invariants: Sequence[Invariant]) -> None:
    """Refuse invariants that cannot all hold on one consistent table, exactly.

    Every invariant fixes a linear function of each node's cell vector; an invariant at a
    level also fixes its query at every level above, summed over the children. Going up
    from the deepest invariant level, the rows fixed at a level are the level's own
    invariant rows and the rows carried up from below (their values summed over children);
    for every exact linear dependency c among these rows (``cᵀ A = 0``, a basis of the left
    null space in rational arithmetic) the values must satisfy ``cᵀ t_v = 0`` at every
    node v. Only independent rows are carried further up. Integer values are compared
    exactly (int64 sums refuse overflow); real values within 1e-9 relative.

    For a tree with the same invariants at every node of a level this is exactly the
    solvability of the invariant system: the sum of the children's affine solution sets
    ``{z : A z = t_c}`` is ``{z : A z = Σ t_c}``.

    Raises
    ------
    DataError
        Values beyond 2⁵³, or contradicting invariants, naming the level, the node and the
        invariants (never a value).
    """
    import flint

    names = hierarchy.names
    for i in invariants:
        check_float_exact(i.values, f"invariant {i.query.name!r} at level {names[i.level]!r}")
    if not invariants:
        return
    deepest = max(i.level for i in invariants)
    rows: np.ndarray | None = None
    values: np.ndarray | None = None
    labels: list[str] = []
    for k in range(deepest, -1, -1):
        if rows is not None and k < deepest:
            values = hierarchy.aggregate_up(k + 1, values)
            labels = [lab if lab.endswith("summed)") else f"{lab} (summed)" for lab in labels]
        own = [i for i in invariants if i.level == k]
        if own:
            new_rows = np.vstack([np.asarray(i.query.matrix) for i in own])
            new_vals = [np.asarray(i.values) for i in own]
            ints = [_integral(v) for v in new_vals]
            if all(v is not None for v in ints) and (values is None or values.dtype.kind == "i"):
                new_vals = ints
            else:
                new_vals = [np.asarray(v, dtype=float) for v in new_vals]
                values = None if values is None else values.astype(float)
            stacked = np.hstack(new_vals)
            rows = new_rows if rows is None else np.vstack([rows, new_rows])
            values = stacked if values is None else np.hstack([values, stacked])
            labels += [f"{names[k]}: {i.query.name}" for i in own for _ in i.query.labels]
        if rows is None:
            continue
        gram = exact_matrix(rows).transpose()
        null, nullity = gram.nullspace()
        if nullity:
            basis = (
                np.array(
                    [[int(null[r, c]) for c in range(nullity)] for r in range(rows.shape[0])],
                    dtype=np.int64,
                )
                if isinstance(null, flint.fmpz_mat)
                else None
            )
            bad = _violations(values, basis, null, nullity, rows.shape[0])
            if bad is not None:
                node, vec = bad
                involved = dict.fromkeys(
                    labels[r] for r in range(rows.shape[0]) if null[r, vec] != 0
                )
                raise DataError(
                    f"the invariants contradict each other at node "
                    f"{str(hierarchy.levels[k].codes[node])!r} of level {names[k]!r}: "
                    f"{', '.join(involved)} cannot all hold with parent = sum of children; "
                    "correct the invariant values (they must come from one table)"
                )
        rref, *_, rank = gram.rref()
        pivots = []
        for r in range(int(rank)):
            pivots.append(next(c for c in range(rows.shape[0]) if rref[r, c] != 0))
        rows, values = rows[pivots], values[:, pivots]
        labels = [labels[c] for c in pivots]


def _violations(
    values: np.ndarray, basis: np.ndarray | None, null, nullity: int, n_rows: int
) -> tuple[int, int] | None:
    """First (node, null vector) with cᵀ t_v ≠ 0, or None."""
    if basis is not None and values.dtype.kind in "iu":
        weight = int(np.abs(basis).sum(axis=0).max())
        out, overflow = exact_int64(lambda a: a @ basis.astype(a.dtype), values, weight)
        if overflow is not None:
            out = values.astype(object) @ basis.astype(object)
        wrong = out != 0
    else:
        dense = np.array(
            [[float(null[r, c]) for c in range(nullity)] for r in range(n_rows)], dtype=float
        )
        v = values.astype(float)
        scale = np.abs(v) @ np.abs(dense)
        wrong = np.abs(v @ dense) > 1e-9 * (1.0 + scale)
    wrong = np.asarray(wrong, dtype=bool)
    if not wrong.any():
        return None
    node, vec = np.argwhere(wrong)[0]
    return int(node), int(vec)


def _not_identifiable(level: str, what: str) -> SpecError:
    return SpecError(
        f"the GLS estimate is not identifiable at level {level!r}: {what}. Add a measurement "
        "(e.g. the detailed query) or an invariant that determines these cells"
    )


# ----------------------------------------------------------------------------- diagonal path
@dataclass
class _DUp:
    """Upward belief of the nodes of one level, cells independent (all (n, K))."""

    m: np.ndarray
    P: np.ndarray
    flat: np.ndarray  # bool: the cell is undetermined from below
    M: np.ndarray | None = None  # children sums (internal levels)
    S: np.ndarray | None = None
    nf: np.ndarray | None = None  # number of flat children

    def message(self) -> _DUp:
        return _DUp(self.m, self.P, self.flat)


def _diagonal_up(f: Forest, lv: list[_Level], bottom: _DUp | None) -> list[_DUp]:
    """Elementwise upward pass; ``bottom`` replaces the last level's own computation."""
    D = f.depth
    up: list = [None] * D
    for j in range(D - 1, -1, -1):
        if j == D - 1 and bottom is not None:
            up[j] = bottom
            continue
        n, K = f.sizes[j], lv[j].h.shape[1]
        Jd = np.broadcast_to(lv[j].diag_J, (n, K))
        hd = lv[j].diag_h
        pos = Jd > 0
        M = S = nf = None
        if j == D - 1:
            Pk = np.where(pos, 1.0 / np.where(pos, Jd, 1.0), 0.0)
            mk = Pk * hd
            fk = ~pos
        else:
            ch = up[j + 1]
            nf = f.sum_children(j, ch.flat.astype(np.int64))
            M = f.sum_children(j, ch.m)
            S = f.sum_children(j, ch.P)
            cf = nf > 0
            den = 1.0 + S * Jd
            Pk = np.where(cf, np.where(pos, 1.0 / np.where(pos, Jd, 1.0), 0.0), S / den)
            mk = np.where(cf, Pk * hd, (M + S * hd) / den)
            fk = cf & ~pos
        if lv[j].H.shape[0]:
            cell = np.argmax(lv[j].H, axis=1)
            mk, Pk, fk = mk.copy(), Pk.copy(), fk.copy()
            mk[:, cell] = lv[j].t
            Pk[:, cell] = 0.0
            fk[:, cell] = False
        up[j] = _DUp(mk, Pk, fk, M, S, nf)
    return up


def _refuse_free_siblings(f: Forest, j: int, nf: np.ndarray, what: str) -> None:
    """Raise when two children of one level-``j`` node leave the same direction unmeasured
    (``nf > 1``): the split between them is not identified."""
    if np.any(nf > 1):
        node = int(np.argwhere(nf > 1)[0, 0])
        raise _not_identifiable(
            f.names[j + 1],
            f"two or more children of {f.names[j]} {f.code(j, node)!r} {what} that is "
            "measured neither at their level nor below",
        )


def _diagonal_down(
    f: Forest, up: list[_DUp], z0: np.ndarray, P0: np.ndarray
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Elementwise downward pass from the smoothed top level ``z0, P0``."""
    zhat, Phat = [z0], [P0]
    for j in range(f.depth - 1):
        u, ch = up[j], up[j + 1]
        par = f.parent(j + 1)
        nf = u.nf
        _refuse_free_siblings(f, j, nf, "have a cell")
        S = u.S
        d = zhat[j] - u.M
        A = np.where(S > 0, 1.0 / np.where(S > 0, S, 1.0), 0.0)
        cf = (nf > 0)[par]
        Pc = ch.P
        G = np.where(cf, ch.flat.astype(float), Pc * A[par])
        Dc = np.where(cf, np.where(ch.flat, S[par], Pc), Pc - G * Pc)
        zhat.append(ch.m + G * d[par])
        Phat.append(Dc + G * G * Phat[j][par])
    return zhat, Phat


# ----------------------------------------------------------------------------- two-channel path
# When every query's Gram matrix is αI + β11ᵀ (total, detailed, their stacks) and every level's
# invariants fix the node total or the whole node, every node matrix of the two passes
# (information J, covariances P and S, gains G) lies in the commutative algebra span{E, F},
# E = 11ᵀ/K (the total direction), F = I − E (deviations from the node mean). A matrix
# x_E E + x_F F is carried as its two eigenvalues, an (n, 2) array; a vector z in "V-form",
# (n, K + 1): column 0 its cell mean z̄ (mean(X z) = x_E z̄), columns 1.. its deviations
# F z = z − z̄ (F X z = x_F F z). Every product of the passes is then elementwise — the
# diagonal path's formulas with E and F as the two "cells" — and a flat direction is a whole
# channel. The per-cell variance of x_E E + x_F F is (x_E + (K − 1) x_F) / K.


def _tc_gram(matrix: np.ndarray) -> tuple[float, float] | None:
    """Eigenvalues (on E, on F) of QᵀQ when it is αI + β11ᵀ, K ≥ 2; None otherwise."""
    Q = np.asarray(matrix, dtype=float)
    K = Q.shape[1]
    if K < 2:
        return None
    G = Q.T @ Q
    beta = float(G[0, 1])
    alpha = float(G[0, 0]) - beta
    if not np.array_equal(G, alpha * np.eye(K) + beta):
        return None
    return alpha + K * beta, alpha


def _total_rows(matrix: np.ndarray) -> bool:
    """Every row is a nonzero multiple of 1ᵀ (node totals)."""
    H = np.asarray(matrix, dtype=float)
    return H.shape[0] > 0 and bool(np.all(H == H[:, :1]) and np.all(H[:, 0] != 0))


def _tc_invariant_kind(matrix: np.ndarray) -> str | None:
    """``"total"`` (rows ∝ 1ᵀ), ``"full"`` (rank K: fixes the node) or None."""
    H = np.asarray(matrix, dtype=float)
    if _total_rows(H):
        return "total"
    if H.shape[0] and np.linalg.matrix_rank(H) == H.shape[1]:
        return "full"
    return None


def _vform(x: np.ndarray) -> np.ndarray:
    """(n, K) cell vectors → (n, K + 1) V-form: mean, then deviations from it."""
    n, K = x.shape
    out = np.empty((n, K + 1))
    np.divide(np.add.reduce(x, axis=1), K, out=out[:, 0])
    np.subtract(x, out[:, :1], out=out[:, 1:])
    return out


def _cm(c: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Channel eigenvalues ``c`` (1|n, 2) applied to V-form vectors ``v`` (n, K + 1)."""
    out = np.empty(v.shape)
    np.multiply(v[:, :1], c[:, :1], out=out[:, :1])
    np.multiply(v[:, 1:], c[:, 1:], out=out[:, 1:])
    return out


@dataclass
class _TCLevel:
    """Per-level inputs of the two-channel path, in scaled units."""

    J: np.ndarray  # (1|n, 2) information eigenvalues (E, F)
    h: np.ndarray  # (n, K + 1) information vector, V-form
    fix: np.ndarray  # (2,) bool: channels fixed by the level's invariants
    tv: np.ndarray | None = None  # (n, K + 1) V-form of the fixed values (fixed channels)
    tmax: np.ndarray | None = None  # (n,) largest |invariant value|


def _collect_tc(
    forest: Forest,
    plan: GLSPlan,
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
) -> list[_TCLevel]:
    K, tau = plan.K, plan.tau
    levels = []
    for j in range(forest.depth):
        k, n = forest.first + j, forest.sizes[j]
        J = np.zeros((1, 2))
        h = np.zeros((n, K + 1))
        for m in measurements:
            if m.level != k:
                continue
            w = _weights(forest, j, plan, m)
            J = J + w[:, None] * np.asarray(_tc_gram(m.query.matrix))
            Q = np.asarray(m.query.matrix, dtype=float)
            y = np.asarray(m.values, dtype=float) / tau
            if m.query.is_identity:
                h += _vform(y) * w[:, None]
            elif _total_rows(Q):  # Qᵀy = (Σ_r q_r y_r) 1: mean only
                h[:, 0] += _rowmul(y, Q[:, :1])[:, 0] * w
            else:
                h += _vform(_rowmul(y, Q)) * w[:, None]
        item = _TCLevel(J, h, np.zeros(2, dtype=bool))
        items = [i for i in invariants if i.level == k]
        if items:
            H = np.vstack([np.asarray(i.query.matrix, dtype=float) for i in items])
            t = np.hstack([np.asarray(i.values, dtype=float) / tau for i in items])
            item.tmax = np.abs(t).max(axis=1, initial=0.0)
            if _total_rows(H):
                item.fix[0] = True
                mu = t / (H[:, 0] * K)
                item.tv = np.zeros((n, K + 1))
                item.tv[:, 0] = mu[:, 0]
                bad = K * np.abs(mu - mu[:, :1]).max(axis=1, initial=0.0)
            else:
                item.fix[:] = True
                if H.shape[0] == K and np.array_equal(H, np.eye(K)):
                    z = t
                else:
                    z = _rowmul(t, np.linalg.pinv(H).T)
                item.tv = _vform(z)
                bad = np.abs(_rowmul(z, H.T) - t).max(axis=1, initial=0.0)
            if np.any(bad > 1e-7 * (1.0 + item.tmax)):
                node = int(np.argmax(bad - 1e-7 * (1.0 + item.tmax)))
                where = forest.code(j, node) if j < forest.depth - 1 else str(node)
                raise DataError(
                    f"the invariants at level {forest.names[j]!r} (node {where!r}) contradict "
                    "each other"
                )
        levels.append(item)
    return levels


def _tc_fix(
    f: Forest,
    j: int,
    L: _TCLevel,
    m: np.ndarray,
    P: np.ndarray,
    flat: np.ndarray,
    trS: np.ndarray | float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fold in the level's invariants: their channels become exact (noiseless observations).

    A channel already exact from below (zero variance, not flat) keeps its value, which must
    agree with the invariant (otherwise the invariants contradict those below).
    """
    atol = 1e-11 * (1.0 + np.reshape(trS, (-1, 1)))
    null = (P <= atol) & ~flat & L.fix
    if null.any():
        res = np.stack(
            [
                m.shape[1] * np.abs(L.tv[:, 0] - m[:, 0]) * L.fix[0],
                np.abs(L.tv[:, 1:] - m[:, 1:]).max(axis=1) * L.fix[1],
            ],
            axis=1,
        )
        bad = np.where(null, res, 0.0).max(axis=1) - 1e-7 * (1.0 + L.tmax)
        if np.any(bad > 0):
            node = int(np.argmax(bad))
            where = f.code(j, node) if j < f.depth - 1 else str(node)
            raise DataError(
                f"the invariants at level {f.names[j]!r} (node {where!r}) contradict "
                "the invariants below it: parent totals must equal the sums of their children's"
            )
    put = L.fix & ~null
    m = m.copy()
    m[:, :1] = np.where(put[:, :1], L.tv[:, :1], m[:, :1])
    m[:, 1:] = np.where(put[:, 1:], L.tv[:, 1:], m[:, 1:])
    return m, np.where(L.fix, 0.0, P), flat & ~L.fix


def _tc_up(f: Forest, lv: list[_TCLevel], bottom: _DUp | None, K: int) -> list[_DUp]:
    """Two-channel upward pass (m: (n, K + 1) V-form; P, flat: (n, 2))."""
    D = f.depth
    up: list = [None] * D
    for j in range(D - 1, -1, -1):
        if j == D - 1 and bottom is not None:
            up[j] = bottom
            continue
        L, n = lv[j], f.sizes[j]
        J = np.broadcast_to(L.J, (n, 2))
        pos = J > 0
        Jinv = np.where(pos, 1.0 / np.where(pos, J, 1.0), 0.0)
        M = S = nf = None
        if j == D - 1:
            P, flat, trS = Jinv, ~pos, 0.0
            m = _cm(P, L.h)
        else:
            ch = up[j + 1]
            nf = f.sum_children(j, ch.flat.astype(np.int64))
            rc = nf[:, 0] + (K - 1) * nf[:, 1]
            if np.any(rc > K):
                node = int(np.argmax(rc > K))
                raise _not_identifiable(
                    f.names[j + 1],
                    f"the children of {f.names[j]} {f.code(j, node)!r} have more "
                    "undetermined directions than there are cells",
                )
            M = f.sum_children(j, ch.m)
            S = f.sum_children(j, ch.P)
            trS = S[:, 0] + (K - 1) * S[:, 1]
            cf = nf > 0
            den = 1.0 + S * J
            P = np.where(cf, Jinv, S / den)
            m = _cm(P, L.h) + _cm(np.where(cf, 0.0, 1.0 / den), M)
            flat = cf & ~pos
        if L.fix.any():
            m, P, flat = _tc_fix(f, j, L, m, P, flat, trS)
        up[j] = _DUp(m, P, flat, M, S, nf)
    return up


def _tc_down(
    f: Forest, up: list[_DUp], K: int, z0: np.ndarray, P0: np.ndarray
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Two-channel RTS smoothing from the smoothed top level ``z0`` (V-form), ``P0`` (n, 2)."""
    zhat, Phat = [z0], [P0]
    for j in range(f.depth - 1):
        u, ch = up[j], up[j + 1]
        par = f.parent(j + 1)
        nf = u.nf
        _refuse_free_siblings(f, j, nf, "share a combination of cells")
        S = u.S
        trS = S[:, 0] + (K - 1) * S[:, 1]
        keep = S > np.maximum(_RTOL * S.max(axis=1), 1e-13 * trS)[:, None]
        A = np.where(keep, 1.0 / np.where(keep, S, 1.0), 0.0)  # S⁺
        cf = (nf > 0)[par]
        Pc = ch.P
        G = np.where(cf, ch.flat.astype(float), Pc * A[par])
        Dc = np.where(cf, np.where(ch.flat, S[par], Pc), Pc - G * Pc)
        zhat.append(ch.m + _cm(G, (zhat[j] - u.M)[par]))
        Phat.append(Dc + G * G * Phat[j][par])
    return zhat, Phat


# ----------------------------------------------------------------------------- general path
@dataclass
class _Up:
    m: np.ndarray  # (n, K), or (n, C, K): C copies sharing every matrix below
    P: np.ndarray  # (1|n, K, K)
    N: np.ndarray | None = None  # (n, K, K) flat basis (columns [0, r) valid, rest +0.0)
    r: np.ndarray | None = None  # (n,) number of flat directions
    shared: bool = False  # P is one (1, K, K) matrix for every node
    # children summaries (internal levels)
    M: np.ndarray | None = None
    S: np.ndarray | None = None
    Nc: np.ndarray | None = None  # packed flat directions of the children (n, K, K)
    rc: np.ndarray | None = None  # (n,) number of packed columns (0: plain update)
    off: np.ndarray | None = None  # per child: offset of its columns in the parent's pack

    def message(self) -> _Up:
        return _Up(self.m, self.P, self.N, self.r, self.shared)


def _flat_basis(Pz: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal basis (columns first) of the range of a PSD projector-like matrix."""
    ev, V = np.linalg.eigh(_sym(Pz))
    keep = ev > 1e-8
    order = np.argsort(~keep, axis=-1, kind="stable")
    V = np.take_along_axis(V, order[..., None, :], axis=-1)
    keep = np.take_along_axis(keep, order, axis=-1)
    return np.where(keep[..., None, :], V, 0.0), keep.sum(axis=-1)


def _solve_bordered(
    Mat: np.ndarray, rhs: np.ndarray, K: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pseudo-solve the node relation; z occupies the first K coordinates.

    Returns m (n, K), P (b, K, K), the flat basis N (b, K, K) and its rank r (b,).
    """
    Minv, Null = _pinv_psd(Mat)
    N, r = _flat_basis(Null[..., :K, :K], K)
    Pi = np.eye(K) - N @ N.swapaxes(-1, -2)
    x = _mv(Minv, rhs)
    m = _mv(Pi, x[..., :K])
    P = _sym(Pi @ Minv[..., :K, :K] @ Pi)
    return m, P, N, r


def _leaf_up(L: _Level, K: int) -> _Up:
    nH = L.H.shape[0]
    b = L.J.shape[0]
    Mat = np.zeros((b, K + nH, K + nH))
    Mat[:, :K, :K] = L.J
    Mat[:, :K, K:] = L.H.T
    Mat[:, K:, :K] = L.H
    rhs = np.concatenate([L.h, L.t], axis=-1)
    m, P, N, r = _solve_bordered(Mat, rhs, K)
    if not np.any(r):
        return _Up(m, P, shared=L.shared)
    n = L.h.shape[0]
    return _Up(
        m,
        P,
        np.broadcast_to(N, (n, K, K)).copy(),
        np.broadcast_to(r, (n,)).copy(),
        shared=L.shared,
    )


def _pack_children(
    f: Forest, j: int, child: _Up, K: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate the children's flat bases into one (K, K) block per parent."""
    n_par = f.sizes[j]
    par = f.parent(j + 1)
    rc = np.bincount(par, weights=child.r, minlength=n_par).astype(np.int64)
    if np.any(rc > K):
        node = int(np.argmax(rc > K))
        raise _not_identifiable(
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
    f: Forest, j: int, L: _Level, S: np.ndarray, M: np.ndarray, idx: slice | np.ndarray, K: int
) -> tuple[np.ndarray, np.ndarray]:
    """Information update with the node's measurements, then its invariants (no flat child)."""
    X = np.eye(K) + S @ L.J
    P0 = _sym(np.linalg.solve(X, S))
    m0 = _solve_vec(X, M + _node_mv("nij,nj->ni", S, L.h))
    if not L.H.shape[0]:
        return m0, P0
    HP = np.einsum("ak,nkl->nal", L.H, P0)
    R = _sym(HP @ L.H.T)
    atol = 1e-11 * (1.0 + np.trace(S, axis1=1, axis2=2)) * float((L.H**2).sum())
    Rinv, Rnull = _pinv_psd(R, atol)
    res = L.t - np.einsum("n...k,ak->n...a", m0, L.H)  # not m0 @ H.T (see _rowmul)
    bad = _node_max(np.abs(_node_mv("nab,nb->na", Rnull, res)))
    if np.any(bad > 1e-7 * (1.0 + _node_max(np.abs(L.t)))):
        node = int(np.arange(f.sizes[j])[idx][int(np.argmax(bad))])
        raise DataError(
            f"the invariants at level {f.names[j]!r} (node {f.code(j, node)!r}) contradict "
            "the invariants below it: parent totals must equal the sums of their children's"
        )
    Kg = HP.swapaxes(1, 2) @ Rinv
    return m0 + _node_mv("nka,na->nk", Kg, res), _sym(P0 - Kg @ HP)


def _bordered_update(
    L: _Level, S: np.ndarray, M: np.ndarray, Nc: np.ndarray, rc: np.ndarray, K: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Relation of nodes with flat children: variables (z, λ, w, μ); see the module doc."""
    n, nH = S.shape[0], L.H.shape[0]
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
    rhs = np.concatenate([L.h, M, np.zeros(M.shape), L.t], axis=-1)
    return _solve_bordered(Mat, rhs, K)


def _internal_up(f: Forest, j: int, L: _Level, ch: _Up, K: int) -> _Up:
    """One internal level: the plain update where no child is flat, the relation elsewhere."""
    n = f.sizes[j]
    M = f.sum_children(j, ch.m)
    S = _sym(f.sum_children(j, ch.P, shared=ch.shared))
    u = _Up(np.empty(M.shape), np.empty((n, K, K)), M=M, S=S, rc=np.zeros(n, np.int64))
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


def _general_up(f: Forest, lv: list[_Level], K: int, bottom: _Up | None) -> list[_Up]:
    """Upward pass of the general path, leaves first.

    Means, information vectors and invariant values may carry copy axes — ``h`` (n, C, K),
    ``t`` (n, C, n_H) — for C problems on one tree that share every matrix (J, H, variances):
    the blocks of a marginal workload repeated over within-group contrasts
    (:mod:`censusdp.estimation.structured_gls`). Matrices (P, S, N, gains) stay per node;
    with no copy axis every operation is the one of a single problem, bit for bit.
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


def family_inverse_bordered(f: Forest, j: int, u: _Up, pb: np.ndarray, K: int) -> np.ndarray:
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
    gram = Nc.swapaxes(1, 2) @ Nc + pad[:, :, None] * np.eye(K)
    low = np.linalg.eigvalsh(gram)[:, 0]
    if np.any(low < 1e-8):
        node = int(pb[int(np.argmin(low))])
        raise _not_identifiable(
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


def _general_down(
    f: Forest, up: list[_Up], K: int, z0: np.ndarray, P0: np.ndarray
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """RTS smoothing from the smoothed top level ``z0, P0`` (per node: plain or bordered)."""
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
            Gs = Pcs @ A[pos[par[cs]]]
            G[cs], Dc[cs] = Gs, Pcs - Gs @ Pcs
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
            Gb = Pcb @ Ap + Nch @ Bc
            F = np.concatenate([Pcb, Nch], axis=2)
            Yc = np.concatenate(
                [
                    np.concatenate([Ap, Bc.swapaxes(1, 2)], axis=2),
                    np.concatenate([Bc, Cc], axis=2),
                ],
                axis=1,
            )
            G[cbi], Dc[cbi] = Gb, Pcb - F @ Yc @ F.swapaxes(1, 2)
        zhat.append(ch.m + _node_mv("nij,nj->ni", G, d[par]))
        Pk = Phat[j] if Phat[j].shape[0] > 1 else np.broadcast_to(Phat[j], (f.sizes[j], K, K))
        Phat.append(_sym(Dc + G @ Pk[par] @ G.swapaxes(1, 2)))
    return zhat, Phat


# ----------------------------------------------------------------------------- split passes
@dataclass(eq=False)
class UpwardState:
    """The upward pass over one sub-forest: every level's beliefs and children summaries.

    ``message()`` is what the cut-level nodes send to the levels above: their mean ``m``,
    covariance ``P`` (and flat directions ``N, r`` on the general path, or the ``flat`` mask on
    the diagonal path and the total/deviation kernel — there ``m`` is (n, K + 1), the cell
    mean then the deviations, and ``P``, ``flat`` are (n, 2), on 1 and on its complement),
    after folding in their own measurements and invariants.
    """

    forest: Forest
    ups: list
    diagonal: bool

    def message(self) -> _Up | _DUp:
        return self.ups[0].message()


def gls_upward(
    plan: GLSPlan,
    forest: Forest,
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
) -> UpwardState:
    """Upward pass over a sub-forest (levels ``forest.first`` .. leaf).

    Parameters
    ----------
    plan : GLSPlan
        From :func:`gls_plan` on the whole problem.
    forest : Forest
        The partition's levels, cut .. leaf (:meth:`Forest.of` with the partition's ranges).
    measurements, invariants : sequence
        Those of levels ``forest.first ..``, restricted to the forest's node ranges
        (:func:`restrict`); integer levels.

    References
    ----------
    Hay et al. (2010), §4 (upward pass); Rauch, Tung & Striebel (1965).
    """
    if plan.two_channel:
        ups = _tc_up(forest, _collect_tc(forest, plan, measurements, invariants), None, plan.K)
        return UpwardState(forest, ups, plan.diagonal)
    lv = _collect(forest, plan, measurements, invariants)
    if plan.diagonal:
        ups = _diagonal_up(forest, lv, None)
    else:
        ups = _general_up(forest, lv, plan.K, None)
    return UpwardState(forest, ups, plan.diagonal)


def _concat_messages(parts: Sequence[_Up | _DUp], K: int) -> _Up | _DUp:
    """The cut level's messages of all partitions, in partition order."""
    if isinstance(parts[0], _DUp):
        return _DUp(*(np.concatenate([getattr(p, a) for p in parts]) for a in ("m", "P", "flat")))
    sizes = [p.m.shape[0] for p in parts]
    m = np.concatenate([p.m for p in parts])
    if parts[0].shared:  # the same (1, K, K) matrix in every partition
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
    return _Up(m, P, N, r, parts[0].shared)


def gls_top(
    plan: GLSPlan,
    hierarchy: Hierarchy,
    cut: int,
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
    messages: Sequence[_Up | _DUp],
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Levels 0 .. cut: upward from the cut-level messages, then smoothing down to the cut.

    Parameters
    ----------
    plan : GLSPlan
    hierarchy : Hierarchy
    cut : int
        The cut level; the messages of its nodes play the role of the children of the level
        above (the same math as the single-process passes).
    measurements, invariants : sequence
        Those of levels above the cut (others are ignored); integer levels.
    messages : sequence
        :meth:`UpwardState.message` of every partition, in partition (node) order.

    Returns
    -------
    zhat, Phat : lists of numpy.ndarray
        Smoothed estimates and covariances (scaled units) of levels 0 .. cut, in the path's
        representation (per-cell variances on the diagonal path; V-form estimates and (n, 2)
        eigenvalues on the total/deviation kernel), for :func:`gls_downward` and
        :func:`gls_finish`.

    Raises
    ------
    SpecError
        The root is not identifiable.
    """
    K = plan.K
    forest = whole_forest(hierarchy, 0, cut)
    bottom = _concat_messages(messages, K) if len(messages) > 1 else messages[0]
    top_m = [m for m in measurements if m.level < cut]
    top_i = [i for i in invariants if i.level < cut]
    if plan.two_channel:
        lv = _collect_tc(forest, plan, top_m, top_i) if cut else []
        ups = _tc_up(forest, lv, bottom, K)
        if ups[0].flat.any():
            raise _not_identifiable(
                plan.names[0],
                "some combination of cells is measured at no level and held invariant nowhere",
            )
        return _tc_down(forest, ups, K, ups[0].m, ups[0].P)
    lv = _collect(forest, plan, top_m, top_i) if cut else []
    if plan.diagonal:
        ups = _diagonal_up(forest, lv, bottom)
        if ups[0].flat.any():
            raise _not_identifiable(plan.names[0], "some cell is measured at no level")
        return _diagonal_down(forest, ups, ups[0].m, ups[0].P)
    ups = _general_up(forest, lv, K, bottom)
    root = ups[0]
    if root.N is not None and np.any(root.r):
        raise _not_identifiable(
            plan.names[0],
            "some combination of cells is measured at no level and held invariant nowhere",
        )
    return _general_down(forest, ups, K, root.m, np.broadcast_to(root.P, (1, K, K)).copy())


def gls_downward(
    plan: GLSPlan, state: UpwardState, zhat_cut: np.ndarray, Phat_cut: np.ndarray
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Smoothing of one sub-forest from its cut-level estimates and covariances.

    Returns the smoothed estimates and covariances (scaled units) of every level of the
    forest, the cut level (as given) first.

    References
    ----------
    Rauch, Tung & Striebel (1965).
    """
    if plan.two_channel:
        return _tc_down(state.forest, state.ups, plan.K, zhat_cut, Phat_cut)
    if plan.diagonal:
        return _diagonal_down(state.forest, state.ups, zhat_cut, Phat_cut)
    return _general_down(state.forest, state.ups, plan.K, zhat_cut, Phat_cut)


def gls_finish(
    plan: GLSPlan, zhat: Sequence[np.ndarray], Phat: Sequence[np.ndarray], covariance: bool
) -> tuple[list[np.ndarray], list[np.ndarray] | None, list[np.ndarray] | None]:
    """Data-unit estimates, per-cell variances and (optionally) covariances per level."""
    K = plan.K
    vscale = plan.vscale
    if plan.two_channel:  # V-form estimates, (n, 2) eigenvalues (E, F)
        estimates = [(z[:, 1:] + z[:, :1]) * plan.tau for z in zhat]
        variances = covs = None
        if vscale is not None:
            variances = [
                np.repeat(np.maximum((p[:, :1] + (K - 1) * p[:, 1:]) / K, 0.0) * vscale, K, 1)
                for p in Phat
            ]
            if covariance:  # x_F I + (x_E − x_F)/K 11ᵀ
                covs = [
                    (p[:, 1, None, None] * np.eye(K) + ((p[:, 0] - p[:, 1]) / K)[:, None, None])
                    * vscale
                    for p in Phat
                ]
        return estimates, variances, covs
    if plan.diagonal:
        Pd = list(Phat)
        covs = [np.einsum("nk,kl->nkl", p, np.eye(K)) for p in Phat] if covariance else None
    else:
        Pd = [np.diagonal(p, axis1=1, axis2=2).copy() for p in Phat]
        covs = list(Phat) if covariance else None
    vscale = plan.vscale
    estimates = [z * plan.tau for z in zhat]
    variances = None if vscale is None else [np.maximum(p, 0.0) * vscale for p in Pd]
    if covs is not None:
        covs = None if vscale is None else [c * vscale for c in covs]
    return estimates, variances, covs


def gls_diagnostics(plan: GLSPlan, residuals: dict, diagnostics: dict) -> dict:
    """The release's diagnostics, after checking that the invariants hold.

    ``residuals`` is :func:`forest_residuals` over every level (or the
    :func:`merge_residuals` of pieces that cover them).
    """
    diag = {
        "path": "diagonal" if plan.diagonal else "general",
        "kernel": "elementwise"
        if plan.diagonal
        else ("total/deviation" if plan.two_channel else "dense"),
        "geometry": plan.geometry,
    }
    diag.update(diagnostics)
    diag.update(residuals)
    if diag["max_invariant_residual"] > 1e-6 * (1.0 + diag["max_invariant_value"]):
        raise DataError(
            "the invariants contradict each other (they cannot all hold with parent = sum of "
            f"children); largest violation at level {diag['worst_invariant_level']!r}"
        )
    if plan.vscale is None:
        diag["note"] = (
            "euclidean geometry with unequal noise scales: the tree passes give the estimate "
            "but not its sandwich covariance; use gls_sparse.general_gls for it"
        )
    return diag


def gls_release(
    plan: GLSPlan,
    hierarchy: Hierarchy,
    invariants: Sequence[Invariant],
    privacy: PrivacyStatement,
    estimates: list[np.ndarray],
    variances: list[np.ndarray] | None,
    covariances: list[np.ndarray] | None,
    diagnostics: dict,
) -> Release:
    """The :class:`Release`, after checking consistency and the invariants."""
    residuals = forest_residuals(whole_forest(hierarchy), estimates, invariants)
    return Release(
        estimator="gls",
        hierarchy=hierarchy,
        cells=plan.cells,
        estimates=estimates,
        variances=variances,
        privacy=dataclasses.replace(
            with_invariants(privacy, invariant_labels(hierarchy.names, invariants)),
            geometry=plan.geometry,
        ),
        integer=False,
        diagnostics=gls_diagnostics(plan, residuals, diagnostics),
        covariances=covariances,
    )


# ----------------------------------------------------------------------------- public API
def tree_gls(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant] = (),
    privacy: PrivacyStatement | None = None,
    *,
    covariance: bool = False,
    geometry: Geometry = "weighted",
) -> Release:
    """The GLS (projection) estimate of a consistent, invariant-respecting table.

    The one-partition case of the split passes (cut at the root): :func:`gls_upward` over the
    whole tree, :func:`gls_top` at the root, :func:`gls_downward` over the whole tree.

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
    privacy : PrivacyStatement, optional
        None (the default): the statement is derived from the measurements — each law's
        privacy at its query's computed sensitivity, composed over levels, invariants named
        (:func:`~censusdp.mechanisms.privacy.derive_statement`). A statement passed in is
        checked against that derivation and kept when it claims at least as much. Returned
        with ``geometry`` set.
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
        Invariants that contradict each other (checked exactly before estimating) or lie
        beyond 2⁵³.
    SpecError
        Invariants that determine every measured value of a level, unless ``privacy``
        acknowledges it (:func:`~censusdp.mechanisms.queries.guard_exact_release`).
    BudgetError
        ``privacy`` claims less than the measurements spend (e.g. ρ = 10⁻⁹ for σ = 20 noise).

    References
    ----------
    Hay, Rastogi, Miklau & Suciu (2010), §4 (the one-cell algorithm); Rauch, Tung & Striebel
    (1965); Gao, Gong & Yu (2022), Thm. 22; Bun & Steinke (2016), Lemma 2.3 (composition).
    """
    t0 = time.perf_counter()
    privacy = checked_statement(hierarchy.names, measurements, invariants, privacy)
    plan, meas, invs = gls_plan(
        hierarchy, cells, measurements, invariants, geometry, privacy=privacy
    )
    t1 = time.perf_counter()
    state = gls_upward(plan, whole_forest(hierarchy), meas, invs)
    zhat, Phat = gls_top(plan, hierarchy, 0, meas, invs, [state.message()])
    zhat, Phat = gls_downward(plan, state, zhat[-1], Phat[-1])
    t2 = time.perf_counter()
    est, var, cov = gls_finish(plan, zhat, Phat, covariance)
    timings = {"seconds_setup": t1 - t0, "seconds_solve": t2 - t1}
    return gls_release(plan, hierarchy, invs, privacy, est, var, cov, timings)


def forest_residuals(
    forest: Forest, estimates: Sequence[np.ndarray], invariants: Sequence[Invariant]
) -> dict:
    """Largest |parent − Σ children| and |invariant query − value| over a forest's levels.

    ``estimates`` and ``invariants`` are the forest's (invariants of other levels are
    ignored); per node the sums are those of :meth:`Hierarchy.aggregate_up`, so pieces of a
    partitioned release give the residuals of the whole through :func:`merge_residuals`.
    """
    cons = 0.0
    for j in range(forest.depth - 1):
        d = np.abs(forest.sum_children(j, estimates[j + 1]) - estimates[j])
        cons = max(cons, float(d.max(initial=0.0)))
    inv, val, worst = 0.0, 0.0, ""
    for i in invariants:
        j = i.level - forest.first
        if not 0 <= j < forest.depth:
            continue
        r = float(np.abs(i.query.apply(estimates[j]) - i.values).max(initial=0.0))
        val = max(val, float(np.abs(i.values).max(initial=0.0)))
        if r >= inv:
            inv, worst = r, forest.names[j]
    return {
        "max_consistency_residual": cons,
        "max_invariant_residual": inv,
        "max_invariant_value": val,
        "worst_invariant_level": worst,
    }


def merge_residuals(parts: Sequence[dict]) -> dict:
    """The :func:`forest_residuals` of the union of disjoint pieces (the largest of each)."""
    out = {
        "max_consistency_residual": 0.0,
        "max_invariant_residual": 0.0,
        "max_invariant_value": 0.0,
        "worst_invariant_level": "",
    }
    for r in parts:
        out["max_consistency_residual"] = max(
            out["max_consistency_residual"], r["max_consistency_residual"]
        )
        out["max_invariant_value"] = max(out["max_invariant_value"], r["max_invariant_value"])
        if (
            r["worst_invariant_level"]
            and r["max_invariant_residual"] >= out["max_invariant_residual"]
        ):
            out["max_invariant_residual"] = r["max_invariant_residual"]
            out["worst_invariant_level"] = r["worst_invariant_level"]
    return out
