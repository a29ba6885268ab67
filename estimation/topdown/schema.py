"""TopDown-style on schema histograms: the Bureau's multi-pass solves, level by level.

The root is solved alone; then, from the root down, the children of every parent are solved
jointly given the parent's *integer* histogram: the multi-pass non-negative least squares of
:func:`~censusdp.estimation.topdown.sparse.l2_multipass` on the level's measured product
queries, then the multi-pass controlled rounding of
:func:`~censusdp.estimation.topdown.sparse.l1_multipass`. Invariants (given at any level,
propagated upwards by summing over children) are met with ``==``; structural zeros (cells no
node may fill, e.g. persons under 18 in a nursing facility, the Bureau's ``nurse_nva_0``
edit) are removed from every problem. A parent with one child hands its histogram down, a
parent with an empty histogram has empty children; no solver runs for them.

For ``pl94`` the query orderings are the Bureau's production ones (:func:`bureau_pl94_ordering`,
``Strategy1b_ST_CTY_TR_BG_isoTot_Ordering_dsepJune3``): at the root one L2 pass over every
query; at the state, county, tract and block-group levels pass 0 the ``total`` alone and
pass 1 the others; at the blocks one pass over everything. The rounder: ``total`` first, then
``hhgq``, ``hhgq * hispanic``, ``hhgq * hispanic * cenrace``, ``detailed`` (at the root and
the blocks in a single pass). Other schemas get :func:`default_ordering` (``total``, then
the other measured queries; rounding ``total``, then ``detailed``) unless the caller names
passes.

This is the library's one TopDown-style implementation: a classic flat cells table is the
one-attribute schema ``Schema.flat(cells)``, and :func:`~censusdp.estimation.topdown.flat.topdown`
is the front end that converts its queries and calls :func:`topdown_schema`. A level whose
cells no measured or invariant query identifies is refused; a level without measurements
whose invariants fix its cells is solved from them.

Non-negativity and the parent equality are kept on purpose: they are what makes TopDown
biased for small areas and cells. This is the baseline the unbiased estimator
(:func:`~censusdp.estimation.gls.structured.structured_gls`, on the same measurements) is
compared with.

References
----------
Abowd et al. (2022), "The 2020 Census Disclosure Avoidance System TopDown Algorithm",
Harvard Data Science Review, Special Issue 2.
U.S. Census Bureau (2021), DAS_2020_Redistricting_Production_Code,
``programs/strategies/strategies.py`` and ``configs/production/pl94/person_US.ini``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from censusdp.budget import PrivacyStatement, with_invariants
from censusdp.errors import DataError, SolverError, SpecError
from censusdp.estimation.gls.structured import resolve_products
from censusdp.estimation.release import Release
from censusdp.estimation.topdown.sparse import (
    DEFAULT_SLACK,
    ChildrenLayout,
    l1_multipass,
    l2_multipass,
)
from censusdp.executor import Executor
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.forest import Forest
from censusdp.mechanisms.privacy import check_statement, derive_statement
from censusdp.mechanisms.product_measure import (
    ProductInvariant,
    ProductMeasurement,
    checked_values,
    product_privacy,
)
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.options import with_keywords
from censusdp.schema import Schema
from censusdp.timing import stage

__all__ = [
    "LevelOrdering",
    "TopDownOptions",
    "TopDownPasses",
    "bureau_pl94_ordering",
    "default_ordering",
    "propagate_product_invariants",
    "structural_zero_mask",
    "topdown_forest",
    "topdown_schema",
    "trivial_children",
]

#: Per level: (L2 passes of query names, rounder passes of query texts).
LevelOrdering = tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]

_OTHERS = (
    "cenrace", "hispanic", "votingage", "hhinstlevels", "hhgq", "votingage * hispanic",
    "hispanic * cenrace", "votingage * cenrace", "votingage * hispanic * cenrace", "detailed",
)  # fmt: skip
_ROUNDER = (
    "total", "hhgq", "hhgq * hispanic", "hhgq * hispanic * cenrace",
    "hhgq * votingage * hispanic * cenrace", "detailed",
)  # fmt: skip

_POST_PROCESSING = (
    "TopDown-style estimates (non-negative integers, consistent, invariants exact) are "
    "post-processing of the same measurements and invariants: the privacy guarantee is "
    "unchanged; they carry no standard errors and are biased for small areas"
)


def bureau_pl94_ordering(level_names: Sequence[str]) -> dict[str, LevelOrdering]:
    """The Bureau's production query orderings for the ``pl94`` strategy, per level.

    ``Strategy1b_ST_CTY_TR_BG_isoTot_Ordering_dsepJune3`` (``person_US.ini``): the root
    (``US``) one L2 pass and one rounder pass; the leaves (``Block``) one L2 pass over
    ``total`` and the others, one rounder pass; every level between: L2 ``total`` then the
    others, rounder ``total`` then ``hhgq`` … ``detailed``. (The Bureau's lists name
    ``hhgq`` and ``votingage * hispanic`` twice and ``hhgq * votingage * hispanic *
    cenrace``, which is ``detailed`` in this schema; each query is used once.)
    """
    out: dict[str, LevelOrdering] = {}
    last = len(level_names) - 1
    for k, name in enumerate(level_names):
        if k == 0:
            out[name] = ((_OTHERS,), (_ROUNDER,))
        elif k == last:
            out[name] = ((("total", *_OTHERS),), (_ROUNDER,))
        else:
            out[name] = ((("total",), _OTHERS), (("total",), _ROUNDER[1:]))
    return out


def structural_zero_mask(schema: Schema, rows: Sequence[tuple[str, Sequence[str]]]) -> np.ndarray:
    """Flat boolean mask of the cells counted by the given query rows (structural zeros).

    Parameters
    ----------
    schema : Schema
    rows : sequence of (query text, row key)
        E.g. ``[("hhgq * votingage", ("Nursing facilities/Skilled-nursing facilities",
        "Under 18 years"))]``, the Bureau's ``nurse_nva_0`` edit.

    Raises
    ------
    SpecError
        A query or a row label the schema does not have.
    """
    mask = np.zeros(schema.shape, bool)
    for text, key in rows:
        q = ProductQuery.parse(schema, text)
        z = np.zeros(q.n_rows, np.int64)
        z[q.row_index(key)] = 1
        mask |= q.adjoint(z) > 0
    return mask.reshape(-1)


def _by_level(
    hierarchy: Hierarchy, schema: Schema, measurements: Sequence[ProductMeasurement]
) -> list[list[ProductMeasurement]]:
    """The measurements per level (levels as indices, values checked), each query once."""
    out: list[list[ProductMeasurement]] = [[] for _ in range(hierarchy.depth)]
    for mm in resolve_products(hierarchy, schema, measurements, "measurement"):
        if any(o.query.name == mm.query.name for o in out[mm.level]):
            raise SpecError(
                f"level {hierarchy.names[mm.level]!r}: query {mm.query.name!r} is measured twice"
            )
        out[mm.level].append(mm)
    return out


def propagate_product_invariants(
    hierarchy: Hierarchy, invariants: Sequence[ProductInvariant]
) -> list[dict[str, tuple[ProductQuery, np.ndarray]]]:
    """Per level, the invariants given there plus their sums from the levels below.

    A query held exactly at every node of level ``k`` is held exactly at every node above
    (the sum over children), so every sub-problem sees invariants consistent with its parent
    and stays feasible. A query given at a level and implied from below must agree exactly.

    Returns
    -------
    list of dict
        Per level (root first), query name → (query, int64 ``(n_nodes, rows)`` values).

    Raises
    ------
    SpecError
        An unknown level, or values of the wrong shape.
    DataError
        Values that are not integers, or an invariant that disagrees with the sum of the
        same invariant over its children (naming the level and node).
    """
    out: list[dict[str, tuple[ProductQuery, np.ndarray]]] = [{} for _ in range(hierarchy.depth)]

    def put(k: int, q: ProductQuery, v: np.ndarray) -> None:
        old = out[k].get(q.name)
        if old is not None:
            bad = np.flatnonzero(np.any(old[1] != v, axis=1))
            if bad.size:
                lv = hierarchy.levels[k]
                raise DataError(
                    f"invariant {q.name!r} at level {lv.name!r}, node {str(lv.codes[bad[0]])!r}, "
                    "disagrees with the sum of the same invariant over its children; give "
                    "invariants that nest"
                )
        else:
            out[k][q.name] = (q, v)

    for inv in invariants:
        k = hierarchy.level_index(inv.level)
        lv = hierarchy.levels[k]
        v = checked_values(inv.values, lv.size, inv.query, "invariant", lv.name)
        if not np.all(np.isfinite(v)) or np.any(v != np.rint(v)):
            raise DataError(
                f"invariant {inv.query.name!r} at level {lv.name!r} is not integer-valued; "
                "TopDown needs integer invariants (counts)"
            )
        put(k, inv.query, np.rint(v).astype(np.int64))
    for k in range(hierarchy.depth - 1, 0, -1):
        for q, v in list(out[k].values()):
            put(k - 1, q, hierarchy.aggregate_up(k, v))
    return out


def trivial_children(
    forest: Forest, j: int, parent: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The children no solver needs, and the parents left to solve, of forest level ``j``
    (``parent``: the int64 histograms of level ``j - 1``).

    An only child equals its (integer) parent; the children of a parent with an all-zero
    histogram are all zero. Returns the children's int64 histograms with those filled in
    (``(n_children, cells)``, zero elsewhere), the parents with one child, the mask of parents
    with several children and an all-zero histogram, and the indices of the other parents.
    """
    count, start = forest.child_count[j - 1], forest.child_start(j - 1)
    out = np.zeros((forest.sizes[j], parent.shape[1]), dtype=np.int64)
    single = np.flatnonzero(count == 1)
    out[start[single]] = parent[single]
    zero = (count > 1) & (parent.sum(axis=1) == 0)
    todo = np.flatnonzero((count > 1) & ~zero)
    return out, single, zero, todo


