"""The codebook route over a geographic hierarchy: one engine for a state's county file.

A codebook file whose rows are the counties of one or more states (the NHGIS PPDD county
extracts) is released the way the PPMF route releases blocks
(:mod:`censusdp.pipelines.products.ppmf_persons`), on the same schema machinery:

1. **Hierarchy from the rows' GISJOIN** (``[hierarchy] levels = ["nation", "state",
   "county"]``): a county's GISJOIN ``G` + state FIPS + ``0`` + county FIPS + ``0`` holds its
   state's (``code[:4]``), so the tree is :func:`~censusdp.hierarchy.builders.from_gisjoin`
   of the rows, which are its leaves. Counties are public geography, so the tree reads no
   confidential data.
2. **Measurements at the rows' level**: each row's strategy of marginals (the codebook's, as
   in :mod:`censusdp.pipelines.products.codebook_tables`), computed from its ``_sf`` columns, with
   discrete Gaussian noise (Canonne, Kamath & Steinke 2020). Rows are disjoint areas, so a
   person is in one row and spends the ρ of one row's measurements (parallel composition,
   McSherry 2009); the statement is derived by the structured GLS from the measurements and
   checked against :func:`~censusdp.pipelines.products.codebook_tables.levels_statement`.
3. **Invariants** (``[invariants] state = "total"``): the states' totals, computed from the
   rows' ``_sf`` columns, are held exact; the guarantee is then induced subspace DP (Gao,
   Gong & Yu 2022), said in the statement.
4. **Structured GLS over the hierarchy**
   (:func:`~censusdp.estimation.gls.structured.structured_gls`): consistent — every state's
   tables are the sums of its counties' — with the invariants exact and the GLS covariance
   of every column at every node.
5. **Two integer products from the same estimate** (post-processing, one statement):

   * ``unbiased/``: the totals are rounded down the tree (each node's children shifted by
     their parent's rounding error shared out, then pipage rounded in the parent's group,
     :func:`~censusdp.pipelines.products.codebook_tables.round_given`; invariant levels are exact),
     then every county's strategy marginals down the chain of shared margins from its
     total (:meth:`~censusdp.pipelines.products.codebook_tables.TablePlan.round`). Every cell is
     unbiased for the GLS estimate, every codebook identity holds exactly at every level,
     the states' tables are the sums of their counties' and the invariant totals are
     ``==``. ``<col>_se`` is ``√(GLS variance + rounding variance)``: the rounding part is
     exact for totals (down the tree: ``Var e_child = f(1 − f) + Var e_parent / n²``) and
     single cells, and bounded for sums of cells
     (:meth:`~censusdp.pipelines.products.codebook_tables.TablePlan.rounding_variances`).
   * ``nonnegative/``: the same steps with each group first projected onto its
     non-negative simplex (children's totals onto ``{t ≥ 0, Σ t = parent}``, each coarse
     cell's finer cells onto ``{x ≥ 0, Σ x = coarse}``; Held, Wolfe & Crowder 1974), as the
     TopDown algorithm solves each parent (Abowd et al. 2022): no negative cell, identities
     and invariants exact, biased (:data:`~censusdp.estimation.integer.nonnegative.BIASED_NOTE`), no
     standard errors.

6. **Evaluation** (``[evaluate]``): the size-class report of
   :mod:`censusdp.pipelines.size_class_report` — publishable errors simulated from the
   released non-negative tables (``repetitions`` replicates) and, labelled confidential in
   ``evaluation/``, both products' errors against the ``_sf`` totals; the output is then laid
   out as ``run``'s: the release in ``OUT/release/``, ``OUT/evaluation/`` beside it.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2.
Canonne, C., Kamath, G. and Steinke, T. (2020). The discrete Gaussian for differential
    privacy. NeurIPS 2020.
Gao, J., Gong, R. and Yu, F.-Y. (2022). Subspace differential privacy. AAAI 2022.
Held, M., Wolfe, P. and Crowder, H. P. (1974). Validation of subgradient optimization.
    Math. Programming 6, 62–88.
McSherry, F. (2009). Privacy integrated queries. SIGMOD 2009.
Srinivasan, A. (2001). Distributions on level-sets with applications to approximation
    algorithms. FOCS 2001.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from censusdp.budget import PrivacyStatement, Product, Step, with_products
from censusdp.errors import DataError
from censusdp.estimation.covariance import NodeCovariance
from censusdp.estimation.gls.structured import StructuredRelease, structured_gls
from censusdp.estimation.integer.laminar import pipage_round, rounding_variance
from censusdp.estimation.integer.nonnegative import BIASED_NOTE
from censusdp.estimation.release import ReleaseBase
from censusdp.hierarchy import Hierarchy, gisjoin
from censusdp.hierarchy.builders import from_gisjoin
from censusdp.hierarchy.gisjoin import RowLevels
from censusdp.mechanisms.product_measure import ProductInvariant, ProductMeasurement
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.io.codebook import Codebook
from censusdp.pipelines.io.outputs import (
    DICTIONARY_FILE,
    OUTPUT_COLUMNS_NOTE,
    SIZE_CLASS_FILES,
    parent_codes,
    wide_table,
    write_data_dictionary,
    write_release_texts,
    written_errors,
)
from censusdp.pipelines.products.codebook_tables import (
    STANDARD_ERRORS_NOTE,
    TablePlan,
    levels_statement,
    round_given,
)
from censusdp.pipelines.release_statement import exact_through_invariants
from censusdp.progress import progress_bar
from censusdp.rng import KeyedRNG
from censusdp.timing import stage

log = logging.getLogger(__name__)

__all__ = [
    "HierarchyRelease",
    "codebook_products",
    "hierarchy_of_rows",
    "release_hierarchy",
    "round_hierarchy",
    "round_totals",
    "write_hierarchy_release",
]


@dataclass(frozen=True, eq=False)
class HierarchyRelease(ReleaseBase):
    """Both products of a codebook file over a hierarchy, every level; as a release
    (:class:`~censusdp.estimation.release.ReleaseBase`) it is the unbiased integer product,
    with a per-node diagonal covariance ``GLS variance + rounding variance`` of every column
    (a standard error covers everything between the truth and the released number).

    Attributes
    ----------
    hierarchy : Hierarchy
    gls : StructuredRelease
    estimate : list of numpy.ndarray
        Per level, the GLS estimate of every column ``(n_nodes, columns)``.
    unbiased, nonnegative : list of numpy.ndarray
        Per level, int64 ``(n_nodes, columns)``.
    gls_se, rounding_variance : list of numpy.ndarray
        Per level: the GLS standard error and the rounding's variance of every unbiased
        integer column.
    privacy : PrivacyStatement
    columns : tuple of str
        The codebook's columns (the cells of :meth:`to_frame`).
    """

    hierarchy: Hierarchy
    gls: StructuredRelease
    estimate: list[np.ndarray]
    unbiased: list[np.ndarray]
    nonnegative: list[np.ndarray]
    gls_se: list[np.ndarray]
    rounding_variance: list[np.ndarray]
    privacy: PrivacyStatement
    columns: tuple[str, ...] = ()

    integer = True
    estimator = "unbiased"

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(self.hierarchy.names)

    def level(self, level: str | int) -> np.ndarray:
        """The unbiased integer columns of one level, ``(n_nodes, columns)``."""
        return self.unbiased[self.level_index(level)]

    def level_codes(self, level: str | int) -> np.ndarray:
        return self.hierarchy.levels[self.level_index(level)].codes

    @property
    def cell_labels(self) -> tuple[str, ...]:
        return self.columns

    @functools.cached_property
    def covariance(self) -> NodeCovariance:
        """Per node, diagonal: ``GLS variance + rounding variance`` of every column (the
        columns overlap, so a sum of columns has no variance here)."""
        return NodeCovariance(
            tuple(se**2 + v for se, v in zip(self.gls_se, self.rounding_variance, strict=True))
        )


def hierarchy_of_rows(
    codes: np.ndarray, levels: Sequence[str], *, source: str, rows: np.ndarray, column: str
) -> tuple[Hierarchy, np.ndarray]:
    """The hierarchy ``levels`` (root first) whose leaves are the rows' GISJOIN ``codes``.

    Returns ``(hierarchy, leaf_row)``: the file row (position in ``codes``) of every leaf.

    Raises
    ------
    SpecError
        Levels that are not nested GISJOIN levels.
    DataError
        A row that is not a GISJOIN of the leaf level (naming file, data row, column, code).
    """
    below = list(levels[1:])
    layouts = gisjoin.check_hierarchy_levels(below, f"{source}: hierarchy.levels")
    gisjoin.parse(codes, below[-1], source=source, rows=rows, column=column)
    return from_gisjoin(
        codes,
        [(lv, lay.length) for lv, lay in zip(below, layouts, strict=True)],
        root_name=levels[0],
        root_code="root",
        source=source,
    )


def round_totals(
    h: Hierarchy,
    estimates: Sequence[np.ndarray],
    fixed: int,
    exact: Sequence[np.ndarray],
    rng: KeyedRNG,
    *,
    nonnegative: bool = False,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every node's integer total, top down, children summing to their parent.

    Levels ``0..fixed`` take their ``exact`` totals (the invariants and their sums); below,
    each level's GLS totals are rounded given their parents' integers
    (:func:`~censusdp.pipelines.products.codebook_tables.round_given`, groups = parents; with
    ``nonnegative`` projected onto ``{t ≥ 0, Σ t = parent}`` first). With no fixed level
    (``fixed = -1``) the root is rounded alone (pipage rounding: floor or ceiling, unbiased).

    Returns
    -------
    (totals, variances)
        Per level, int64 totals and the variance of each node's total rounding error given
        the GLS estimate: ``v_node + Var(parent's error) / n_parent²`` with ``v = f(1 − f)``
        (0 at fixed levels) — the parent's error is shared out evenly and the node's own
        pipage error has mean zero given it, so the two are uncorrelated and this is exact.
    """
    ints: list[np.ndarray] = []
    var: list[np.ndarray] = []
    for k in range(h.depth):
        est = np.asarray(estimates[k], dtype=np.float64)
        if k <= fixed:
            got = np.asarray(exact[k], dtype=np.int64)
            if np.abs(est - got).max(initial=0.0) > 1e-6 * max(1.0, np.abs(got).max()):
                raise ArithmeticError("internal: the GLS estimate moved an invariant total")
            ints.append(got)
            var.append(np.zeros(got.shape))
            continue
        gen = rng.generator(f"totals/{h.names[k]}")
        if k == 0:
            root = np.maximum(est, 0.0) if nonnegative else est
            ints.append(pipage_round(root, [], gen))
            var.append(rounding_variance(root))
            continue
        parent = h.levels[k].parent
        got, v = round_given(est[None, :], parent, ints[k - 1][None, :], gen,
                             nonnegative=nonnegative)  # fmt: skip
        count = h.levels[k - 1].child_count[parent].astype(np.float64)
        ints.append(got[0])
        var.append(v[0] + var[k - 1][parent] / count**2)
    return ints, var


