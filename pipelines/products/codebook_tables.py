"""``privatize`` with a codebook: overlapping published tables released from one estimate.

A file such as the NHGIS PPDD extracts holds, per area, ten tables that are overlapping
marginals of one person histogram (:mod:`censusdp.pipelines.io.codebook`). Privatizing its
columns as if they were disjoint cells understates the privacy loss by the number of
columns that count each person (up to 32 of the 376 PPDD columns), and breaks the identities
among the tables. This module releases them the way the 2020 Census did (Abowd et al. 2022):

1. **Measure a strategy of marginals** (product queries of the codebook's schema, default
   the codebook's ``[strategy]``: for PPDD ``total``, ``votingage * hispanic``,
   ``votingage * hispanic * race7``, ``votingage * hispanic * cenrace``, ``sex * age`` and
   ``hhgq``). The file holds no microdata, so each strategy row is
   computed from the area's ``_sf`` columns: a strategy row must lie in the span of the
   codebook's rows (checked from Grams; Hispanic × race, say, is P8 minus P9's
   not-Hispanic rows). Each query gets discrete Gaussian noise (Canonne, Kamath & Steinke
   2020), one keyed stream per query.
2. **Privacy is derived**: each query's sensitivity comes from its matrix
   (:class:`~censusdp.mechanisms.product_query.ProductQuery`), and the per-person ρ is
   ``max_c Σ_q (rows of q counting cell c)/(2σ_q²)`` (Bun & Steinke 2016), per area. A
   caller's ρ calibrates the σ's (rounded up, so the derived ρ never exceeds it). The rows
   of a file may be of several summary levels (counties and the places in them): each row's
   level is told from its GISJOIN and the file's identifier columns
   (:func:`censusdp.pipelines.io.nhgis.row_geography`), rows of one level are disjoint areas
   (parallel composition), and a person counted in a row of each of ``k`` levels spends the
   sum of their ρ (:func:`compose_over_levels`); a file whose levels cannot be told is
   refused.
3. **Single-node GLS in the marginal basis**: with ``F = Σ_q Q_qᵀQ_q/σ_q²`` and
   ``h = Σ_q Q_qᵀy_q/σ_q²`` the estimate is ``F⁺h`` (block by block,
   :class:`~censusdp.estimation.gls.marginal_basis.BlockDiagonal`); components no query
   identifies are zero and never released — every published column lies in the measured
   span, so it is identified. Its covariance is ``F⁺`` (the same for every area).
4. **Rounding that keeps every identity exact.** Rounding the 376 columns one by one would
   break the 73 identities, and rounding the 46,368 cells would add the rounding noise of
   thousands of cells to every total. What is rounded is the strategy's marginals, in the
   order of their shared margins: the total and the pairwise common coarsenings (meets) of
   the strategy queries must form a chain (for PPDD: total ⊂ voting age ⊂ × Hispanic ⊂
   × race 7); the coarsest (the total) is rounded
   unbiasedly, each finer one *given* the one below it (its cells are shifted by the
   rounding error of their coarse cell spread evenly — zero mean — then rounded by
   dependent (pipage) rounding that keeps every coarse cell's integer sum; Ageev &
   Sviridenko 2004, Srinivasan 2001), and each strategy query given the finest chain
   element it refines. Every marginal is then unbiased for the GLS estimate, and any two
   agree exactly (integers) on their common margin. Every column is finally a sum of cells
   of one strategy query, in integers, so every linear identity of the tables holds exactly;
   this is checked against the codebook's identity basis before anything is written.
   Rounding is post-processing: the privacy statement is unchanged.

The published standard error ``<col>_se`` covers both steps: ``√(q F⁺ qᵀ + v)``, the GLS
variance (exact) plus ``v``, the rounding's variance given the estimate — exact for the
area's total and for a single cell of a step (``f(1 − f)``), and for sums a bound from the
non-positive correlation of pipage rounding within a group (:meth:`TablePlan.rounding_variances`;
its tightness against simulated roundings and the intervals' coverage are tested).

With ``[hierarchy]`` (and ``[invariants]``, ``[evaluate]``) a file of counties is released over
nation → state → county by :mod:`censusdp.pipelines.products.codebook_hierarchy` from the same plan:
structured GLS over the tree, the totals rounded down it, both integer products.

Columns that overlap without a codebook are refused (:func:`refuse_overlapping_columns`).

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2.
Ageev, A. A. and Sviridenko, M. I. (2004). Pipage rounding. J. Comb. Optim. 8, 307–328.
Bun, M. and Steinke, T. (2016). Concentrated differential privacy: simplifications,
    extensions, and lower bounds. TCC 2016.
Canonne, C., Kamath, G. and Steinke, T. (2020). The discrete Gaussian for differential
    privacy. NeurIPS 2020.
McSherry, F. (2009). Privacy integrated queries. SIGMOD 2009 (parallel composition over
    disjoint parts of the data).
Srinivasan, A. (2001). Distributions on level-sets with applications to approximation
    algorithms. FOCS 2001.
Van Riper, D., Kugler, T. and Schroeder, J. (2020). IPUMS NHGIS Privacy-Protected 2010
    Census Demonstration Data, version 20200527. Minneapolis, MN: IPUMS.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from censusdp.budget import (
    Accounting,
    PrivacyLoss,
    PrivacyStatement,
    PureDP,
    compose,
    statement_for,
)
from censusdp.errors import BudgetError, DataError, SpecError
from censusdp.estimation.covariance import NodeCovariance
from censusdp.estimation.gls.marginal_basis import BlockDiagonal, MarginalBasis
from censusdp.estimation.integer.laminar import pipage_round, rounding_variance
from censusdp.estimation.release import LevelRelease
from censusdp.hierarchy.gisjoin import LAYOUTS, RowLevels, declared_layout
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.product_query import (
    ProductQuery,
    QueryRows,
    axis_product,
    max_weighted_column,
)
from censusdp.pipelines.io.codebook import Codebook, available_codebooks
from censusdp.pipelines.io.outputs import (
    OUTPUT_COLUMNS_NOTE,
    DictionaryEntry,
    estimate_entries,
    written_errors,
)
from censusdp.pipelines.release_statement import change_factor, unit_of_universes
from censusdp.pipelines.spec import SpecCore, open_spec, zcdp_keys
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema
from censusdp.timing import stage

log = logging.getLogger(__name__)

__all__ = [
    "TableSpec",
    "TablePlan",
    "compose_over_levels",
    "levels_statement",
    "TableRelease",
    "load_table_spec",
    "release_tables",
    "privatize_tables",
    "refuse_overlapping_columns",
    "round_given",
    "shift_to_targets",
    "project_to_targets",
    "group_sum_variance",
    "codebook_dictionary",
]

#: What the ``_se`` columns are (manifests of both codebook routes).
STANDARD_ERRORS_NOTE = (
    "standard errors of the integer release: the GLS variance (exact) plus the rounding's "
    "variance given the estimate (exact for an area's total and single cells, a bound from "
    "pipage rounding's negative correlation for sums of cells)"
)

#: Rows of areas estimated at once (each holds the 46,368 cells of a PPDD area in float64).
CHUNK = 64

# -------------------------------------------------------------------------------- partitions
#: A partition of the cells into a product of per-axis groups: per axis, the group of each
#: detailed value (groups numbered 0..r−1).
Partition = tuple[np.ndarray, ...]


def _relabel(labels: np.ndarray) -> np.ndarray:
    """Groups renumbered in order of their first value."""
    _, first, inv = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[inv.reshape(-1)]


def _partition_of(query: ProductQuery) -> Partition:
    """Per axis, the row of each detailed value (the query must partition every axis)."""
    out = []
    for f in query.factors:
        counts = f.matrix.sum(axis=0)
        if not (counts == 1).all():
            raise SpecError(
                f"strategy query {query.name!r}: element {f.name!r} of {f.attribute!r} does "
                "not partition the attribute (a slice, or overlapping groups); measure whole "
                "recodes — slices such as 18 and over are rows of their recode"
            )
        out.append(np.argmax(f.matrix, axis=0).astype(np.int64))
    return tuple(out)


def _meet(a: Partition, b: Partition) -> Partition:
    """The finest common coarsening, per axis (connected groups of the two labelings)."""
    out = []
    for x, y in zip(a, b, strict=True):
        lab = x.copy()
        while True:  # merge labels linked through y until stable (domains are small)
            by_y = np.full(int(y.max()) + 1, np.iinfo(np.int64).max)
            np.minimum.at(by_y, y, lab)
            by_x = np.full(int(lab.max()) + 1, np.iinfo(np.int64).max)
            np.minimum.at(by_x, lab, by_y[y])
            new = by_x[lab]
            if np.array_equal(new, lab):
                break
            lab = new
        out.append(_relabel(lab))
    return tuple(out)


def _coarse_map(fine: Partition, coarse: Partition) -> list[np.ndarray] | None:
    """Per axis, the coarse group of each fine group; None when ``fine`` does not refine it."""
    maps = []
    for f, c in zip(fine, coarse, strict=True):
        m = np.zeros(int(f.max()) + 1, dtype=np.int64)
        m[f] = c
        if not np.array_equal(m[f], c):
            return None
        maps.append(m)
    return maps


def _same(a: Partition, b: Partition) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _shape(p: Partition) -> tuple[int, ...]:
    return tuple(int(x.max()) + 1 for x in p)


def _aggregate(x: np.ndarray, p: Partition) -> np.ndarray:
    """The marginal ``(n, ∏ r_a)`` of a batch of cell tensors ``(n, *shape)``."""
    y = x
    for ax, lab in enumerate(p):
        r = int(lab.max()) + 1
        if r == 1:
            y = y.sum(axis=ax + 1, keepdims=True)
        elif r < lab.size:
            ind = (np.arange(r)[:, None] == lab[None, :]).astype(y.dtype)
            y = axis_product(y, ax + 1, ind)
    return y.reshape(y.shape[0], -1)


def _parent_index(fine: Partition, coarse: Partition) -> np.ndarray:
    """For each cell of the fine marginal (C order), its cell of the coarse marginal."""
    maps = _coarse_map(fine, coarse)
    if maps is None:
        raise ArithmeticError("internal: the rounding order needs a refinement")
    grids = np.meshgrid(*maps, indexing="ij")
    return np.ravel_multi_index([g.ravel() for g in grids], _shape(coarse)).astype(np.int64)


# ------------------------------------------------------------------------------ rounding
def shift_to_targets(values: np.ndarray, parent: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``values`` (n, r) shifted so that their sums over ``parent`` equal ``target`` (n, r_c).

    Each value moves by its coarse cell's gap ``target − Σ values`` divided by the number of
    cells the coarse cell holds (every coarse cell must hold one). With ``E[target]`` the
    real coarse sums the shift has mean zero, so what is rounded next stays unbiased.
    """
    rc = target.shape[1]
    count = np.bincount(parent, minlength=rc)
    sums = np.zeros((values.shape[0], rc))
    np.add.at(sums, (slice(None), parent), values)
    return values + ((target - sums) / count)[:, parent]