def _solve_parent(task: tuple, opts: dict) -> tuple[np.ndarray, dict]:
    """L2 then L1 for one parent (a pure function of its inputs)."""
    parent, meas, invs, n, where = task
    clock: dict[str, float] = {}
    with stage(clock, "seconds", cpu=time.process_time):
        with stage(clock, "l2"):
            layout = ChildrenLayout(n, opts["n_cells"], parent, opts["zero"])
            xt, l2 = l2_multipass(layout, meas, invs, opts["l2"], slack=opts["slack"], where=where)
        with stage(clock, "l1"):
            counts, l1 = l1_multipass(layout, xt, invs, opts["l1"], where=where)
    return counts, {
        "active": layout.n_active,
        "l2_seconds": clock["l2"],
        "l1_seconds": clock["l1"],
        "cpu_seconds": clock["cpu_seconds"],
        "l2_status": [p.status for p in l2],
        "l1_status": [p.status for p in l1],
    }


def _solve_run(run: list[tuple], opts: dict) -> list[tuple[np.ndarray, dict]]:
    """A run of parents: one task of an executor."""
    return [_solve_parent(t, opts) for t in run]


def _runs(children: np.ndarray, chunks: int) -> list[np.ndarray]:
    """Parents ``0 .. n-1`` cut into at most ``chunks`` contiguous runs of about equal numbers
    of children (their problems' size), none empty."""
    if children.size == 0:
        return []
    cum = np.cumsum(children)
    targets = cum[-1] * np.arange(1, max(1, chunks)) / max(1, chunks)
    bounds = np.unique(np.concatenate([[0], np.searchsorted(cum, targets, "right"), [cum.size]]))
    return [np.arange(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True) if hi > lo]


