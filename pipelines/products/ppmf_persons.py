"""``censusdp privatize PPMF.csv --spec SPEC -o OUTDIR``: a PPMF in, two products out.

The route of ``privatize`` for the Census Bureau's Privacy-Protected Microdata File layout
(one row per person; :mod:`censusdp.pipelines.io.ppmf`), chosen when the spec says
``[data] source = "ppmf"`` or the input's header is a PPMF's. The file is read into the block
hierarchy (nation → state → county → tract → block group → block) and its sparse ``pl94``
histogram; the 2020 production strategy (11 product queries per geounit, the schema's
``[allocation]`` of :file:`censusdp/schemas/pl94.toml`, scaled to the spec's ρ) is measured
with discrete Gaussian noise, the nation and state totals held invariant, by the streamed
engine :func:`~censusdp.pipelines.products.pl94_stream.stream_pl94` (measure inside partitions →
structured GLS → unbiased rounding, one county at a time). In its callbacks the same GLS
estimates also give the non-negative product (:mod:`censusdp.estimation.integer.nonnegative`), so
both are post-processing of one set of measurements under one privacy statement when the block
list is public (:func:`ppmf_products` derives what each product is from its steps).

Written atomically into ``OUTDIR`` (:func:`censusdp.atomic.output_dir`: a temporary
directory renamed into place when complete; never over the input, nothing half-written):

* ``unbiased/pl94_<level>.csv`` and ``unbiased/pl94_long.csv`` — P1–P5 for every level (each
  row with its GEOID and its ancestors' ``state_GEOID`` … ``block_group_GEOID``; a
  ``data_dictionary.csv`` beside), with ``<column>_moe`` (the integer 90% margin of error of
  ``<column>_se``, :func:`~censusdp.pipelines.io.outputs.lattice_moe`) and ``<column>_se = sqrt(GLS variance + rounding variance)`` for every column
  (:func:`column_standard_errors`): the GLS variance exact; the rounding's exact for the
  whole-population columns (``P1_001N``, ``P2_001N``) down to the county (the top network:
  each total its floor or ceiling, ``ψ(1 − ψ)``), and elsewhere the unbiased replicate
  estimate from :data:`ROUNDING_REPLICATES` = 32 re-roundings of the same estimates with keys
  of their own (:mod:`~censusdp.estimation.integer.controlled`, "Replicate rounding
  variances": post-processing, no privacy cost; ``± 1.645 · _se`` covers at worst as a
  Student t with 32 degrees of freedom, 89.0% at nominal 90%). Each county's subtree is
  rounded as one flow network, so a node's total below the county is the floor or ceiling of
  its estimate plus its share of the county's cell errors (on a synthetic 4,000-block state
  at the production budget: 0.36–0.45 persons RMS for tracts, block groups and blocks; block
  groups moved by 3.06 before); the totals' proven bound
  (:func:`~censusdp.estimation.integer.controlled.total_variance_bound`) is 1.30–1.39 times
  the simulated rounding SD there and is not used for ``_se``. On 200 releases of a
  synthetic county the 90% intervals covered 89.3–91.3% for total population, White alone
  and Hispanic at tract and block group and 89.4–90.3% at block (GLS-only ``_se``: 62–81% at
  tract and block group; tests/pipelines/test_ppmf_rounding_coverage.py). A figure held by
  an invariant (``P1_001N`` and ``P2_001N`` of the nation, every state and any only child of
  one, as DC's county: :func:`invariant_columns`, derived from the invariants) is the exact
  count with ``_se`` and ``_moe`` exactly 0;
* ``nonnegative/pl94_<level>.csv``, ``nonnegative/pl94_long.csv`` — the same tables from the
  non-negative product (biased; no standard errors);
* ``nonnegative/microdata.csv`` — one row per person of the non-negative block histogram, in
  the PPMF's columns (``TABBLKST, TABBLKCOU, TABTRACT, TABBLKGRP, TABBLK, RTYPE, GQTYPE_PL,
  VOTING_AGE, CENHISP, CENRACE``); its tabulations equal the non-negative tables exactly;
* ``manifest.json`` — the derived privacy statement (induced subspace DP with the
  invariants), the two products and their labels, the spec without its seed, versions,
  timings; ``privacy.md``; ``README.md``;
* the size-class report of :mod:`censusdp.pipelines.size_class_report` (simulated from the
  released numbers). With ``--evaluate`` the output is laid out as ``run``'s: all the
  above in ``release/``, and beside it (never inside) the confidential ``evaluation/``.

A PPMF spec::

    [data]
    source = "ppmf"
    [privacy]
    accounting = "zcdp"
    rho = 2.556                 # optional: default the allocation's own (2020 production)
    delta = 1e-10               # optional: also report (ε, δ)
    [mechanism]
    noise = "discrete_gaussian"
    [hierarchy]
    blocks = "blocks.csv"       # the public list of every block (see below)
    block_column = "GEOID20"    # optional: default the first of block, BLOCKID, GEOID20, ...
    [areas]                     # optional: off-spine areas (places) as sums of blocks
    file = "BlockAssign_ST44_RI_INCPLACE_CDP.txt"
    level = "place"
    block_column = "BLOCKID"
    area_column = "PLACEFP"
    skip_blank = true           # blocks in no place have a blank code
    list = "places.csv"         # optional: every place (each must contain a block)
    share = 0.1                 # optional: measure the places too, with 0.1 of the total ρ
    queries = ["total"]         # optional: what every place answers (default the total)
    [report]
    repetitions = 10            # simulated releases for the size-class bias
    [run]
    seed = 1                    # reproducible mode, tests only

**The hierarchy must be public.** A PPMF holds only the blocks with people; a hierarchy built
from its rows would publish which blocks are occupied (every block of the output is a block
with a person). The route therefore takes the block set from a public list
(``[hierarchy] blocks`` or ``--blocks``: any file listing every block, e.g. a block
assignment file, :func:`~censusdp.pipelines.io.ppmf.read_block_list`), where empty blocks are
present with zero counts, and refuses without one unless ``--blocks-from-data`` acknowledges
the disclosure, which the privacy statement then carries.

**Areas** (``[areas]`` or ``--areas FILE``; :func:`~censusdp.hierarchy.equivalency.read_equivalency`)
are released as sums of their blocks: ``unbiased/pl94_<level>.csv`` with ``_se`` from the
exact GLS variance of the streamed area sweep (:func:`~censusdp.estimation.gls.areas.area_partition`
per partition, :func:`~censusdp.estimation.gls.areas.area_top`) plus the replicate rounding
variance (each replicate's area error the sum of its blocks'), ``nonnegative/pl94_<level>.csv`` from the
non-negative blocks, and a row of the size-class report.

**Measured areas** (``[areas] share``): the places are also measured, each answering
``queries`` with discrete Gaussian noise from ``share`` of the total ρ (the tree's allocation
is scaled to the rest; the places are disjoint sets of blocks, so they compose like one more
level, and the derived statement lists their spend). The tree GLS is then updated with
their answers exactly (:func:`~censusdp.estimation.gls.area_measurements.update_with_areas`):
every level's estimate and standard error changes, the places stay sums of released blocks
and the invariants hold ``==`` after rounding. The update needs every node at once, which the
streamed engine does not give (it rounds each partition as it goes), so this route runs in
memory (every level's cell tensors: a county or a small state) and so do its simulated
releases for the size-class report.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2.
U.S. Census Bureau (2021). 2010 Demonstration Privacy-Protected Microdata File, record layout.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from censusdp.atomic import check_output, output_dir
from censusdp.budget import PrivacyStatement, Product, Step, with_products
from censusdp.config import exact_fraction
from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls.area_measurements import (
    MeasuredAreas,
    area_plan,
    area_statement,
    measure_areas,
    update_with_areas,
)
from censusdp.estimation.gls.areas import AreaEstimates, AreaPartial, area_partition, area_top
from censusdp.estimation.gls.marginal_basis import BlockDiagonal
from censusdp.estimation.gls.predict import allocation_plan
from censusdp.estimation.gls.structured import structured_gls, structured_setup
from censusdp.estimation.integer.controlled import (
    replicate_variance,
    round_structured,
    rounding_replicates,
)
from censusdp.estimation.integer.nonnegative import (
    BIASED_NOTE,
    nonnegative_structured,
)
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.equivalency import Equivalency, read_equivalency
from censusdp.mechanisms.product_measure import (
    ProductInvariant,
    ProductMeasurement,
    measure_products,
)
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.io.outputs import (
    OUTPUT_COLUMNS_NOTE,
    SIZE_CLASS_FILES,
    parent_codes,
    write_data_dictionary,
    write_release_texts,
)
from censusdp.pipelines.io.ppmf import (
    GEOGRAPHY,
    LEVELS,
    PPMFHistogram,
    read_block_list,
    read_ppmf,
)
from censusdp.pipelines.products.pl94_stream import (
    PartitionRelease,
    Pl94StreamOptions,
    SparseHistogram,
    TopRelease,
    stream_pl94,
)
from censusdp.pipelines.products.pl94_tables import (
    LevelTables,
    pl94_codebook,
    pl94_column_values,
    pl94_dictionary,
    pl94_frames,
)
from censusdp.pipelines.release_statement import (
    change_factor,
    exact_through_invariants,
    held_nodes,
)
from censusdp.pipelines.runner import separate_evaluation
from censusdp.pipelines.size_class_report import (
    PRODUCTS,
    area_totals,
    evaluate_size_classes,
    simulate_size_classes,
    write_size_class_report,
)
from censusdp.pipelines.spec import ProductKeys, ProductSpec, load_product_spec, relative_path
from censusdp.progress import progress_bar
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema
from censusdp.spreadsheet import write_csv
from censusdp.timing import CPU_PREFIX, stage

log = logging.getLogger(__name__)

__all__ = [
    "AreasSpec",
    "PPMFSpec",
    "PPMFResult",
    "REPORT_LEVELS",
    "column_standard_errors",
    "held_pl94_columns",
    "invariant_columns",
    "is_ppmf",
    "load_ppmf_spec",
    "ppmf_products",
    "privatize_ppmf",
    "write_microdata",
]

#: Levels of the size-class report (places are added where an equivalency file gives them).
REPORT_LEVELS = ("block", "block_group", "tract")
#: The levels the partitions cut (the engine's default).
CUT = "county"
#: Invariants: the nation and state totals (2020 production).
INVARIANTS = (("nation", "total"), ("state", "total"))
#: Columns of the microdata file, in order (the PPMF's, without VINTAGE).
MICRODATA_COLUMNS = (
    *(g[0] for g in GEOGRAPHY),
    "RTYPE",
    "GQTYPE_PL",
    "VOTING_AGE",
    "CENHISP",
    "CENRACE",
)
#: What the persons route's spec says about itself (:func:`load_ppmf_spec`).
PERSONS_KEYS = ProductKeys(
    source="ppmf",
    reads="a PPMF (persons with TABBLKST ... CENRACE)",
    strategy="pl94",
    levels=LEVELS,
    data_keys=("source", "path"),
    more_tables=("areas",),
)


@dataclass(frozen=True)
class AreasSpec:
    """Off-spine areas from a block → area equivalency file (``[areas]``).

    Attributes
    ----------
    file : Path
    level : str
        Their level name in the outputs (``"place"``).
    block_column, area_column : str
    skip_blank : bool
        Blocks with a blank area code are in no area.
    gisjoin : bool
        The block codes are NHGIS GISJOINs.
    areas : Path or None
        A one-column list of the areas (header ``area_column``): each must contain a block.
    share : Fraction or None
        ``[areas] share``: the fraction of the total ρ spent measuring the areas (the tree's
        allocation gets the rest); None: the areas are not measured, only summed.
    queries : tuple of str
        ``[areas] queries``: the schema queries every area answers (default the total).
    """

    file: Path
    level: str = "place"
    block_column: str = "block"
    area_column: str = "area"
    skip_blank: bool = False
    gisjoin: bool = False
    areas: Path | None = None
    share: Fraction | None = None
    queries: tuple[str, ...] = ("total",)

    def to_dict(self) -> dict:
        d = {**dataclasses.asdict(self), "file": self.file.name, "queries": list(self.queries)}
        d["share"] = None if self.share is None else str(self.share)
        return {**d, "areas": None if self.areas is None else self.areas.name}

    def read(self, h: Hierarchy) -> Equivalency:
        """The equivalency against ``h`` (DataError naming file, row and column)."""
        return read_equivalency(
            self.file,
            h,
            block_column=self.block_column,
            area_column=self.area_column,
            name=self.level,
            gisjoin=self.gisjoin,
            areas_path=self.areas,
            skip_blank_areas=self.skip_blank,
        )


@dataclass(frozen=True)
class PPMFSpec(ProductSpec):
    """A PPMF privatize spec (:func:`load_ppmf_spec`): the keys every PPMF route shares
    (:class:`~censusdp.pipelines.spec.ProductSpec`) and the persons route's ``[areas]``."""

    areas: AreasSpec | None = None

    def to_dict(self) -> dict:
        """The spec for the manifest, never the seed."""
        d = super().to_dict()
        allocation = d.pop("allocation")
        areas = None if self.areas is None else self.areas.to_dict()
        return {**d, "areas": areas, "allocation": allocation}


