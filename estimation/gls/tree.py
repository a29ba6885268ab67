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
them — the blocks of a marginal workload repeated over within-group contrasts, docs/design.md § The structured algebra —
run in one pass with a copy axis on every mean and information vector (``(n, C, K)``) and
one set of per-node matrices (:mod:`censusdp.estimation.gls.structured`).

**Kernel.** The passes are the public kernel :mod:`censusdp.estimation.gls.kernel`
(:func:`~censusdp.estimation.gls.kernel.general_up`,
:func:`~censusdp.estimation.gls.kernel.general_down`) for every problem — one cell, identity
queries, total and detailed queries included; this module is its flat front end
(:func:`level_inputs` turns measurements and invariants into the kernel's per-level inputs)
and :mod:`censusdp.estimation.gls.structured` its structured one (issue 34: two front ends of
one kernel). The sub-forests the passes run on are :class:`~censusdp.hierarchy.forest.Forest`
(re-exported here for one release). This module had its own elementwise passes for identity
queries and a two-eigenvalue (total/deviation) kernel; measured when they were removed (CPU
seconds, warm, old and new alternating in one process, median of 3):
``benchmarks/national_scale.py`` with 1,000,000 blocks, noise + GLS + rounding 1.54 → 1.50,
its 3,221 counties × 36 cells part 0.53 → 0.66 (1.2×, under the 1.5× that would keep a fast
path); the GLS alone: one cell, 4,000,000 blocks 0.089 → 0.123, 36 cells 0.002 → 0.18, the
two-cell units shape (detailed queries, block totals invariant, 1,000,000 blocks)
0.24 → 0.43.

Geometry: ``"weighted"`` uses the measurement variances (Σ⁻¹-weighted projection; for Gaussian
noise this equals conditioning on consistency and the invariants — Gao, Gong & Yu 2022,
Thm. 22 generalised); ``"euclidean"`` uses unit weights (the projection Π_N of the seed, the
same estimate when all scales are equal). See :mod:`censusdp.estimation.gls.sparse` for the
privacy statement of each; the general sparse solver there is the reference these passes are
tested against.

**Partitions.** Both passes are per node given the level above or below, so they split on a
*sub-forest* (the subtrees below a run of cut-level nodes): :func:`gls_upward` runs the
upward pass over levels cut .. leaf of one partition and yields each cut-level node's message
(its relation ``m, P, N``); :func:`gls_top` runs levels 0 .. cut with those messages as leaves
(they play the role of the children of the level above) and smooths down to the cut;
:func:`gls_downward` smooths one partition below the cut. :func:`tree_gls` is the one-partition
case (cut at the root), so there is one implementation of the math. Every batched operation
is per node — elementwise ufuncs, ``np.add.reduceat`` over a node's children, and the kernel's
stacked ``matmul``/``solve``/``eigh`` — and every branch
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from censusdp.budget import PrivacyStatement, invariant_labels, with_invariants
from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls.kernel import (
    LevelInputs,
    UpwardBelief,
    concat_messages,
    general_down,
    general_up,
    root_start,
)
from censusdp.estimation.release import Release
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.core import exact_int64
from censusdp.hierarchy.forest import Forest, whole_forest
from censusdp.mechanisms.privacy import checked_statement
from censusdp.mechanisms.queries import (
    Invariant,
    Measurement,
    at_level_indices,
    check_float_exact,
    exact_matrix,
    guard_exact_release,
)
from censusdp.timing import stage

__all__ = [
    "tree_gls",
    "NodeVarianceMeasurement",
    # Forest and whole_forest moved to censusdp.hierarchy.forest (a hierarchy concept);
    # re-exported here for one release so that importers of this module keep working.
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
    "level_inputs",
    "restrict",
    "whole_forest",
]

Geometry = Literal["weighted", "euclidean"]


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


@dataclass(frozen=True)
class GLSPlan:
    """What every partition must agree on: cells, scaling and geometry.

    Attributes
    ----------
    cells : tuple of str
    names : tuple of str
        The hierarchy's level names.
    geometry : {"weighted", "euclidean"}
    tau2, tau : float
        Scale of the computation (median noise variance, weighted geometry).
    vscale : float or None
        Factor from scaled to data-unit variances (None: not defined, Euclidean geometry
        with unequal noise scales).
    """

    cells: tuple[str, ...]
    names: tuple[str, ...]
    geometry: str
    tau2: float
    tau: float
    vscale: float | None

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

    Returns the plan and the measurements and invariants with integer levels (and their
    names in ``level_name``; levels may be given by name or index,
    :func:`~censusdp.mechanisms.queries.at_level_indices`). The
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
    meas = at_level_indices(hierarchy.names, measurements)
    invs = at_level_indices(hierarchy.names, invariants)
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
    plan = GLSPlan(
        cells=cells,
        names=hierarchy.names,
        geometry=geometry,
        tau2=tau2,
        tau=float(np.sqrt(tau2)),
        vscale=vscale,
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


def level_inputs(
    forest: Forest,
    plan: GLSPlan,
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
) -> list[LevelInputs]:
    """The flat front end: every level's :class:`~censusdp.estimation.gls.kernel.LevelInputs`.

    Per node, in scaled units (variances / τ², values / τ): ``J = Σ_q w_q Q_qᵀ Q_q``,
    ``h = Σ_q w_q Q_qᵀ y_q`` (``w_q = τ²/σ²_q``, per node for a
    :class:`NodeVarianceMeasurement`; 1 in the Euclidean geometry), the invariant rows ``H``
    and values ``t`` of the level.

    Parameters
    ----------
    forest : Forest
        The levels to collect (``forest.first ..``).
    plan : GLSPlan
        From :func:`gls_plan`.
    measurements, invariants : sequence
        Integer levels, restricted to the forest's node ranges (:func:`restrict`).

    Raises
    ------
    SpecError
        Node variances of the wrong shape or not positive and finite.
    """
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
        levels.append(LevelInputs(J, h, H, t, shared))
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
        pivots = [
            next(c for c in range(rows.shape[0]) if rref[r, c] != 0) for r in range(int(rank))
        ]
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


# ----------------------------------------------------------------------------- split passes
@dataclass(eq=False)
class UpwardState:
    """The upward pass over one sub-forest: every level's beliefs and children summaries.

    ``message()`` is what the cut-level nodes send to the levels above: their mean ``m``,
    covariance ``P`` and flat directions ``N, r``
    (:class:`~censusdp.estimation.gls.kernel.UpwardBelief`), after folding in their own
    measurements and invariants.
    """

    forest: Forest
    ups: list[UpwardBelief]

    def message(self) -> UpwardBelief:
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
    lv = level_inputs(forest, plan, measurements, invariants)
    return UpwardState(forest, general_up(forest, lv, plan.K, None))


def gls_top(
    plan: GLSPlan,
    hierarchy: Hierarchy,
    cut: int,
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
    messages: Sequence[UpwardBelief],
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
        Smoothed estimates (n, K) and covariances (1|n, K, K) (scaled units) of levels
        0 .. cut, for :func:`gls_downward` and :func:`gls_finish`.

    Raises
    ------
    SpecError
        The root is not identifiable.
    """
    K = plan.K
    forest = whole_forest(hierarchy, 0, cut)
    bottom = concat_messages(messages, K) if len(messages) > 1 else messages[0]
    top_m = [m for m in measurements if m.level < cut]
    top_i = [i for i in invariants if i.level < cut]
    lv = level_inputs(forest, plan, top_m, top_i) if cut else []
    ups = general_up(forest, lv, K, bottom)
    z0, P0 = root_start(
        ups,
        K,
        plan.names[0],
        "some combination of cells is measured at no level and held invariant nowhere",
    )
    return general_down(forest, ups, K, z0, P0)


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
    return general_down(state.forest, state.ups, plan.K, zhat_cut, Phat_cut)


def gls_finish(
    plan: GLSPlan, zhat: Sequence[np.ndarray], Phat: Sequence[np.ndarray], covariance: bool
) -> tuple[list[np.ndarray], list[np.ndarray] | None, list[np.ndarray] | None]:
    """Data-unit estimates, per-cell variances and (optionally) covariances per level
    (variances and covariances None when ``plan.vscale`` is: Euclidean, unequal scales)."""
    estimates = [z * plan.tau for z in zhat]
    vscale = plan.vscale
    if vscale is None:
        return estimates, None, None
    # a held cell's variance is 0 in exact arithmetic; the smoother leaves an ε-residue of
    # either sign: at or below 1e-12 of the level's largest it is reported as 0 (the rule of
    # BlockCovariance and Prediction)
    variances = []
    for p in Phat:
        v = np.diagonal(p, axis1=1, axis2=2) * vscale
        variances.append(np.where(v > 1e-12 * v.max(initial=0.0), v, 0.0))
    return estimates, variances, [p * vscale for p in Phat] if covariance else None


def gls_diagnostics(plan: GLSPlan, residuals: dict, diagnostics: dict) -> dict:
    """The release's diagnostics, after checking that the invariants hold.

    ``residuals`` is :func:`forest_residuals` over every level (or the
    :func:`merge_residuals` of pieces that cover them).
    """
    diag = {
        "path": "general",  # the one kernel (kept for readers of this key)
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
        Noisy answers ``values`` (n_nodes, k) of ``query`` at every node of ``level`` (a
        name, or an index: the same release bit for bit); the noise variance is
        ``law.variance`` (or ``node_variance`` of a :class:`NodeVarianceMeasurement`).
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
        Shapes that do not match the hierarchy, an unknown level name, an estimate that is
        not identifiable (the message names the level), or invariants that determine every
        measured value of a level, unless ``privacy`` acknowledges it
        (:func:`~censusdp.mechanisms.queries.guard_exact_release`).
    DataError
        Invariants that contradict each other (checked exactly before estimating) or lie
        beyond 2⁵³.
    BudgetError
        ``privacy`` claims less than the measurements spend (e.g. ρ = 10⁻⁹ for σ = 20 noise).

    References
    ----------
    Hay, Rastogi, Miklau & Suciu (2010), §4 (the one-cell algorithm); Rauch, Tung & Striebel
    (1965); Gao, Gong & Yu (2022), Thm. 22; Bun & Steinke (2016), Lemma 2.3 (composition).
    """
    clock: dict[str, float] = {}
    with stage(clock, "setup"):
        measurements = at_level_indices(hierarchy.names, measurements)
        invariants = at_level_indices(hierarchy.names, invariants)
        privacy = checked_statement(hierarchy.names, measurements, invariants, privacy)
        plan, meas, invs = gls_plan(
            hierarchy, cells, measurements, invariants, geometry, privacy=privacy
        )
    with stage(clock, "solve"):
        state = gls_upward(plan, whole_forest(hierarchy), meas, invs)
        zhat, Phat = gls_top(plan, hierarchy, 0, meas, invs, [state.message()])
        zhat, Phat = gls_downward(plan, state, zhat[-1], Phat[-1])
    est, var, cov = gls_finish(plan, zhat, Phat, covariance)
    timings = {"seconds_setup": clock["setup"], "seconds_solve": clock["solve"]}
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
    worst = ("max_invariant_residual", "worst_invariant_level")
    for r in parts:
        for key in ("max_consistency_residual", "max_invariant_value"):
            out[key] = max(out[key], r[key])
        if r[worst[1]] and r[worst[0]] >= out[worst[0]]:
            out.update({key: r[key] for key in worst})
    return out