@dataclass(frozen=True, eq=False)
class TopDownOptions:
    """How :func:`topdown_schema` solves, beyond its data: the passes, the held cells, the
    band, the claimed statement and where the parents' problems run.

    Attributes
    ----------
    ordering : mapping level name → (L2 passes, rounder passes), optional
        Query names per pass (see :func:`bureau_pl94_ordering`, the default for ``pl94``).
        Default for other schemas (:func:`default_ordering`): at every level L2 passes
        ``total`` then the other measured queries, rounder passes ``total`` then
        ``detailed``.
    structural_zeros : numpy.ndarray, optional
        Boolean mask (flat or ``schema.shape``) of cells held at zero at every node
        (:func:`structural_zero_mask`). The root's noisy answers are fitted with them.
    slack : float
        The L2 band's additive slack in counts (the Bureau's ``opt_tol_slack`` = 0.1).
    privacy : PrivacyStatement, optional
        Checked against the statement derived from the measurements (BudgetError when it
        claims less).
    chunks : int, optional
        Runs of parents per level, contiguous and of about equal size in children (default
        1, or 4 per worker of an ``executor``).
    progress : callable, optional
        Called with one line per level solved.
    executor : Executor, optional
        Runs each level's runs of parents as tasks (:mod:`censusdp.pipelines.execute`: sync,
        threads, a Dask cluster), the largest first; None: here, in turn. Every parent's
        problem is a pure function of its inputs, so the release is the same for any
        executor, number of workers and ``chunks``.
    """

    ordering: Mapping[str, LevelOrdering] | None = None
    structural_zeros: np.ndarray | None = None
    slack: float = DEFAULT_SLACK
    privacy: PrivacyStatement | None = None
    chunks: int | None = None
    progress: Callable[[str], None] | None = None
    executor: Executor | None = None