def csv_header(path: str | Path) -> set[str] | None:
    """The column names of a CSV file's header, or None when ``path`` is not a readable CSV."""
    from censusdp.pipelines.io.ppmf import sniff_csv

    p = Path(path)
    if not p.is_file() or p.suffix.lower() not in (".csv", ".txt", ""):
        return None
    try:
        return set(sniff_csv(p)[2])
    except DataError:
        return None


def is_ppmf(path: str | Path) -> bool:
    """Whether ``path`` is a CSV whose header names the PPMF's geography columns."""
    header = csv_header(path)
    return header is not None and all(any(s in header for s in g[2]) for g in GEOGRAPHY)


def load_ppmf_spec(path: str | Path) -> PPMFSpec:
    """Read a PPMF privatize spec (module docstring).

    Raises
    ------
    SpecError
        Naming the file and the dotted key.
    """
    path = Path(path)
    p, doc, shared = load_product_spec(path, PERSONS_KEYS)
    ar = p.table(doc, "areas", required=False)
    p.keys(ar, "areas", ("file", "level", "block_column", "area_column", "skip_blank", "gisjoin",
                         "list", "share", "queries"))  # fmt: skip
    areas = None
    if ar:
        listed = p.get(ar, "areas", "list", str)
        share = p.get(ar, "areas", "share", float)
        if share is not None:  # the areas' fraction of the total ρ
            share = exact_fraction(share, f"{path}: areas.share", below_one=True)
        queries = p.str_list(ar.get("queries", ["total"]), "areas.queries", allow_str=True)
        areas = AreasSpec(
            relative_path(path, p.get(ar, "areas", "file", str, required=True)),
            level=p.get(ar, "areas", "level", str, default="place"),
            block_column=p.get(ar, "areas", "block_column", str, default="block"),
            area_column=p.get(ar, "areas", "area_column", str, default="area"),
            skip_blank=p.get(ar, "areas", "skip_blank", bool, default=False),
            gisjoin=p.get(ar, "areas", "gisjoin", bool, default=False),
            areas=None if listed is None else relative_path(path, listed),
            share=share,
            queries=tuple(queries),
        )
        if areas.level in LEVELS:
            raise p.fail("areas.level", f"{areas.level!r} is a level of the hierarchy; name the "
                         "areas otherwise (e.g. place)")  # fmt: skip
    fields = {f.name: getattr(shared, f.name) for f in dataclasses.fields(shared)}
    return PPMFSpec(**fields, areas=areas)