def project_to_targets(values: np.ndarray, parent: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Euclidean projection of every group (row, coarse cell) of ``values`` (n, r) onto
    ``{v ≥ 0, Σ_group v = target}`` (``target`` (n, r_c) non-negative).

    One simplex projection per group, by the sorting threshold
    (:func:`censusdp.estimation.integer.nonnegative.project_simplex`; Held, Wolfe & Crowder 1974;
    Duchi et al. 2008): the groups are laid out as padded lanes ``(n, m, r_c)``.
    """
    from censusdp.estimation.integer.nonnegative import project_simplex

    n, r = values.shape
    rc = target.shape[1]
    order = np.argsort(parent, kind="stable")
    count = np.bincount(parent, minlength=rc)
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    pos = np.empty(r, dtype=np.int64)
    pos[order] = np.arange(r) - start[parent[order]]
    lanes = np.full((n, int(count.max()), rc), -np.inf)
    lanes[:, pos, parent] = values
    got = project_simplex(lanes, np.asarray(target, dtype=np.float64))
    return got[:, pos, parent]


def round_given(
    values: np.ndarray,
    parent: np.ndarray,
    target: np.ndarray,
    gen: np.random.Generator,
    *,
    nonnegative: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Unbiased integers for ``values`` (n, r) whose sums over ``parent`` equal ``target``.

    ``target`` (n, r_c) are integers with ``E[target] = `` the real sums of ``values`` per
    coarse cell. Each value is shifted by its coarse cell's rounding error divided by the
    number of cells it holds (:func:`shift_to_targets`: zero mean, so still unbiased), making
    every coarse sum an integer, then rounded by pipage rounding on the groups (area, coarse
    cell), which keeps every group's integer sum and rounds each value to its floor or
    ceiling with the right mean (:func:`censusdp.estimation.integer.laminar.pipage_round`; Ageev &
    Sviridenko 2004, Srinivasan 2001). With ``nonnegative`` (targets ≥ 0) each group is
    instead projected onto its non-negative simplex (:func:`project_to_targets`; biased)
    and rounded the same way, so no value is negative.

    Returns
    -------
    (integers, variances)
        int64 (n, r), and float (n, r) the variance ``f(1 − f)`` of each value's rounding
        given what was rounded (``f`` the fractional part of the shifted or projected
        value): exact for one value; pipage rounding makes any two values of a group
        non-positively correlated (Srinivasan 2001, negative correlation) and keeps each
        group's sum.
    """
    n, r = values.shape
    rc = target.shape[1]
    if nonnegative:
        shifted = project_to_targets(values, parent, target)
    else:
        shifted = shift_to_targets(values, parent, target)
    order = np.argsort(parent, kind="stable")
    group = (np.arange(n)[:, None] * rc + parent[order][None, :]).ravel()
    flat = pipage_round(shifted[:, order].ravel(), [group], gen)
    out = np.empty((n, r), dtype=np.int64)
    out[:, order] = flat.reshape(n, r)
    check = np.zeros((n, rc), dtype=np.int64)
    np.add.at(check, (slice(None), parent), out)
    if not np.array_equal(check, target):
        raise ArithmeticError("internal: conditional rounding lost a coarse sum")
    return out, rounding_variance(shifted)


def group_sum_variance(weights: np.ndarray, parent: np.ndarray, var: np.ndarray) -> np.ndarray:
    """A bound on ``Var(Σ_u w_ju ε_u)`` per row and weight vector, for rounding errors ``ε``
    (n, r) made by :func:`round_given`: independent across groups (row, coarse cell), each
    with variance ``var``, non-positively correlated within a group, summing to 0 over it.

    Within a group ``Σ_u w_u ε_u = Σ_u (w_u − m) ε_u`` for any constant ``m``; with ``m`` the
    group's smallest weight (or its largest, and signs flipped) every coefficient has one
    sign, so non-positive covariances give ``Var ≤ Σ_u (w_u − m)² var_u``; the smaller of the
    two choices is taken per group and the groups add. A weight vector that is constant on a
    group (a column holding the whole coarse cell) gets 0 from it: its sum is exact.

    Parameters
    ----------
    weights : (k, r) float
        Non-negative coefficients of each of ``k`` sums.
    parent : (r,) int
        The group (coarse cell) of each value.
    var : (n, r) float

    Returns
    -------
    (n, k) float
    """
    rc = int(parent.max()) + 1
    k = weights.shape[0]
    lo = np.full((k, rc), np.inf)
    hi = np.full((k, rc), -np.inf)
    np.minimum.at(lo, (slice(None), parent), weights)
    np.maximum.at(hi, (slice(None), parent), weights)
    ind = np.zeros((weights.shape[1], rc))
    ind[np.arange(weights.shape[1]), parent] = 1.0
    out = []
    for m in (lo, hi):
        d2 = (weights - m[:, parent]) ** 2  # (k, r)
        out.append(
            (var @ (d2.T[:, :, None] * ind[:, None, :]).reshape(-1, k * rc)).reshape(
                var.shape[0], k, rc
            )
        )
    return np.minimum(out[0], out[1]).sum(axis=2)


# ---------------------------------------------------------------------------------- spec
@dataclass(frozen=True, kw_only=True)
class TableSpec(SpecCore):
    """What a codebook-route ``privatize`` does (from the CLI, a spec file, or both):
    :class:`~censusdp.pipelines.spec.SpecCore`'s keys (``rho``, required, the per-person ρ the
    strategy spends in every area; ``repetitions`` from ``[evaluate]``) and its own.

    Attributes
    ----------
    codebook : str
        A shipped codebook name (``"ppdd"``) or the path of a codebook TOML.
    strategy : tuple of (query text, share)
        The measured product queries and their shares of ρ; empty: the codebook's.
    schema : str or None
        The schema the spec expects (must be the codebook's).
    encoding : str or None
    level : str or None
        The summary level of every row (``"place"``, or a SUMLEV code), where the file does
        not tell it.
    level_column : str or None
        A column holding each row's level name or SUMLEV code.
    levels : tuple of str
        ``[hierarchy] levels`` (root first, the rows' level last): the hierarchy route
        (:mod:`censusdp.pipelines.products.codebook_hierarchy`); empty: every row alone.
    invariants : tuple of (level, "total")
        ``[invariants]``: totals held exact (hierarchy route only).
    evaluate : bool
        ``[evaluate]``: write the size-class report and its confidential evaluation.
    """

    codebook: str
    rho: float
    strategy: tuple[tuple[str, float], ...] = ()
    schema: str | None = None
    encoding: str | None = None
    source: str = "<command line>"
    level: str | None = None
    level_column: str | None = None
    levels: tuple[str, ...] = ()
    invariants: tuple[tuple[str, str], ...] = ()
    evaluate: bool = False


def load_table_spec(path: str | Path) -> TableSpec:
    """Read a codebook-route spec::

        [data]
        source = "nhgis"
        codebook = "ppdd"            # shipped name, or a codebook TOML (relative to the spec)
        schema = "ppdd"              # optional: checked against the codebook's
        encoding = "latin-1"         # optional
        level = "place"              # optional: every row's summary level, where the file
                                     # does not tell it (or level_column = "SUMLEV")
        [privacy]
        accounting = "zcdp"
        rho = 1.0
        delta = 1e-10                # optional
        [strategy]                   # optional: default the codebook's [strategy]
        queries = ["total", "votingage * hispanic * cenrace", "sex * age", "hhgq"]
        shares = [0.1, 0.5, 0.3, 0.1]
        [mechanism]
        noise = "discrete_gaussian"
        [run]
        seed = 1                     # optional: reproducible mode, for tests only
        [hierarchy]                  # optional: the hierarchy route (an output folder)
        levels = ["nation", "state", "county"]   # root first, the rows' level last
        [invariants]                 # optional, with [hierarchy]: totals held exact
        state = "total"
        [evaluate]                   # optional, with [hierarchy]: the size-class report
        repetitions = 10             # and its confidential evaluation/ against the _sf

    Raises
    ------
    SpecError
        Naming the file and the dotted key.
    """
    path = Path(path)
    tables = ("data", "privacy", "strategy", "mechanism", "run", "hierarchy", "invariants",
              "evaluate")  # fmt: skip
    data_keys = ("source", "codebook", "schema", "encoding", "path", "level", "level_column")
    p, doc, data = open_spec(path, tables, data_keys, data_required=True)
    source = p.get(data, "data", "source", str, required=True)
    if source != "nhgis":
        raise p.fail("data.source", 'a codebook route reads NHGIS-style files: "nhgis"')
    codebook = p.get(data, "data", "codebook", str, required=True)
    if codebook.endswith(".toml") and not Path(codebook).is_absolute():
        codebook = str(path.parent / codebook)
    rho, delta, seed = zcdp_keys(p, doc, "the codebook route", rho_required=True)
    strategy: tuple[tuple[str, float], ...] = ()
    st = p.table(doc, "strategy", required=False)
    if st:
        p.keys(st, "strategy", ("queries", "shares"))
        queries = p.str_list(
            p.get(st, "strategy", "queries", list, required=True), "strategy.queries"
        )
        shares = p.get(st, "strategy", "shares", list, required=True)
        if len(shares) != len(queries) or not all(
            isinstance(s, int | float) and not isinstance(s, bool) for s in shares
        ):
            raise p.fail("strategy.shares", "give one number per query of strategy.queries")
        strategy = tuple(zip(queries, (float(s) for s in shares), strict=True))
    level = p.get(data, "data", "level", str)
    level_column = p.get(data, "data", "level_column", str)
    if level is not None and level_column is not None:
        raise p.fail("data.level", "give data.level (every row) or data.level_column, not both")
    if level is not None and declared_layout(level) is None:
        raise p.fail(
            "data.level",
            f"{level!r} is no summary level; give one of {[x.level for x in LAYOUTS]} or a "
            'SUMLEV code such as "160"',
        )
    levels, invariants, evaluate, repetitions = _hierarchy_keys(p, doc, level, level_column)
    return TableSpec(
        codebook=codebook,
        rho=rho,
        delta=delta,
        strategy=strategy,
        schema=p.get(data, "data", "schema", str),
        encoding=p.get(data, "data", "encoding", str),
        seed=seed,
        source=str(path),
        level=level,
        level_column=level_column,
        levels=levels,
        invariants=invariants,
        evaluate=evaluate,
        repetitions=repetitions,
    )


def _hierarchy_keys(p, doc: Mapping, level: str | None, level_column: str | None):
    """``[hierarchy] levels``, ``[invariants]`` and ``[evaluate]`` of a codebook spec, and the
    combinations refused (each naming the key and the fix)."""
    from censusdp.hierarchy.gisjoin import check_hierarchy_levels

    hier = p.table(doc, "hierarchy", required=False)
    p.keys(hier, "hierarchy", ("levels",))
    levels: tuple[str, ...] = ()
    if hier:
        levels = tuple(p.str_list(p.get(hier, "hierarchy", "levels", list, required=True),
                                  "hierarchy.levels"))  # fmt: skip
        if len(levels) < 2:
            raise p.fail("hierarchy.levels", 'give the root and the rows\' level at least, e.g. '
                         '["nation", "state", "county"]')  # fmt: skip
        try:
            check_hierarchy_levels(levels[1:], "hierarchy.levels")
        except SpecError as err:
            raise p.fail("hierarchy.levels", str(err)) from None
        if level is not None or level_column is not None:
            raise p.fail("data.level", "with [hierarchy] the rows are its last level; drop "
                         "data.level / data.level_column")  # fmt: skip
    inv = p.table(doc, "invariants", required=False)
    invariants = []
    for lv, q in (inv or {}).items():
        if not levels:
            raise p.fail(f"invariants.{lv}", "invariants are held over a hierarchy: add "
                         '[hierarchy] levels = ["nation", "state", "county"]')  # fmt: skip
        if lv not in levels[:-1]:
            raise p.fail(f"invariants.{lv}", f"name a level above the rows' of hierarchy.levels "
                         f"{list(levels[:-1])}")  # fmt: skip
        if q != "total":
            raise p.fail(f"invariants.{lv}", 'the codebook route holds totals: give "total"')
        invariants.append((lv, q))
    ev = p.table(doc, "evaluate", required=False)
    evaluate = "evaluate" in doc
    repetitions = 10
    if evaluate:
        if not levels:
            raise p.fail("evaluate", "the evaluation compares the hierarchy route's products: "
                         "add [hierarchy] levels")  # fmt: skip
        p.keys(ev, "evaluate", ("repetitions",))
        repetitions = p.get(ev, "evaluate", "repetitions", int, default=10)
        if repetitions < 2:
            raise p.fail("evaluate.repetitions", "give at least 2 (the bias has a standard error)")
    return levels, tuple(invariants), evaluate, repetitions


# ---------------------------------------------------------------------------------- plan
def _axis_rows(rows: QueryRows) -> list[np.ndarray]:
    """Per axis, the ``(n, d_a)`` factor of every row (row ``i`` is ``⊗_a out[a][i]``)."""
    out = []
    for ax in range(len(rows.schema.shape)):
        m = np.empty((len(rows), rows.schema.shape[ax]), dtype=np.int64)
        for q, query in enumerate(rows.queries):
            sel = np.flatnonzero(rows.query_of_row == q)
            idx = np.unravel_index(rows.row_of_row[sel], query.row_shape)[ax]
            m[sel] = query.factors[ax].matrix[idx]
        out.append(m)
    return out


def _cross_gram(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    g = np.ones((a[0].shape[0], b[0].shape[0]))
    for x, y in zip(a, b, strict=True):
        g *= x.astype(np.float64) @ y.T.astype(np.float64)
    return g


def _rows_of(query: ProductQuery) -> QueryRows:
    n = query.n_rows
    return QueryRows(
        query.schema,
        (query,),
        np.zeros(n, np.int64),
        np.arange(n, dtype=np.int64),
        tuple(f"{query.name}[{i}]" for i in range(n)),
    )


def _calibrated_laws(
    queries: Sequence[ProductQuery], shares: np.ndarray, rho: float
) -> tuple[tuple[float, ...], tuple[DiscreteGaussian, ...], tuple[float, ...], float]:
    """σ_q from ρ_q = share·ρ (rounded up), and ρ derived back from the matrices (Bun &
    Steinke 2016: ``max_c Σ_q (rows of q counting cell c)/(2σ_q²)``).

    Returns ``(Δ₂ per query, law per query, ρ per query, derived ρ)``.

    Raises
    ------
    BudgetError
        The derived ρ above ``rho`` (a bug in the calibration).
    """
    sens = tuple(q.l2_sensitivity for q in queries)
    laws = tuple(
        DiscreteGaussian.from_rho(float(s) * rho, sensitivity=d)
        for s, d in zip(shares, sens, strict=True)
    )
    per_q = tuple(law.privacy(d) for law, d in zip(laws, sens, strict=True))
    derived = max_weighted_column(queries, [1.0 / (2.0 * float(w.sigma2)) for w in laws])
    if derived > rho * (1 + 1e-12):
        raise BudgetError(
            f"the strategy spends ρ = {derived:.6g} per person, more than the ρ = {rho:g} "
            "stated; this is a bug in the calibration"
        )
    return sens, laws, per_q, derived


def _measures_from_columns(
    codebook: Codebook, cols: list[np.ndarray], queries: Sequence[ProductQuery], where: str
) -> tuple[np.ndarray, ...]:
    """Per query, ``A_q = G_qc G_cc⁺`` (its answers from the columns ``cols``, the
    codebook's rows per axis), refused unless exact: the residual
    ``‖A_q M − Q_q‖²`` of every row vanishes (from Grams, never the cells)."""
    g_cc = _cross_gram(cols, cols)
    pinv_cc = np.linalg.pinv(g_cc, rcond=1e-10, hermitian=True)
    measure = []
    for q in queries:  # a loop over the strategy's queries, not areas or cells
        srows = _axis_rows(_rows_of(q))
        g_qc = _cross_gram(srows, cols)
        a = g_qc @ pinv_cc
        resid = (
            ((a @ g_cc) * a).sum(axis=1)
            - 2 * (a * g_qc).sum(axis=1)
            + np.prod([(s * s).sum(axis=1) for s in srows], axis=0)
        )
        bad = np.flatnonzero(resid > 1e-6)
        if bad.size:
            raise SpecError(
                f"{where}: query {q.name!r}, row {q.labels[bad[0]]!r} is not determined by "
                f"the columns of {codebook.source} (no combination of them counts exactly "
                "those persons); measure marginals the published tables determine"
            )
        measure.append(a)
    return tuple(measure)


def _columns_from_queries(
    codebook: Codebook,
    cols: list[np.ndarray],
    queries: Sequence[ProductQuery],
    parts: Sequence[Partition],
    where: str,
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Each column as a 0/1 sum of cells of the first strategy query that refines it.

    Returns ``(column_query, column_weights)`` as :class:`TablePlan`'s; a column no query
    refines is refused (the release could not write it from the rounded marginals)."""
    column_query = np.full(len(codebook.columns), -1, dtype=np.int64)
    weights: list[list[tuple[int, np.ndarray]]] = [[] for _ in queries]
    for j in range(len(codebook.columns)):  # a loop over the codebook's columns, not areas
        for qi, part in enumerate(parts):
            coef = []
            for m, lab in zip((c[j] for c in cols), part, strict=True):
                c = np.zeros(int(lab.max()) + 1, dtype=np.int64)
                c[lab] = m
                if not np.array_equal(c[lab], m):
                    break
                coef.append(c)
            else:
                w = coef[0]
                for c in coef[1:]:
                    w = np.multiply.outer(w, c)
                weights[qi].append((j, w.ravel()))
                column_query[j] = qi
                break
        else:
            raise SpecError(
                f"{where}: column {codebook.columns[j]!r} is not a sum of cells of any "
                "strategy query; add a query that refines it (so the release can write it "
                "from the rounded marginals)"
            )
    column_weights = tuple(
        np.array([w for _, w in ws], dtype=np.int64).reshape(len(ws), q.n_rows)
        for ws, q in zip(weights, queries, strict=True)
    )
    return column_query, column_weights


def _rounding_chain(
    schema: Schema, parts: Sequence[Partition], where: str
) -> tuple[tuple[Partition, ...], tuple[int, ...]]:
    """The rounding order: the total and the queries' pairwise common margins (meets),
    coarsest first, which must nest; and per query the finest chain element it refines.

    The total comes first: every area's total is rounded before anything finer (and the
    hierarchy route holds it to its parent's), so every query descends from it."""
    total = tuple(np.zeros(d, dtype=np.int64) for d in schema.shape)
    meets = [total] + [_meet(parts[i], parts[j]) for i in range(len(parts)) for j in range(i)]
    chain: list[Partition] = []
    for m in sorted(meets, key=lambda p: int(np.prod(_shape(p)))):
        if chain and _same(chain[-1], m):
            continue
        if chain and _coarse_map(m, chain[-1]) is None:
            raise SpecError(
                f"{where}: the margins the queries share do not nest, so no rounding keeps "
                "them all consistent; choose queries whose pairwise common margins form a "
                "chain (e.g. each a refinement of total and voting age)"
            )
        chain.append(m)
    parent = []
    for part in parts:
        fits = [i for i, c in enumerate(chain) if _coarse_map(part, c) is not None]
        parent.append(fits[-1] if fits else -1)
    return tuple(chain), tuple(parent)


def _gls_covariance(
    codebook: Codebook, queries: Sequence[ProductQuery], laws: Sequence[DiscreteGaussian]
) -> tuple[MarginalBasis, BlockDiagonal, np.ndarray]:
    """The marginal basis, the GLS covariance ``F⁺`` with ``F = Σ_q Q_qᵀQ_q/σ_q²``, and
    every column's GLS standard error ``√(q F⁺ qᵀ)``."""
    basis = MarginalBasis.for_queries(codebook.schema, [*queries, codebook.rows])
    info = sum(basis.gram(q, 1.0 / float(law.sigma2)) for q, law in zip(queries, laws, strict=True))
    cov = info.pinv()
    se = np.empty(len(codebook.columns))
    for qi, q in enumerate(codebook.rows.queries):
        sel = np.flatnonzero(codebook.rows.query_of_row == qi)
        se[sel] = np.sqrt(np.maximum(cov.query_variances(q)[codebook.rows.row_of_row[sel]], 0))
    return basis, cov, se


@dataclass(frozen=True, eq=False)
class TablePlan:
    """Everything a codebook release needs that does not depend on the data.

    Attributes
    ----------
    codebook : Codebook
    queries : tuple of ProductQuery
        The strategy.
    laws : tuple of DiscreteGaussian
        One per query.
    sensitivities : tuple of float
        Δ₂ of each query, from its matrix.
    rho : float
        The derived per-person ρ of one area's measurements (≤ the requested ρ).
    rho_per_query : tuple of float
        Δ₂²/(2σ²) of each query.
    measure_from_columns : tuple of numpy.ndarray
        Per query, ``A_q`` (rows × columns) with ``A_q M = Q_q``: its answers from the
        columns.
    basis : MarginalBasis
    covariance : BlockDiagonal
        ``F⁺``: the covariance of the estimate's coefficients (every area).
    chain : tuple of Partition
        The strategy's shared margins, coarsest first (the rounding order).
    chain_parent : tuple of int
        Per query, the finest chain element it refines.
    column_query : numpy.ndarray
        int64 (columns,): the query each column is summed from.
    column_weights : tuple of numpy.ndarray
        Per query, the 0/1 ``(columns, rows)`` matrix of the columns it produces.
    column_se : numpy.ndarray
        float (columns,): GLS standard error of every column.
    identities : numpy.ndarray
        The codebook's identity basis.
    """

    codebook: Codebook
    queries: tuple[ProductQuery, ...]
    laws: tuple[DiscreteGaussian, ...]
    sensitivities: tuple[float, ...]
    rho: float
    rho_per_query: tuple[float, ...]
    measure_from_columns: tuple[np.ndarray, ...]
    basis: MarginalBasis
    covariance: BlockDiagonal
    chain: tuple[Partition, ...]
    chain_parent: tuple[int, ...]
    column_query: np.ndarray
    column_weights: tuple[np.ndarray, ...]
    column_se: np.ndarray
    identities: np.ndarray

    @classmethod
    def build(
        cls, codebook: Codebook, rho: float, strategy: Sequence[tuple[str, float]] = ()
    ) -> TablePlan:
        """Check the strategy against the codebook and calibrate it to ``rho``.

        The steps: the privacy calibration (:func:`_calibrated_laws`), each query's answers
        from the columns (:func:`_measures_from_columns`), each column from one query's
        cells (:func:`_columns_from_queries`), the rounding order of the shared margins
        (:func:`_rounding_chain`), the GLS covariance ``F⁺`` and the columns' standard
        errors (:func:`_gls_covariance`).

        Raises
        ------
        SpecError
            A strategy query the columns do not determine, a column no strategy query
            determines, shares that are not positive or do not sum to 1, shared margins that
            do not nest.
        BudgetError
            A ρ outside the supported range.
        """
        schema = codebook.schema
        where = "strategy" if strategy else f"{codebook.source}: [strategy]"
        strategy = tuple(strategy) or codebook.strategy
        if not strategy:
            raise SpecError(
                f"{codebook.source}: the codebook has no [strategy]; give [strategy] queries "
                "and shares in the spec"
            )
        shares = np.array([s for _, s in strategy], dtype=float)
        if (shares <= 0).any() or not math.isclose(shares.sum(), 1.0, rel_tol=1e-9):
            raise SpecError(f"{where}: shares must be positive and sum to 1")
        if not rho > 0 or not math.isfinite(rho):
            raise BudgetError(f"rho must be a positive finite number, got {rho!r}")
        queries = tuple(ProductQuery.parse(schema, t) for t, _ in strategy)
        if len({q.name for q in queries}) != len(queries):
            raise SpecError(f"{where}: a query is listed twice")
        parts = tuple(_partition_of(q) for q in queries)
        sens, laws, per_q, derived = _calibrated_laws(queries, shares, rho)
        cols = _axis_rows(codebook.rows)
        measure = _measures_from_columns(codebook, cols, queries, where)
        column_query, column_weights = _columns_from_queries(codebook, cols, queries, parts, where)
        chain, parent = _rounding_chain(schema, parts, where)
        basis, cov, se = _gls_covariance(codebook, queries, laws)
        return cls(
            codebook, queries, laws, sens, float(derived), per_q, measure, basis, cov, chain,
            parent, column_query, column_weights, se, codebook.identities(),
        )  # fmt: skip

    # ---------------------------------------------------------------------------------
    def statement(self, delta: float | None = None) -> PrivacyStatement:
        """The derived privacy statement (per area; per person when areas are disjoint)."""
        names = ", ".join(
            f"{q.name} (Δ₂² = {d * d:g}, σ² = {float(w.sigma2):.6g}, ρ = {r:.6g})"
            for q, d, w, r in zip(
                self.queries, self.sensitivities, self.laws, self.rho_per_query, strict=True
            )
        )
        base = dataclasses.replace(
            statement_for(Accounting.ZCDP, self.rho, delta, mechanism="discrete_gaussian"),
            unit=unit_of_universes([t.universe for t in self.codebook.tables.values()]),
            change_factor=change_factor("discrete_gaussian"),
        )
        return base.with_notes(
            f"ρ derived from the measured strategy of the {self.codebook.schema.name!r} schema: "
            f"{names}; composed per person as max over cells of Σ_q (rows of q counting the "
            "cell)/(2σ_q²)",
            "each area (row) is measured separately: the statement is per person when the "
            "areas are disjoint; a person in k rows of the file spends k·ρ",
            "every table column is written from one GLS estimate of the histogram's "
            "identified part, rounded to integers that keep every identity among the columns",
        )

    def strategy_rows(self) -> list[dict[str, Any]]:
        """The strategy for a manifest: per query its name, rows, L2 sensitivity, σ² and ρ."""
        return [
            {"query": q.name, "rows": q.n_rows, "l2_sensitivity": d, "sigma2": float(w.sigma2),
             "rho": r}
            for q, d, w, r in zip(
                self.queries, self.sensitivities, self.laws, self.rho_per_query, strict=True
            )
        ]  # fmt: skip

    @property
    def total_column(self) -> int:
        """The index of a column counting every person (P1), or -1 when none does."""
        rows = self.codebook.rows
        hit = [
            j
            for j in range(len(rows.names))
            if rows.queries[rows.query_of_row[j]].n_rows == 1
            and all((f.matrix == 1).all() for f in rows.queries[rows.query_of_row[j]].factors)
        ]
        return hit[0] if hit else -1

    def totals(self, truth: np.ndarray) -> np.ndarray:
        """Every area's exact total (int64), from its columns: the sum of the first strategy
        query's answers (each query partitions every attribute)."""
        a = self.measure_from_columns[0]
        return np.rint(np.asarray(truth, dtype=np.float64) @ a.T).astype(np.int64).sum(axis=1)

    def measure(self, truth: np.ndarray, rng: KeyedRNG) -> list[np.ndarray]:
        """Noisy answers ``(areas, rows)`` of every query, computed from the columns.

        Raises
        ------
        DataError
            When the columns are not one tabulation (an identity fails), naming the area.
        """
        out = []
        n = truth.shape[0]
        for q, a, law in zip(self.queries, self.measure_from_columns, self.laws, strict=True):
            exact = truth.astype(np.float64) @ a.T
            answers = np.rint(exact).astype(np.int64)
            slack = 1e-9 * (np.abs(truth).astype(np.float64) @ np.abs(a).T) + 1e-6  # float
            if (np.abs(exact - answers) > slack).any():
                raise ArithmeticError("internal: a strategy answer from the columns is not exact")
            noise = rng.draw(f"privatize/{q.name}", n, 0, n, law.sample, width=q.n_rows)
            out.append(answers + noise)
        return out

    def marginals(self, x: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The strategy's and the chain's marginals ``(n, rows)`` of cell tensors ``x``
        ``(n, *schema.shape)``."""
        return [q.apply(x) for q in self.queries], [_aggregate(x, c) for c in self.chain]

    def estimate(self, answers: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """GLS: the strategy's and the chain's marginals of ``F⁺h``, area by area (chunks)."""
        n = answers[0].shape[0]
        strat = [np.empty((n, q.n_rows)) for q in self.queries]
        chain = [np.empty((n, int(np.prod(_shape(c))))) for c in self.chain]
        for lo in range(0, n, CHUNK):
            hi = min(lo + CHUNK, n)
            h = sum(
                q.adjoint(y[lo:hi].astype(np.float64) / float(law.sigma2))
                for q, y, law in zip(self.queries, answers, self.laws, strict=True)
            )
            x = self.basis.from_basis(self.covariance.apply(self.basis.to_basis(h)))
            got_s, got_c = self.marginals(x)
            for s, g in zip([*strat, *chain], [*got_s, *got_c], strict=True):
                s[lo:hi] = g
        return strat, chain

    def round(
        self,
        strat: Sequence[np.ndarray],
        chain: Sequence[np.ndarray],
        rng: KeyedRNG,
        *,
        totals: np.ndarray | None = None,
        nonnegative: bool = False,
        record: dict | None = None,
    ) -> list[np.ndarray]:
        """Integer strategy marginals, unbiased, agreeing exactly on every shared margin.

        Parameters
        ----------
        strat, chain : the real marginals (:meth:`estimate`, :meth:`marginals`).
        rng : KeyedRNG
        totals : numpy.ndarray, optional
            int64 (n,): every area's integer total, already rounded (the hierarchy route
            rounds them down the tree); None: the totals are rounded here, all areas as one
            pipage group (their sum is the floor or ceiling of the real sum).
        nonnegative : bool
            Project each step onto its non-negative simplex before rounding (needs
            ``totals`` ≥ 0): the non-negative product, biased.
        record : dict, optional
            Filled with each step's rounding variances given the coarser steps
            (``"chain"``: one (n, r) array per chain element, ``"query"``: one per strategy
            query, None where it is a copy of its chain element), for
            :meth:`rounding_variances`.
        """
        if nonnegative and totals is None:
            raise ValueError("the non-negative rounding needs the areas' integer totals")
        rec_chain: list[np.ndarray] = []
        ints: list[np.ndarray] = []
        for i, vals in enumerate(chain):
            gen = rng.generator(f"round/chain/{i}")
            if i == 0 and totals is None:
                ints.append(pipage_round(vals.ravel(), [], gen).reshape(vals.shape))
                rec_chain.append(rounding_variance(vals))
                continue
            if i == 0:
                par, target = np.zeros(vals.shape[1], np.int64), np.asarray(totals)[:, None]
            else:
                par, target = _parent_index(self.chain[i], self.chain[i - 1]), ints[i - 1]
            got, var = round_given(vals, par, target, gen, nonnegative=nonnegative)
            ints.append(got)
            rec_chain.append(var)
        out, rec_query = [], []
        parts = [_partition_of(q) for q in self.queries]
        for q, vals, part, pi in zip(self.queries, strat, parts, self.chain_parent, strict=True):
            gen = rng.generator(f"round/{q.name}")
            if _same(part, self.chain[pi]):
                out.append(ints[pi].copy())
                rec_query.append(None)
            else:
                par = _parent_index(part, self.chain[pi])
                got, var = round_given(vals, par, ints[pi], gen, nonnegative=nonnegative)
                out.append(got)
                rec_query.append(var)
        if record is not None:
            record.update(chain=rec_chain, query=rec_query)
        return out

    def rounding_variances(self, record: dict) -> tuple[np.ndarray, np.ndarray]:
        """What :meth:`round`'s steps below the areas' totals add to every column's variance.

        A column is a 0/1 sum of cells of one strategy query, rounded through the chain
        ``total ⊂ … ⊂ chain element ⊂ query``. Each step's rounding error is its coarse
        cell's error spread evenly (the shift) plus the step's own pipage error, which has
        mean zero given the coarser steps: the steps' errors are uncorrelated (martingale
        differences), and a column's error is ``Σ_steps Σ_u w_u ε_u`` with ``w`` the column's
        weights carried up the chain (a coarse cell's weight is the mean of its cells').
        Each step's term is bounded by :func:`group_sum_variance` at the recorded variances
        (exact for one cell, 0 for a whole coarse cell), the bound of
        non-positive correlation within a group.

        Returns
        -------
        (variance, weight)
            float (n, columns): the bound on the rounding variance of every column below
            its area's total; float (columns,): the weight ``w`` of the column on its area's
            total error, which the caller adds as ``w² · Var(total's error)``.
        """
        n = record["chain"][0].shape[0]
        var = np.zeros((n, len(self.codebook.columns)))
        weight = np.zeros(len(self.codebook.columns))
        parts = [_partition_of(q) for q in self.queries]
        for qi, (part, pi) in enumerate(zip(parts, self.chain_parent, strict=True)):
            cols = np.flatnonzero(self.column_query == qi)
            w = self.column_weights[qi].astype(np.float64)
            steps = []
            if record["query"][qi] is not None:
                steps.append((_parent_index(part, self.chain[pi]), record["query"][qi]))
            for i in range(pi, 0, -1):
                steps.append((_parent_index(self.chain[i], self.chain[i - 1]), record["chain"][i]))
            for par, v in steps:
                var[:, cols] += group_sum_variance(w, par, v)
                rc = int(par.max()) + 1
                up = np.zeros((w.shape[0], rc))
                np.add.at(up, (slice(None), par), w)
                w = up / np.bincount(par, minlength=rc)
            weight[cols] = w[:, 0]  # chain[0] is the total: one cell
        return var, weight

    def columns(self, marginals: Sequence[np.ndarray]) -> np.ndarray:
        """Every column ``(areas, columns)`` as an integer (or real) sum of strategy cells."""
        n = marginals[0].shape[0]
        dtype = np.result_type(*(m.dtype for m in marginals))
        out = np.empty((n, len(self.codebook.columns)), dtype=dtype)
        for qi, (m, w) in enumerate(zip(marginals, self.column_weights, strict=True)):
            out[:, self.column_query == qi] = m @ w.T.astype(dtype)
        return out


@dataclass(frozen=True, eq=False)
class TableRelease:
    """A codebook release: integer columns, their standard errors, the derived statement.

    Attributes
    ----------
    plan : TablePlan
    values : numpy.ndarray
        int64 ``(areas, columns)``: the unbiased integer columns.
    standard_errors : numpy.ndarray
        ``(areas, columns)``: of every released column, the estimate's and the rounding's
        error together.
    estimate : numpy.ndarray
        The real-valued estimate of every column.
    privacy : PrivacyStatement
    areas : tuple of str, or None
        The rows' area codes (None: the rows are numbered from 1).
    release : LevelRelease
        The release as a member of the release family: one level ``"area"``, the codebook's
        columns as cells, a per-area diagonal covariance from :attr:`standard_errors`.
    """

    plan: TablePlan
    values: np.ndarray
    standard_errors: np.ndarray
    estimate: np.ndarray
    privacy: PrivacyStatement
    areas: tuple[str, ...] | None = None

    @functools.cached_property
    def release(self) -> LevelRelease:
        n = self.values.shape[0]
        codes = np.arange(1, n + 1) if self.areas is None else np.asarray(self.areas, object)
        return LevelRelease(
            "unbiased",
            ("area",),
            (codes,),
            tuple(self.plan.codebook.columns),
            (self.values,),
            NodeCovariance.from_standard_errors([self.standard_errors]),
            self.privacy,
            integer=True,
        )


def release_tables(
    plan: TablePlan,
    truth: np.ndarray,
    rng: KeyedRNG,
    *,
    delta: float | None = None,
    areas: Sequence[str] | None = None,
    source: str = "input",
    levels: RowLevels | None = None,
) -> TableRelease:
    """Measure, estimate, round and tabulate every column of ``truth`` (areas × columns).

    With ``levels`` (the summary level of every row) the privacy statement is per person
    over the whole file, composed over the levels a person can be counted in
    (:func:`levels_statement`); without, it is the statement of one area's measurements.

    Raises
    ------
    DataError
        When a row's columns break an identity of the codebook (not one tabulation).
    """
    truth = np.asarray(truth, dtype=np.int64)
    bad = plan.identities @ truth.T
    if bad.any():
        k, i = np.argwhere(bad)[0]
        where = f"area {areas[i]!r}" if areas is not None else f"row {i + 1}"
        raise DataError(
            f"{source}, {where}: the columns break the identity {_identity_text(plan, k)} of "
            f"{plan.codebook.source}, so they are not one tabulation of a histogram; check the "
            "file (the _sf columns) or the codebook"
        )
    answers = plan.measure(truth, rng)
    strat, chain = plan.estimate(answers)
    record: dict = {}
    ints = plan.round(strat, chain, rng, record=record)
    values = plan.columns(ints)
    if (plan.identities @ values.T).any():
        raise ArithmeticError("internal: the rounded release breaks an identity")
    # the rounding's variance: below the totals (bounded, TablePlan.rounding_variances) and
    # the area's total, rounded alone: f(1 − f), exact
    below, weight = plan.rounding_variances(record)
    se = np.sqrt(plan.column_se**2 + below + weight**2 * record["chain"][0])
    if levels is not None and levels.level.shape[0] != truth.shape[0]:
        raise ValueError(f"levels has {levels.level.shape[0]} rows, truth {truth.shape[0]}")
    privacy = plan.statement(delta) if levels is None else levels_statement(plan, levels, delta)
    codes = None if areas is None else tuple(areas)
    return TableRelease(plan, values, se, plan.columns(strat), privacy, codes)


# ------------------------------------------------------------------ composition over levels
def compose_over_levels(
    levels: RowLevels, loss_of_level: Mapping[str, PrivacyLoss]
) -> tuple[PrivacyLoss, str | None, tuple[str, ...]]:
    """The per-person privacy loss of a file whose rows are measured area by area.

    Rows of one level are disjoint areas, so each person is in at most one of them and the
    level's rows compose in parallel (McSherry 2009, parallel composition): the level costs a person
    ``loss_of_level[level]`` (the loss of one row's measurements). Rows of different levels
    can count the same person (a place and its county), so over the levels one person can be
    in (:meth:`~censusdp.hierarchy.gisjoin.RowLevels.person_groups`) the losses compose
    sequentially: ε adds when every loss is pure (Dwork & Roth 2014, Thm. 3.16), else ρ adds
    (Bun & Steinke 2016, Lemma 2.3). The per-person loss is the largest over those groups.

    Parameters
    ----------
    levels : RowLevels
    loss_of_level : mapping of level name → PureDP or ZCDP
        The loss of one row's measurements at each level present.

    Returns
    -------
    (loss, state, levels)
        The per-person loss, and the state and levels of the group that attains it (the
        first in state order).

    Raises
    ------
    KeyError
        A level present in the file with no loss given.
    """
    groups = levels.person_groups()
    losses = [compose([loss_of_level[lv] for lv in group]) for _, group in groups]
    if all(isinstance(x, PureDP) for x in losses):
        amounts = [x.epsilon for x in losses]
    else:
        losses = [x.to_zcdp() for x in losses]
        amounts = [x.rho for x in losses]
    worst = int(np.argmax(amounts))
    return losses[worst], groups[worst][0], groups[worst][1]


def levels_statement(
    plan: TablePlan, levels: RowLevels, delta: float | None = None
) -> PrivacyStatement:
    """The per-person statement of a codebook release of a file with these row ``levels``:
    every row measured with ``plan`` (ρ = ``plan.rho`` per person in the row), composed over
    the levels a person can be counted in (:func:`compose_over_levels`)."""
    per_row = plan.statement(delta)
    loss, state, worst = compose_over_levels(levels, {lv: per_row.budget for lv in levels.levels})
    titles = {lay.level: lay.title for lay in LAYOUTS}
    counts = ", ".join(f"{titles[lv]}: {n:,} rows" for lv, n in levels.counts().items())
    if len(worst) == 1:
        note = (
            f"every row is a {titles[worst[0]]} ({counts}; summary level from the "
            f"{levels.basis}): rows of one level are disjoint areas, so each person is in at "
            f"most one row and spends the ρ = {plan.rho:.6g} of one row"
        )
    else:
        where = f"in state {state}" if state is not None else "in the file"
        note = (
            f"the rows are of {len(levels.levels)} summary levels ({counts}; told from the "
            f"{levels.basis}); rows of one level are disjoint areas, but a person {where} can "
            f"be counted in one row of each of {', '.join(worst)}, and each row's "
            f"measurements spend ρ = {plan.rho:.6g}: composed per person, ρ = "
            f"{' + '.join([f'{plan.rho:.6g}'] * len(worst))} = {loss.amount:.6g}"
        )
    return replace(per_row, rho=loss.amount).with_notes(note)


def _identity_text(plan: TablePlan, k: int) -> str:
    w = plan.identities[k]
    terms = [
        f"{'+' if c > 0 else '−'} {'' if abs(c) == 1 else f'{abs(c)}·'}{plan.codebook.columns[j]}"
        for j, c in enumerate(w)
        if c
    ]
    return (" ".join(terms) + " = 0").lstrip("+ ")


# ---------------------------------------------------------------------------- refusal
def refuse_overlapping_columns(cells: Sequence[str], truth: np.ndarray, source: str) -> None:
    """Refuse columns that count a person more than once (SpecError), before any noise.

    Two tests: columns a shipped codebook knows (NHGIS codes) whose rows overlap; and,
    generically, an exact identity with coefficients ±1 among the (non-zero) columns that
    holds in every row of the data, found as an integer kernel vector (LLL-reduced) — only
    when there are more rows than columns, so that an identity is evidence. Messages name
    columns, never counts.
    """
    cells = list(cells)
    for name in available_codebooks():
        cb = Codebook.load(name)
        known = [i for i, c in enumerate(cb.columns) if c in set(cells)]
        if len(known) < 2:
            continue
        rows = cb.rows.subset(np.array(known))
        g = rows.gram()
        off = g - np.diag(np.diag(g))
        if off.any():
            a, b = np.argwhere(off)[0]
            raise SpecError(
                f"{source}: the columns overlap — they are the tables of the {name!r} codebook "
                f"({cb.source}), where a person counted in {rows.names[a]!r} is also counted "
                f"in {rows.names[b]!r}; each person is counted in up to "
                f"{rows.l1_sensitivity} of these {len(known)} columns, so treating them as "
                "disjoint cells would understate the privacy loss (ρ) by up to that factor. "
                f"Privatize with the codebook: --codebook {name} (or [data] codebook = "
                f'"{name}" in the spec), or describe the columns in a codebook TOML (the '
                "shipped model: censusdp/pipelines/codebooks/ppdd.toml) and pass its path"
            )
    x = np.asarray(truth, dtype=np.int64)
    nz = np.flatnonzero(x.any(axis=0))
    if nz.size < 2 or x.shape[0] <= nz.size:
        return
    sub = x[:, nz]
    if np.linalg.matrix_rank(sub.astype(np.float64)) == nz.size:
        return
    import flint

    ker, nullity = flint.fmpz_mat(sub.tolist()).nullspace()
    if not nullity:
        return

    def primitive(rows: list[list[int]]) -> list[list[int]]:
        return [[v // math.gcd(*r) for v in r] for r in rows]

    vecs = primitive([[int(ker[i, j]) for i in range(ker.nrows())] for j in range(nullity)])
    for w in primitive(flint.fmpz_mat(vecs).lll().tolist()):
        w = np.array([int(v) for v in w])
        support = np.flatnonzero(w)
        if support.size >= 2 and (np.abs(w[support]) == 1).all():
            pos = [cells[nz[j]] for j in support if w[j] > 0]
            neg = [cells[nz[j]] for j in support if w[j] < 0]
            lhs, rhs = (pos, neg) if len(pos) <= len(neg) else (neg, pos)
            raise SpecError(
                f"{source}: the columns overlap — {' + '.join(lhs)} = {' + '.join(rhs)} in every "
                "row, so a person counted on one side is counted again on the other; treating "
                "the columns as disjoint cells would understate the privacy loss. Describe "
                "the columns in a codebook TOML (each column a row of a product query over a "
                "schema; the shipped model is censusdp/pipelines/codebooks/ppdd.toml) and "
                "pass it with --codebook PATH, or keep only disjoint columns in [data] cells"
            )


# ------------------------------------------------------------------------------ command
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_file_columns(cb: Codebook, batch, name: str, spec: TableSpec) -> None:
    """Refuse a file the codebook does not describe (DataError, SpecError): another schema
    than the spec's, a long layout, columns missing or undescribed."""
    if spec.schema is not None and spec.schema != cb.schema.name:
        raise SpecError(
            f"{spec.source}: data.schema is {spec.schema!r} but codebook {cb.source} is over "
            f"schema {cb.schema.name!r}; drop data.schema or name the codebook's"
        )
    if batch.layout != "wide":
        raise DataError(
            f"{name}: the codebook route reads wide files (<code>_sf columns); this one is long "
            "(one row per version)"
        )
    missing = [c for c in cb.columns if c not in set(batch.cells)]
    extra = [c for c in batch.cells if c not in set(cb.columns)]
    if missing or extra:
        what = (
            f"lacks {len(missing)} of its columns (first {missing[:3]})"
            if missing
            else f"has {len(extra)} _sf columns it does not describe (first {extra[:3]})"
        )
        raise DataError(
            f"{name}: the file does not match codebook {cb.source}: it {what}; the release "
            "writes every column of the codebook from one estimate, so give a file with exactly "
            "its columns, or a codebook TOML describing the file's columns"
        )


def input_digests(
    path: str | Path,
    spec: TableSpec,
    spec_path: str | Path | None,
    codebook_file: Path | None,
    cb: Codebook,
) -> dict[str, str]:
    """SHA-256 of every input: the file, the spec, the codebook TOML, or the shipped codebook
    and schema the release was made with."""
    inputs = {str(path): _sha256(Path(path))}
    for extra in (spec_path, codebook_file):
        if extra is not None:
            inputs[str(extra)] = _sha256(Path(extra))
    if codebook_file is None:
        from importlib import resources

        for pkg, sub, name in (
            ("censusdp.pipelines", "codebooks", spec.codebook),
            ("censusdp", "schemas", cb.schema.name),
        ):
            f = resources.files(pkg) / sub / f"{name}.toml"
            if f.is_file():
                inputs[f"{pkg}/{sub}/{name}.toml"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return inputs


def codebook_dictionary(
    cb: Codebook,
    *,
    key_columns: Sequence[str] = ("gisjoin",),
    with_se: bool = True,
    suffix: str = "_dp",
) -> list[DictionaryEntry]:
    """What every column of a codebook release is (``data_dictionary.csv``, and the codebook
    route's sidecar): the geography keys, each ``<column>_dp`` (integer) with its table (the
    codebook's table and its NHGIS code) and the row's label (``Male × 65+``, ``Total``),
    its ``_se`` and ``_moe`` (the integer 90% margin of error,
    :func:`~censusdp.pipelines.io.outputs.lattice_moe`); the unit from the table's universe
    (:func:`~censusdp.pipelines.release_statement.unit_of_universes`). ``key_columns``: the
    identifier columns written first (the input's, or the hierarchy's codes)."""
    rows = cb.rows
    labels = [
        cb.rows.queries[q].labels[r].replace("total", "Total", 1)
        for q, r in zip(rows.query_of_row, rows.row_of_row, strict=True)
    ]
    tables = [f"{t} ({cb.tables[t].nhgis})" if t in cb.tables else t for t in cb.table_of]
    universe = {t: info.universe for t, info in cb.tables.items()}
    out = [
        DictionaryEntry(k, "", "identifier carried from the input, as read", "text", "code")
        for k in key_columns
    ]
    for c, t, table, lab in zip(cb.columns, cb.table_of, tables, labels, strict=True):
        unit = unit_of_universes([universe.get(t, "")])
        unit = f"{unit}s" if unit else "count"
        out += estimate_entries(
            [c], [table], [f"{lab} ({universe.get(t, '')})"], unit=unit, integer=True,
            suffix=suffix, with_se=with_se,
        )  # fmt: skip
    return out


def privatize_tables(
    path: str | Path,
    spec: TableSpec,
    out: str | Path,
    *,
    spec_path: str | Path | None = None,
    overwrite: bool = False,
    formats: Sequence[str] = (".csv", ".parquet", ".pq"),
) -> tuple[Path, TableRelease]:
    """The codebook route of ``censusdp privatize``: read, release, write (atomically).

    Writes ``out`` in the input's layout (``<col>_dp`` integer release, ``<col>_se``) and the
    sidecar ``OUT.censusdp.json`` holding the privacy statement and the manifest: strategy,
    σ² and ρ per query, codebook, schema, and the SHA-256 of every input.

    Raises
    ------
    SpecError, DataError, BudgetError
    """
    from censusdp.atomic import check_output
    from censusdp.pipelines.spec import check_run_options

    check_run_options(seed=spec.seed)
    codebook_file = Path(spec.codebook) if spec.codebook.endswith(".toml") else None
    policy: dict[str, Any] = {
        "overwrite": overwrite,
        "inputs": [path, spec_path, codebook_file],
        "formats": tuple(formats),
        "option": "-o",
    }
    if spec.levels:  # the hierarchy route: an output folder with both products
        from censusdp.pipelines.products.codebook_hierarchy import privatize_hierarchy

        return privatize_hierarchy(path, spec, out, spec_path=spec_path, overwrite=overwrite)
    check_output(out, kind="file", **policy)
    clock: dict[str, float] = {}
    with stage(clock, "read"):
        cb, batch, levels, order = _read_codebook_file(path, spec)
        plan = TablePlan.build(cb, spec.rho, spec.strategy)
        rng = KeyedRNG.from_seed(spec.seed)
    log.info(
        "read in %.1f s: %d rows; measure, GLS and rounding of %d queries per row",
        clock["read"],
        batch.truth.shape[0],
        len(plan.queries),
    )
    with stage(clock, "release"):
        rel = release_tables(
            plan,
            batch.truth[:, order],
            rng,
            delta=spec.delta,
            areas=list(batch.gisjoin),
            source=Path(path).name,
            levels=levels,
        )
        inputs = input_digests(path, spec, spec_path, codebook_file, cb)
        info = _codebook_info(plan, rel, batch, levels, spec.rho, inputs)
    log.info("released in %.1f s; writing %s", clock["read"] + clock["release"], Path(out).name)
    _write_codebook_release(out, batch, rel, order, info, policy)
    return Path(out), rel


def _read_codebook_file(path: str | Path, spec: TableSpec) -> tuple[Codebook, Any, Any, np.ndarray]:
    """The codebook, the file (checked against it), each row's summary level (told before
    any noise: rows of several levels share persons) and the codebook's columns' positions
    among the file's."""
    from censusdp.pipelines.io.nhgis import read_batch, row_geography

    cb = Codebook.load(spec.codebook)
    log.info("reading %s (codebook %s)", Path(path).name, cb.source)
    batch = read_batch(path, encoding=spec.encoding)
    check_file_columns(cb, batch, Path(path).name, spec)
    levels = row_geography(
        batch,
        level=spec.level,
        level_column=spec.level_column,
        fix=(
            'declare it in a spec (--spec): [data] level = "place" for a file of one level, '
            'or [data] level_column = "COLUMN" naming a column with each row\'s level name '
            "or SUMLEV code"
        ),
    )
    order = np.array([batch.cells.index(c) for c in cb.columns])
    return cb, batch, levels, order


def _codebook_info(
    plan: TablePlan,
    rel: TableRelease,
    batch,
    levels: RowLevels,
    rho_requested: float,
    inputs: dict[str, str],
) -> dict[str, Any]:
    """The sidecar's manifest of a codebook release: the statement, the strategy's σ² and
    ρ per query, the rows' geography, the estimator, the inputs' digests and the data
    dictionary."""
    cb = plan.codebook
    info = {
        "route": "codebook",
        "privacy": rel.privacy.text(),
        "privacy_statement": rel.privacy.to_dict(),
        "codebook": cb.source,
        "schema": cb.schema.name,
        "areas": int(batch.truth.shape[0]),
        "strategy": plan.strategy_rows(),
        "rho_requested": rho_requested,
        "rho_derived": rel.privacy.rho,
        "rho_per_row": plan.rho,
        "geography": {
            "levels": levels.counts(),
            "told_from": levels.basis,
            "person_groups": [
                {"state": st, "levels": list(lvs)} for st, lvs in levels.person_groups()
            ],
        },
        "estimator": "single-node GLS in the marginal basis (F⁺h); integer rounding of the "
        "strategy marginals in the order of their shared margins, columns summed in integers",
        "identities": int(plan.identities.shape[0]),
        "standard_errors": STANDARD_ERRORS_NOTE,
        "inputs_sha256": inputs,
    }
    keys = [*batch.key_columns, *([batch.version_column] if batch.layout == "long" else [])]
    dictionary = codebook_dictionary(cb, key_columns=keys)
    info["columns"] = OUTPUT_COLUMNS_NOTE.replace("data_dictionary.csv", "data_dictionary")
    info["data_dictionary"] = [dataclasses.asdict(e) for e in dictionary]
    return info


def _write_codebook_release(
    out: str | Path, batch, rel: TableRelease, order: np.ndarray, info: dict, policy: dict
) -> None:
    """Write the release in the input's layout (atomically, with the sidecar ``info``):
    integers as integers, SEs to 6 significant digits, the integer (lattice) 90% MOE."""
    from censusdp.atomic import output_file
    from censusdp.pipelines.io.nhgis import write_batch

    with output_file(out, command="privatize", info=info, **policy) as tmp:
        values = np.empty_like(rel.values)
        ses = np.empty(rel.values.shape)
        values[:, order], ses[:, order] = rel.values, rel.standard_errors
        meta = {"privacy": info["privacy"], "schema": info["schema"], "codebook": info["codebook"]}
        ses, moes = written_errors(ses, integer=True)
        write_batch(
            batch, values, ses, tmp, margins_of_error=moes,
            metadata={**meta, "data_dictionary": info["data_dictionary"]},
        )  # fmt: skip