def topdown_schema(
    hierarchy: Hierarchy,
    schema: Schema,
    measurements: Sequence[ProductMeasurement],
    invariants: Sequence[ProductInvariant] = (),
    options: TopDownOptions | None = None,
    **legacy: Any,
) -> Release:
    """TopDown-style estimates of a schema histogram: non-negative integers, consistent.

    Parameters
    ----------
    hierarchy : Hierarchy
    schema : Schema
    measurements : sequence of ProductMeasurement
        Noisy answers of product queries, every level measured (the root included); any
        noise law, weighted by the inverse of its variance (per node with
        ``node_variance``).
    invariants : sequence of ProductInvariant
        Exact integer answers, met with ``==``; propagated to the levels above.
    options : TopDownOptions, optional
        The ordering, structural zeros, slack, claimed statement and the executor
        (:class:`TopDownOptions`; defaults when omitted).
    **legacy
        The fields of :class:`TopDownOptions` as keyword arguments, as before it existed
        (applied over ``options``; accepted for one release).

    Returns
    -------
    Release
        ``estimator="topdown"``, int64 ``(n_nodes, cells)`` per level; diagnostics per
        level: parents solved and trivial, mean active cells, the L2 and rounding passes'
        statuses, rounding passes that needed the MILP, L2 and L1 seconds.

    Raises
    ------
    SpecError
        A measured query in no L2 pass, or measurements over another schema.
    DataError
        Malformed measurements or invariants, or structural zeros an invariant contradicts.
    SolverError
        A sub-problem failed; the message names the level and parent.
    TypeError
        A keyword that is no field of :class:`TopDownOptions`.
    """
    opts = with_keywords(TopDownOptions, options, legacy, "topdown_schema")
    plan = _plan(hierarchy, schema, measurements, invariants, opts)
    levels = hierarchy.levels
    forest = Forest(
        0, hierarchy.names, hierarchy.sizes, [lv.child_count for lv in levels[:-1]],
        [lv.codes for lv in levels],
    )  # fmt: skip
    estimates, diag = topdown_forest(
        forest, None, [plan.level_meas(k) for k in range(hierarchy.depth)], plan.invs,
        plan.passes, executor=opts.executor, chunks=plan.chunks, progress=opts.progress,
    )  # fmt: skip
    names = hierarchy.names
    labels = [f"{names[hierarchy.level_index(i.level)]}: {i.query.name}" for i in invariants]
    statement = with_invariants(plan.statement, list(dict.fromkeys(labels)))
    return Release(
        estimator="topdown",
        hierarchy=hierarchy,
        cells=schema.cells,
        estimates=estimates,
        variances=None,
        privacy=statement.with_notes(_POST_PROCESSING),
        integer=True,
        diagnostics={
            "levels": diag,
            "seconds": float(sum(d["seconds"] for d in diag.values())),
            "cpu_seconds": float(sum(d["cpu_seconds"] for d in diag.values())),
            "milp_fallbacks": int(sum(d["milp_fallbacks"] for d in diag.values())),
            "slack": opts.slack,
            "ordering": {
                lvl: [list(map(list, o[0])), list(map(list, o[1]))]
                for lvl, o in plan.ordering.items()
            },
            "structural_zeros": 0 if plan.passes.zero is None else int(plan.passes.zero.sum()),
            "strategy": "per-parent sparse problems: Clarabel (L2 passes), HiGHS MILP (L1)",
        },
    )