# -- the two products, streamed --------------------------------------------------------------
#: ``on_levels(names, ranges, piece, unbiased, nonnegative, total_var, replicates)``:
#: consecutive levels of some node ranges — the GLS piece (None in simulations), both
#: products' int64 cell tensors, per level the *exact* rounding variance of each node's total
#: where the rounding gives it (None elsewhere, or not computed) and per level the
#: replicate roundings' errors in the P1–P5 columns, ``(R, n, 298)`` (None in simulations).
_OnLevels = Callable[..., None]

#: Replicate roundings behind the unbiased tables' ``_se`` (module docstring): ``± 1.645 ·
#: _se`` covers as a Student t with 32 degrees of freedom at worst (89.0% at nominal 90%).
ROUNDING_REPLICATES = 32


def _exact_totals(rounded, names, first: int) -> list[np.ndarray | None]:
    """Per level of ``names`` (level ``first`` onward), the exact rounding variance of each
    node's total where :meth:`~censusdp.estimation.integer.controlled.RoundedLevels.total_is_exact`,
    else None."""
    if rounded.spread is None:
        return [None] * len(names)
    return [
        rounded.spread[first + j] if rounded.total_is_exact(first + j) else None
        for j in range(len(names))
    ]


def _invariants(h: Hierarchy, schema: Schema, hist_block, hist_count) -> list[ProductInvariant]:
    tot = area_totals(h, hist_block, hist_count, [lvl for lvl, _ in INVARIANTS])
    return [
        ProductInvariant(lvl, ProductQuery.parse(schema, q), tot[lvl][:, None])
        for lvl, q in INVARIANTS
    ]


def _two_products(
    h: Hierarchy,
    schema: Schema,
    source: SparseHistogram,
    plan,
    rng: KeyedRNG,
    on_levels: _OnLevels,
    *,
    with_pieces: bool,
    invariants: list[ProductInvariant],
    on_partition: Callable[[int, tuple], None] | None = None,
):
    """Run the engine on ``source`` with its non-negative product
    (:attr:`~censusdp.pipelines.products.pl94_stream.Pl94StreamOptions.nonnegative`, keys
    ``rng.child("nonnegative")``) and hand both products' levels to ``on_levels``.

    ``invariants`` are ``source``'s (both products hold them ==); ``on_partition(index,
    ranges)`` is told each partition's node ranges (levels cut .. leaf). With
    ``with_pieces`` the engine also rounds :data:`ROUNDING_REPLICATES` replicates for the
    standard errors.
    """
    k_cut = h.level_index(CUT)

    def on_top(top: TopRelease) -> None:
        on_levels(
            h.names[: k_cut + 1], tuple((0, h.sizes[k]) for k in range(k_cut + 1)),
            top.piece if with_pieces else None, list(top.counts), top.nonnegative.counts,
            _exact_totals(top.rounded, h.names[: k_cut + 1], 0), top.replicate_errors,
        )  # fmt: skip

    def on_release(pr: PartitionRelease) -> None:
        if on_partition is not None:
            on_partition(pr.piece.partition, pr.partition.ranges)
        # below the cut the totals' spread is a bound (None): the replicates instead
        on_levels(
            h.names[k_cut + 1 :], tuple(pr.partition.ranges[1:]),
            pr.piece if with_pieces else None, list(pr.counts), pr.nonnegative.counts, None,
            pr.replicate_errors,
        )  # fmt: skip

    return stream_pl94(
        h, schema, source, plan, rng, on_top=on_top, on_partition=on_release,
        options=Pl94StreamOptions(
            invariants=INVARIANTS, cut=CUT, nonnegative=True,
            rounding_replicates=ROUNDING_REPLICATES if with_pieces else 0,
        ),
    )  # fmt: skip


def column_standard_errors(
    piece,
    level: str,
    total_var: np.ndarray | None = None,
    rounding_var: np.ndarray | None = None,
    *,
    held: np.ndarray | None = None,
) -> np.ndarray:
    """Standard error of every P1–P5 column at every node of ``level`` in ``piece``.

    ``sqrt(GLS variance + rounding variance)``: the rounding error has mean zero given the
    estimate, so the two add (:mod:`~censusdp.estimation.integer.controlled`, "Replicate
    rounding variances"). Entries held by an invariant (``held``, from
    :func:`invariant_columns`) are exactly 0: their released value is the invariant's exact
    value (the rounding holds the invariants ``==``), so nothing lies between it and the truth
    — the float error of the GLS there (e.g. 2.4e-07 for a state total) is not an error of the
    released figure.

    Parameters
    ----------
    piece
        Anything with ``query_standard_errors(level, query)`` (the GLS piece, areas).
    level : str
    total_var : (n,) array, optional
        The rounding variance of each node's total, used for the whole-population columns
        (``P1_001N``, ``P2_001N``): exact where the rounding gives it
        (:meth:`~censusdp.estimation.integer.controlled.RoundedLevels.total_is_exact`), or the
        :attr:`~censusdp.estimation.integer.controlled.RoundedLevels.spread` bound.
    rounding_var : (n, 298) array, optional
        The rounding variance of every column
        (:func:`~censusdp.estimation.integer.controlled.replicate_variance` of the replicate
        errors), used for every column ``total_var`` does not give.
    held : (n, 298) bool array, optional
        The entries an invariant holds (:func:`invariant_columns`); their SE is exactly 0.

    Returns
    -------
    (n, 298) numpy.ndarray
        Without ``total_var`` and ``rounding_var``: the GLS standard errors alone.
    """
    se = pl94_column_values(lambda q: piece.query_standard_errors(level, q))
    var = se**2
    if rounding_var is not None:
        var = var + np.asarray(rounding_var, dtype=float)
    if total_var is not None:
        whole = pl94_column_values(lambda q: np.broadcast_to(
            q.dense().sum(axis=1) == q.dense().shape[1], (1, q.n_rows)
        ).astype(float))[0] > 0  # fmt: skip
        tv = np.asarray(total_var, dtype=float).reshape(-1, 1)
        var[:, whole] = se[:, whole] ** 2 + tv
    out = np.sqrt(var)
    if held is not None:
        out[np.asarray(held, dtype=bool)] = 0.0
    return out


