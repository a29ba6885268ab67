"""``censusdp privatize UNITS.csv --spec SPEC -o OUTDIR``: the H1 table (occupancy status).

The route of ``privatize`` for the PPMF *units* file (one row per housing unit or
group-quarters facility; :func:`~censusdp.pipelines.io.ppmf.read_ppmf_units`), chosen when the
spec says ``[data] source = "ppmf_units"`` or the input's header has ``HH_STATUS``. It releases
the 2020 redistricting table H1 for every level of nation → state → county → tract → block
group → block:

* ``H1_001N`` housing units — **invariant** (exact) at every block, as in 2020 (the
  production units run held ``tot_hu`` of every block), hence at every level;
* ``H1_002N`` occupied and ``H1_003N`` vacant — from the Bureau's production units strategy
  (``DetailedOnly``: the two-cell histogram measured at every geounit, discrete Gaussian,
  the level shares of ``configs/production/pl94/unit_US.ini``; :file:`censusdp/schemas/h1.toml`),
  scaled to the spec's ρ.

**Estimation, and why it is exact.** With the total ``t_v`` of every node known, the only
free coordinate of a node's histogram is its occupied count ``o_v`` (vacant ``t_v − o_v``).
The detailed measurements ``y_v = (o_v + e₁, t_v − o_v + e₂)`` with independent noises of
variances ``σ₁², σ₂²`` are then two measurements of ``o_v`` — ``y_{v,1}`` and ``t_v − y_{v,2}`` —
and the GLS objective over consistent, invariant-respecting tables,
``Σ_v (y_{v,1} − o_v)²/σ₁² + (y_{v,2} − t_v + o_v)²/σ₂²``, is (up to a constant) the
one-cell tree GLS of ``o`` with measurements ``m_v = (y_{v,1}/σ₁² + (t_v − y_{v,2})/σ₂²) /
(1/σ₁² + 1/σ₂²)`` of variance ``1/(1/σ₁² + 1/σ₂²)`` (Hay et al. 2010). The estimate is computed
by :func:`~censusdp.estimation.gls.tree.tree_gls` on the two-cell problem with the block totals
as invariants, which is that GLS exactly; its variances are exact, and the
vacant estimate ``t_v − ô_v`` has the same variance (a node's total has none).

**Rounding.** The occupied leaf estimates are rounded by the unbiased dependent (pipage)
rounding of the tree's laminar family (:func:`~censusdp.estimation.integer.laminar.round_tree`, one
cell): every node's occupied count is ``⌊ô_v⌋`` or ``⌈ô_v⌉``, children sum to their parent,
``E[rounded] = ô``. Vacant is ``t_v − rounded occupied``: an integer, within
``⌊t_v − ô_v⌋``/``⌈t_v − ô_v⌉`` (``t_v`` is an integer), unbiased, and consistent over the tree
because both ``t`` and the rounded occupied are. So ``H1_001N = H1_002N + H1_003N`` and the
invariant hold with ``==`` at every node. This product is unbiased, not non-negative: a node
with few units (even none: the total fixes occupied + vacant, not each) can show a negative
occupied or vacant count, as the persons route's unbiased product can.

**Standard errors** cover everything between the truth and the released count. Given the
estimate ``ô_v``, the rounded count is ``⌊ô_v⌋ + B`` with ``B`` Bernoulli of mean ``ψ_v = ô_v −
⌊ô_v⌋``, so the rounding error has mean zero and the exact variance ``ψ_v(1 − ψ_v)`` (at most
1/4; :func:`~censusdp.estimation.integer.laminar.round_tree`'s own variances of each node's sum).
Mean zero given ``ô`` makes it uncorrelated with the GLS error ``ô − o``, so the two add:
``H1_002N_se = H1_003N_se = sqrt(Var_GLS(ô_v) + ψ_v(1 − ψ_v))``, both terms exact (no replicates
are needed here, unlike the persons route's flow rounding). ``H1_001N`` is held by the block
invariant (summed up the tree), so its value is the exact count and its ``_se`` and ``_moe``
are exactly 0.

**The non-negative product** (``nonnegative/h1_<level>.csv``; :func:`nonnegative_occupied`)
is made from the same GLS estimates (post-processing when the blocks are public: see
:func:`units_products`) top down:
per parent, the children's occupied estimates projected onto ``{0 ≤ o_i ≤ T_i, Σ o_i = O}``
(``T_i`` the child's exact housing units, ``O`` the parent's integer occupied; a capped
simplex, :mod:`censusdp.estimation.integer.capped_simplex`), then rounded keeping ``O`` and the box;
vacant ``= T_i − o_i ≥ 0``. It is labelled biased and has no standard errors; the
size-class report (:mod:`censusdp.pipelines.size_class_report`) gives both products'
errors in occupied units by size class (housing units) and its bias, simulated from the
released non-negative block counts.

**What is refused.** Other queries, other invariants, noise laws other than the discrete
Gaussian: a :class:`~censusdp.errors.SpecError` (the reduction above is what is exact and
tested). The hierarchy must be public (``[hierarchy] blocks``, or ``--blocks-from-data`` to
accept that the set of blocks with a housing unit is disclosed — which the block invariant
discloses anyway for blocks with units).

**Privacy.** The statement is derived from the measurements (ρ-zCDP, one housing unit added
or removed) with the block totals named: *induced subspace DP* (Gao, Gong & Yu 2022), never
plain DP. When the persons file of the same census is released too, the two compose:
``--compose-with DIR`` (a persons release of ``privatize``) writes one statement for both,
ρ = ρ_persons + ρ_units (Bun & Steinke 2016, Lemma 2.3), the invariants of both named —
assuming, as the Bureau's accounting did, that a respondent's record in each file is one
record of that file's unit.

A units spec::

    [data]
    source = "ppmf_units"
    [privacy]
    accounting = "zcdp"
    rho = 0.075               # optional: default the production units run's 11417641/152349649
    delta = 1e-10             # optional: also report (ε, δ)
    [mechanism]
    noise = "discrete_gaussian"
    [hierarchy]
    blocks = "blocks.csv"     # the public list of every block
    block_column = "GEOID20"  # optional
    [run]
    seed = 1                  # reproducible mode, tests only

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2.
U.S. Census Bureau (2021). Certificate of Disclosure Avoidance, P.L. 94-171 Redistricting
    Data US Units (DAS_2020_Redistricting_Production_Code, docs/certificates): ρ, level
    shares, strategy DetailedOnly, block invariant ``tot_hu``.
Hay, M., Rastogi, V., Miklau, G. & Suciu, D. (2010). Boosting the accuracy of
    differentially private histograms through consistency. PVLDB 3(1).
Gao, J., Gong, R. & Yu, F.-Y. (2022). Subspace Differential Privacy. AAAI.
Bun, M. & Steinke, T. (2016). Concentrated differential privacy. TCC.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd

from censusdp.atomic import check_output, output_dir
from censusdp.budget import Accounting, PrivacyStatement, Product, Step, with_products
from censusdp.errors import SpecError
from censusdp.estimation.covariance import NodeCovariance
from censusdp.estimation.gls.predict import allocation_plan
from censusdp.estimation.gls.tree import tree_gls
from censusdp.estimation.integer.capped_simplex import project_capped_simplex
from censusdp.estimation.integer.controlled import round_children
from censusdp.estimation.integer.laminar import TOL, round_tree, uniform_draws
from censusdp.estimation.release import LevelRelease
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.forest import whole_forest
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.pipelines.io.outputs import (
    OUTPUT_COLUMNS_NOTE,
    SIZE_CLASS_FILES,
    DictionaryEntry,
    code_entries,
    estimate_entries,
    long_entries,
    long_table,
    parent_codes,
    wide_table,
    write_data_dictionary,
    write_release_texts,
    written_errors,
)
from censusdp.pipelines.io.ppmf import LEVELS, PPMFHistogram, read_block_list, read_ppmf_units
from censusdp.pipelines.products.ppmf_persons import REPORT_LEVELS
from censusdp.pipelines.release_statement import (
    VerifiedRelease,
    change_factor,
    exact_through_invariants,
    refuse_output_in,
    verify_release,
)
from censusdp.pipelines.runner import separate_evaluation
from censusdp.pipelines.size_class_report import (
    PRODUCTS,
    evaluate_size_classes,
    simulate_size_classes,
    write_size_class_report,
)
from censusdp.pipelines.spec import ProductKeys, ProductSpec, load_product_spec
from censusdp.progress import progress_bar
from censusdp.rng import KeyedRNG
from censusdp.schema import Allocation, Schema
from censusdp.spreadsheet import write_csv
from censusdp.timing import CPU_PREFIX, stage

log = logging.getLogger(__name__)

__all__ = [
    "H1_COLUMNS",
    "H1Release",
    "compose_statements",
    "h1_frames",
    "load_units_spec",
    "nonnegative_occupied",
    "privatize_units",
    "release_h1",
    "units_products",
]

#: The H1 columns (NHGIS names) and labels: total (invariant), occupied, vacant.
H1_COLUMNS = ("H1_001N", "H1_002N", "H1_003N")
H1_LABELS = ("Total housing units", "Occupied", "Vacant")
#: The cells of the ``h1`` schema, in its order.
CELLS = ("occupied", "vacant")
#: The level whose totals are invariant (2020: ``tot_hu`` of every block).
INVARIANT_LEVEL = "block"
#: How the non-negative product is labelled wherever it is written.
NONNEGATIVE_NOTE = (
    "non-negative product: every count a non-negative integer, occupied + vacant = the "
    "housing units (invariant) and children summing to their parent at every level, made "
    "from the same GLS estimates as the unbiased product (what that makes it, privacy-wise, "
    "privacy.md says); it is BIASED (occupied is pulled towards the middle of [0, housing units] "
    "where the estimate leaves that range) and has no standard errors: use the unbiased "
    "product, with its standard errors, for estimates and intervals"
)


#: What the units route's spec says about itself (:func:`load_units_spec`).
UNITS_KEYS = ProductKeys(
    source="ppmf_units",
    reads="a PPMF units file (RTYPE, HH_STATUS)",
    strategy="h1",
    levels=LEVELS,
)


def load_units_spec(path: str | Path) -> ProductSpec:
    """Read a units privatize spec (module docstring): the keys every PPMF route shares
    (:func:`~censusdp.pipelines.spec.load_product_spec`) and no other.

    Raises
    ------
    SpecError
        Naming the file and the dotted key; anything but the H1 production strategy with
        its block invariant (other keys, another noise law) is refused.
    """
    return load_product_spec(path, UNITS_KEYS)[2]


# -- the release ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class H1Release:
    """H1 for every level of the block hierarchy: both products of one set of measurements.

    Attributes
    ----------
    hierarchy : Hierarchy
    counts : list of numpy.ndarray
        Per level (root first), int64 ``(n_nodes, 3)``: ``H1_001N`` (the invariant),
        ``H1_002N`` (occupied, unbiased rounding), ``H1_003N`` (vacant = total − occupied).
    estimates : list of numpy.ndarray
        Per level, float ``(n_nodes, 2)``: the GLS estimates of occupied and vacant.
    standard_errors : list of numpy.ndarray
        Per level, float ``(n_nodes, 3)``: the standard error of each released column,
        ``sqrt(GLS variance + rounding variance)``, both exact (module docstring,
        "Standard errors"); exactly 0 for the invariant total; occupied and vacant share one.
    privacy : PrivacyStatement
    nonnegative : list of numpy.ndarray
        Per level, int64 ``(n_nodes, 3)``: the non-negative product
        (:func:`nonnegative_occupied`), same columns; biased, no standard errors.
    gls_standard_errors : list of numpy.ndarray
        Per level, float ``(n_nodes,)``: the GLS standard error of occupied (and vacant)
        alone, the error of the real-valued estimate before rounding.
    release : LevelRelease
        The unbiased product as a member of the release family (``conf_int``, ``summary``,
        ``to_frame``... over the columns ``H1_001N ...`` and :attr:`standard_errors`).
    """

    hierarchy: Hierarchy
    counts: list[np.ndarray]
    estimates: list[np.ndarray]
    standard_errors: list[np.ndarray]
    privacy: PrivacyStatement
    nonnegative: list[np.ndarray]
    gls_standard_errors: list[np.ndarray]

    @functools.cached_property
    def release(self) -> LevelRelease:
        h = self.hierarchy
        return LevelRelease(
            "unbiased",
            tuple(h.names),
            tuple(lv.codes for lv in h.levels),
            H1_COLUMNS,
            tuple(self.counts),
            NodeCovariance.from_standard_errors(self.standard_errors),
            self.privacy,
            integer=True,
        )


def nonnegative_occupied(
    h: Hierarchy,
    occupied: list[np.ndarray],
    totals: list[np.ndarray],
    rng: KeyedRNG,
    *,
    label: str = "nonnegative/h1",
) -> list[np.ndarray]:
    """The non-negative product's occupied counts, top down from the GLS estimates.

    The root's estimate is clipped to ``[0, T]`` and rounded to ⌊·⌋ or ⌈·⌉ with mean the
    clipped value. Below, per parent, the children's estimates are projected in Euclidean
    norm onto ``{0 ≤ o_i ≤ T_i, Σ_i o_i = O}`` (``T_i`` the child's exact housing units, ``O``
    the parent's integer occupied; :func:`~censusdp.estimation.integer.capped_simplex.project_capped_simplex`),
    the least-squares step of TopDown (Abowd et al. 2022) for one cell with the box of the
    block invariant. The projected values are rounded by conditioned systematic sampling
    (Madow 1949; :func:`~censusdp.estimation.integer.controlled.round_children`) of their
    fractional parts: each child gets ``⌊o_i⌋`` plus 0 or 1, the group exactly its parent's
    integer. A child gains a unit only when its fraction is positive, i.e. ``⌊o_i⌋ < o_i ≤
    T_i``, so ``0 ≤ rounded ≤ T_i`` holds exactly (not up to float resolution), and vacant
    ``T_i − rounded`` is a non-negative integer.

    Parameters
    ----------
    h : Hierarchy
    occupied : list of (n_nodes,) float
        Per level, the GLS estimates of occupied.
    totals : list of (n_nodes,) int
        Per level, the exact housing units (the invariant, summed up the tree).
    rng : KeyedRNG
        Uniforms from ``<label>/<level>``, one per parent node.
    label : str

    Returns
    -------
    list of (n_nodes,) int64
        Occupied per level, ``0 ≤ · ≤ totals``, children summing to their parent.

    References
    ----------
    Abowd, J. M. et al. (2022); Kiwiel (2008); Wang & Lu (2015); Madow, W. G. (1949). On the
    theory of systematic sampling, II. Ann. Math. Stat. 20(3).
    """
    forest = whole_forest(h)
    root = np.clip(np.asarray(occupied[0], np.float64), 0.0, totals[0])
    v = rng.draw(f"{label}/{h.names[0]}", 1, 0, 1, uniform_draws)[:, 0]
    parent = (np.floor(root) + (v < root - np.floor(root))).astype(np.int64)
    out = [parent]
    for j in range(1, h.depth):
        name, count = h.names[j], h.levels[j - 1].child_count
        proj = project_capped_simplex(
            occupied[j], totals[j], parent, count, what=f"the occupied counts of level {name!r}"
        )
        floor = np.floor(proj)
        grp = np.repeat(np.arange(parent.size), count)
        need = parent - np.bincount(grp, weights=floor, minlength=parent.size).astype(np.int64)
        v = rng.draw(f"{label}/{name}", parent.size, 0, parent.size, uniform_draws)
        up, _ = round_children(
            need[:, None], (proj - floor)[:, None], count, v.reshape(-1, 1), None,
            (label, forest, j - 1, ("occupied",)), TOL,
        )  # fmt: skip
        parent = floor.astype(np.int64) + up[:, 0]
        out.append(parent)
    return out


def release_h1(
    hist: PPMFHistogram,
    rng: KeyedRNG,
    *,
    rho: Fraction | None = None,
    allocation: Allocation | None = None,
) -> H1Release:
    """Measure, estimate and round H1 on ``hist``'s hierarchy: both products (module
    docstring).

    Parameters
    ----------
    hist : PPMFHistogram
        A units file read by :func:`~censusdp.pipelines.io.ppmf.read_ppmf_units` (``h1``).
    rng : KeyedRNG
        Noise from its ``measure/<level>/detailed`` streams, rounding from ``rounding/h1``
        and ``nonnegative/h1/<level>``.
    rho : Fraction, optional
        Total ρ (default: the allocation's).
    allocation : Allocation, optional
        Level shares of the ``h1`` strategy (default: the production units run's,
        :file:`censusdp/schemas/h1.toml`).

    Raises
    ------
    SpecError
        A histogram that is not ``h1``, or a hierarchy without a ``block`` level.

    References
    ----------
    Hay et al. (2010); Abowd et al. (2022); the module docstring's reduction.
    """
    schema = hist.schema
    if schema.name != "h1":
        raise SpecError(
            f"{hist.path.name}: H1 is released from a units file (schema h1), not a "
            f"{schema.name!r} histogram; read it with read_ppmf_units"
        )
    h = hist.hierarchy
    if INVARIANT_LEVEL not in h.names:
        raise SpecError(
            f"the hierarchy {list(h.names)} has no level {INVARIANT_LEVEL!r}; the H1 total is "
            "held at every block"
        )
    return _release(h, schema, hist.dense().reshape(-1, schema.n_cells), rng, rho, allocation)


def _release(
    h: Hierarchy,
    schema: Schema,
    leaf: np.ndarray,
    rng: KeyedRNG,
    rho: Fraction | None,
    allocation: Allocation | None = None,
) -> H1Release:
    """Both products from the leaf (occupied, vacant) counts ``leaf``: the release itself,
    and each replicate of the size-class simulation (from the released counts)."""
    alloc = schema.allocation if allocation is None else allocation
    if alloc is None:  # pragma: no cover - h1 ships one
        raise SpecError("the h1 schema has no [allocation]")
    if rho is not None:
        alloc = dataclasses.replace(alloc, rho=rho)
    query = Query.detailed(CELLS)
    plan = [
        (h.level_index(lvl), query, law) for lvl, _, law in allocation_plan(schema, alloc, h.names)
    ]
    level_counts = h.aggregate(leaf)
    meas = measure(h.names, level_counts, plan, rng)
    inv = invariant(level_counts, h.level_index(INVARIANT_LEVEL), Query.total(CELLS))
    gls = tree_gls(h, CELLS, meas, [inv])
    occupied, rounding_var = round_tree(
        h, gls.estimates[-1][:, :1], rng, mode="cells", label="rounding/h1", with_variances=True
    )
    totals = [c.sum(axis=1) for c in level_counts]
    nonneg = nonnegative_occupied(h, [e[:, 0] for e in gls.estimates], totals, rng)
    counts, ses, gls_ses, nn = [], [], [], []
    for k, total in enumerate(totals):
        occ = occupied[k][:, 0]
        counts.append(np.stack([total, occ, total - occ], axis=1))
        nn.append(np.stack([total, nonneg[k], total - nonneg[k]], axis=1))
        gls_var = np.maximum(gls.variances[k][:, 0], 0.0)
        gls_ses.append(np.sqrt(gls_var))
        # the rounding's exact variance ψ(1 − ψ) of the node's occupied count (its only
        # tracked sum); vacant = total − occupied has the same; the total is the invariant's
        se = np.sqrt(gls_var + rounding_var[k][:, 0])
        ses.append(np.stack([np.zeros_like(se), se, se], axis=1))
    return H1Release(h, counts, list(gls.estimates), ses, gls.privacy, nn, gls_ses)


def h1_frames(
    release: H1Release, product: str = "unbiased"
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """The wide tables (per level: ``GEOID``, the ancestors' codes ``state_GEOID`` ...,
    ``H1_001N``, ``H1_001N_se``, ``H1_001N_moe``, ...) and the long table (level, GEOID, the
    ancestors' codes, table, column, label, value, se, moe) of every level, of one product:
    ``"unbiased"`` (with ``_se`` to six significant digits and ``_moe``, the integer 90%
    margin of error of an integer release, :func:`~censusdp.pipelines.io.outputs.lattice_moe`)
    or ``"nonnegative"`` (no standard errors: no ``_se``/``_moe`` columns, no ``se``/``moe``).
    """
    h = release.hierarchy
    unbiased = product == "unbiased"
    counts = release.counts if unbiased else release.nonnegative
    every_parent = list(parent_codes(h, h.depth - 1, 0, 0))
    labels = {"table": ["H1"] * len(H1_COLUMNS), "column": H1_COLUMNS, "label": H1_LABELS}
    wide: dict[str, pd.DataFrame] = {}
    longs = []
    for k, name in enumerate(h.names):
        codes = np.asarray(h.levels[k].codes, dtype=object)
        parents = parent_codes(h, k)
        values = counts[k]
        errors = written_errors(release.standard_errors[k], integer=True) if unbiased else None
        wide[name] = wide_table({"GEOID": codes, **parents}, H1_COLUMNS, values, errors)
        ids = {"GEOID": codes, **{p: parents.get(p) for p in every_parent}}
        longs.append(long_table(name, ids, values, errors, labels=labels))
    return wide, pd.concat(longs, ignore_index=True)


def h1_dictionary(parents: Sequence[str], *, with_se: bool) -> list[DictionaryEntry]:
    """What every column of :func:`h1_frames`' tables is (``data_dictionary.csv``)."""
    out = code_entries("GEOID", parents)
    out += estimate_entries(
        H1_COLUMNS, ["H1"] * len(H1_COLUMNS), H1_LABELS, unit="housing units", integer=True,
        with_se=with_se,
    )  # fmt: skip
    errors = ("its standard error", "its integer 90% margin of error") if with_se else None
    return out + long_entries("h1_long.csv", "housing units", "H1", "H1_001N", errors)


def _occupied(release: H1Release, levels) -> dict[str, dict[str, np.ndarray]]:
    """Both products' occupied count of every area of ``levels``."""
    h = release.hierarchy
    pick = {"unbiased": release.counts, "nonnegative": release.nonnegative}
    return {p: {lv: pick[p][h.level_index(lv)][:, 1] for lv in levels} for p in PRODUCTS}


def size_class_report(
    release: H1Release,
    schema: Schema,
    rng: KeyedRNG,
    repetitions: int,
    *,
    rho: Fraction | None = None,
    truth: np.ndarray | None = None,
    allocation: Allocation | None = None,
):
    """Both products' occupied-count errors by size class (housing units), simulated from
    the released non-negative block counts as the persons route does
    (:func:`~censusdp.pipelines.size_class_report.simulate_size_classes`): each replicate
    measures that pseudo-truth again with the release's strategy and budget and fresh noise
    (``rng.child("simulation/<r>")``) and makes both products again. Areas are classed by
    their housing units (public: the invariant). Vacant's errors are minus occupied's (the
    total is exact), so occupied's are reported.

    ``truth`` (the confidential leaf (occupied, vacant) counts), when given, also returns the
    confidential evaluation (:func:`~censusdp.pipelines.size_class_report.evaluate_size_classes`).

    Returns
    -------
    (simulated, evaluation or None) : pandas.DataFrame
    """
    h = release.hierarchy
    levels = [lv for lv in REPORT_LEVELS if lv in h.names]
    nn = release.nonnegative[-1]
    pseudo_leaf = np.stack([nn[:, 1], nn[:, 2]], axis=1)
    size = {lv: release.counts[h.level_index(lv)][:, 0] for lv in levels}
    pseudo = {lv: release.nonnegative[h.level_index(lv)][:, 1] for lv in levels}

    # closed (on an error too) before the error propagates: it stays the last line
    bar = progress_bar(repetitions, "censusdp size classes", "release")

    def replicate(r: int) -> dict[str, dict[str, np.ndarray]]:
        rel = _release(h, schema, pseudo_leaf, rng.child(f"simulation/{r}"), rho, allocation)
        bar.update()
        return _occupied(rel, levels)

    with bar:
        sim = simulate_size_classes(pseudo, replicate, repetitions, size=size)
    evaluation = None
    if truth is not None:
        occ = h.aggregate(truth)
        ref = {lv: occ[h.level_index(lv)][:, 0] for lv in levels}
        evaluation = evaluate_size_classes(ref, _occupied(release, levels), size=size)
    return sim, evaluation


def compose_statements(
    persons: PrivacyStatement,
    units: PrivacyStatement,
    *,
    persons_label: str = "persons release",
    units_label: str = "this housing-unit release",
) -> PrivacyStatement:
    """One statement for the persons and the units releases of one census: ρ adds (zCDP
    sequential composition, Bun & Steinke 2016, Lemma 2.3), the invariants and exact areas
    of both are named, and so are the two parts (``persons_label``, ``units_label``: for a
    verified folder, :meth:`~censusdp.pipelines.release_statement.VerifiedRelease.label`).

    The privacy unit is a respondent who is one record in each file (one person's record in
    the persons file, one housing unit's in the units file; the note says so): the sum
    bounds that loss, as the Bureau's accounting did.

    Raises
    ------
    SpecError
        A statement that is not ρ-zCDP (pure ε would have to be converted; refused).
    """
    for which, s in (("persons", persons), ("units", units)):
        if s.accounting != Accounting.ZCDP or s.rho is None:
            raise SpecError(
                f"the {which} release's statement is not rho-zCDP; the persons and units "
                "releases compose here only in zCDP"
            )
    assert persons.rho is not None and units.rho is not None
    return PrivacyStatement(
        accounting=Accounting.ZCDP,
        rho=persons.rho + units.rho,
        delta=units.delta if units.delta is not None else persons.delta,
        invariants=tuple(f"persons {i}" for i in persons.invariants)
        + tuple(f"housing units {i}" for i in units.invariants),
        geometry=units.geometry,
        data_dependent=persons.data_dependent or units.data_dependent,
        mechanism=units.mechanism
        if units.mechanism == persons.mechanism
        else f"persons: {persons.mechanism}; housing units: {units.mechanism}",
        unit="respondent",
        exact=tuple(f"persons {x}" for x in persons.exact)
        + tuple(f"housing units {x}" for x in units.exact),
        reveals=tuple(dict.fromkeys(persons.reveals + units.reveals)),
        parts=(f"{persons_label}: {persons.budget}", f"{units_label}: {units.budget}"),
        change_factor=persons.change_factor
        if persons.change_factor == units.change_factor
        else None,
        notes=(
            f"composed: persons rho = {persons.rho:.6g}, housing units rho = {units.rho:.6g} "
            "(zCDP sequential composition); the persons file protects one person's record "
            "and the units file one housing unit's: the sum bounds the loss of a respondent "
            "who is one record in each",
            *persons.notes,
            *units.notes,
        ),
    )


def _persons_release(folder: str | Path, out: str | Path) -> VerifiedRelease:
    """The persons release ``--compose-with`` names, verified (checksums, kind, schema:
    :func:`~censusdp.pipelines.release_statement.verify_release`) and never the output."""
    refuse_output_in(out, folder, option="--compose-with")
    return verify_release(folder, route="ppmf", option="--compose-with")


def units_products(blocks_public: bool) -> tuple[Product, ...]:
    """The H1 release's products and the steps that made each from the measurements (their
    :meth:`~censusdp.budget.Product.wording` is what every file says about them)."""
    hierarchy = (
        Step("blocks from the public block list", ("public",))
        if blocks_public
        else Step(
            "blocks from the units file's own rows (--blocks-from-data)",
            ("confidential",),
            reveals="the set of blocks with at least one housing unit or facility, exactly",
        )
    )
    gls = Step("tree GLS with every block's housing units held", ("measurements", "invariants"))
    return (
        Product(
            "h1_<level>.csv (unbiased)",
            (hierarchy, gls, Step("unbiased tree rounding", ("measurements", "randomness"))),
        ),
        Product(
            "nonnegative/",
            (
                hierarchy,
                gls,
                Step(
                    "top-down capped-simplex projection and rounding of the GLS estimates",
                    ("measurements", "invariants", "randomness"),
                ),
            ),
        ),
        Product(
            "size_classes.*",
            (
                hierarchy,
                Step(
                    "simulated from the released non-negative counts",
                    ("measurements", "invariants", "randomness"),
                ),
            ),
        ),  # fmt: skip
    )


@dataclass(frozen=True)
class UnitsResult:
    """What ``privatize`` on a units file wrote."""

    out: Path
    privacy: PrivacyStatement
    housing_units: int
    seconds: float


def privatize_units(
    path: str | Path,
    spec_path: str | Path | None,
    out: str | Path,
    *,
    seed: int | None = None,
    overwrite: bool = False,
    blocks: str | Path | None = None,
    blocks_from_data: bool = False,
    compose_with: str | Path | None = None,
    evaluate: bool = False,
    repetitions: int | None = None,
) -> UnitsResult:
    """Privatize a PPMF units file into both H1 products for every level.

    Writes ``h1_<level>.csv`` (wide, with ``_se``) and ``h1_long.csv`` (the unbiased
    product), ``nonnegative/h1_<level>.csv`` and ``nonnegative/h1_long.csv`` (the
    non-negative product, no standard errors), the size-class report
    (``size_classes.csv``, ``.md``, ``.png``), ``manifest.json``, ``privacy.md`` and
    ``README.md`` into ``out`` atomically (nothing on an error).

    Parameters
    ----------
    path : path-like
        The units file (:func:`~censusdp.pipelines.io.ppmf.read_ppmf_units`).
    spec_path : path-like or None
        A units spec (:func:`load_units_spec`); None: the production allocation.
    out : path-like
        New directory, or an earlier censusdp output with ``overwrite``.
    seed : int, optional
        Reproducible mode (tests).
    blocks : path-like, optional
        The public list of every block (overrides ``[hierarchy] blocks``).
    blocks_from_data : bool
        Build the blocks from the file's rows, acknowledging the disclosure.
    compose_with : path-like, optional
        A persons release directory: the statement covers both releases.
    evaluate : bool
        Also write the confidential comparison with the truth, laid out as ``run`` does:
        ``out/release/`` (everything above) beside ``out/evaluation/`` (CONFIDENTIAL), never
        inside the release (:func:`censusdp.pipelines.runner.separate_evaluation`).
    repetitions : int, optional
        Simulated releases for the size-class report (default: the spec's, 10).

    Raises
    ------
    SpecError
        Refused output, a bad spec, no block list and no acknowledgement.
    DataError
        A malformed units file or block list (file, data row and column named).
    """
    steps: dict[str, float] = {}  # each step's wall (and thread CPU) seconds
    total: dict[str, float] = {}  # the run's wall and process CPU seconds, to the manifest
    with ExitStack() as stack:
        with stage(total, "seconds", cpu=time.process_time):
            with stage(steps, "read"):
                spec = load_units_spec(spec_path) if spec_path is not None else ProductSpec()
                spec = spec.with_cli(seed=seed, repetitions=repetitions, blocks=blocks)
                inputs = [x for x in (path, spec_path, spec.blocks, compose_with) if x is not None]
                persons = None if compose_with is None else _persons_release(compose_with, out)
                check_output(out, kind="dir", overwrite=overwrite, inputs=inputs, option="-o")
                hist = _read_units(path, spec, blocks_from_data)
            sizes = zip(hist.hierarchy.names, hist.hierarchy.sizes, strict=True)
            log.info("read in %.1f s; nodes per level: %s; measure, GLS and rounding of both "
                     "products", steps["read"], ", ".join(f"{lv} {n}" for lv, n in sizes))  # fmt: skip
            with stage(steps, "release"):
                rng = KeyedRNG.from_seed(spec.seed).child("units")
                rel = release_h1(hist, rng, rho=spec.rho, allocation=spec.allocation)
            log.info("released in %.1f s; writing the tables", steps["release"])
            products = units_products(spec.blocks is not None)
            privacy = units_privacy = _units_statement(rel, spec, hist, products)
            if persons is not None:
                privacy = compose_statements(
                    persons.privacy, privacy, persons_label=persons.label()
                )
            tmp = stack.enter_context(output_dir(out, overwrite=overwrite, inputs=inputs,
                                                 command="privatize", option="-o",
                                                 info={"route": "ppmf_units"}))  # fmt: skip
            _write_h1_tables(tmp, rel)
            with stage(steps, "size_class_report"):
                log.info("size-class report: %d simulated release(s)", spec.repetitions)
                sim, evaluation = size_class_report(
                    rel, hist.schema, rng, spec.repetitions, rho=spec.rho,
                    allocation=spec.allocation,
                    truth=hist.dense().reshape(-1, hist.schema.n_cells) if evaluate else None,
                )  # fmt: skip
                write_size_class_report(
                    tmp, sim, repetitions=spec.repetitions, evaluation=evaluation,
                    unit="housing units", what="block occupancy (occupied, vacant)",
                    privacy=products[-1].wording(),
                )  # fmt: skip
        timings = {k: v for k, v in steps.items() if not k.startswith(CPU_PREFIX)} | total
        log.info("size-class report in %.1f s; writing the manifest (%.1f s in all)",
                 timings["size_class_report"], timings["seconds"])  # fmt: skip
        _write_manifest(tmp, path, spec, privacy, units_privacy, persons, products, timings,
                        evaluate)  # fmt: skip
        if evaluate:  # as `run` lays it out: release/ and the confidential evaluation/ apart
            separate_evaluation(tmp)
    return UnitsResult(Path(out), privacy, hist.persons, timings["seconds"])


def _read_units(path: str | Path, spec: ProductSpec, blocks_from_data: bool) -> PPMFHistogram:
    """The units file on the public block list (or, acknowledged, on its own rows' blocks).

    Raises
    ------
    SpecError
        No block list and no acknowledgement.
    DataError
        A malformed units file or block list.
    """
    if spec.blocks is None and not blocks_from_data:
        raise SpecError(
            f"{Path(path).name}: no public block list. A units file holds only the blocks with "
            "housing units or facilities, so a hierarchy built from its rows would release "
            "that set. Give the list of every block ([hierarchy] blocks = FILE, or --blocks "
            "FILE), or pass --blocks-from-data to accept that disclosure"
        )
    log.info("reading the units file (%s)", Path(path).name)
    hist = read_ppmf_units(path)
    if spec.blocks is not None:
        hist = hist.on_blocks(
            read_block_list(spec.blocks, column=spec.block_column), spec.blocks.name
        )
    return hist


def _units_statement(
    rel: H1Release, spec: ProductSpec, hist: PPMFHistogram, products: tuple[Product, ...]
) -> PrivacyStatement:
    """The units release's own statement: derived from its measurements, with the spec's δ,
    the privacy unit, the change factor, the target ρ, the areas exact through the block
    invariant and what each product is."""
    privacy = dataclasses.replace(
        rel.privacy,
        delta=spec.delta,
        unit="housing unit",
        change_factor=change_factor(rel.privacy.mechanism),
        target=float(
            spec.rho if spec.rho is not None else (spec.allocation or hist.schema.allocation).rho
        ),
        exact=tuple(exact_through_invariants(hist.hierarchy, [(INVARIANT_LEVEL, "total")])),
    )
    return with_products(privacy, products)


def _write_h1_tables(tmp: Path, rel: H1Release) -> None:
    """Both products' wide and long H1 tables and their data dictionaries: the unbiased one
    in ``tmp``, the non-negative one in ``tmp/nonnegative``."""
    for product, folder in (("unbiased", tmp), ("nonnegative", tmp / "nonnegative")):
        folder.mkdir(exist_ok=True)
        wide, long = h1_frames(rel, product)
        for name, frame in wide.items():
            write_csv(frame, folder / f"h1_{name}.csv", index=False)
        write_csv(long, folder / "h1_long.csv", index=False)
        parents = list(parent_codes(rel.hierarchy, rel.hierarchy.depth - 1, 0, 0))
        write_data_dictionary(folder, h1_dictionary(parents, with_se=product == "unbiased"))


def _write_manifest(
    tmp: Path,
    path,
    spec: ProductSpec,
    privacy: PrivacyStatement,
    units_privacy: PrivacyStatement,
    persons: VerifiedRelease | None,
    products: tuple[Product, ...],
    timings: dict,
    evaluate: bool,
) -> None:
    from censusdp.pipelines.runner import package_versions

    product = (
        "h1_<level>.csv, h1_long.csv: H1 for every level. H1_001N (housing units) is "
        "invariant at every block, so exact at every level (_se 0); H1_002N (occupied) is "
        "the GLS estimate of the measurements, integer by unbiased rounding (floor or ceil "
        "of the estimate, children summing to their parent); H1_003N (vacant) = H1_001N - "
        "H1_002N. _se = sqrt(exact GLS variance + the rounding's exact variance psi(1-psi), "
        "psi the fractional part of the node's estimate): every error between the truth and "
        "the released count; H1_001N_se and H1_001N_moe are exactly 0 (the invariant)"
    )
    manifest = {
        "command": "privatize",
        "route": "ppmf_units",
        "input": Path(path).name,
        "spec": spec.to_dict(),
        "strategy": "h1 2020 production units strategy DetailedOnly and "
        + (
            "allocation (censusdp/schemas/h1.toml)"
            if spec.allocation is None
            else "the spec's [allocation] (spec.allocation)"
        ),
        "invariants": [f"{INVARIANT_LEVEL}: total"],
        "exact_through_invariants": list(units_privacy.exact),
        "privacy": privacy.to_dict(),
        "privacy_units_alone": units_privacy.to_dict(),
        "composed_with": None
        if persons is None
        else {
            "folder": persons.path.name,
            "route": persons.route,
            "manifest_sha256": persons.manifest_sha256,
            "privacy": persons.privacy.to_dict(),
        },
        "products": {"unbiased": product, "nonnegative": f"nonnegative/: {NONNEGATIVE_NOTE}"},
        "product_steps": [p.to_dict() for p in products],
        "columns": OUTPUT_COLUMNS_NOTE,
        "size_class_report": {
            "files": list(SIZE_CLASS_FILES),
            "quantity": "occupied housing units (H1_002N); areas classed by housing units",
            "repetitions": spec.repetitions,
            "confidential_evaluation": "../evaluation/ (CONFIDENTIAL)" if evaluate else None,
        },
        "versions": package_versions(),
        "timings": timings,
    }
    scope = (
        f"This statement covers the {persons.label()} ({persons.privacy.budget}) and this "
        "housing-unit release together."
        if persons is not None
        else "This statement covers this housing-unit release."
    )
    notes = [
        product,
        f"nonnegative/: {NONNEGATIVE_NOTE}",
        f"blocks: every block of the public list {spec.blocks.name} (empty blocks included)"
        if spec.blocks is not None
        else "blocks: taken from the units file's rows (--blocks-from-data): the set of "
        "blocks with a housing unit or facility is disclosed",
        "size_classes.md: both products' errors in occupied units by size class (housing "
        "units), simulated from the released numbers",
    ]
    write_release_texts(
        tmp, manifest, privacy, products, title="PPMF units: H1", notes=notes, scope=scope
    )