@dataclass(frozen=True, eq=False)
class TopDownPasses:
    """What every parent's problem of a run shares: the number of cells, the structural
    zeros (flat mask or None), per level name the L2 passes (query names) and the rounder
    passes (product queries), and the L2 band's slack (:func:`topdown_forest`)."""

    n_cells: int
    zero: np.ndarray | None
    l2: Mapping[str, tuple[tuple[str, ...], ...]]
    l1: Mapping[str, tuple[tuple[ProductQuery, ...], ...]]
    slack: float = DEFAULT_SLACK

    @classmethod
    def of(
        cls,
        schema: Schema,
        ordering: Mapping[str, LevelOrdering],
        zero: np.ndarray | None = None,
        slack: float = DEFAULT_SLACK,
    ) -> TopDownPasses:
        """The passes of ``ordering`` (rounder query texts parsed over ``schema``)."""
        l1 = {
            lvl: tuple(tuple(ProductQuery.parse(schema, t) for t in p) for p in passes)
            for lvl, (_, passes) in ordering.items()
        }
        return cls(schema.n_cells, zero, {lvl: o[0] for lvl, o in ordering.items()}, l1, slack)

    def solve_opts(self, level: str) -> dict:
        """What every parent's problem at ``level`` shares (:func:`_solve_parent`)."""
        return dict(
            n_cells=self.n_cells, zero=self.zero, l2=self.l2[level], l1=self.l1[level],
            slack=self.slack,
        )  # fmt: skip


@dataclass(frozen=True, eq=False)
class _Plan:
    """A checked TopDown-style problem: measurements and invariants per level (invariants
    with the sums of those below), the passes per level, the derived statement and how
    many runs of parents a level's problems make."""

    hierarchy: Hierarchy
    meas: list[list[ProductMeasurement]]
    invs: list[dict[str, tuple[ProductQuery, np.ndarray]]]
    ordering: Mapping[str, LevelOrdering]
    passes: TopDownPasses
    statement: PrivacyStatement
    chunks: int
    opts: TopDownOptions

    def level_meas(self, k: int) -> list[tuple]:
        """Level ``k``'s ``(query, values, variance)`` at every node."""
        return [
            (
                mm.query,
                np.asarray(mm.values),
                np.asarray(mm.variance) if np.ndim(mm.variance) else mm.variance,
            )
            for mm in self.meas[k]
        ]


def _plan(
    hierarchy: Hierarchy,
    schema: Schema,
    measurements: Sequence[ProductMeasurement],
    invariants: Sequence[ProductInvariant],
    opts: TopDownOptions,
) -> _Plan:
    """Check the inputs and the options and set the problem up (:class:`_Plan`)."""
    chunks = opts.chunks
    if chunks is None:
        chunks = 1 if opts.executor is None else 4 * max(1, int(opts.executor.workers))
    names = hierarchy.names
    meas = _by_level(hierarchy, schema, measurements)
    invs = propagate_product_invariants(hierarchy, invariants)
    product_privacy(list(measurements), level_names=names)  # node variances ≥ the law's
    # derived with the invariants: the statement names them itself (induced subspace DP)
    # rather than carrying a note that a supplied statement omitted them
    derived = derive_statement(
        names,
        [(hierarchy.level_index(mm.level), mm.query, mm.law) for mm in measurements],
        resolve_products(hierarchy, schema, invariants, "invariant", check_values=False),
    )
    statement = check_statement(opts.privacy, derived) if opts.privacy is not None else derived
    m = schema.n_cells
    zero = None
    if opts.structural_zeros is not None:
        zero = np.asarray(opts.structural_zeros, bool).reshape(-1)
        if zero.size != m:
            raise SpecError(
                f"structural_zeros has {zero.size} cells; schema {schema.name!r} has {m}"
            )
    ordering = opts.ordering
    if ordering is None:
        ordering = default_ordering(schema, names, [[q.query.name for q in lv] for lv in meas])
    _check_identified(hierarchy, meas, invs, m)
    _check_ordering(hierarchy, meas, ordering)
    passes = TopDownPasses.of(schema, ordering, zero, opts.slack)
    return _Plan(hierarchy, meas, invs, ordering, passes, statement, chunks, opts)