@functools.cache
def held_pl94_columns(query: str) -> np.ndarray:
    """Which P1–P5 columns an invariant on ``query`` (a ``pl94`` product query, e.g.
    ``"total"``) holds: those whose row lies in the row space of the query's rows (a linear
    combination of held statistics is held). For ``"total"``: ``P1_001N`` and ``P2_001N``.

    Exact linear algebra on 0/1 rows: the residual of each column's row after projection onto
    the query's row space is 0 up to float resolution, or at least ``1/cells`` away from it
    (the test uses ``1e-9`` of the row's norm). Cached per query.

    Returns
    -------
    (298,) bool numpy.ndarray, read-only
    """
    book = pl94_codebook()
    H = ProductQuery.parse(book.schema, query).dense().astype(float)
    C = pl94_column_values(lambda q: q.dense().T.astype(float))  # (cells, 298): column rows
    resid = C - np.linalg.pinv(H) @ (H @ C)
    out = np.linalg.norm(resid, axis=0) <= 1e-9 * np.linalg.norm(C, axis=0)
    out.setflags(write=False)
    return out


def invariant_columns(
    h: Hierarchy,
    level: str,
    lo: int = 0,
    hi: int | None = None,
    invariants: Sequence[tuple[str, str]] = INVARIANTS,
) -> np.ndarray:
    """Which P1–P5 entries of nodes ``lo:hi`` of ``level`` the invariants hold exactly.

    Derived from the invariants alone (never from a standard error): a column held by a
    query (:func:`held_pl94_columns`) at a node held for it
    (:func:`~censusdp.pipelines.release_statement.held_nodes`: the invariant's levels, the
    levels above them, only children of held nodes). For the route's nation and state totals:
    ``P1_001N`` and ``P2_001N`` of the nation, every state, and every only child of one (DC's
    county, and its only tract, ...).

    Returns
    -------
    (hi - lo, 298) bool numpy.ndarray
        The ``held`` of :func:`column_standard_errors`.
    """
    hi = h.sizes[h.level_index(level)] if hi is None else hi
    out = np.zeros((hi - lo, len(pl94_codebook().columns)), dtype=bool)
    for query in dict.fromkeys(q for _, q in invariants):
        nodes = held_nodes(h, [lvl for lvl, q in invariants if q == query], level, lo, hi)
        out |= nodes[:, None] & held_pl94_columns(query)[None, :]
    return out


# -- writers -------------------------------------------------------------------------------------
class _TableWriter:
    """P1–P5 of one product, appended level chunk by level chunk (wide per level, long),
    and its ``data_dictionary.csv`` (:func:`~censusdp.pipelines.products.pl94_tables.pl94_dictionary`).

    The long file holds rows of levels with different ancestors (a county has a
    ``state_GEOID``, a block all four), so its columns are every ancestor column of the
    hierarchy, blank where a level has no such ancestor.
    """

    def __init__(self, folder: Path, h: Hierarchy, *, with_se: bool) -> None:
        self.folder = folder
        folder.mkdir()
        self.started: set[str] = set()
        self.h = h
        self.parents = list(parent_codes(h, h.depth - 1, 0, 0))
        write_data_dictionary(folder, pl94_dictionary(parents=self.parents, with_se=with_se))

    def add(self, level: str, tables: LevelTables) -> None:
        wide, long = pl94_frames({level: tables})
        rest = [c for c in long.columns[2:] if c not in (tables.parents or {})]
        long = long.reindex(columns=[*long.columns[:2], *self.parents, *rest])
        for name, frame in (((f"pl94_{level}.csv"), wide[level]), ("pl94_long.csv", long)):
            first = name not in self.started
            write_csv(
                frame, self.folder / name, index=False, header=first, mode="w" if first else "a"
            )
            self.started.add(name)

    def add_nodes(self, level: str, lo: int, hi: int, counts: np.ndarray, se=None) -> None:
        """Nodes ``lo:hi`` of a level of the hierarchy, with their ancestors' codes."""
        k = self.h.level_index(level)
        codes = self.h.levels[k].codes[lo:hi]
        parents = parent_codes(self.h, k, lo, hi)
        self.add(level, LevelTables(codes, counts, se, parents))


