"""Off-spine areas measured as extra budgeted queries, combined exactly with the tree GLS.

:mod:`censusdp.estimation.gls.areas` releases an area (a set of leaves, e.g. a place) as the sum
of its leaves' GLS estimates. Here the areas are *also measured*: every area ``α`` answers
product queries ``Q_q`` of the schema with discrete Gaussian noise,
``y_{α,q} = Q_q s_α + ε``, ``s_α = Σ_{l∈α} z_l``, and the GLS with these extra rows
``B = E ⊗ Q`` (``E`` the area × leaf incidence) is computed exactly as a low-rank update of
the tree GLS (the information-filter update of Kalman 1960; Rauch, Tung & Striebel 1965):

    x̂' = x̂ + Σ Bᵀ K⁻¹ (y − B x̂),   Σ' = Σ − Σ Bᵀ K⁻¹ B Σ,   K = B Σ Bᵀ + D,

with ``Σ`` the tree GLS's *constrained* error covariance (consistency and invariants held),
so the update lies in the invariants' null space: every invariant and every parent = sum of
children holds exactly after it, and areas stay sums of released leaves. The tree estimate
is unbiased and ``E[y − B x̂] = 0``, so the update is too (it is the GLS of all the rows).

**Per block.** Every Gram ``Q_qᵀQ_q`` is block-diagonal in the structured GLS's marginal
basis (docs/design.md § The structured algebra), so per block ``S`` the area rows reduce to an equivalent whitened
measurement ``ỹ_α = R_S s_α + ε̃``, ``ε̃ ~ (0, I)``, with ``R_SᵀR_S = Σ_q G_{q,S}/σ_q²``
(``r_S ≤ n_S`` rows, identical over the block's ``mult_S`` copies); the GLS depends on the
rows only through ``BᵀD⁻¹B`` and ``BᵀD⁻¹y``, which the whitened rows reproduce. Per block:

* ``Σ Bᵀ`` — one tree solve (:func:`~censusdp.estimation.gls.kernel.general_up` /
  :func:`~censusdp.estimation.gls.kernel.general_down`, zero measurements and invariant values)
  whose leaf information vectors are the columns of ``Bᵀ``, the ``n_areas · r_S`` columns
  carried as the solve's copy axis: ``X_v = Cov(e_v, B e)`` for *every* node ``v``;
* ``K = E X_leaf Rᵀ + I`` (``n_areas r_S`` square), one Cholesky factor ``L``;
* every node's covariance exactly: ``Σ'_v = Σ_v − (L⁻¹X_v)ᵀ(L⁻¹X_v)``;
* every area's covariance exactly: its prior one from the one-pass sweep
  (:func:`~censusdp.estimation.gls.areas.area_sweep`) minus ``(L⁻¹ Σ_{l∈α} X_l)ᵀ(…)``.

**Cost.** The solve carries ``m = n_areas · r_S`` columns: ``O(nodes · m · k_S²)`` time and
``nodes · m · k_S`` memory per block, plus ``O(m³)`` for ``K``. That is small for the areas of
a county or a state (hundreds of places, ``r_S = 1`` for totals) and is what bounds its use:
a national run with 30,000 places would carry 30,000 columns through every node. The
structure that bounds it is nesting: places nest in states, so ``X_v`` for a node in state
``s`` is a state-local term (areas of ``s``) plus a rank-``k`` term through the nation
(``Cov(e_v, e_nation)``), and ``K`` is block-diagonal by state plus a rank-``k`` nation
coupling — a per-state update followed by one ``k × k`` nation correction, not done here.

**Privacy.** Areas from an equivalency file are disjoint sets of leaves (a block listed
twice is refused when the file is read, and again here), so each person is in at most one
area: the areas are a partition of part of the population, like a level of the hierarchy,
and a query's sensitivity over all areas is its sensitivity on one histogram.
:func:`area_plan` gives each query its discrete Gaussian law from its ρ share
(``σ² = Δ₂²/(2ρ_q)``, Canonne, Kamath & Steinke 2020); :func:`area_statement` composes the
areas' spends with the tree's into the one derived statement.

References
----------
Kalman, R. E. (1960). A new approach to linear filtering and prediction problems.
Rauch, Tung & Striebel (1965). Maximum likelihood estimates of linear dynamic systems.
Hay, Rastogi, Miklau & Suciu (2010). Boosting the accuracy of differentially private
    histograms through consistency. PVLDB 3(1).
Canonne, Kamath & Steinke (2020). The discrete Gaussian for differential privacy.
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.linalg

from censusdp.budget import PrivacyStatement, compose
from censusdp.errors import BudgetError, SpecError
from censusdp.estimation.gls.areas import AreaEstimates, area_sweep, covariance_levels
from censusdp.estimation.gls.kernel import LevelInputs, general_down, general_up, root_start
from censusdp.estimation.gls.marginal_basis import BlockDiagonal, MarginalBasis
from censusdp.estimation.gls.structured import (
    StructuredRelease,
    StructuredSetup,
    add_adjoint,
    block_error,
    gather_block,
    structured_output,
)
from censusdp.hierarchy.equivalency import Equivalency
from censusdp.hierarchy.forest import Forest, whole_forest
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.privacy import derive_statement
from censusdp.mechanisms.product_measure import ProductMeasurement, measure_products
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

__all__ = [
    "MeasuredAreas",
    "area_plan",
    "area_statement",
    "check_disjoint",
    "measure_areas",
    "update_with_areas",
]

#: Eigenvalues of the area information below this fraction of its largest are zero.
_RTOL = 1e-10


def check_disjoint(equivalency: Equivalency) -> None:
    """Refuse areas that share a leaf: the areas' sensitivity is a single histogram's only
    when each person is in at most one area.

    Raises
    ------
    SpecError
        A leaf in two areas (naming the areas' file and the two area codes).
    """
    leaf = np.asarray(equivalency.leaf)
    order = np.argsort(leaf, kind="stable")
    dup = np.flatnonzero(np.diff(leaf[order]) == 0)
    if dup.size:
        a, b = equivalency.area[order[dup[0]]], equivalency.area[order[dup[0] + 1]]
        raise SpecError(
            f"{equivalency.source}: {equivalency.name}s {equivalency.codes[a]!r} and "
            f"{equivalency.codes[b]!r} share a block, so a person can be in two areas and the "
            "areas' measurements would cost twice the budget they are given; measure "
            "overlapping kinds of areas from separate equivalency files, each with its own share"
        )


def area_plan(
    schema: Schema, rho: Fraction | float, queries: Sequence[str] = ("total",)
) -> list[tuple[ProductQuery, DiscreteGaussian]]:
    """The areas' (query, law) pairs: ``rho`` split equally over ``queries``, each measured
    with discrete Gaussian noise of ``σ² = Δ₂²/(2ρ_q)`` exactly (the areas are disjoint, so
    ``Δ₂`` is the query's sensitivity on one histogram).

    Raises
    ------
    SpecError
        ``rho`` not positive, no query, a query named twice or not of the schema.
    """
    rho = Fraction(rho).limit_denominator(10**12) if isinstance(rho, float) else Fraction(rho)
    if not rho > 0:
        raise SpecError(f"the areas' ρ must be positive, got {float(rho):g}")
    if not queries or len(set(queries)) != len(queries):
        raise SpecError(f"give the areas' queries once each, got {list(queries)}")
    share = rho / len(queries)
    out = []
    for text in queries:
        q = ProductQuery.parse(schema, text)
        out.append((q, DiscreteGaussian.from_sigma2(Fraction(q.l1_sensitivity) / (2 * share))))
    return out


def measure_areas(
    equivalency: Equivalency,
    leaf_counts: np.ndarray,
    plan: Sequence[tuple[ProductQuery, DiscreteGaussian]],
    rng: KeyedRNG,
) -> list[ProductMeasurement]:
    """Noisy answers of every area to every query of ``plan``.

    ``leaf_counts`` are the confidential leaf histograms ``(n_leaves, *schema.shape)``
    (integers). The noise of query ``q`` comes from ``rng``'s stream
    ``measure/<areas name>/<q>``, keyed by area index (:func:`measure_products`), so an
    area's noise does not depend on the others'. Returns one
    :class:`~censusdp.mechanisms.product_measure.ProductMeasurement` per query with
    ``level`` the areas' name and values ``(n_areas, n_rows)``.
    """
    check_disjoint(equivalency)
    sums = equivalency.sum_leaves(np.asarray(leaf_counts))
    return measure_products(
        [sums], [(0, q, law) for q, law in plan], rng, level_names=[equivalency.name]
    )


def area_statement(
    level_names: Sequence[str],
    tree_plan: Sequence[tuple],
    area_name: str,
    plan: Sequence[tuple[ProductQuery, DiscreteGaussian]],
    invariants: Sequence = (),
    *,
    delta: float | None = None,
) -> PrivacyStatement:
    """The one privacy statement of the tree's measurements and the areas', derived from
    their sensitivities (:func:`~censusdp.mechanisms.privacy.derive_statement`; the areas
    compose like one more level: a person is in at most one area).

    ``tree_plan`` holds ``(level name or index, query, law)``; ``invariants`` as for
    ``derive_statement``.
    """
    names = [*level_names, area_name]
    items = [
        (names.index(lv) if isinstance(lv, str) else int(lv), q, law) for lv, q, law in tree_plan
    ]
    items += [(len(names) - 1, q, law) for q, law in plan]
    return derive_statement(names, items, invariants, delta=delta)


@dataclass(frozen=True, eq=False)
class MeasuredAreas:
    """The tree GLS updated with the areas' measurements.

    Attributes
    ----------
    release : StructuredRelease
        Every level's updated estimates and exact covariances (consistent, invariants held);
        its privacy statement composes the areas' spend.
    areas : AreaEstimates
        The areas: sums of the updated leaves, with their exact covariances.
    prior_areas : AreaEstimates
        The areas before the update (sums of the tree GLS's leaves): what measuring them
        gained is the drop of their standard errors.
    diagnostics : dict
        Per block the update's rank (``n_areas · r_S``).
    """

    release: StructuredRelease
    areas: AreaEstimates
    prior_areas: AreaEstimates
    diagnostics: dict


def _area_information(
    setup: StructuredSetup, measurements: Sequence[ProductMeasurement], n_areas: int
) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Per block the areas' information matrix ``Σ_q τ² G_{q,S}/σ_q²`` (scaled units,
    block coordinates), and the information vectors ``τ Σ_q Tᵀ Q_qᵀ y_q/σ_q²`` in basis
    coordinates ``(n_areas, *basis.shape)``."""
    basis, tau = setup.basis, setup.tau
    info = {m: np.zeros((basis.block_size(m),) * 2) for m in basis.subsets}
    vec = np.zeros((n_areas, *basis.shape))
    for m in measurements:
        if m.query.schema is not setup.schema:
            raise SpecError(
                f"area query {m.query.name!r} is over another schema than {setup.schema.name!r}"
            )
        var = float(m.law.variance)
        try:
            g = basis.gram(m.query, weight=tau**2 / var)
        except SpecError as err:
            raise SpecError(
                f"area query {m.query.name!r}: {err}; measure it at some level of the tree too "
                "(or measure the areas with a query of the tree's workload, e.g. total)"
            ) from None
        for mask, blk in g.blocks.items():
            info[mask] = info[mask] + blk
        vals = np.asarray(m.values, np.float64)
        if vals.shape != (n_areas, m.query.n_rows):
            raise SpecError(
                f"area query {m.query.name!r}: values have shape {vals.shape}, expected "
                f"({n_areas}, {m.query.n_rows})"
            )
        add_adjoint(basis, m.query, vals * (tau / var), vec)
    return info, vec


def _whitening(setup: StructuredSetup, mask: int, info: np.ndarray) -> np.ndarray:
    """Rows ``R`` (r × k_S, identified coordinates) with ``RᵀR`` the areas' information.

    Raises
    ------
    SpecError
        The areas measure a combination of cells that no tree measurement or invariant
        identifies (it would change what the release identifies).
    """
    V = setup.V[mask]
    if V is not None:
        out = info - V @ (V.T @ info @ V) @ V.T
        if np.abs(out).max(initial=0.0) > 1e-9 * max(np.abs(info).max(initial=0.0), 1e-300):
            raise SpecError(
                "the areas' queries measure a combination of cells that no level of the tree "
                "measures; measure it in the tree too, or measure the areas with a query of the "
                "tree's workload (e.g. total)"
            )
        info = V.T @ info @ V
    ev, U = np.linalg.eigh(0.5 * (info + info.T))
    keep = ev > _RTOL * max(float(ev.max(initial=0.0)), 1e-300)
    return (U[:, keep] * np.sqrt(ev[keep])).T


def _identified(setup: StructuredSetup, mask: int, coef: np.ndarray) -> np.ndarray:
    """Block ``mask`` of coefficient tensors ``(n, *shape)`` in scaled identified
    coordinates ``(n, mult_S, k_S)``."""
    z = gather_block(setup.basis, coef, mask)
    V = setup.V[mask]
    return (z if V is None else z @ V) / setup.tau


def update_with_areas(
    release: StructuredRelease,
    equivalency: Equivalency,
    measurements: Sequence[ProductMeasurement],
    privacy: PrivacyStatement,
) -> MeasuredAreas:
    """The GLS of the tree's measurements and the areas' measurements together, exactly.

    Parameters
    ----------
    release : StructuredRelease
        The tree GLS (:func:`~censusdp.estimation.gls.structured.structured_gls`, weighted
        geometry; it keeps its setup).
    equivalency : Equivalency
        The areas, read against ``release.hierarchy`` (disjoint).
    measurements : sequence of ProductMeasurement
        The areas' noisy answers (:func:`measure_areas`), values ``(n_areas, n_rows)``.
    privacy : PrivacyStatement
        The one statement of all the measurements (:func:`area_statement`), checked to cover
        the tree's derived spend plus the areas'.

    Returns
    -------
    MeasuredAreas

    Raises
    ------
    BudgetError
        ``privacy`` claims less than the tree's and the areas' measurements spend.
    SpecError
        A release without setup or covariances (Euclidean geometry with unequal scales),
        an equivalency of another hierarchy or with overlapping areas, area queries outside
        the tree's workload or identified subspace, or measuring at a leaf a combination of
        cells that only levels above the leaves measure (not supported: the passes carry no
        information along such flat directions).
    """
    setup = _weighted_setup(release, equivalency, measurements)
    h = release.hierarchy
    basis, nA = setup.basis, equivalency.n_areas
    info, avec = _area_information(setup, measurements, nA)
    ctx = _UpdateContext(
        setup=setup,
        equivalency=equivalency,
        forest=whole_forest(h),
        leaf=np.asarray(equivalency.leaf),
        area=np.asarray(equivalency.area),
        coefs=[basis.to_basis(e) for e in release.estimates],
        avec=avec,
        root=h.names[0],
        depth=h.depth,
    )
    smoothed: dict = {}
    prior_area: dict[int, np.ndarray] = {}
    post_area: dict[int, np.ndarray] = {}
    ranks: dict[str, int] = {}
    for mask in basis.subsets:
        smoothed[mask], prior_area[mask], post_area[mask], rank = _update_block(ctx, mask, info)
        if rank is not None:
            ranks[_label(setup, mask)] = rank
    estimates, covariances = structured_output(setup, smoothed, range(h.depth), h.sizes)
    stmt = _check_privacy(release, equivalency.name, measurements, privacy)
    updated = dataclasses.replace(
        release,
        estimates=tuple(estimates),
        covariances=tuple(covariances),
        privacy=stmt,
        diagnostics={**release.diagnostics, "area_update_rank": ranks},
        _rows={},
        setup=None,  # its covariance passes are the tree's alone: not this release's
    )
    post = equivalency.sum_leaves(estimates[-1])
    prior = equivalency.sum_leaves(release.estimates[-1])
    return MeasuredAreas(
        release=updated,
        areas=_area_estimates(release, equivalency, basis, stmt, post, post_area),
        prior_areas=_area_estimates(release, equivalency, basis, stmt, prior, prior_area),
        diagnostics={"update_rank": ranks},
    )


def _weighted_setup(
    release: StructuredRelease,
    equivalency: Equivalency,
    measurements: Sequence[ProductMeasurement],
) -> StructuredSetup:
    """The release's weighted setup, once the areas are checked to be of its hierarchy,
    measured and disjoint."""
    setup = release.setup
    if setup is None or setup.vscale is None or setup.geometry != "weighted":
        raise SpecError(
            "measured areas update the weighted tree GLS (its covariance is needed); build the "
            "release with structured_gls(..., geometry='weighted')"
        )
    h = release.hierarchy
    if equivalency.n_leaves != h.leaves.size:
        raise SpecError(
            f"{equivalency.source}: the equivalency was read for {equivalency.n_leaves} leaves, "
            f"the release's hierarchy has {h.leaves.size}; read it against this hierarchy"
        )
    if not measurements:
        raise SpecError("no area measurements to update the release with")
    check_disjoint(equivalency)
    return setup


@dataclass(frozen=True, eq=False)
class _UpdateContext:
    """What every block's update reads: the tree's setup and forest, the areas (leaf →
    area pairs), the tree estimates' basis coefficients and the areas' answers."""

    setup: StructuredSetup
    equivalency: Equivalency
    forest: Forest
    leaf: np.ndarray
    area: np.ndarray
    coefs: list[np.ndarray]
    avec: np.ndarray
    root: str
    depth: int


def _update_block(
    ctx: _UpdateContext, mask: int, info: dict[int, np.ndarray]
) -> tuple[tuple | None, np.ndarray, np.ndarray, int | None]:
    """Block ``mask`` conditioned on the areas' answers (a rank-``m`` update of the tree
    GLS): its smoothed (estimates, covariances) per level, the areas' covariances before
    and after, and ``m`` (None when the areas measure nothing of the block)."""
    setup, equivalency = ctx.setup, ctx.equivalency
    nA, D = equivalency.n_areas, ctx.depth
    kS, nS = setup.k(mask), setup.basis.block_size(mask)
    if kS == 0:
        empty = np.zeros((nA, nS, nS))
        return None, empty, empty, None
    R = _whitening(setup, mask, info[mask])
    r, m = R.shape[0], nA * R.shape[0]
    zhat = [_identified(setup, mask, c) for c in ctx.coefs]
    try:
        X, P, ups = _columns(setup, mask, ctx.forest, ctx.leaf, ctx.area, nA, R)
        P0 = root_start(ups, kS, ctx.root)[1]
        cov_a = area_sweep(ctx.forest, ups, kS, ctx.leaf, ctx.area, nA, P0)
    except SpecError as err:
        raise block_error(setup.schema, mask, err) from None
    prior = _cells(setup, mask, cov_a)
    if r == 0:  # the areas measure nothing of this block: it is unchanged
        return (zhat, P), prior, prior, None
    Xa = equivalency.sum_leaves(X[-1])  # (nA, m, k): Cov(s_α, B e)ᵀ
    K = np.einsum("amk,ik->aim", Xa, R).reshape(m, m) + np.eye(m)
    L = np.linalg.cholesky(0.5 * (K + K.T))
    # the whitened answers ỹ = (R⁺)ᵀ h (Rᵀỹ = h, Cov ỹ = I), per copy, and residuals
    ytil = _identified(setup, mask, ctx.avec) * setup.tau @ np.linalg.pinv(R)
    s_hat = equivalency.sum_leaves(zhat[-1])  # (nA, C, k)
    resid = (ytil - s_hat @ R.T).transpose(0, 2, 1).reshape(m, -1)  # (m, C)
    w = scipy.linalg.cho_solve((L, True), resid)
    new_z, new_P = [], []
    for j in range(D):
        Z = scipy.linalg.solve_triangular(L, X[j].transpose(1, 0, 2).reshape(m, -1), lower=True)
        Z = Z.reshape(m, -1, kS)
        new_z.append(zhat[j] + np.einsum("nmk,mc->nck", X[j], w))
        new_P.append(P[j] - np.einsum("mnk,mnl->nkl", Z, Z))
    Za = scipy.linalg.solve_triangular(L, Xa.transpose(1, 0, 2).reshape(m, -1), lower=True)
    Za = Za.reshape(m, nA, kS)
    post = cov_a - np.einsum("mak,mal->akl", Za, Za)
    return (new_z, new_P), prior, _cells(setup, mask, post), m


def _area_estimates(
    release: StructuredRelease,
    equivalency: Equivalency,
    basis: MarginalBasis,
    stmt: PrivacyStatement,
    est: np.ndarray,
    cov: dict[int, np.ndarray],
) -> AreaEstimates:
    """The areas' estimates ``est`` with their covariance blocks ``cov``."""
    return AreaEstimates(
        name=equivalency.name,
        codes=equivalency.codes,
        leaves=equivalency.leaves_per_area(),
        schema=release.schema,
        basis=basis,
        estimates=(est,),
        covariances=(BlockDiagonal(basis, cov),),
        identified=release.identified,
        privacy=stmt,
    )


def _columns(
    setup: StructuredSetup,
    mask: int,
    forest,
    leaf: np.ndarray,
    area: np.ndarray,
    n_areas: int,
    R: np.ndarray,
) -> tuple[list[np.ndarray], list[np.ndarray], list]:
    """``X_v = (Σ Bᵀ)_v`` per level ``(n, n_areas · r, k_S)`` by one tree solve whose leaf
    information vectors are ``Bᵀ``'s columns (zero measurements and invariant values
    elsewhere: the solve's map from information to estimate is the constrained covariance
    ``Σ``), the smoothed covariances ``P_v`` and the upward pass (scaled units)."""
    h = setup.hierarchy
    kS, r = setup.k(mask), R.shape[0]
    m = n_areas * r
    levels = covariance_levels(setup, mask, 0, h.sizes)
    rhs = []
    for j, lv in enumerate(levels if m else ()):
        n = lv.h.shape[0]
        hj = np.zeros((n, m, kS))
        if j == h.depth - 1:
            cols = area[:, None] * r + np.arange(r)[None, :]  # column of (α, i)
            hj[leaf[:, None], cols] = R[None, :, :]
        rhs.append(LevelInputs(lv.J, hj, lv.H, np.zeros((n, m, lv.H.shape[0])), lv.shared))
    ups = general_up(forest, rhs if m else levels, kS, None)
    bottom = ups[-1]
    if m and bottom.N is not None and np.any(bottom.r):
        # the passes carry no information along a node's flat directions (measured only
        # above it); an area answer there would need to be moved up the tree first
        off = np.abs(R @ bottom.N[leaf]).max(axis=(1, 2))
        bad = off > 1e-9 * max(float(np.abs(R).max()), 1e-300)
        if bad.any():
            lf = int(leaf[np.argmax(bad)])
            raise SpecError(
                f"the areas' queries measure, at {h.names[-1]} {h.levels[-1].codes[lf]!r}, "
                f"a combination of cells that level does not measure (only levels above it "
                f"do); measure the areas with queries the {h.names[-1]} level measures (e.g. "
                "total)"
            )
    P0 = root_start(ups, kS, h.names[0])[1]
    X, P = general_down(forest, ups, kS, ups[0].m, P0)
    return X, P, ups


def _cells(setup: StructuredSetup, mask: int, cov: np.ndarray) -> np.ndarray:
    V = setup.V[mask]
    assert setup.vscale is not None
    return (cov if V is None else V @ cov @ V.T) * setup.vscale


def _label(setup: StructuredSetup, mask: int) -> str:
    names = [a.name for i, a in enumerate(setup.schema.attributes) if mask >> i & 1]
    return "{" + ", ".join(names) + "}"


def _check_privacy(
    release: StructuredRelease,
    name: str,
    measurements: Sequence[ProductMeasurement],
    privacy: PrivacyStatement,
) -> PrivacyStatement:
    """``privacy`` when it covers the tree's derived spend plus the areas' (the areas'
    derived from their sensitivities, a person being in at most one area).

    Raises
    ------
    BudgetError
        The statement claims less than the measurements spend.
    """
    areas = derive_statement([name], [(0, m.query, m.law) for m in measurements])
    spent = compose([release.privacy.budget, areas.budget])
    if not privacy.budget.covers(spent):
        raise BudgetError(
            f"the privacy statement claims {privacy.budget}, but the tree's measurements "
            f"({release.privacy.budget}) and the {name}s' ({areas.budget}) spend {spent}; "
            "pass the statement of area_statement(...)"
        )
    return privacy