def default_ordering(
    schema: Schema, level_names: Sequence[str], measured: Sequence[Sequence[str]]
) -> dict[str, LevelOrdering]:
    """The passes used when none are given: the Bureau's for ``pl94``
    (:func:`bureau_pl94_ordering`), else at every level L2 pass 0 the ``total`` (when
    measured) and pass 1 the level's other measured queries, rounder passes ``total`` then
    ``detailed`` — the two-pass form of the Bureau's ``isoTot`` orderings (Abowd et al.
    2022, §5), also what a flat table (``Schema.flat(cells)``) gets.

    Parameters
    ----------
    schema : Schema
    level_names : sequence of str
    measured : sequence of sequence of str
        Per level, the names of its measured queries.
    """
    if schema.name == "pl94":
        return bureau_pl94_ordering(level_names)
    out: dict[str, LevelOrdering] = {}
    for name, queries in zip(level_names, measured, strict=True):
        first = ("total",) if "total" in queries else ()
        rest = tuple(q for q in dict.fromkeys(queries) if q != "total")
        out[name] = (tuple(p for p in (first, rest) if p), (("total",), ("detailed",)))
    return out


#: Above this many cells a level without ``detailed`` is not rank-checked (a dense
#: rows × cells factorisation) but refused.
_RANK_CELLS = 4096


def _check_identified(
    hierarchy: Hierarchy,
    meas: list[list[ProductMeasurement]],
    invs: list[dict[str, tuple[ProductQuery, np.ndarray]]],
    n_cells: int,
) -> None:
    """Refuse a level whose cells no measurement or invariant identifies.

    TopDown fixes each level's histogram before the level below is solved, so a level whose
    measured and invariant queries do not span the cells would be split arbitrarily (the
    solver's tie-break) and every level below would inherit that split.
    """
    for k, lv in enumerate(hierarchy.levels):
        queries = [mm.query for mm in meas[k]] + [q for q, _ in invs[k].values()]
        if any(q.name == "detailed" for q in queries):
            continue
        if n_cells > _RANK_CELLS:
            why = f"measures no detailed query over its {n_cells} cells"
        else:
            rows = [q.dense() for q in queries]
            rank = int(np.linalg.matrix_rank(np.vstack(rows).astype(np.float64))) if rows else 0
            if rank >= n_cells:
                continue
            why = f"has only {rank} independent measured or invariant queries over {n_cells} cells"
        raise SpecError(
            f"TopDown-style needs every level's cells identified, but level {lv.name!r} {why}; "
            f'measure its histogram (add "detailed" to [queries] for {lv.name!r}), as the '
            "Census Bureau measures every level"
        )


def _check_ordering(
    hierarchy: Hierarchy,
    meas: list[list[ProductMeasurement]],
    ordering: Mapping[str, LevelOrdering],
) -> None:
    """Every level has an ordering and every measured query a pass (a level without
    measurements must be identified by its invariants: :func:`_check_identified`)."""
    for k, lv in enumerate(hierarchy.levels):
        if lv.name not in ordering:
            raise SpecError(f"ordering has no entry for level {lv.name!r}")
        in_pass = {q for p in ordering[lv.name][0] for q in p}
        missing = [mm.query.name for mm in meas[k] if mm.query.name not in in_pass]
        if missing:
            raise SpecError(
                f"level {lv.name!r}: measured queries {missing} are in no L2 pass of the "
                "ordering; add them to a pass"
            )