def _microdata_lines(h: Hierarchy, block: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """One fixed-width CSV line (uint8 row) per (block, cell) entry."""
    leaf = h.names[-1]
    codes = np.asarray(h.levels[-1].codes, dtype="S15")[block]
    if codes.dtype.itemsize != 15 or np.any(np.char.str_len(codes) != 15):
        raise DataError("microdata: block codes are not 15-character PPMF GEOIDs")
    geo = codes.view(np.uint8).reshape(-1, 15)
    bg = h.ancestor_index(leaf, "block_group")[block]
    bgc = np.asarray(h.levels[h.level_index("block_group")].codes, dtype="S12")[bg]
    bgd = bgc.view(np.uint8).reshape(-1, 12)[:, 11:12]
    hhgq, va, hisp, race = np.unravel_index(cell, (8, 2, 2, 63))
    digit = np.uint8(ord("0"))
    race1 = race + 1
    attrs = np.stack(
        [
            np.where(hhgq == 0, 3, 5) + digit,  # RTYPE
            hhgq + digit,  # GQTYPE_PL
            va + 1 + digit,  # VOTING_AGE
            hisp + 1 + digit,  # CENHISP
            race1 // 10 + digit,  # CENRACE, two digits
            race1 % 10 + digit,
        ],
        axis=1,
    ).astype(np.uint8)
    parts = [geo[:, 0:2], geo[:, 2:5], geo[:, 5:11], bgd, geo[:, 11:15]]
    parts += [attrs[:, i : i + 1] for i in range(4)] + [attrs[:, 4:6]]
    comma = np.full((block.size, 1), ord(","), np.uint8)
    pieces = []
    for i, part in enumerate(parts):
        pieces += [part] if i == 0 else [comma, part]
    pieces.append(np.full((block.size, 1), ord("\n"), np.uint8))
    return np.concatenate(pieces, axis=1)


def write_microdata(
    handle, h: Hierarchy, block: np.ndarray, cell: np.ndarray, count: np.ndarray
) -> int:
    """Append one row per person of sparse (block, cell, count) entries to an open binary
    file, in :data:`MICRODATA_COLUMNS`; returns the persons written."""
    keep = np.asarray(count) > 0
    lines = _microdata_lines(h, np.asarray(block)[keep], np.asarray(cell)[keep])
    rows = np.repeat(lines, np.asarray(count)[keep], axis=0)
    handle.write(rows.tobytes())
    return int(rows.shape[0])


# -- the command -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PPMFResult:
    """What ``privatize`` on a PPMF wrote."""

    out: Path
    privacy: PrivacyStatement
    persons: int
    seconds: float


def _total_rho(schema: Schema, spec: PPMFSpec) -> Fraction:
    """The total ρ the plan aims at: the spec's, else its allocation's (the schema's)."""
    alloc = schema.allocation if spec.allocation is None else spec.allocation
    return Fraction(alloc.rho) if spec.rho is None else spec.rho


def _plan(schema: Schema, spec: PPMFSpec, levels):
    """The tree's (level, query, law) plan and the areas' (query, law) plan (empty unless
    ``[areas] share``): the total ρ split, the tree's allocation scaled to its part."""
    alloc = schema.allocation if spec.allocation is None else spec.allocation
    if alloc is None:  # pragma: no cover - pl94 ships one
        raise SpecError("the pl94 schema has no [allocation]")
    total = _total_rho(schema, spec)
    share = None if spec.areas is None else spec.areas.share
    tree = total if share is None else total * (1 - share)
    plan = allocation_plan(schema, dataclasses.replace(alloc, rho=tree), levels=levels)
    if share is None:
        return plan, []
    return plan, area_plan(schema, total * share, spec.areas.queries)


#: What the block hierarchy built from the confidential rows (``--blocks-from-data``) reveals.
BLOCKS_FROM_DATA_REVEALS = "the set of blocks with at least one person, exactly"


def ppmf_products(blocks_public: bool, areas: str | None = None) -> tuple[Product, ...]:
    """The PPMF route's products and the steps that made each from the measurements: the
    one source of what every file (``privacy.md``, ``README.md``, the manifest) says about
    their privacy (:meth:`~censusdp.budget.Product.wording`).

    Every step after the measurements reads only the noisy measurements (through the GLS
    estimates), the invariants (nation and state totals, released exactly), public inputs
    and fresh randomness: the non-negative tables and ``microdata.csv`` are post-processing
    like the unbiased tables. Only a block hierarchy taken from the rows
    (``--blocks-from-data``) reads confidential data; it reveals the occupied blocks.
    """
    hierarchy = (
        Step("blocks from the public block list", ("public",))
        if blocks_public
        else Step(
            "the block hierarchy from the PPMF's own rows (--blocks-from-data)",
            ("confidential",),
            reveals=BLOCKS_FROM_DATA_REVEALS,
        )
    )
    gls = Step(
        "structured GLS with the nation and state totals held", ("measurements", "invariants")
    )
    extra = (
        ()
        if areas is None
        else (Step(f"{areas}s summed from released blocks", ("measurements", "public")),)
    )
    return (
        Product(
            "unbiased/",
            (hierarchy, gls, Step("unbiased controlled rounding", ("measurements", "invariants",
                                  "randomness")), *extra),
        ),
        Product(
            "nonnegative/ (tables and microdata.csv)",
            (
                hierarchy,
                gls,
                Step("top-down non-negative projection and rounding of the GLS estimates",
                     ("measurements", "invariants", "randomness")),
                Step("microdata.csv: one row per person of the non-negative block counts",
                     ("measurements",)),
                *extra,
            ),
        ),
        Product(
            "size_classes.*",
            (hierarchy, Step("simulated from the released non-negative counts",
                             ("measurements", "invariants", "randomness"))),
        ),
    )  # fmt: skip


def _measured_products(
    h: Hierarchy,
    schema: Schema,
    source: SparseHistogram,
    plan,
    aplan,
    rng: KeyedRNG,
    on_levels: _OnLevels,
    *,
    with_pieces: bool,
    invariants: list[ProductInvariant],
    eq: Equivalency,
    delta: float | None,
) -> tuple[PrivacyStatement, MeasuredAreas]:
    """Both products when the areas are measured too (``[areas] share``), in memory.

    The tree is measured as the engine measures it (noise streams ``measure/<level>/<query>``
    of ``rng``), the areas from ``rng.child("areas")``; the structured GLS of the tree is
    updated exactly with the areas' answers (:func:`~censusdp.estimation.gls.area_measurements.update_with_areas`:
    every node's estimate and covariance), then rounded (``rng.child("rounding")``) and made
    non-negative (``rng.child("nonnegative")``) as the streamed route does, every level at
    once. Memory holds every node's cell tensor (``O(nodes × cells)``): a county or a small
    state, not a nation (the streamed engine has no second pass for the update).
    """
    n = h.leaves.size
    leaf = np.zeros((n, schema.n_cells), np.int64)
    lf, cell, count = source(0, n)
    np.add.at(leaf, (lf, cell), count)
    leaf = leaf.reshape(n, *schema.shape)
    meas = measure_products(h.aggregate(leaf), plan, rng, level_names=h.names)
    ameas = measure_areas(eq, leaf, aplan, rng.child("areas"))
    del leaf
    rel = structured_gls(h, schema, meas, invariants)
    del meas
    stmt = area_statement(h.names, plan, eq.name, aplan, delta=delta)
    stmt = dataclasses.replace(
        stmt,
        invariants=rel.privacy.invariants,
        geometry=rel.privacy.geometry,
        notes=tuple(
            dict.fromkeys([*(x for x in rel.privacy.notes if "derived from" not in x), *stmt.notes])
        ),  # fmt: skip
    )
    got = update_with_areas(rel, eq, ameas, stmt)
    upd = got.release
    rounded = round_structured(
        upd, rng.child("rounding"), invariants=invariants, cut=h.level_index(CUT)
    )
    nn = nonnegative_structured(upd, rng.child("nonnegative"), invariants=invariants)
    reps = None
    if with_pieces:  # the replicates the streamed route rounds, here in memory
        reps = rounding_replicates(
            upd, rng, ROUNDING_REPLICATES, pl94_codebook().rows, invariants=invariants,
            cut=h.level_index(CUT),
        )  # fmt: skip
    on_levels(
        tuple(h.names),
        tuple((0, k) for k in h.sizes),
        upd if with_pieces else None,
        list(rounded.counts),
        list(nn.counts),
        _exact_totals(rounded, h.names, 0),
        reps,
    )
    return stmt, got


class _AreaProducts:
    """Both products' integer tables of the areas, summed from each partition's blocks, and
    the streamed area sweep of the GLS covariances (:func:`~censusdp.estimation.gls.areas.area_partition`
    per partition, :func:`~censusdp.estimation.gls.areas.area_top` at the end)."""

    def __init__(self, h: Hierarchy, schema: Schema, plan, invariants, eq: Equivalency) -> None:
        self.h, self.schema, self.eq = h, schema, eq
        meas = [ProductMeasurement(lvl, q, np.empty((0, q.n_rows)), law) for lvl, q, law in plan]
        self.setup = structured_setup(h, schema, meas, invariants, check_values=False)
        self.k_cut = h.level_index(CUT)
        self.partials: list[tuple[int, AreaPartial]] = []
        self.measured: AreaEstimates | None = None  # the updated areas, when measured
        self.sums = {p: np.zeros((eq.n_areas, schema.n_cells), np.int64) for p in PRODUCTS}
        #: (R, areas, 298): the replicate roundings' errors of the areas' P1–P5 columns
        #: (sums of their blocks' errors), or None without replicates
        self.replicate_errors: np.ndarray | None = None

    def partition(self, index: int, ranges) -> None:
        self.partials.append((index, area_partition(self.setup, self.eq, self.k_cut, ranges)))

    def leaves(self, lo: int, hi: int, unbiased: np.ndarray, nonneg: np.ndarray, reps=None) -> None:
        a, b = np.searchsorted(self.eq.leaf, [lo, hi])
        inc = sp.csr_matrix(
            (np.ones(b - a, np.int64), (self.eq.area[a:b], self.eq.leaf[a:b] - lo)),
            shape=(self.eq.n_areas, hi - lo),
        )
        for product, c in (("unbiased", unbiased), ("nonnegative", nonneg)):
            self.sums[product] += np.asarray(inc @ c.reshape(hi - lo, -1))
        if reps is not None:  # (R, leaves, m) → (R, areas, m), every replicate at once
            R, _, m = reps.shape
            z = np.asarray(inc @ reps.transpose(1, 0, 2).reshape(hi - lo, R * m))
            z = z.reshape(self.eq.n_areas, R, m).transpose(1, 0, 2)
            if self.replicate_errors is None:
                self.replicate_errors = z
            else:
                self.replicate_errors += z

    def tables(self) -> dict[str, LevelTables]:
        """Both products' P1–P5 tables of the areas (the unbiased one with ``_se`` =
        sqrt(exact GLS variance + the replicate rounding variance))."""
        shape = (self.eq.n_areas, *self.schema.shape)
        est = self.measured if self.measured is not None else self._summed()
        z = self.replicate_errors
        return {
            "unbiased": LevelTables(
                self.eq.codes,
                self.sums["unbiased"].reshape(shape),
                column_standard_errors(
                    est, self.eq.name, None, None if z is None else replicate_variance(z)
                ),
            ),
            "nonnegative": LevelTables(self.eq.codes, self.sums["nonnegative"].reshape(shape)),
        }

    def _summed(self) -> AreaEstimates:
        """The areas' exact covariances under the tree GLS alone (the streamed sweep)."""
        cov = area_top(self.setup, self.eq, self.k_cut, [p for _, p in sorted(self.partials)])
        return AreaEstimates(
            name=self.eq.name,
            codes=self.eq.codes,
            leaves=self.eq.leaves_per_area(),
            schema=self.schema,
            basis=self.setup.basis,
            estimates=(),
            covariances=(cov,),
            identified=BlockDiagonal(self.setup.basis, self.setup.ident),
        )


def privatize_ppmf(
    path: str | Path,
    spec_path: str | Path | None,
    out: str | Path,
    *,
    seed: int | None = None,
    overwrite: bool = False,
    evaluate: bool = False,
    repetitions: int | None = None,
    blocks: str | Path | None = None,
    blocks_from_data: bool = False,
    areas: str | Path | None = None,
) -> PPMFResult:
    """Privatize a PPMF persons file into both products, tables, microdata and the report.

    Parameters
    ----------
    path : path-like
        The PPMF (CSV; :func:`~censusdp.pipelines.io.ppmf.read_ppmf`).
    spec_path : path-like or None
        A PPMF spec (:func:`load_ppmf_spec`); None: the allocation's own budget.
    out : path-like
        The output directory: new, or an earlier censusdp output with ``overwrite``.
    seed : int, optional
        Reproducible mode (tests); overrides the spec's.
    evaluate : bool
        Also write the confidential comparison with the truth, laid out as ``run`` does:
        ``out/release/`` (everything above) beside ``out/evaluation/`` (CONFIDENTIAL), never
        inside the release (:func:`censusdp.pipelines.runner.separate_evaluation`).
    repetitions : int, optional
        Simulated releases for the size-class report (default: the spec's).
    blocks : path-like, optional
        The public list of every block (overrides ``[hierarchy] blocks``).
    blocks_from_data : bool
        Without a block list, build the hierarchy from the PPMF's rows, acknowledging that
        the set of occupied blocks is then released (noted in the privacy statement).
    areas : path-like, optional
        A block → area equivalency file (overrides ``[areas] file``).

    Raises
    ------
    SpecError
        The output refused by the policy (checked before any work), a bad spec, no public
        block list and no acknowledgement.
    DataError
        A malformed PPMF, block list or equivalency file (file, data row and column named);
        nothing is written.
    """
    steps: dict[str, float] = {}  # each step's wall (and thread CPU) seconds
    total: dict[str, float] = {}  # the run's wall and process CPU seconds, to the manifest
    with ExitStack() as stack:
        with stage(total, "seconds", cpu=time.process_time):
            with stage(steps, "read"):
                spec, inputs = _checked_ppmf_inputs(
                    path, spec_path, out, overwrite, blocks_from_data,
                    cli=dict(blocks=blocks, areas=areas, repetitions=repetitions, seed=seed),
                )  # fmt: skip
                run = _PPMFRun.read(path, spec)
            sizes = zip(run.h.names, run.h.sizes, strict=True)
            log.info("read in %.1f s; nodes per level: %s", steps["read"],
                     ", ".join(f"{name} {n}" for name, n in sizes))  # fmt: skip
            tmp = stack.enter_context(output_dir(out, overwrite=overwrite, inputs=inputs,
                                                 command="privatize", option="-o",
                                                 info={"route": "ppmf"}))  # fmt: skip
            with stage(steps, "release"):
                privacy, written = run.release(tmp)
            log.info("released in %.1f s", steps["release"])
            privacy, products = run.statement(privacy)
            rel = written.totals()
            if run.area_products is not None:
                with stage(steps, "areas"):
                    run.write_areas(written, rel)
            with stage(steps, "size_class_report"):
                run.size_class_report(tmp, written.nn_leaf, rel, evaluate, products)
        timings = {k: v for k, v in steps.items() if not k.startswith(CPU_PREFIX)} | total
        log.info("size-class report in %.1f s; writing the manifest (%.1f s in all)",
                 timings["size_class_report"], timings["seconds"])  # fmt: skip
        _write_manifest(tmp, path, spec, privacy, products, timings, evaluate)
        if evaluate:  # as `run` lays it out: release/ and the confidential evaluation/ apart
            separate_evaluation(tmp)
    return PPMFResult(Path(out), privacy, run.hist.persons, timings["seconds"])


def _checked_ppmf_inputs(
    path: str | Path,
    spec_path: str | Path | None,
    out: str | Path,
    overwrite: bool,
    blocks_from_data: bool,
    cli: dict,
) -> tuple[PPMFSpec, list]:
    """The spec (its file's, the command line's ``cli`` over it) and the inputs the output
    must not overwrite, after the checks made before any data is read: the output policy,
    a public block list or its disclosure acknowledged, areas only over a block list."""
    spec = load_ppmf_spec(spec_path) if spec_path is not None else PPMFSpec()
    spec = spec.with_cli(seed=cli["seed"], repetitions=cli["repetitions"], blocks=cli["blocks"])
    if cli["areas"] is not None:
        a = spec.areas or AreasSpec(Path(cli["areas"]))
        spec = dataclasses.replace(spec, areas=dataclasses.replace(a, file=Path(cli["areas"])))
    ar = spec.areas
    inputs = [path, spec_path, spec.blocks, *(() if ar is None else (ar.file, ar.areas))]
    inputs = [x for x in inputs if x is not None]
    check_output(out, kind="dir", overwrite=overwrite, inputs=inputs, option="-o")
    if spec.blocks is None and not blocks_from_data:
        raise SpecError(
            f"{Path(path).name}: no public block list. A PPMF holds only the blocks with people, "
            "so a hierarchy built from its rows would release which blocks are occupied. Give "
            "the list of every block ([hierarchy] blocks = FILE in the spec, or --blocks FILE: "
            "e.g. the state's block assignment file), or pass --blocks-from-data to accept "
            "that disclosure (the privacy statement will say so)"
        )
    if spec.blocks is None and spec.areas is not None:
        raise SpecError(
            f"{spec.areas.file.name}: areas are released as sums of blocks and need every "
            "block, empty ones included; give the public block list ([hierarchy] blocks or "
            "--blocks) rather than --blocks-from-data"
        )
    return spec, inputs


@dataclass(eq=False)
class _LevelWriter:
    """The ``on_levels`` of the release: writes each level range's rows of both products'
    tables (the unbiased ones with ``_se``, :func:`column_standard_errors`), keeps the
    report levels' released totals, writes the non-negative leaves' microdata, and hands
    the leaves to the areas."""

    h: Hierarchy
    writers: dict[str, _TableWriter]
    micro: Any
    bar: Any
    area_products: _AreaProducts | None
    released: dict[str, dict[str, list]]
    nn_leaf: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = dataclasses.field(
        default_factory=list
    )

    def __call__(self, names, ranges, piece, unbiased, nonneg, total_var=None, reps=None) -> None:
        leaf, released = self.h.depth - 1, self.released
        tvs = [None] * len(names) if total_var is None else total_var
        zs = [None] * len(names) if reps is None else reps
        for name, (lo, hi), u, n, tv, z in zip(
            names, ranges, unbiased, nonneg, tvs, zs, strict=True
        ):  # a loop over levels, not nodes
            rv = None if z is None else replicate_variance(z)
            held = invariant_columns(self.h, name, lo, hi)
            se = column_standard_errors(piece, name, tv, rv, held=held)
            self.writers["unbiased"].add_nodes(name, lo, hi, u, se)
            self.writers["nonnegative"].add_nodes(name, lo, hi, n)
            if name in released["unbiased"]:
                released["unbiased"][name].append(u.reshape(u.shape[0], -1).sum(axis=1))
                released["nonnegative"][name].append(n.reshape(n.shape[0], -1).sum(axis=1))
            if self.h.level_index(name) == leaf:
                b, c = np.nonzero(n.reshape(n.shape[0], -1))
                cnt = n.reshape(n.shape[0], -1)[b, c]
                self.nn_leaf.append((b + lo, c, cnt))
                self.bar.update(hi - lo)
                write_microdata(self.micro, self.h, b + lo, c, cnt)
                if self.area_products is not None:
                    self.area_products.leaves(lo, hi, u, n, z)

    def totals(self) -> dict[str, dict[str, np.ndarray]]:
        """Per product and report level, every node's released total."""
        return {p: {lv: np.concatenate(v) for lv, v in d.items()} for p, d in self.released.items()}


@dataclass(eq=False)
class _PPMFRun:
    """One :func:`privatize_ppmf` run between its steps: the spec, the histogram on its
    hierarchy, the plans, the key, the invariants and the areas' accumulator."""

    path: str | Path
    spec: PPMFSpec
    hist: PPMFHistogram
    eq: Equivalency | None
    plan: Any
    aplan: Any
    rng: KeyedRNG
    invs: list[ProductInvariant]
    report_levels: list[str]
    area_products: _AreaProducts | None

    @property
    def h(self) -> Hierarchy:
        return self.hist.hierarchy

    @classmethod
    def read(cls, path: str | Path, spec: PPMFSpec) -> _PPMFRun:
        """Read the PPMF onto the public blocks (or its own), the areas, the plans."""
        log.info("reading the PPMF (%s)", Path(path).name)
        hist: PPMFHistogram = read_ppmf(path)
        if spec.blocks is not None:
            hist = hist.on_blocks(
                read_block_list(spec.blocks, column=spec.block_column), spec.blocks.name
            )
        h, schema = hist.hierarchy, hist.schema
        eq = None if spec.areas is None else spec.areas.read(h)
        plan, aplan = _plan(schema, spec, h.names)
        rng = KeyedRNG.from_seed(spec.seed)
        report_levels = [lvl for lvl in REPORT_LEVELS if lvl in h.names]
        invs = _invariants(h, schema, hist.block, hist.count)
        areas = None if eq is None else _AreaProducts(h, schema, plan, invs, eq)
        return cls(path, spec, hist, eq, plan, aplan, rng, invs, report_levels, areas)

    def release(self, tmp: Path) -> tuple[PrivacyStatement, _LevelWriter]:
        """Both products, written a partition at a time (in memory with measured areas);
        the engine's privacy statement (with the spec's δ)."""
        h, eq, leaf = self.h, self.eq, self.h.depth - 1
        released = {p: {lv: [] for lv in self.report_levels} for p in PRODUCTS}
        writers = {
            "unbiased": _TableWriter(tmp / "unbiased", h, with_se=True),
            "nonnegative": _TableWriter(tmp / "nonnegative", h, with_se=False),
        }
        micro = (tmp / "nonnegative" / "microdata.csv").open("wb")
        micro.write((",".join(MICRODATA_COLUMNS) + "\n").encode())
        log.info(
            "measure, GLS, rounding and tables of both products%s, a partition at a time",
            "" if eq is None else f" (and {eq.name}s measured)" if self.aplan else f" (and {eq.name}s)",
        )  # fmt: skip
        # closed (on an error too) before the error propagates: it stays the last line
        bar = progress_bar(h.sizes[leaf], "censusdp release", h.names[leaf])
        on_levels = _LevelWriter(h, writers, micro, bar, self.area_products, released)
        source = SparseHistogram.of(self.hist)
        try:
            if self.aplan:  # the areas measured too: the tree GLS updated with them, in memory
                privacy, measured = _measured_products(
                    h, self.hist.schema, source, self.plan, self.aplan, self.rng, on_levels,
                    with_pieces=True, invariants=self.invs, eq=eq, delta=self.spec.delta,
                )  # fmt: skip
                self.area_products.measured = measured.areas
            else:
                res = _two_products(
                    h, self.hist.schema, source, self.plan, self.rng, on_levels,
                    with_pieces=True, invariants=self.invs,
                    on_partition=None if self.area_products is None else self.area_products.partition,
                )  # fmt: skip
                privacy = dataclasses.replace(res.privacy, delta=self.spec.delta)
        finally:
            bar.close()
            micro.close()
        return privacy, on_levels

    def statement(self, privacy: PrivacyStatement) -> tuple[PrivacyStatement, tuple[Product, ...]]:
        """The engine's statement completed (unit, change factor, target ρ, what the
        invariants make exact) with what each product is."""
        spec, h = self.spec, self.h
        privacy = dataclasses.replace(
            privacy,
            unit="person",
            change_factor=change_factor(privacy.mechanism),
            target=float(_total_rho(self.hist.schema, spec)),
            exact=tuple(exact_through_invariants(h, INVARIANTS)),
        )
        products = ppmf_products(spec.blocks is not None, None if self.eq is None else self.eq.name)
        return with_products(privacy, products), products

    def write_areas(self, written: _LevelWriter, rel: dict) -> None:
        """Both products' tables of the areas, and their totals into ``rel``."""
        area_products, name = self.area_products, self.eq.name
        for product, tables in area_products.tables().items():
            written.writers[product].add(name, tables)
            rel[product][name] = area_products.sums[product].sum(axis=1)

    def size_class_report(
        self, tmp: Path, nn_leaf: list, rel: dict, evaluate: bool, products: tuple[Product, ...]
    ) -> None:
        """The size-class report, simulated from the released non-negative histogram (and
        with ``evaluate`` the confidential errors of ``rel`` against the truth)."""
        spec, h, eq = self.spec, self.h, self.eq
        log.info(
            "size-class report: %d simulated release(s) from the released histogram",
            spec.repetitions,
        )
        sim_bar = progress_bar(spec.repetitions, "censusdp size classes", "release")
        pb, pc, pn = (np.concatenate(a) for a in zip(*nn_leaf, strict=True))
        pseudo_source = SparseHistogram(pb, pc, pn)
        pseudo = _report_totals(h, eq, pb, pn, self.report_levels)
        sim_invs = _invariants(h, self.hist.schema, pb, pn)

        def replicate(r: int) -> dict[str, dict[str, np.ndarray]]:
            acc = self.simulated(pseudo_source, sim_invs, r)
            sim_bar.update()
            return acc

        with sim_bar:
            sim = simulate_size_classes(pseudo, replicate, spec.repetitions)
        evaluation = None
        if evaluate:
            hist = self.hist
            truth = _report_totals(h, eq, hist.block, hist.count, self.report_levels)
            evaluation = evaluate_size_classes(truth, rel)
        write_size_class_report(
            tmp, sim, repetitions=spec.repetitions, evaluation=evaluation,
            privacy=products[-1].wording(),
        )  # fmt: skip

    def simulated(
        self, source: SparseHistogram, invariants: list[ProductInvariant], r: int
    ) -> dict[str, dict[str, np.ndarray]]:
        """Simulated release ``r`` of ``source`` (keys ``rng.child("simulation/<r>")``): per
        product, the totals of the report levels, the leaves and the areas."""
        h, eq, spec, leaf = self.h, self.eq, self.spec, self.h.depth - 1
        acc = {p: {lv: np.zeros(h.sizes[h.level_index(lv)], np.int64)
                   for lv in (*self.report_levels, h.names[leaf])} for p in PRODUCTS}  # fmt: skip

        def collect(names, ranges, piece, unbiased, nonneg, total_var=None, reps=None) -> None:
            for name, (lo, hi), u, n in zip(names, ranges, unbiased, nonneg, strict=True):
                if name in acc["unbiased"]:
                    acc["unbiased"][name][lo:hi] = u.reshape(hi - lo, -1).sum(axis=1)
                    acc["nonnegative"][name][lo:hi] = n.reshape(hi - lo, -1).sum(axis=1)

        rng = self.rng.child(f"simulation/{r}")
        if self.aplan:
            _measured_products(
                h, self.hist.schema, source, self.plan, self.aplan, rng, collect,
                with_pieces=False, invariants=invariants, eq=eq, delta=spec.delta,
            )  # fmt: skip
        else:
            _two_products(
                h, self.hist.schema, source, self.plan, rng, collect,
                with_pieces=False, invariants=invariants,
            )  # fmt: skip
        if eq is not None:
            for p in PRODUCTS:
                acc[p][eq.name] = eq.sum_leaves(acc[p][h.names[leaf]])
        return acc


def _report_totals(
    h: Hierarchy, eq: Equivalency | None, block: np.ndarray, count: np.ndarray, levels
) -> dict[str, np.ndarray]:
    """Persons per area of the report's levels, and of the equivalency's areas."""
    out = area_totals(h, block, count, [*levels, h.names[-1]])
    leaf_totals = out.pop(h.names[-1]) if h.names[-1] not in levels else out[h.names[-1]]
    if eq is not None:
        out[eq.name] = eq.sum_leaves(leaf_totals)
    return out


def _write_manifest(
    tmp: Path,
    path,
    spec: PPMFSpec,
    privacy: PrivacyStatement,
    products: tuple[Product, ...],
    timings: dict,
    evaluate: bool,
) -> None:
    from censusdp.pipelines.runner import package_versions

    labels = {
        "unbiased": (
            "unbiased/: GLS estimates of the measurements (unbiased), integer by unbiased "
            "rounding (every cell floor or ceil of its estimate, children summing to their "
            "parent, invariants exact; below the county every node's total is the floor or "
            "ceiling of its estimate plus its share of the county's cell errors); <column>_se "
            "of every column is sqrt(exact GLS variance + the rounding's variance): exact "
            "(psi(1-psi)) for P1_001N and P2_001N down to the county, elsewhere estimated "
            f"without bias from {ROUNDING_REPLICATES} replicate roundings of the same "
            "estimates with keys of their own (post-processing; the estimate has the noise "
            f"of {ROUNDING_REPLICATES} replicates: a 90% interval +/- 1.645 * _se covers at "
            "least about 89%)"
        ),
        "nonnegative": f"nonnegative/: {BIASED_NOTE}; microdata.csv: one row per person",
    }
    manifest = {
        "command": "privatize",
        "route": "ppmf",
        "input": Path(path).name,
        "spec": spec.to_dict(),
        "strategy": "pl94 2020 production strategy and "
        + (
            "allocation (censusdp/schemas/pl94.toml)"
            if spec.allocation is None
            else "the spec's [allocation] (spec.allocation)"
        ),
        "invariants": [f"{lvl}: {q}" for lvl, q in INVARIANTS],
        "exact_through_invariants": list(privacy.exact),
        "privacy": privacy.to_dict(),
        "products": labels,
        "columns": OUTPUT_COLUMNS_NOTE,
        "product_steps": [p.to_dict() for p in products],
        "size_class_report": {
            "files": list(SIZE_CLASS_FILES),
            "repetitions": spec.repetitions,
            "confidential_evaluation": "../evaluation/ (CONFIDENTIAL)" if evaluate else None,
        },
        "versions": package_versions(),
        "timings": timings,
    }
    notes = list(labels.values())
    if spec.areas is not None:
        notes += [
            f"pl94_{spec.areas.level}.csv in both folders: the {spec.areas.level}s of "
            f"{spec.areas.file.name}, sums of their blocks (unbiased: _se from the exact GLS "
            "variance plus the replicate rounding variance)"
        ]
        if spec.areas.share is not None:
            notes += [
                f"the {spec.areas.level}s were also measured ({', '.join(spec.areas.queries)}; "
                f"{spec.areas.share} of ρ) and every level's GLS estimate updated with them "
                "exactly (still sums of blocks, invariants exact)"
            ]
    notes += [
        f"blocks: every block of the public list {spec.blocks.name} (empty blocks included)"
        if spec.blocks is not None
        else "blocks: taken from the PPMF's rows (--blocks-from-data): the set of occupied "
        "blocks is disclosed"
    ]
    notes += ["size_classes.md: errors by size class, simulated from the released numbers"]
    notes += [f"columns: {OUTPUT_COLUMNS_NOTE}"]
    write_release_texts(tmp, manifest, privacy, products, title="PPMF", notes=notes)