def round_hierarchy(
    plan: TablePlan,
    gls: StructuredRelease,
    fixed: int,
    exact: Sequence[np.ndarray],
    rng: KeyedRNG,
    *,
    nonnegative: bool = False,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One integer product of a GLS estimate over the hierarchy, every level.

    The totals down the tree (:func:`round_totals`; levels ``0..fixed`` exact), then every
    leaf's strategy marginals down the chain from its total
    (:meth:`~censusdp.pipelines.products.codebook_tables.TablePlan.round`); upper levels are the sums
    of the leaves. Checked: every codebook identity and every node's total.

    Returns
    -------
    (columns, variances)
        Per level, int64 ``(n_nodes, columns)`` and the rounding's variance of every column
        given the estimate (meaningful for the unbiased product): below the leaves' totals
        (:meth:`~censusdp.pipelines.products.codebook_tables.TablePlan.rounding_variances`, summed
        over the leaves of a node, which round independently given their totals) plus
        ``w² · Var(node total's error)``.
    """
    h = gls.hierarchy
    total_q = ProductQuery.parse(plan.codebook.schema, "total")
    est_tot = [gls.query_estimates(k, total_q)[:, 0] for k in range(h.depth)]
    strat, chain = plan.marginals(gls.level(h.depth - 1))
    totals, tvar = round_totals(h, est_tot, fixed, exact, rng, nonnegative=nonnegative)
    record: dict = {}
    ints = plan.round(strat, chain, rng, totals=totals[-1], nonnegative=nonnegative,
                      record=record)  # fmt: skip
    cols = h.aggregate(plan.columns(ints))
    for k, c in enumerate(cols):
        if (plan.identities @ c.T).any():
            raise ArithmeticError("internal: the rounded product breaks an identity")
        if plan.total_column >= 0 and not np.array_equal(c[:, plan.total_column], totals[k]):
            raise ArithmeticError("internal: the rounded product lost a total")
    below, weight = plan.rounding_variances(record)
    below_by_level = h.aggregate(below)
    rvar = [below_by_level[k] + weight[None, :] ** 2 * tvar[k][:, None] for k in range(h.depth)]
    return cols, rvar


def _column_se(gls: StructuredRelease, plan: TablePlan, level: int) -> np.ndarray:
    """GLS standard error of every codebook column at every node of ``level``."""
    rows = plan.codebook.rows
    out = np.empty((gls.hierarchy.sizes[level], len(rows.names)))
    for qi, q in enumerate(rows.queries):
        sel = np.flatnonzero(rows.query_of_row == qi)
        out[:, sel] = gls.query_standard_errors(level, q)[:, rows.row_of_row[sel]]
    return out


def release_hierarchy(
    plan: TablePlan,
    h: Hierarchy,
    truth: np.ndarray,
    rng: KeyedRNG,
    *,
    invariants: Sequence[tuple[str, str]] = (),
    delta: float | None = None,
    row_levels: RowLevels | None = None,
    source: str = "input",
    areas: Sequence[str] | None = None,
) -> HierarchyRelease:
    """Measure every leaf (row), estimate over ``h``, round into both products.

    Parameters
    ----------
    plan : TablePlan
    h : Hierarchy
        Its leaves are the rows of ``truth``, in order.
    truth : numpy.ndarray
        int64 ``(leaves, columns)``: the ``_sf`` columns.
    rng : KeyedRNG
        Noise from ``privatize/<query>`` streams (as the single-file route), the unbiased
        rounding from ``rng.child("rounding")``, the non-negative one from
        ``rng.child("nonnegative")``.
    invariants : sequence of (level, "total")
    delta : float, optional
    row_levels : RowLevels, optional
        The rows' summary levels, for the statement's per-person note.
    source : str
        File name in messages.
    areas : sequence of str, optional
        The leaves' codes, for messages.

    Raises
    ------
    DataError
        Rows whose columns break an identity of the codebook (naming the row).
    """
    from censusdp.pipelines.products.codebook_tables import release_tables

    truth = np.asarray(truth, dtype=np.int64)
    if truth.shape[0] != h.sizes[-1]:
        raise ValueError(f"truth has {truth.shape[0]} rows, the hierarchy {h.sizes[-1]} leaves")
    bad = plan.identities @ truth.T
    if bad.any():  # the single-file route's refusal, naming the row
        release_tables(plan, truth, rng, source=source, areas=areas)
    schema, leaf = plan.codebook.schema, h.names[-1]
    answers = plan.measure(truth, rng)
    meas = [
        ProductMeasurement(leaf, q, a, law)
        for q, a, law in zip(plan.queries, answers, plan.laws, strict=True)
    ]
    total_q = ProductQuery.parse(schema, "total")
    exact = h.aggregate(plan.totals(truth))
    invs = [
        ProductInvariant(lv, total_q, exact[h.level_index(lv)][:, None]) for lv, _ in invariants
    ]
    gls = structured_gls(h, schema, meas, invs, delta=delta)
    fixed = max((h.level_index(lv) for lv, _ in invariants), default=-1)
    unbiased, rvar = round_hierarchy(plan, gls, fixed, exact, rng.child("rounding"))
    nonnegative, _ = round_hierarchy(
        plan, gls, fixed, exact, rng.child("nonnegative"), nonnegative=True
    )
    if min(int(c.min(initial=0)) for c in nonnegative) < 0:
        raise ArithmeticError("internal: the non-negative product has a negative cell")
    estimate = [plan.columns(plan.marginals(gls.level(k))[0]) for k in range(h.depth)]
    gls_se = [_column_se(gls, plan, k) for k in range(h.depth)]
    return HierarchyRelease(
        h, gls, estimate, unbiased, nonnegative, gls_se, rvar,
        _statement(plan, h, gls, invariants, row_levels, delta), tuple(plan.codebook.columns),
    )  # fmt: skip


def _statement(
    plan: TablePlan,
    h: Hierarchy,
    gls: StructuredRelease,
    invariants: Sequence[tuple[str, str]],
    row_levels: RowLevels | None,
    delta: float | None,
) -> PrivacyStatement:
    """The structured GLS's derived statement (induced subspace DP with invariants), with the
    codebook's privacy unit, checked against the per-person composition over the rows."""
    per_row = plan.statement(delta) if row_levels is None else levels_statement(
        plan, row_levels, delta
    )  # fmt: skip
    stmt = gls.privacy
    if not math.isclose(stmt.rho, per_row.rho, rel_tol=1e-9):
        raise ArithmeticError(
            f"internal: the GLS statement's ρ = {stmt.rho} is not the rows' ρ = {per_row.rho}"
        )
    stmt = dataclasses.replace(
        stmt,
        unit=per_row.unit,
        change_factor=per_row.change_factor,
        exact=tuple(exact_through_invariants(h, list(invariants))),
    )
    return stmt.with_notes(
        per_row.notes[-1],
        f"measured at the {h.names[-1]} level only (the file's rows); the tables of every "
        f"level above ({', '.join(h.names[:-1])}) are the sums of the rows below them "
        "(structured GLS over the hierarchy, then rounding that keeps every sum)",
    )


def codebook_products(levels: Sequence[str], invariants: Sequence[tuple[str, str]],
                      evaluate: bool) -> tuple[Product, ...]:  # fmt: skip
    """The products of the hierarchy route and the steps that made each (every one
    post-processing of the measurements and invariants; the hierarchy is public geography)."""
    held = ", ".join(f"{lv} {q}" for lv, q in invariants) or "no invariant"
    geo = Step("the hierarchy from the rows' GISJOIN codes (public geography)", ("public",))
    gls = Step(f"structured GLS over {' → '.join(levels)} with {held} held",
               ("measurements", "invariants"))  # fmt: skip
    rnd = ("measurements", "invariants", "randomness")
    out = (
        Product("unbiased/", (geo, gls, Step(
            "unbiased rounding of the totals down the tree and of each row's marginals down "
            "their shared margins", rnd))),
        Product("nonnegative/", (geo, gls, Step(
            "top-down non-negative projection and rounding of the same estimates", rnd))),
    )  # fmt: skip
    if evaluate:
        out += (Product("size_classes.*", (geo, Step(
            "simulated from the released non-negative tables", rnd))),)  # fmt: skip
    return out


def write_hierarchy_release(
    tmp: Path,
    batch,
    leaf_row: np.ndarray,
    rel: HierarchyRelease,
    plan: TablePlan,
) -> list[str]:
    """Write ``unbiased/`` and ``nonnegative/`` into the (temporary) output folder ``tmp``:
    ``<leaf>.csv`` in the input's layout (the file's rows, in its order; ``_se`` and
    ``_moe`` in the unbiased one) and ``<level>.csv`` (gisjoin, the ancestors' GISJOINs
    ``state_GISJOIN`` ..., ``_dp``, ``_se``, ``_moe``) for every upper level, and a
    ``data_dictionary.csv`` in each folder. ``_se`` is written to six significant digits;
    ``_moe`` is the integer 90% margin of error of an integer release
    (:func:`~censusdp.pipelines.io.outputs.lattice_moe`)."""
    from censusdp.pipelines.io.nhgis import write_batch
    from censusdp.pipelines.products.codebook_tables import codebook_dictionary
    from censusdp.spreadsheet import write_csv

    h, cb = rel.hierarchy, plan.codebook
    order = np.array([batch.cells.index(c) for c in cb.columns])
    written = []
    for folder, levels, with_se in (("unbiased", rel.unbiased, True),
                                    ("nonnegative", rel.nonnegative, False)):  # fmt: skip
        (tmp / folder).mkdir()
        for k, name in enumerate(h.names):
            se = rel.standard_errors(k) if with_se else None
            path = tmp / folder / f"{name}.csv"
            if k == h.depth - 1:  # the file's rows, in the input's layout and order
                values = np.empty((leaf_row.size, len(order)), dtype=np.int64)
                values[leaf_row[:, None], order[None, :]] = levels[k]
                ses = moes = None
                if se is not None:
                    ses, moes = np.empty(values.shape), np.empty(values.shape, dtype=np.int64)
                    cells = (leaf_row[:, None], order[None, :])
                    ses[cells], moes[cells] = written_errors(se, integer=True)
                geo = {}
                for p, codes in parent_codes(h, k, code_column="GISJOIN").items():
                    geo[p] = np.empty(leaf_row.size, dtype=object)
                    geo[p][leaf_row] = np.asarray(codes).astype(str)
                write_batch(batch, values, ses, path, margins_of_error=moes, geography=geo)
            else:
                ids = {"gisjoin": [str(c) for c in h.levels[k].codes]}
                ids |= {p: np.asarray(v).astype(str)
                        for p, v in parent_codes(h, k, code_column="GISJOIN").items()}  # fmt: skip
                errors = None if se is None else written_errors(se, integer=True)
                frame = wide_table(ids, cb.columns, levels[k], errors, suffix="_dp")
                write_csv(frame, path)
            written.append(f"{folder}/{name}.csv")
        parents = list(parent_codes(h, h.depth - 1, 0, 0, code_column="GISJOIN"))
        keys = list(dict.fromkeys(["gisjoin", *parents, *batch.key_columns]))
        write_data_dictionary(
            tmp / folder, codebook_dictionary(cb, key_columns=keys, with_se=with_se)
        )
        written.append(f"{folder}/{DICTIONARY_FILE}")
    return written


def evaluate_release(
    tmp: Path,
    plan: TablePlan,
    rel: HierarchyRelease,
    truth: np.ndarray,
    rng: KeyedRNG,
    *,
    invariants: Sequence[tuple[str, str]],
    repetitions: int,
    privacy: str,
) -> None:
    """The size-class report of both products (:mod:`censusdp.pipelines.size_class_report`)
    into ``tmp``: simulated from the released non-negative tables (publishable), and against
    the ``_sf`` totals in ``evaluation/`` (CONFIDENTIAL; moved beside the release afterwards)."""
    from censusdp.pipelines.size_class_report import (
        evaluate_size_classes,
        simulate_size_classes,
        write_size_class_report,
    )

    h = rel.hierarchy
    levels = [k for k in range(1, h.depth)]
    t = plan.total_column

    def totals(r: HierarchyRelease) -> dict[str, dict[str, np.ndarray]]:
        return {
            "unbiased": {h.names[k]: r.unbiased[k][:, t] for k in levels},
            "nonnegative": {h.names[k]: r.nonnegative[k][:, t] for k in levels},
        }

    pseudo_cols = rel.nonnegative[-1]
    pseudo = {h.names[k]: rel.nonnegative[k][:, t] for k in levels}

    # closed (on an error too) before the error propagates: it stays the last line
    bar = progress_bar(repetitions, "censusdp size classes", "release")

    def replicate(r: int) -> dict[str, dict[str, np.ndarray]]:
        sim_rel = release_hierarchy(
            plan, h, pseudo_cols, rng.child(f"simulation/{r}"), invariants=invariants
        )  # fmt: skip
        bar.update()
        return totals(sim_rel)

    with bar:
        sim = simulate_size_classes(pseudo, replicate, repetitions)
    truth_totals = {h.names[k]: c[:, t] for k, c in enumerate(h.aggregate(truth)) if k in levels}
    evaluation = evaluate_size_classes(truth_totals, totals(rel))
    write_size_class_report(
        tmp, sim, repetitions=repetitions, evaluation=evaluation,
        what=f"{h.names[-1]} tables", privacy=privacy,
    )  # fmt: skip


def privatize_hierarchy(path: str | Path, spec, out: str | Path, *,
                        spec_path: str | Path | None = None, overwrite: bool = False):  # fmt: skip
    """The codebook route with ``[hierarchy]``: read, release both products, write a folder.

    Returns ``(out, HierarchyRelease)``.

    Raises
    ------
    SpecError, DataError
        The output refused (before any work), a file not matching the codebook, rows that
        are not of the hierarchy's leaf level (naming file, row, column and code).
    """
    from censusdp.atomic import check_output, output_dir
    from censusdp.pipelines.products.codebook_tables import input_digests
    from censusdp.pipelines.runner import separate_evaluation
    from censusdp.pipelines.spec import check_run_options

    steps: dict[str, float] = {}  # each step's wall (and thread CPU) seconds
    total: dict[str, float] = {}  # the run's, to the manifest
    with ExitStack() as stack:
        with stage(total, "seconds"):
            with stage(steps, "release"):  # read and released
                check_run_options(seed=spec.seed)
                codebook_file = Path(spec.codebook) if spec.codebook.endswith(".toml") else None
                inputs = [x for x in (path, spec_path, codebook_file) if x is not None]
                check_output(out, kind="dir", overwrite=overwrite, inputs=inputs, option="-o")
                with stage(steps, "read"):
                    rows = _county_rows(path, spec)
                    plan = TablePlan.build(rows.codebook, spec.rho, spec.strategy)
                    rng = KeyedRNG.from_seed(spec.seed)
                h = rows.hierarchy
                log.info(
                    "read in %.1f s; nodes per level: %s; measure, GLS and rounding of both "
                    "products", steps["read"],
                    ", ".join(f"{lv} {n}" for lv, n in zip(h.names, h.sizes, strict=True)),
                )  # fmt: skip
                rel = release_hierarchy(
                    plan, h, rows.truth, rng, invariants=spec.invariants, delta=spec.delta,
                    row_levels=rows.levels, source=rows.name,
                    areas=[str(c) for c in h.levels[-1].codes],
                )  # fmt: skip
                products = codebook_products(spec.levels, spec.invariants, spec.evaluate)
                rel = dataclasses.replace(rel, privacy=with_products(rel.privacy, products))
            log.info("read and released in %.1f s; writing the tables", steps["release"])
            tmp = stack.enter_context(output_dir(out, overwrite=overwrite, inputs=inputs,
                                                 command="privatize", option="-o",
                                                 info={"route": "codebook-hierarchy"}))  # fmt: skip
            files = write_hierarchy_release(tmp, rows.batch, rows.leaf_row, rel, plan)
            if spec.evaluate:
                with stage(steps, "size_class_report"):
                    log.info("size-class report: %d simulated release(s)", spec.repetitions)
                    evaluate_release(
                        tmp, plan, rel, rows.truth, rng.child("report"),
                        invariants=spec.invariants, repetitions=spec.repetitions,
                        privacy=products[-1].wording(),
                    )  # fmt: skip
        timings = {k: steps[k] for k in ("release", "size_class_report") if k in steps}
        timings["seconds"] = total["seconds"]
        log.info("writing the manifest (%.1f s in all)", timings["seconds"])
        digests = input_digests(path, spec, spec_path, codebook_file, rows.codebook)
        manifest = _hierarchy_manifest(spec, rows, plan, rel.privacy, products, files, digests)
        manifest["timings"] = timings
        _write_hierarchy_texts(tmp, manifest, rows, rel.privacy, products, spec.evaluate)
        if spec.evaluate:  # as `run` lays it out: release/ and the confidential evaluation/ apart
            separate_evaluation(tmp)
    return Path(out), rel


@dataclass(frozen=True, eq=False)
class _CountyRows:
    """A codebook file read as the leaves of its hierarchy (:func:`privatize_hierarchy`).

    Attributes
    ----------
    codebook : Codebook
    batch : NHGIS batch
        The file as read (:func:`~censusdp.pipelines.io.nhgis.read_batch`).
    name : str
        The file's name, for messages.
    hierarchy : Hierarchy
        From the rows' GISJOINs (:func:`hierarchy_of_rows`); its leaves are the rows.
    leaf_row : numpy.ndarray
        Per leaf, its row of the file.
    levels : RowLevels
        The rows' summary levels (for the statement's per-person note).
    truth : numpy.ndarray
        int64 ``(leaves, columns)``: the ``_sf`` columns in the codebook's order, per leaf
        (confidential).
    """

    codebook: Codebook
    batch: Any
    name: str
    hierarchy: Hierarchy
    leaf_row: np.ndarray
    levels: RowLevels
    truth: np.ndarray


def _county_rows(path: str | Path, spec) -> _CountyRows:
    """Read the file, check it against the codebook and the hierarchy's levels (every row
    of the leaf level: a row of a level above is refused, naming file, row, column and
    code), and build the hierarchy from its rows."""
    from censusdp.pipelines.io.nhgis import read_batch, row_geography, spine_rows
    from censusdp.pipelines.products.codebook_tables import check_file_columns

    cb = Codebook.load(spec.codebook)
    log.info("reading %s (codebook %s)", Path(path).name, cb.source)
    batch = read_batch(path, encoding=spec.encoding)
    name = Path(path).name
    check_file_columns(cb, batch, name, spec)
    below = list(spec.levels[1:])
    gisjoin.check_hierarchy_levels(below, f"{spec.source}: hierarchy.levels")
    upper = {lv: r for lv, r in spine_rows(batch, below).items() if lv != below[-1] and r.size}
    if upper:
        lv, r = next(iter(upper.items()))
        raise DataError(
            f"{name}, data row {int(batch.unit_rows[r[0]]) + 1}, column "
            f"{batch.gisjoin_column!r}: {str(batch.gisjoin[r[0]])!r} is a {lv} row beside the "
            f"{below[-1]} rows; the codebook hierarchy route measures the {below[-1]}s and "
            f"writes each {lv}'s tables as the sum of its {below[-1]}s', so drop the {lv} rows"
        )
    h, leaf_row = hierarchy_of_rows(
        batch.gisjoin, spec.levels, source=name, rows=batch.unit_rows,
        column=batch.gisjoin_column,
    )  # fmt: skip
    order = np.array([batch.cells.index(c) for c in cb.columns])
    truth = batch.truth[leaf_row][:, order]
    return _CountyRows(cb, batch, name, h, leaf_row, row_geography(batch), truth)


def _hierarchy_manifest(
    spec,
    rows: _CountyRows,
    plan: TablePlan,
    privacy: PrivacyStatement,
    products: Sequence[Product],
    files: object,
    digests: dict[str, str],
) -> dict:
    """``manifest.json`` of a codebook hierarchy release, but its timings."""
    from censusdp.pipelines.runner import package_versions

    cb, h = rows.codebook, rows.hierarchy
    return {
        "command": "privatize",
        "route": "codebook-hierarchy",
        "input": rows.name,
        "codebook": cb.source,
        "schema": cb.schema.name,
        "hierarchy": {"levels": list(h.names), "sizes": list(h.sizes)},
        "invariants": [f"{lv}: {q}" for lv, q in spec.invariants],
        "exact_through_invariants": list(privacy.exact),
        "strategy": plan.strategy_rows(),
        "rho_requested": spec.rho,
        "rho_derived": privacy.rho,
        "privacy": privacy.to_dict(),
        "privacy_text": privacy.text(),
        "products": {
            "unbiased": "unbiased/: GLS estimates rounded without bias; every codebook "
            "identity exact at every level, each level the sum of the one below, the "
            f"invariants exact; <column>_se: {STANDARD_ERRORS_NOTE}",
            "nonnegative": f"nonnegative/: {BIASED_NOTE}; no negative cell, identities "
            "and invariants exact",
        },
        "product_steps": [p.to_dict() for p in products],
        "columns": OUTPUT_COLUMNS_NOTE,
        "files": files,
        "size_class_report": None
        if not spec.evaluate
        else {
            "files": list(SIZE_CLASS_FILES),
            "repetitions": spec.repetitions,
            "confidential_evaluation": "../evaluation/ (CONFIDENTIAL, beside release/)",
        },  # fmt: skip
        "inputs_sha256": digests,
        "reproducible_mode": spec.seed is not None,
        "versions": package_versions(),
    }


def _write_hierarchy_texts(
    tmp: Path,
    manifest: dict,
    rows: _CountyRows,
    privacy: PrivacyStatement,
    products: Sequence[Product],
    evaluate: bool,
) -> None:
    """``manifest.json``, ``README.md`` and ``privacy.md`` of a codebook hierarchy release."""
    h, name = rows.hierarchy, rows.name
    notes = [*manifest["products"].values(), f"columns: {OUTPUT_COLUMNS_NOTE}"]
    notes += [f"{lv}.csv in both folders: every {lv}" for lv in h.names[:-1]]
    notes += [f"{h.names[-1]}.csv in both folders: the rows of {name}, in its layout"]
    if evaluate:
        notes += ["size_classes.md: errors by size class, simulated from the released "
                  "non-negative tables; ../evaluation/ (beside this release/ folder): "
                  "CONFIDENTIAL, against the _sf totals"]  # fmt: skip
    title = f"{name}, codebook {rows.codebook.source}"
    write_release_texts(tmp, manifest, privacy, products, title=title, notes=notes)