def topdown_forest(
    forest: Forest,
    top: np.ndarray | None,
    measurements: Sequence[Sequence[tuple[ProductQuery, np.ndarray, Any]]],
    invariants: Sequence[Mapping[str, tuple[ProductQuery, np.ndarray]]],
    passes: TopDownPasses,
    *,
    executor: Executor | None = None,
    chunks: int = 1,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[np.ndarray], dict[str, dict]]:
    """TopDown-style down a forest: every level's children solved given their parents'
    integer histograms (Abowd et al. 2022, §4: the L2 passes, then the rounder).

    :func:`topdown_schema` runs it on the whole hierarchy; a partition of the driver
    (:mod:`~censusdp.pipelines.topdown_integerizer`) on its subtrees below the cut, from the
    cut nodes' integers. Every parent's problem is a pure function of its inputs, so a level's
    histograms do not depend on the forest it is solved in, the executor or ``chunks``.

    Parameters
    ----------
    forest : Forest
        The levels to solve (local node indices).
    top : numpy.ndarray or None
        The int64 histograms ``(nodes, cells)`` of the forest's first level, or None: its one
        node is a root, solved alone (no parent).
    measurements : sequence of sequence of (ProductQuery, values, variance)
        Per forest level, the measured queries' answers at its nodes and their variance (a
        float or one per node).
    invariants : sequence of mapping
        Per forest level, query name → (query, int64 values at its nodes), met with ``==``
        (with the sums of the levels below: :func:`propagate_product_invariants`).
    passes : TopDownPasses
    executor : Executor, optional
        Runs a level's runs of parents as tasks (None: here, in turn).
    chunks : int
        Runs of parents per level, contiguous, of about equal numbers of children.
    progress : callable, optional
        Called with one line per level solved.

    Returns
    -------
    estimates : list of numpy.ndarray
        Per forest level, int64 ``(nodes, cells)``; the first is ``top`` when given.
    diagnostics : dict
        Per level solved (by name): :func:`_level_diag`.

    Raises
    ------
    SolverError
        A sub-problem failed, or a level's result is not exact (negative, not summing to its
        parents, a structural zero filled, an invariant missed); the message names the level
        and parent.
    """
    walk = _Walk(forest, passes, executor, chunks, progress, {})
    out = [walk.root(measurements[0], invariants[0]) if top is None else np.asarray(top)]
    for j in range(1, forest.depth):
        out.append(walk.level(j, out[-1], measurements[j], invariants[j]))
    return out, walk.diag


@dataclass(frozen=True, eq=False)
class _Walk:
    """One :func:`topdown_forest` run: the forest, the passes, where the parents' problems
    run, and the levels' diagnostics."""

    forest: Forest
    passes: TopDownPasses
    executor: Executor | None
    chunks: int
    progress: Callable[[str], None] | None
    diag: dict[str, dict]

    def root(self, meas: Sequence[tuple], invs: Mapping[str, tuple]) -> np.ndarray:
        """The root's histogram alone (no parent)."""
        name = self.forest.names[0]
        clock: dict[str, float] = {}
        with stage(clock, "seconds", cpu=time.process_time):
            where = f"level {name!r}, root {self.forest.code(0, 0)!r}"
            task = (None, list(meas), list(invs.values()), 1, where)
            counts, info = _solve_parent(task, self.passes.solve_opts(name))
        self.diag[name] = _level_diag([info], 0, 0, clock)
        if self.progress:
            self.progress(f"{name}: {self.diag[name]['seconds']:.1f} s")
        return counts

    def level(
        self, j: int, par: np.ndarray, meas: Sequence[tuple], invs: Mapping[str, tuple]
    ) -> np.ndarray:
        """Forest level ``j`` given its parents' integer histograms ``par``: trivial parents
        handed down, the others' problems solved (in runs), the level checked exactly."""
        f = self.forest
        name, up = f.names[j], f.names[j - 1]
        clock: dict[str, float] = {}
        with stage(clock, "seconds", cpu=time.process_time):
            out, single, empty, todo = trivial_children(f, j, par)
            start, count = f.child_start(j - 1), f.child_count[j - 1]
            tasks = []
            for p in todo:
                lo, hi = int(start[p]), int(start[p] + count[p])
                m = [(q, v[lo:hi], var[lo:hi] if np.ndim(var) else var) for q, v, var in meas]
                where = f"level {name!r}, parent {f.code(j - 1, p)!r} (level {up!r})"
                tasks.append((par[p], m, [(q, v[lo:hi]) for q, v in invs.values()], hi - lo, where))
            infos = []
            for p, (cnt, info) in zip(todo, self._solve(name, tasks), strict=True):
                out[start[p] : start[p] + cnt.shape[0]] = cnt
                infos.append(info)
            _check_level(f, j, out, par, invs, self.passes.zero)
        d = self.diag[name] = _level_diag(infos, int(single.size), int(empty.sum()), clock)
        if self.progress:
            self.progress(
                f"{name}: {d['parents_solved']} parents, {d['seconds']:.1f} s "
                f"({d['cpu_seconds']:.1f} CPU s; L2 {d['l2_seconds']:.1f} s, L1 "
                f"{d['l1_seconds']:.1f} s; {d['mean_active_cells']:.0f} active cells)"
            )
        return out

    def _solve(self, name: str, tasks: list[tuple]) -> Iterator[tuple[np.ndarray, dict]]:
        """The parents' problems of level ``name`` solved in contiguous runs, on the
        executor or here; results in the tasks' order."""
        runs = _runs(np.asarray([t[3] for t in tasks], np.int64), self.chunks)
        items = [[tasks[i] for i in r] for r in runs]
        o = self.passes.solve_opts(name)
        if self.executor is not None:
            handles = self.executor.submit(_solve_run, items, o, cost=[len(r) for r in runs])
            try:
                results = self.executor.gather(handles)
            finally:
                self.executor.release(handles)
        else:
            results = [_solve_run(it, o) for it in items]
        return (r for run in results for r in run)


def _level_diag(infos: list[dict], single: int, empty: int, clock: dict[str, float]) -> dict:
    """A level's diagnostics from its solved parents' and its ``clock`` (``seconds``,
    ``cpu_seconds``): parents solved and trivial, mean active cells, the L2 passes' and the
    rounding passes' statuses counted, the rounding passes that needed the MILP (their LP
    relaxation had a fractional vertex), L2 and L1 seconds."""
    l1 = Counter(s for i in infos for s in i["l1_status"])
    return {
        "parents_solved": len(infos),
        "trivial_single_child": single,
        "trivial_zero_parent": empty,
        "mean_active_cells": float(np.mean([i["active"] for i in infos])) if infos else 0.0,
        "l2_status": dict(Counter(s for i in infos for s in i["l2_status"])),
        "l1_status": dict(l1),
        "milp_fallbacks": int(l1.get("milp", 0)),
        "l2_seconds": float(sum(i["l2_seconds"] for i in infos)),
        "l1_seconds": float(sum(i["l1_seconds"] for i in infos)),
        "seconds": clock["seconds"],
        "cpu_seconds": clock["cpu_seconds"],
    }


def _check_level(
    forest: Forest,
    j: int,
    out: np.ndarray,
    parent: np.ndarray,
    invs: Mapping[str, tuple[ProductQuery, np.ndarray]],
    zero: np.ndarray | None,
) -> None:
    """Consistency, non-negativity, invariants and structural zeros, exactly."""
    name = forest.names[j]
    if np.any(out < 0):
        raise SolverError(f"level {name!r}: a negative count survived the rounding")
    if not np.array_equal(forest.sum_children(j - 1, out), parent):
        raise SolverError(f"level {name!r}: children do not sum to their parents")
    if zero is not None and np.any(out[:, zero]):
        raise SolverError(f"level {name!r}: a structural zero is filled")
    for q, v in invs.values():
        if not np.array_equal(q.apply(out.reshape(-1, *q.schema.shape)), v):
            raise SolverError(f"level {name!r}: invariant {q.name!r} is not met exactly")
