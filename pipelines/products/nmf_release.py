"""A release from the 2020 Noisy Measurement File: unbiased GLS tables P1–P5 with exact SEs.

:func:`release_nmf` reads an NMF (:mod:`censusdp.pipelines.io.nmf`) one state at a time —
the state's subtrees ``0ss`` and ``1ss`` (either or both), never the nation at once — and
runs the structured GLS (:func:`~censusdp.estimation.gls.structured.structured_gls`) on the
state's spine (docs/design.md § The Noisy Measurement File: virtual state → state parts → spine county → tract → block group
→ block), with the published state total held invariant (tying the two parts). A node that
is its parent's only child has no measurements; the reader carries it with variance +inf
(weight 0: its estimate is determined by its parent's).

**The national pass.** When the file has the US level and every state is released, the
estimate is one GLS over nation → states → … → blocks that uses the US measurements (every
query but the total, the nation's total being the sum of the held state totals), computed
without holding more than one state's spine: (1) each state is read and its upward pass run
over state … block (:func:`state_upward`: the public steps
:func:`~censusdp.estimation.gls.structured.structured_setup` and
:func:`~censusdp.estimation.gls.structured.structured_upward` on the state's own problem,
its subtrees, its structural zeros and its held total), keeping only the state node's
message per block (a mean and covariance, moved from the state's noise scale τ to the
nation's); (2) the root combines the US level with the states' messages
(:func:`national_top`: :func:`~censusdp.estimation.gls.structured.structured_upward` with
``bottom`` and :func:`~censusdp.estimation.gls.structured.structured_top`); (3) each state's
upward state — kept from (1) while the kept ones fit in ``cache_bytes``
(:meth:`StateUpward.nbytes`, the partition driver's 1 GiB by default), else the state read
and its upward pass rerun — is smoothed from its node's result
(:func:`national_state`: :func:`~censusdp.estimation.gls.structured.structured_downward`),
its areas from the same root (:func:`national_areas`). This is the Rauch–Tung–Striebel
smoother of the whole tree cut at the state level, so the estimates and every covariance
equal those of the GLS over the whole nation (tested against the in-memory structured GLS of
the nation and a dense GLS with the zeros and state totals as equality rows, 1e-9). With
one state, a subset of states or no US level, each state is estimated alone
(:func:`estimate_state`), bit for bit as before the national pass. Then it writes, per state:

* the spine levels ``pl94_spine_<level>.csv`` (state part, spine county, tract, block
  group; the file's ``geocode``),
* the tabulation geographies ``pl94_<level>.csv``: state (the virtual state, whose total is
  the published one), county, tract and block group (by prefixes of the blocks'
  16-character tabulation GEOIDs, released as sums of blocks through
  :func:`~censusdp.estimation.gls.areas.area_release`) and block (``GEOID`` of 15 characters
  and the spine ``geocode``),
* with a block-assignment file (BAF: block GEOID → area, e.g. districts): the areas'
  ``pl94_area_<name>.csv`` and the covariance matrix of their total populations
  ``area_<name>_P1_001N_covariance.csv`` (what plan-level inference needs),
* under the national pass, ``pl94_nation.csv``: the nation (:func:`nation_tables`),

every table with the Bureau's column names ``P1_001N`` … ``P5_010N`` (the codebook of
:mod:`censusdp.pipelines.products.pl94_tables`) and beside each its exact GLS standard error
``<column>_se``. Values are the *real-valued* GLS estimates (no rounding, no
non-negativity): unbiased, and with the SE they are what a user carries into a model.
With ``integers=True`` (``--integers``) the non-negative integer product of the same
estimate is written beside them under ``nonnegative/`` (:mod:`censusdp.pipelines.products.nmf_integers`:
consistent, structural zeros and state totals exact; biased, no SEs); with ``published``
(``--published``) the metric set by size class against a published table
(:func:`~censusdp.pipelines.products.nmf_evaluate.compare_published`).

**Standard errors.** The estimate is linear in the measurements; its error (estimate − the
confidential truth) has mean 0 and the standard deviation ``_se`` exactly (the GLS
covariance of the node, or of the area's sum of blocks: one pass up the tree,
:mod:`censusdp.estimation.gls.areas`). There is no rounding in this release, so the SE covers
everything between the truth and the number written. A figure the published state total
holds (``P1_001N``, ``P2_001N`` of the state and of any only child of it) is written as that
total with ``_se`` exactly 0 (:func:`held_values`), not as the GLS's float approximation of
it. **What the national pass changed:** the SEs are those of the national GLS — smaller
where the US level informs a state's figures — and errors of different states are no longer
independent: they are correlated through the US level, so the nation's figures (sums over
states) get their own exact SE from the root (``pl94_nation.csv``), not the root-sum-square
of the states' SEs, and a state's areas carry the state node's covariance smoothed from the
root (:func:`national_areas`). Without it (one state, a subset, no US level) errors of
different states are independent. The covariance between two disjoint areas is the
same sweep's cross terms at the nodes whose subtrees meet both
(:func:`~censusdp.estimation.gls.areas.area_query_covariance`), equal to
``(Var(α ∪ β) − Var α − Var β) / 2`` (tested against it).

**Structural zeros.** The file's constraints are held exactly (docs/design.md § The Noisy Measurement File): an hhgq upper
bound of 0 at a node zeroes every cell of that type there, and nursing facilities hold no
one under 18 at every node (:meth:`~censusdp.pipelines.io.nmf.NMFMeasurements.zeros`, the
``zeros`` of the structured GLS: restricted least squares, each node its own mask). Those
cells are released as exactly 0 with SE 0, and every SE (spine, tabulation, areas and their
covariances) is the exact covariance of the restricted estimate. The hhgq *lower* bounds
and non-negativity are inequalities: the linear estimate does not impose them (they would
bias it).

**What is not yet done.** A state's whole spine is held in memory (its estimates are
``2,016`` floats per node): :func:`stream_state` runs a state's GLS on the streamed
structured GLS (:mod:`censusdp.pipelines.structured_stream`, which holds the file's
structural zeros and per-node variances, each partition's task its own nodes' masks and
weights) spine county by spine county, bit for bit the same estimate (a 6,000-block, 40-county
synthetic state: GLS peak 1,327 → 952 MB, 4.0 → 3.7 CPU s), but this release does not yet
use it — its tables, tabulation sweeps and integer product take the state whole; states
beyond ``cache_bytes`` are read twice by the national pass; ``--areas`` needs a run of one
state (a BAF is per state), which is then estimated without the US level (:func:`add_areas` gives a state's
areas under the national pass in Python); areas that cross state lines (a national BAF)
would need the area sweep's top (:func:`~censusdp.estimation.gls.areas.area_top`) over the
states' partial sweeps, not wired here.

**Privacy.** A release made from the file is post-processing of the Census Bureau's
published measurements: no further privacy loss — estimating on the US level too (the
national pass) is still post-processing, and the ρ is unchanged (the US level was always
one of the levels read and counted). The ρ restated is derived from the file's
own variances and queries (Δ₂² = 1 per query, the least noisy node of each level bounding
its loss, levels composed), set beside the production ρ = 293764/114921; with the state
totals held invariant the guarantee is induced subspace DP (Gao, Gong & Yu 2022).

References
----------
U.S. Census Bureau (2023). 2020 Census Redistricting Data (P.L. 94-171) Noisy Measurement
    File; (2021) 2020 Census Block Assignment Files; P.L. 94-171 Summary File table shells.
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (spine, queries, off-spine geographies).
Hay, Rastogi, Miklau & Suciu (2010); Rauch, Tung & Striebel (1965) — the tree GLS.
Gao, Gong & Yu (2022). Subspace Differential Privacy — induced subspace DP.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from censusdp.atomic import output_dir
from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls.areas import (
    AreaEstimates,
    area_partition,
    area_query_covariance,
    area_release,
    query_block_rows,
)
from censusdp.estimation.gls.kernel import UpwardBelief
from censusdp.estimation.gls.marginal_basis import BlockDiagonal, MarginalBasis
from censusdp.estimation.gls.structured import (
    StructuredPiece,
    StructuredRelease,
    StructuredSetup,
    StructuredUpward,
    check_residuals,
    check_structured_invariants,
    resolve_products,
    structured_downward,
    structured_gls,
    structured_output,
    structured_residuals,
    structured_setup,
    structured_top,
    structured_upward,
)
from censusdp.estimation.integer.nonnegative import BIASED_NOTE
from censusdp.hierarchy.core import Hierarchy, as_codes
from censusdp.hierarchy.equivalency import Equivalency, equivalency_from_arrays, read_equivalency
from censusdp.hierarchy.forest import whole_forest
from censusdp.mechanisms.laws import floating_point_note
from censusdp.mechanisms.product_measure import ProductInvariant
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.options import with_keywords
from censusdp.pipelines.io.nmf import (
    PRODUCTION_RHO,
    NMFLevel,
    NMFMeasurements,
    collect_nmf,
    level_measurements,
    nmf_subtree_ids,
    read_nmf,
    read_state_totals,
)
from censusdp.pipelines.io.outputs import (
    DICTIONARY_FILE,
    DictionaryEntry,
    parent_codes,
    real_moe,
    significant,
    write_data_dictionary,
)
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.partition_driver import DEFAULT_CACHE_BYTES
from censusdp.pipelines.products.nmf_integers import INTEGER_FOLDER, nmf_integers, write_integers
from censusdp.pipelines.products.pl94_tables import (
    pl94_codebook,
    pl94_column_values,
    pl94_dictionary,
)
from censusdp.pipelines.structured_stream import (
    StreamOptions,
    StreamResult,
    given_values,
    structured_stream,
)
from censusdp.rng import KeyedRNG
from censusdp.spreadsheet import write_csv
from censusdp.timing import stage

__all__ = [
    "SPINE_OUTPUT_LEVELS",
    "TABULATION_PREFIX",
    "NMFStateRelease",
    "NMFRelease",
    "NMFReleaseOptions",
    "NationalTop",
    "StateUpward",
    "FileNoise",
    "StateTableWriter",
    "add_areas",
    "area_total_covariance",
    "census_block_geoids",
    "estimate_state",
    "nation_tables",
    "national_areas",
    "national_state",
    "national_top",
    "state_upward",
    "stream_state",
    "held_values",
    "pl94_columns",
    "release_nmf",
    "release_statement",
]

#: Spine levels written as ``pl94_spine_<level>.csv`` (not tabulation units).
SPINE_OUTPUT_LEVELS = ("state_part", "county", "tract", "block_group")
#: Tabulation level → length of its GEOID, a prefix of a block's 16-character tabulation
#: GEOID (state 2, county 3, tract 6, block group 1, block 4).
TABULATION_PREFIX = {"county": 5, "tract": 11, "block_group": 12}
#: What the release does not impose, stated in the manifest.
NOT_IMPOSED = (
    "the hhgq lower bounds and non-negativity are not imposed on the real-valued estimates "
    "(they would bias them)"
)
#: ... and without the national pass (one state, a subset of states or no US level).
NOT_IMPOSED_STATES = (
    "the US level's measurements are not used (each state is estimated from its own "
    "subtrees and its published total); " + NOT_IMPOSED
)
#: The estimator, stated in the manifest: the national pass (the file's US level and every
#: state) or states one by one.
ESTIMATOR_NATIONAL = (
    "structured GLS (weighted, exact discrete Gaussian variances) over the whole nation: "
    "the US level's measurements combined at the root with every state's upward message, "
    "state totals invariant; real-valued estimates, exact SEs (errors of different states "
    "correlated through the US level)"
)
ESTIMATOR_STATES = (
    "structured GLS (weighted, exact discrete Gaussian variances), one state at a time, "
    "state total invariant; real-valued estimates, exact SEs"
)
#: The structural zeros the GLS holds, stated in the manifest.
ZEROS_HELD = (
    "structural zeros held exactly (== 0, SE 0) at every node that carries them: an hhgq "
    "upper bound of 0 zeroes that group-quarters type, and nursing facilities hold no one "
    "under 18 (docs/design.md § The Noisy Measurement File; restricted least squares, blocks of 16 over hhgq × votingage)"
)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def census_block_geoids(tabulation_geoids: object) -> np.ndarray:
    """15-character Census block GEOIDs (state 2, county 3, tract 6, block 4, as in block
    assignment files) of 16-character NMF tabulation GEOIDs (… block group 1, block 4): the
    block group digit is the block number's first digit, so it is dropped."""
    g = as_codes(tabulation_geoids)
    return np.strings.add(np.strings.slice(g, 0, 11), np.strings.slice(g, 12, None))


def pl94_columns(estimates: object, level: str | int) -> tuple[np.ndarray, np.ndarray]:
    """Every P1–P5 column (``pl94_codebook()``'s rows) of every node of ``level``: the
    real-valued estimates and their exact standard errors, ``(n_nodes, 298)`` each.

    ``estimates`` is a :class:`~censusdp.estimation.gls.structured.StructuredRelease` or an
    :class:`~censusdp.estimation.gls.areas.AreaEstimates`; a column is the row of one product
    query, so its SE is the quadratic form of that row with the node's covariance blocks
    (docs/design.md § The structured algebra), here of the 298 rows at once
    (:func:`column_variances`).
    """
    est = pl94_column_values(lambda q: estimates.query_estimates(level, q))  # type: ignore[attr-defined]
    return est, np.sqrt(column_variances(estimates, level))  # type: ignore[arg-type]


#: Nodes of one product in :func:`column_variances` (``(nodes, n_S, 298)`` floats).
_COLUMN_CHUNK = 2048


def _column_rows(basis: MarginalBasis) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Per block, ``(298, n_S)``: every P1–P5 column as a functional of the block
    (:func:`~censusdp.estimation.gls.areas.query_block_rows` of its query, its row), and
    every column's squared norm ``‖q‖²`` (its variance under the identity)."""
    rows = pl94_codebook().rows
    out: dict[int, np.ndarray] = {}
    for qi, q in enumerate(rows.queries):
        sel = np.flatnonzero(rows.query_of_row == qi)
        for mask, r in query_block_rows(basis, q).items():
            block = out.setdefault(mask, np.zeros((rows.query_of_row.size, r.shape[1])))
            block[sel] = r[rows.row_of_row[sel]]
    return out, sum((r**2).sum(axis=1) for r in out.values())


def column_variances(estimates: StructuredRelease | AreaEstimates, level: str | int) -> np.ndarray:
    """Every P1–P5 column's error variance at every node of ``level``, ``(n_nodes, 298)``:
    the 298 columns' rows (:func:`_column_rows`) with each block of the nodes' covariance,
    in chunks of nodes — the values of ``query_variances`` column by column (to summation
    order, ~1e-15 relative), with their rules: a release level's variances at or below
    ``1e-12 · ‖q‖² · s_k`` (``s_k`` the level's largest block diagonal entry) are the
    smoother's residue, reported 0; an area's negatives are 0; NaN for unidentified rows."""
    k = estimates.level_index(level)
    assert estimates.covariances is not None
    cov = estimates.covariances[k]
    rows, norm2 = _column_rows(estimates.basis)
    n = estimates.level(level).shape[0]
    var = np.zeros((n, norm2.size))
    for mask, R in rows.items():
        B = cov.blocks[mask]
        for lo in range(0, B.shape[0], _COLUMN_CHUNK):  # (1, n_S, n_S): shared by every node
            T = np.einsum("njc,cj->nc", B[lo : lo + _COLUMN_CHUNK] @ R.T, R)
            var[lo : lo + T.shape[0]] += T if B.shape[0] == n else T[:1]
    if isinstance(estimates, AreaEstimates):
        var = np.maximum(var, 0.0)
    else:
        diag = [np.diagonal(b, axis1=-2, axis2=-1) for b in cov.blocks.values()]
        scale = max((float(d.max()) for d in diag if d.size), default=0.0)
        var = np.where(var > 1e-12 * scale * norm2, var, 0.0)
    book = pl94_codebook().rows
    ident = np.concatenate([estimates.identified_rows(q) for q in book.queries])
    offsets = np.cumsum([0] + [q.n_rows for q in book.queries])[:-1]
    return np.where(ident[offsets[book.query_of_row] + book.row_of_row][None, :], var, np.nan)


def _frame(codes: Mapping[str, np.ndarray], est: np.ndarray, se: np.ndarray) -> pd.DataFrame:
    """Codes, then per column the real-valued estimate (float64, as computed), its SE (six
    significant digits) and its 90% MOE ``1.645 · SE`` (:func:`~censusdp.pipelines.io.outputs.real_moe`:
    the estimates are not integers, so the ACS's normal interval applies)."""
    names = pl94_codebook().columns
    values = np.empty((est.shape[0], 3 * len(names)))  # one float block, not 894 columns
    values[:, 0::3], values[:, 1::3], values[:, 2::3] = est, significant(se), real_moe(se)
    heads = [f"{c}{s}" for c in names for s in ("", "_se", "_moe")]
    code = pd.DataFrame({k: np.asarray(v, dtype=object) for k, v in codes.items()})
    return pd.concat([code, pd.DataFrame(values, columns=heads)], axis=1)


#: A tabulation GEOID's ancestors: level → length of its prefix (a block GEOID's block
#: group is its first 12 characters: the block number's first digit is the group).
_PREFIX = {"state": 2, **TABULATION_PREFIX}


def _tabulation_parents(level: str, geoids: np.ndarray) -> dict[str, np.ndarray]:
    """``state_GEOID``, ``county_GEOID``, ... of tabulation GEOIDs (their prefixes), the
    levels above ``level``, vectorised."""
    g = as_codes(geoids)
    above = list(_PREFIX)[: list(_PREFIX).index(level)] if level in _PREFIX else list(_PREFIX)
    return {f"{lv}_GEOID": np.strings.slice(g, 0, _PREFIX[lv]) for lv in above}


def _nmf_dictionary(files: Mapping[str, Sequence[str]]) -> list[DictionaryEntry]:
    """What every column of the NMF release's tables is (``data_dictionary.csv``)."""
    spine = [f"{lv}_geocode" for lv in ("state", "state_part", *SPINE_OUTPUT_LEVELS)]
    known = {
        e.column: e
        for e in pl94_dictionary(
            parents=[f"{lv}_GEOID" for lv in _PREFIX], integer=False, long=False
        )  # fmt: skip
    }
    known["geocode"] = DictionaryEntry(
        "geocode", "", "the node's geocode on the NMF spine", "text", "code"
    )
    for c in spine:
        known[c] = DictionaryEntry(
            c, "", f"the spine geocode of the node's {c[: -len('_geocode')]}", "text", "code"
        )
    known["area"] = DictionaryEntry("area", "", "the area's code (block assignment file)",
                                    "text", "code")  # fmt: skip
    known["blocks"] = DictionaryEntry("blocks", "", "blocks in the area", "integer", "blocks")
    out: dict[str, DictionaryEntry] = {}
    for name, columns in files.items():
        for c in columns:
            if c in known:
                out.setdefault(c, known[c])
            elif name.endswith("_P1_001N_covariance.csv"):
                out.setdefault(c, DictionaryEntry(
                    c, "P1", f"{name}: covariance of the P1_001N errors with area {c}", "float",
                    "persons squared",
                ))  # fmt: skip
            else:  # pragma: no cover - every written column is described above
                raise AssertionError(f"internal: no dictionary entry for {name} column {c}")
    return list(out.values())


@dataclass(frozen=True, eq=False)
class NMFStateRelease:
    """One state's GLS release from the NMF, in memory.

    Attributes
    ----------
    state : str
        Two FIPS digits.
    measurements : NMFMeasurements
        The state's subtrees joined over its spine, with its total.
    release : StructuredRelease
        The structured GLS on the spine (levels nation, state, state_part, county, tract,
        block_group, block).
    tabulation : dict of str → AreaEstimates
        County, tract and block group as sums of blocks (by GEOID prefix).
    areas : AreaEstimates or None
        The user's areas (BAF), sums of blocks.
    area_covariance : numpy.ndarray or None
        ``(n_areas, n_areas)`` error covariance of the areas' total populations.
    equivalencies : dict of str → Equivalency
        The blocks of every tabulation unit and user area (by their names).
    seconds : dict
        Timings of the steps.
    areas_of : callable, optional
        Equivalency → :class:`~censusdp.estimation.gls.areas.AreaEstimates` where the state's
        own GLS does not give its area covariances (the national pass); None: from
        ``release``.
    cross_of : callable, optional
        (Equivalency, query) → covariance matrices between disjoint areas (the national
        pass, :data:`CrossFn`); None: from ``release``.
    """

    state: str
    measurements: NMFMeasurements
    release: StructuredRelease
    tabulation: dict[str, AreaEstimates]
    areas: AreaEstimates | None
    area_covariance: np.ndarray | None
    equivalencies: dict[str, Equivalency]
    seconds: dict
    areas_of: AreaFn | None = None
    cross_of: CrossFn | None = None

    def area_release(self, eq: Equivalency) -> AreaEstimates:
        """Sums of the state's blocks (``eq`` read against its spine) with their exact
        covariance: :func:`~censusdp.estimation.gls.areas.area_release` of the state's own GLS,
        or ``areas_of`` (the national pass: :func:`national_areas`)."""
        if self.areas_of is not None:
            return self.areas_of(eq)
        return area_release(self.release, eq)

    def area_cross(self, eq: Equivalency, query: ProductQuery) -> np.ndarray:
        """``(n_areas, n_areas, n_rows)``: the covariance matrices between ``eq``'s disjoint
        areas of every row of ``query``
        (:func:`~censusdp.estimation.gls.areas.area_query_covariance` of the state's own GLS,
        or ``cross_of`` under the national pass)."""
        if self.cross_of is not None:
            return self.cross_of(eq, query)
        assert self.release.setup is not None
        return area_query_covariance(self.release.setup, eq, query)

    @property
    def hierarchy(self) -> Hierarchy:
        return self.release.hierarchy

    @property
    def tabulation_geoids(self) -> np.ndarray:
        """16-character tabulation GEOID of every spine block."""
        return self.measurements.spine.tabulation_geoids


#: A state's sums of blocks with their exact covariance: ``area_release(release, eq)`` for a
#: state estimated alone, :func:`national_areas` under the national pass.
AreaFn = Callable[[Equivalency], AreaEstimates]
#: A state's covariance matrices between disjoint areas, row by row of a query
#: (:func:`~censusdp.estimation.gls.areas.area_query_covariance`), ``(n_areas, n_areas, n_rows)``.
CrossFn = Callable[[Equivalency, ProductQuery], np.ndarray]


def area_total_covariance(
    state: NMFStateRelease, eq: Equivalency, areas: AreaEstimates | None = None
) -> np.ndarray:
    """``(n_areas, n_areas)`` error covariance of the (disjoint) areas' total populations.

    One sweep of the blocks' gains' total rows up the state's tree, every two areas' terms
    taken at the nodes whose subtrees meet both
    (:func:`~censusdp.estimation.gls.areas.area_query_covariance`; under the national pass
    from the state node's covariance smoothed from the root, ``state.cross_of``): exact,
    and what the unions ``Var(α ∪ β)`` of every two areas gave, without their
    ``n_areas − 1`` sweeps of the blocks. With ``areas`` (``state.area_release(eq)``) the
    diagonal is their variance, so that it is the square of the written ``P1_001N_se``
    (the two sweeps sum different terms: they agree to ~1e-9 of the variance, the
    cancellation of the sweep's large terms at national scale).
    """
    q = state.release.resolve_query("total")
    cov = state.area_cross(eq, q)[:, :, 0]
    cov = 0.5 * (cov + cov.T)
    if areas is not None:
        np.fill_diagonal(cov, areas.query_variances(eq.name, "total")[:, 0])
    return cov


def _block_equivalency(
    path: Path,
    hierarchy: Hierarchy,
    census_geoids: np.ndarray,
    *,
    block_column: str,
    area_column: str,
    name: str,
    skip_blank_areas: bool,
) -> Equivalency:
    """A BAF (15-character block GEOIDs) mapped onto the spine's blocks."""
    if pd.Index(np.asarray(census_geoids, dtype=object)).has_duplicates:
        raise DataError(
            "NMF blocks: two blocks have the same 15-character GEOID (a block number whose "
            "first digit is not its block group); the file's geocodes are not standard"
        )
    n = census_geoids.size
    flat, order = Hierarchy.from_parents(
        ["state", "block"], [["state"], census_geoids], [None, np.zeros(n, np.int64)],
        return_order=True,
    )  # fmt: skip
    eq = read_equivalency(path, flat, block_column=block_column, area_column=area_column,
                          name=name, skip_blank_areas=skip_blank_areas)  # fmt: skip
    leaf = order[1][eq.leaf]  # flat canonical → spine block index (census_geoids' order)
    o = np.argsort(leaf, kind="stable")
    return Equivalency(eq.name, eq.codes, leaf[o], eq.area[o], hierarchy.leaves.size, eq.source)


def _check_one_state(measurements: NMFMeasurements) -> None:
    """Refuse anything but one state's subtrees with its published total."""
    h = measurements.spine.hierarchy
    if h["state"].size != 1 or "US" in measurements.levels:
        raise SpecError(
            "estimate_state: give one state's subtrees (0ss and/or 1ss) without the US level"
        )
    if not measurements.state_totals:
        raise DataError(
            f"state {h['state'].codes[0]}: no published total given; the state total is "
            "invariant in the 2020 run and ties the state's two parts (--state-totals)"
        )


def _tabulation(
    m: NMFMeasurements, areas_of: AreaFn
) -> tuple[dict[str, AreaEstimates], dict[str, Equivalency]]:
    """The tabulation county, tract and block group of a state's blocks (GEOID prefixes)
    released by ``areas_of``, with their equivalencies."""
    h, geo = m.spine.hierarchy, m.spine.tabulation_geoids
    eqs = {
        level: equivalency_from_arrays(h, h["block"].codes, np.strings.slice(geo, 0, width),
                                       name=level, source="the NMF's block GEOIDs")
        for level, width in TABULATION_PREFIX.items()
    }  # fmt: skip
    return {level: areas_of(eq) for level, eq in eqs.items()}, eqs


def estimate_state(
    measurements: NMFMeasurements,
    *,
    areas: str | Path | None = None,
    block_column: str = "BLOCKID",
    area_column: str = "DISTRICT",
    area_name: str | None = None,
    skip_blank_areas: bool = False,
) -> NMFStateRelease:
    """The GLS of one state's measurements, its tabulation geographies and its areas.

    Parameters
    ----------
    measurements : NMFMeasurements
        One state's subtrees (one or both parts, without the US level) with its published
        total (:func:`~censusdp.pipelines.io.nmf.collect_nmf`).
    areas : path, optional
        Block assignment file: a block GEOID column (15 characters) and an area column.
    block_column, area_column, area_name, skip_blank_areas
        As :func:`~censusdp.hierarchy.equivalency.read_equivalency`.

    Raises
    ------
    DataError, SpecError
        Several states or a US level, no state total, an unreadable or mismatched BAF.
    """
    clock: dict[str, float] = {}
    h = measurements.spine.hierarchy
    with stage(clock, "gls"):
        _check_one_state(measurements)
        meas = measurements.measurements()
        rel = structured_gls(h, meas[0].query.schema, meas, measurements.invariants(),
                             zeros=measurements.zeros())  # fmt: skip
    with stage(clock, "tabulation"):
        tab, eqs = _tabulation(measurements, lambda eq: area_release(rel, eq))
    secs = {"gls": clock["gls"], "tabulation": clock["tabulation"], "areas": 0.0}
    state = NMFStateRelease(str(h["state"].codes[0]), measurements, rel, tab, None, None, eqs,
                            secs)  # fmt: skip
    if areas is None:
        return state
    return add_areas(state, areas, block_column=block_column, area_column=area_column,
                     area_name=area_name, skip_blank_areas=skip_blank_areas)  # fmt: skip


def stream_state(
    measurements: NMFMeasurements,
    on_partition: Callable[[StructuredPiece], None] | None = None,
    *,
    partitions: int | None = None,
    options: StreamOptions | None = None,
) -> StreamResult:
    """One state's structured GLS streamed spine county by spine county.

    The same estimate as :func:`estimate_state`'s ``structured_gls`` bit for bit (tested),
    on :func:`~censusdp.pipelines.structured_stream.structured_stream` cut at the spine
    county: the levels nation … county solved once (``StreamResult.top``), each run of
    counties' tracts, block groups and blocks handed to ``on_partition`` as a
    :class:`~censusdp.estimation.gls.structured.StructuredPiece` and dropped. The file's
    structural zeros and per-node variances (+inf at only children) go with each
    partition's own nodes.

    Parameters
    ----------
    measurements : NMFMeasurements
        One state's subtrees with its published total (as :func:`estimate_state`).
    on_partition : callable, optional
        Receives each partition's levels below the county, in county order.
    partitions : int, optional
        Leaf-balanced runs of counties (:func:`~censusdp.pipelines.partition.partition_units`;
        default one per spine county).
    options : StreamOptions, optional
        Cache, workers or executor, sink (its ``zeros`` are the file's).

    Raises
    ------
    SpecError, DataError
        As :func:`estimate_state`.
    """
    _check_one_state(measurements)
    h = measurements.spine.hierarchy
    meas = measurements.measurements()
    cut = h.level_index("county")
    parts = partition_units(h, cut, partitions or h.sizes[cut])
    opts = dataclasses.replace(options or StreamOptions(), zeros=measurements.zeros())
    return structured_stream(h, meas[0].query.schema, meas, given_values(meas, h, cut), parts,
                             measurements.invariants(), on_partition, opts)  # fmt: skip


# ----------------------------------------------------------------------------- national pass
def _level_values(items: Sequence, first: int, ranges: Sequence[tuple[int, int]]) -> list[list]:
    """Per forest level (from hierarchy level ``first``), per resolved item: its values'
    rows in that level's range, None for other levels (what
    :func:`~censusdp.estimation.gls.structured.structured_upward` reads)."""
    return [
        [it.values[lo:hi] if it.level == first + j else None for it in items]
        for j, (lo, hi) in enumerate(ranges)
    ]


def _same_basis(a: MarginalBasis, b: MarginalBasis) -> bool:
    """Whether two bases are the same (the same refinement of every axis): then block
    coordinates agree, and messages pass between problems solved in them."""
    return a.subsets == b.subsets and all(
        np.array_equal(x.group_of, y.group_of) for x, y in zip(a.axes, b.axes, strict=True)
    )


def _fully_identified(setup: StructuredSetup, who: str) -> None:
    """Refuse a problem with an unidentified block: the national pass passes block
    coordinates between problems, which needs every block whole."""
    if any(v is not None for v in setup.V.values()):
        raise SpecError(
            f"national pass: {who} leaves a combination of cells unidentified (blocks "
            f"{sorted(setup.dropped)}); release the states one by one (--state)"
        )


def _rescaled(belief: UpwardBelief, r: float) -> UpwardBelief:
    """An upward message from scaled units ``z / τ_a`` to ``z / τ_b`` (``r = τ_a / τ_b``):
    the mean times ``r``, the covariance times ``r²``, the flat directions unchanged."""
    return UpwardBelief(belief.m * r, belief.P * (r * r), belief.N, belief.r, belief.shared)


@dataclass(eq=False)
class StateUpward:
    """One state's side of the national pass: its structured problem (the state's own
    :func:`~censusdp.estimation.gls.structured.structured_setup`, its basis that of every
    state), its upward pass over the levels state … block, and what it sends up.

    Attributes
    ----------
    measurements : NMFMeasurements
        The state's subtrees with its published total.
    setup : StructuredSetup
    up : StructuredUpward
        The upward pass of every block over the forest state … block.
    invariants : list of ProductInvariant
        The state total, resolved (level indices).
    """

    measurements: NMFMeasurements
    setup: StructuredSetup
    up: StructuredUpward
    invariants: list

    @property
    def message(self) -> dict:
        """Block mask → the state node's upward belief (its subtrees, its structural zeros
        and its held total; scaled by the state's τ)."""
        return self.up.messages()

    def for_top(self) -> tuple:
        """``(state, total, message, tau, zeros, basis)``: what :func:`national_top` needs of
        the state (small: no array grows with the state's nodes), so a caller can drop the
        state's spine before the root is solved."""
        m = self.measurements
        code = str(m.spine.hierarchy["state"].codes[0])
        return (code, m.state_totals[code], self.message, self.setup.tau, self.zeros,
                self.setup.basis)  # fmt: skip

    def nbytes(self) -> int:
        """Bytes of the arrays this state holds (its measurements and spine, its setup's
        per-node weights and masks, its upward pass): what keeping it for the national
        pass's second half costs (:func:`held_bytes`)."""
        return held_bytes(self)

    @property
    def zeros(self) -> np.ndarray:
        """``(8, 2, 2)`` cells zero in every part of the state: zero in the state (implied by
        consistency; they only fix the basis's split axes at the national top)."""
        return self.measurements.levels["State"].structural_zeros.all(axis=0)


def held_bytes(obj: object) -> int:
    """Bytes of every numpy array reachable from ``obj`` through dataclass fields, slots,
    dicts, lists and tuples, each buffer counted once (a view counts its base)."""
    seen: set[int] = set()
    total, stack = 0, [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, np.ndarray):
            base = x
            while isinstance(base.base, np.ndarray):
                base = base.base
            if id(base) not in seen:
                seen.add(id(base))
                total += base.nbytes
            continue
        if id(x) in seen or x is None or isinstance(x, (str, bytes, int, float)):
            continue
        seen.add(id(x))
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif dataclasses.is_dataclass(x):
            stack.extend(getattr(x, f.name) for f in dataclasses.fields(x))
        elif hasattr(type(x), "__slots__"):
            stack.extend(getattr(x, a, None) for a in type(x).__slots__)
    return total


def state_upward(measurements: NMFMeasurements) -> StateUpward:
    """The upward pass of one state (one or both parts, without the US level, with its
    published total) over its spine below the nation: the first half of the national pass.

    The setup is the one :func:`~censusdp.estimation.gls.structured.structured_gls` builds
    on the state's spine (basis, weights, zeros, τ = the median of the state's variances),
    so each state's operations are those of its own problem; the nation combines the
    states' messages after moving them to its own τ (:func:`national_top`).

    Raises
    ------
    SpecError, DataError
        Several states or a US level, no state total (as :func:`estimate_state`).
    """
    h = measurements.spine.hierarchy
    _check_one_state(measurements)
    meas = measurements.measurements()
    schema = meas[0].query.schema
    meas_r = resolve_products(h, schema, meas, "measurement")
    invs = measurements.invariants()
    setup = structured_setup(h, schema, meas_r, invs, check_values=False,
                             zeros=measurements.zeros())  # fmt: skip
    _fully_identified(setup, f"state {h['state'].codes[0]}")
    invs_r = check_structured_invariants(h, schema, invs)
    rows = [(0, n) for n in h.sizes[1:]]
    forest = whole_forest(h, 1)
    up = structured_upward(setup, forest, rows, _level_values(meas_r, 1, rows),
                           _level_values(invs_r, 1, rows))  # fmt: skip
    return StateUpward(measurements, setup, up, invs_r)


@dataclass(eq=False)
class NationalTop:
    """The national pass's top: the US level's measurements combined with every state's
    upward message, smoothed (:func:`national_top`).

    Attributes
    ----------
    setup : StructuredSetup
        The top problem: nation (the US measurements, its structural zeros) → states (the
        state totals invariant; their beliefs come from the states' messages).
    states : tuple of str
        The states, in node order.
    tau : dict of str → float
        Each state's τ (its messages were moved from it to ``setup.tau``).
    smoothed : dict
        Block mask → ``(zhat, Phat)`` of the nation and the states (scaled by ``setup.tau``).
    release : StructuredRelease
        The nation and the states as estimated at the top: estimates and exact covariances
        (the nation's figures and their SEs; ``setup`` None — areas go through the states).
    totals : dict of str → int
        The published state totals held (the nation's total is their sum).
    """

    setup: StructuredSetup
    states: tuple[str, ...]
    tau: dict
    smoothed: dict
    release: StructuredRelease
    totals: dict

    def cut(self, state: StateUpward) -> dict:
        """Block mask → ``(z, P)`` of ``state``'s node smoothed from the root, in the state's
        scaled units (where its downward pass starts)."""
        s = self.states.index(str(state.measurements.spine.hierarchy["state"].codes[0]))
        r = self.setup.tau / state.setup.tau
        out: dict = {}
        for mask, sm in self.smoothed.items():
            if sm is None:
                out[mask] = None
                continue
            z, P = sm[0][1], sm[1][1]
            P = P[s : s + 1] if P.shape[0] > 1 else P
            out[mask] = (z[s : s + 1] * r, P * (r * r))
        return out

    def estimate_state(self, state: StateUpward) -> NMFStateRelease:
        """``state``'s levels (state … block) smoothed from the root: the second half of the
        national pass, then its tabulation geographies (:func:`national_state`)."""
        return national_state(self, state)


def national_top(us: NMFLevel, states: Sequence[StateUpward | tuple]) -> NationalTop:
    """Combine the US level's measurements with the states' upward messages at the root,
    and smooth the nation and the states (the top of the national pass).

    Parameters
    ----------
    us : NMFLevel
        The US level (one node, every query but the total; its structural zeros).
    states : sequence
        Per state, in state order: a :class:`StateUpward`, or the small tuple
        ``(state, total, message, tau, zeros, basis)`` kept from it (:meth:`StateUpward.for_top`: a caller need not
        hold any state's spine).

    Returns
    -------
    NationalTop

    Raises
    ------
    SpecError
        States whose bases differ from the nation's (a block not fully identified, other
        queries), an estimate that is not identifiable.
    """
    items = [_top_item(s) for s in states]
    codes = [it[0] for it in items]
    if len(set(codes)) != len(codes) or codes != sorted(codes):
        raise SpecError("national_top: give each state once, in state order")
    n = len(items)
    h = Hierarchy.from_parents(["nation", "state"], [as_codes(["US"]), as_codes(codes)],
                               [None, np.zeros(n, np.int64)])  # fmt: skip
    meas = level_measurements(us)
    schema = items[0][5].schema
    total = ProductQuery.parse(schema, "total")
    inv = ProductInvariant("state", total, np.array([[it[1]] for it in items], np.int64))
    zeros = {"nation": us.structural_zeros, "state": np.stack([it[4] for it in items])}
    meas_r = resolve_products(h, schema, meas, "measurement")
    setup = structured_setup(h, schema, meas_r, [inv], zeros=zeros)
    _fully_identified(setup, "the US level")
    for it in items:
        if not _same_basis(setup.basis, it[5]):
            raise SpecError(
                f"national pass: state {it[0]}'s structured problem is not in the nation's "
                "basis (every block must be identified, with the same queries and zeros' "
                "axes); release the states one by one (--state)"
            )
    rows = [(0, 1), (0, n)]
    bottom = [{mask: None if b is None else _rescaled(b, it[3] / setup.tau)
               for mask, b in it[2].items()} for it in items]  # fmt: skip
    up = structured_upward(setup, whole_forest(h), rows, _level_values(meas_r, 0, rows),
                           [[None], [None]], bottom=bottom)  # fmt: skip
    smoothed = structured_top(setup, up)
    est, cov = structured_output(setup, smoothed, range(2), h.sizes)
    assert cov is not None  # weighted geometry
    rel = StructuredRelease(
        hierarchy=h, schema=schema, basis=setup.basis, estimates=tuple(est),
        covariances=tuple(cov), identified=BlockDiagonal(setup.basis, setup.ident),
        privacy=floating_point_note(setup.statement),
        diagnostics={"estimator": "structured GLS, national pass (top)", "tau": setup.tau},
    )  # fmt: skip
    return NationalTop(setup, tuple(codes), {it[0]: it[3] for it in items}, smoothed, rel,
                       {it[0]: int(it[1]) for it in items})  # fmt: skip


def _top_item(s: StateUpward | tuple) -> tuple:
    return s if isinstance(s, tuple) else s.for_top()


def national_state(top: NationalTop, state: StateUpward) -> NMFStateRelease:
    """One state's release under the national pass: its levels smoothed from the root's
    result (:meth:`NationalTop.cut`), their exact covariances (those of the GLS over the
    whole nation with the US measurements), and the tabulation county, tract and block
    group as sums of blocks with exact SEs (:func:`national_areas`).

    The state's :class:`~censusdp.estimation.gls.structured.StructuredRelease` has the
    state's spine (nation → state → …); its ``nation`` level repeats the state (the nation
    itself is ``top.release``) and its ``setup`` is None (its area SEs need the national
    root: :func:`national_areas`).
    """
    clock: dict[str, float] = {}
    setup, m = state.setup, state.measurements
    h = m.spine.hierarchy
    with stage(clock, "gls"):
        cut = top.cut(state)
        smoothed = structured_downward(setup, state.up, cut)
        forest = state.up.forest
        est, cov = structured_output(setup, smoothed, range(forest.depth), h.sizes[1:])
        assert cov is not None  # weighted geometry
        rows = [(0, n) for n in h.sizes[1:]]
        cons, inv_res, inv_val, worst = structured_residuals(setup, forest, rows, est,
                                                             state.invariants)  # fmt: skip
        check_residuals(inv_res, inv_val, worst)
        rel = StructuredRelease(
            hierarchy=h, schema=setup.schema, basis=setup.basis,
            estimates=(est[0], *est), covariances=(cov[0], *cov),
            identified=BlockDiagonal(setup.basis, setup.ident),
            privacy=floating_point_note(setup.statement),
            diagnostics={"estimator": "structured GLS, national pass (US level used)",
                         "max_consistency_residual": cons, "max_invariant_residual": inv_res,
                         "tau": setup.tau, "tau_nation": top.setup.tau},
        )  # fmt: skip
        P_state = {mask: None if c is None else c[1] for mask, c in cut.items()}

    def areas_of(eq: Equivalency) -> AreaEstimates:
        return national_areas(setup, P_state, rel, eq)

    def cross_of(eq: Equivalency, query: ProductQuery) -> np.ndarray:
        return area_query_covariance(setup, eq, query, first=1, top=P_state)

    with stage(clock, "tabulation"):
        tab, eqs = _tabulation(m, areas_of)
    secs = {"gls": clock["gls"], "tabulation": clock["tabulation"], "areas": 0.0}
    return NMFStateRelease(str(h["state"].codes[0]), m, rel, tab, None, None, eqs, secs,
                           areas_of, cross_of)  # fmt: skip


def national_areas(
    setup: StructuredSetup,
    P_state: Mapping[int, np.ndarray | None],
    release: StructuredRelease,
    eq: Equivalency,
) -> AreaEstimates:
    """Sums of one state's blocks with their exact covariance under the national pass.

    The area sweep (:func:`~censusdp.estimation.gls.areas.area_partition`) runs over the state's
    forest up to the state node; above it the errors are the state node's smoothed error:
    ``Var_α = Σ_below + M_s P̂_s M_sᵀ`` with ``M_s`` the area's gain at the state and
    ``P̂_s`` the state's covariance smoothed from the national root (``P_state``, block mask
    → ``(1, k, k)``, the state's scaled units) — the terms of
    :func:`~censusdp.estimation.gls.areas.area_sweep` above the state summed (Rauch, Tung &
    Striebel 1965; module docstring of :mod:`censusdp.estimation.gls.areas`).
    """
    h = setup.hierarchy
    part = area_partition(setup, eq, 1, [(0, n) for n in h.sizes[1:]])
    basis = setup.basis
    n_areas = eq.n_areas
    blocks: dict[int, np.ndarray] = {}
    for mask in basis.subsets:
        n_s = basis.block_size(mask)
        if setup.k(mask) == 0 or P_state[mask] is None:
            blocks[mask] = np.zeros((n_areas, n_s, n_s))
            continue
        _, area, M = part.pairs[mask]
        cov = part.acc[mask].copy()
        np.add.at(cov, area, M @ P_state[mask][0] @ M.swapaxes(-1, -2))
        cov = 0.5 * (cov + cov.swapaxes(-1, -2))
        V = setup.V[mask]
        assert setup.vscale is not None
        blocks[mask] = (cov if V is None else V @ cov @ V.T) * setup.vscale
    return AreaEstimates(
        name=eq.name, codes=eq.codes, leaves=eq.leaves_per_area(), schema=release.schema,
        basis=basis, estimates=(eq.sum_leaves(release.estimates[-1]),),
        covariances=(BlockDiagonal(basis, blocks),), identified=release.identified,
        privacy=release.privacy,
    )  # fmt: skip


def add_areas(
    state: NMFStateRelease,
    areas: str | Path,
    *,
    block_column: str = "BLOCKID",
    area_column: str = "DISTRICT",
    area_name: str | None = None,
    skip_blank_areas: bool = False,
) -> NMFStateRelease:
    """``state`` with the areas of a block assignment file: what :func:`estimate_state`
    does with ``areas=``, as a step of its own (benchmarks time it apart from the GLS).

    The areas are sums of blocks (:func:`~censusdp.estimation.gls.areas.area_release`) with
    exact SEs, and the covariance of their totals (:func:`area_total_covariance`).

    Raises
    ------
    DataError, SpecError
        An unreadable or mismatched BAF, an area name unfit for a file name.
    """
    clock: dict[str, float] = {}
    with stage(clock, "areas"):
        name = area_name or area_column.lower()
        if not _SAFE_NAME.match(name):
            raise SpecError(
                f"area name {name!r}: use letters, digits, '_' or '-' (it names output files)"
            )
        rel = state.release
        eq = _block_equivalency(
            Path(areas), rel.hierarchy, census_block_geoids(state.tabulation_geoids),
            block_column=block_column, area_column=area_column, name=name,
            skip_blank_areas=skip_blank_areas,
        )  # fmt: skip
        user = state.area_release(eq)
        cov = area_total_covariance(state, eq, user)
    secs = {**state.seconds, "areas": clock["areas"]}
    return dataclasses.replace(state, areas=user, area_covariance=cov,
                               equivalencies={**state.equivalencies, name: eq}, seconds=secs)  # fmt: skip


def release_statement(
    rho: float, *, invariant_totals: bool, levels: int, us_used: bool = False
) -> str:
    """The one-line privacy statement of a release made from the file (the wording of
    :meth:`~censusdp.pipelines.io.nmf.NMFMeasurements.release_note`); ``us_used`` says the
    US level's measurements were estimated on (the national pass): still post-processing
    of published measurements, the same ρ (the US level is one of the levels read)."""
    guarantee = (
        "induced subspace differential privacy (the published state totals are invariant)"
        if invariant_totals
        else "zero-concentrated differential privacy"
    )
    used = "; the US level estimated on together with the states" if us_used else ""
    return (
        "Post-processing of the Census Bureau's published measurements (2020 PL94 Noisy "
        f"Measurement File, {levels} levels read{used}): {guarantee}, ρ = {rho:.6g} derived "
        "from the file's own variances and queries (Δ₂² = 1 per query; production ρ = "
        f"293764/114921 ≈ {float(PRODUCTION_RHO):.6g}); no further privacy loss."
    )


class _LeastNoise:
    """Per (level, query): the least σ² over every node read, and Δ₂² (for the file's ρ)."""

    def __init__(self) -> None:
        self.min: dict[tuple[str, str], float] = {}
        self.sens2: dict[tuple[str, str], float] = {}
        self.read: set[str] = set()

    def add(self, levels: Iterable[NMFLevel]) -> None:
        for lvl in levels:
            self.read.add(lvl.name)
            for q in lvl.queries.values():
                if not q.measured.any():
                    continue
                key = (lvl.name, q.name)
                v = float(q.variance[q.measured].min())
                self.min[key] = min(self.min.get(key, np.inf), v)
                self.sens2[key] = q.query.l2_sensitivity**2

    def rho(self) -> float:
        return float(sum(self.sens2[k] / (2.0 * v) for k, v in self.min.items()))

    def levels(self) -> int:
        return len(self.read)


class FileNoise(_LeastNoise):
    """The ρ a file's own variances and queries imply, accumulated level by level as
    subtrees are read (what :func:`release_nmf` states): ``add(levels)`` per subtree, then
    ``rho()`` = Σ_(level, query) Δ₂² / (2 min σ²) — the least noisy node of each level bounds
    its loss (parallel over nodes, sequential over levels and queries) — and ``levels()``,
    the number of levels read."""


@dataclass(frozen=True)
class NMFRelease:
    """What :func:`release_nmf` wrote.

    Attributes
    ----------
    out : Path
        The output folder.
    states : tuple of str
    rho : float
        ρ derived from the file's variances and queries (every level read).
    statement : str
        The one-line privacy statement.
    files : tuple of str
        The files written (besides the ownership manifest).
    seconds : dict
        Per state, timings.
    """

    out: Path
    states: tuple[str, ...]
    rho: float
    statement: str
    files: tuple[str, ...]
    seconds: dict


def _state_groups(root: Path, states: Sequence[str] | None) -> dict[str, list[str]]:
    found = nmf_subtree_ids(root)
    groups: dict[str, list[str]] = {}
    for s in found:
        groups.setdefault(s[1:], []).append(s)
    if not groups:
        raise DataError(f"NMF root {root}: no State=<fff> subtree at any level; nothing to release")
    if states is None:
        return groups
    out = {}
    for s in dict.fromkeys(states):
        if s not in groups:
            raise DataError(
                f"NMF root {root}: no subtree of state {s!r} (states found: {sorted(groups)[:8]})"
            )
        out[s] = groups[s]
    return out


class _Writer:
    """Appends frames to CSVs in the output folder, state after state; :meth:`dictionary`
    writes ``data_dictionary.csv`` of every column written."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list[str] = []
        self.columns: dict[str, list[str]] = {}

    def add(self, name: str, frame: pd.DataFrame) -> None:
        first = name not in self.started
        write_csv(frame, self.folder / name, index=False, header=first, mode="w" if first else "a")
        if first:
            self.started.append(name)
            self.columns[name] = [str(c) for c in frame.columns]

    def dictionary(self) -> Path:
        """Write ``data_dictionary.csv`` (every column of every file written so far)."""
        return write_data_dictionary(self.folder, _nmf_dictionary(self.columns))


def held_values(
    r: NMFStateRelease,
    level: str,
    est: np.ndarray,
    se: np.ndarray,
    leaves: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(est, se)`` of :func:`pl94_columns` with every figure held by the state-total
    invariant set to the invariant's exact value and a standard error of exactly 0.

    The GLS holds the published total only up to its float error (a state's ``P1_001N``
    came out as 276.99999999999966, its SE as 1e-7); nothing lies between the published
    total and the truth. Which figures are held is derived from the invariants
    (:meth:`~censusdp.pipelines.io.nmf.NMFMeasurements.invariants`), never from an SE: the
    columns in the row space of the invariant's query
    (:func:`~censusdp.pipelines.products.ppmf_persons.held_pl94_columns`: ``P1_001N``, ``P2_001N``)
    at the spine nodes :func:`~censusdp.pipelines.release_statement.held_nodes` gives (the
    state, and a state part, county ... that is its parent's only child), or, for an area
    (``leaves`` its blocks per area; a state's areas are disjoint sets of its blocks), an
    area holding every block of the state.

    Returns
    -------
    (est, se) : new (n, 298) arrays
    """
    from censusdp.pipelines.products.ppmf_persons import held_pl94_columns
    from censusdp.pipelines.release_statement import held_nodes

    h = r.hierarchy
    est, se = np.array(est, dtype=float), np.array(se, dtype=float)
    for inv in r.measurements.invariants():
        if inv.query.n_rows != 1:  # pragma: no cover - the NMF holds the total only
            raise SpecError(f"invariant {inv.query.name!r}: only one-row invariants are held")
        up = h.level_index(inv.level)
        if leaves is None:
            k = h.level_index(level)
            nodes = held_nodes(h, [inv.level], level)
            t = inv.values[:, 0]
            value = t[h.ancestor_index(k, up)] if k >= up else np.bincount(
                h.ancestor_index(up, k), weights=t, minlength=h.sizes[k]
            )  # fmt: skip
        else:
            # one held node (the state) and an area of all its blocks: the same sum
            nodes = (np.asarray(leaves) == h.sizes[-1]) & (h.sizes[up] == 1)
            value = np.full(nodes.size, inv.values[0, 0])
        cols = held_pl94_columns(inv.query.name)
        mask = nodes[:, None] & cols[None, :]
        est[mask] = np.broadcast_to(np.asarray(value, dtype=float)[:, None], est.shape)[mask]
        se[mask] = 0.0
    return est, se


def _write_state(w: _Writer, r: NMFStateRelease) -> None:
    h = r.hierarchy
    est, se = held_values(r, "state", *pl94_columns(r.release, "state"))
    w.add("pl94_state.csv", _frame({"GEOID": h["state"].codes}, est, se))
    for level in SPINE_OUTPUT_LEVELS:
        est, se = held_values(r, level, *pl94_columns(r.release, level))
        up = parent_codes(h, level, code_column="geocode")
        w.add(f"pl94_spine_{level}.csv", _frame({"geocode": h[level].codes, **up}, est, se))
    for level, a in r.tabulation.items():
        est, se = held_values(r, level, *pl94_columns(a, level), leaves=a.leaves)
        up = _tabulation_parents(level, a.codes)
        w.add(f"pl94_{level}.csv", _frame({"GEOID": a.codes, **up}, est, se))
    est, se = held_values(r, "block", *pl94_columns(r.release, "block"))
    geo = census_block_geoids(r.tabulation_geoids)
    up = _tabulation_parents("block", geo)
    w.add("pl94_block.csv", _frame({"GEOID": geo, **up, "geocode": h["block"].codes}, est, se))
    if r.areas is not None:
        a = r.areas
        est, se = held_values(r, a.name, *pl94_columns(a, a.name), leaves=a.leaves)
        frame = _frame({"area": a.codes}, est, se)
        frame.insert(1, "blocks", a.leaves)
        w.add(f"pl94_area_{a.name}.csv", frame)
        assert r.area_covariance is not None
        cov = pd.DataFrame(r.area_covariance, columns=[str(c) for c in a.codes])
        cov.insert(0, "area", np.asarray(a.codes, dtype=object))
        w.add(f"area_{a.name}_P1_001N_covariance.csv", cov)


class StateTableWriter(_Writer):
    """Writes states' tables into ``folder`` exactly as :func:`release_nmf` does, one state
    after another (CSV appended): for callers that run the steps themselves (benchmarks).
    ``folder`` should be an output the caller owns (:func:`censusdp.atomic.output_dir`)."""

    def add_state(self, state: NMFStateRelease) -> None:
        """Append ``state``'s P1–P5 tables with their SEs (spine, tabulation, areas)."""
        _write_state(self, state)

    @property
    def files(self) -> tuple[str, ...]:
        """The files written so far."""
        return tuple(sorted(self.started))


@dataclass(frozen=True, eq=False)
class NMFReleaseOptions:
    """How :func:`release_nmf` runs, beyond the file, its state totals and the output: the
    states, the areas of a block assignment file, the output policy and the extra products.

    Attributes
    ----------
    states : sequence of str, optional
        Two-digit states to release (default: every state in the file).
    areas : path, optional
        Block assignment file (15-character block GEOIDs → area code); needs one state.
    block_column, area_column : str
        The BAF's block and area columns (``BLOCKID``, ``DISTRICT``).
    area_name : str, optional
        The areas' name in file names (default the area column in lower case).
    skip_blank_areas : bool
        Leave out blocks with a blank area code instead of refusing them.
    overwrite : bool
        Replace an existing output folder, only when it is an earlier censusdp output.
    integers : bool
        Also write the non-negative integer product (:mod:`censusdp.pipelines.products.nmf_integers`)
        under ``nonnegative/``: consistent non-negative integers from the same estimate,
        structural zeros held, state totals exact; labelled BIASED, no SEs.
    seed : int, optional
        Seed of the integer product's rounding (reproducible mode; default a fresh key).
    published : path, optional
        A published table of ``P1_001N`` by GEOID (e.g. the state's 2020 P1): writes
        ``published_comparison.csv``, the metric set by size class of every product against
        it (:func:`~censusdp.pipelines.products.nmf_evaluate.compare_published`; public on both
        sides).
    cache_bytes : int
        Under the national pass, memory the states' upward passes may take between its two
        halves (default :data:`~censusdp.pipelines.partition_driver.DEFAULT_CACHE_BYTES`,
        the partition driver's budget, 1 GiB; :meth:`StateUpward.nbytes`): a state kept is
        not read nor passed upward again; the others are (0: every state read twice). The
        output does not depend on it.
    """

    states: Sequence[str] | None = None
    areas: str | Path | None = None
    block_column: str = "BLOCKID"
    area_column: str = "DISTRICT"
    area_name: str | None = None
    skip_blank_areas: bool = False
    overwrite: bool = False
    integers: bool = False
    seed: int | None = None
    published: str | Path | None = None
    cache_bytes: int = DEFAULT_CACHE_BYTES


def release_nmf(
    root: str | Path,
    state_totals: str | Path | Mapping[str, int],
    out: str | Path,
    *,
    on_state: Callable[[NMFStateRelease], object] | None = None,
    options: NMFReleaseOptions | None = None,
    **legacy: Any,
) -> NMFRelease:
    """Read an NMF state by state and write its GLS release (see the module docstring).

    Named steps: the inputs checked (:func:`_state_groups`, the areas' one state), every
    state read, estimated and written (:func:`_release_states`), then the comparison with a
    published table, the privacy statement and the manifest (:func:`_manifest`), all inside
    one output folder written whole or not at all.

    Parameters
    ----------
    root : path
        The NMF folder (``State.parquet`` … ``Block.parquet``, ``US.parquet`` optional).
    state_totals : path or mapping
        The published P1 state totals (:func:`~censusdp.pipelines.io.nmf.read_state_totals`).
    out : path
        The output folder (written whole or not at all; an existing one is replaced only
        when it is an earlier censusdp output and ``options.overwrite``).
    on_state : callable, optional
        Called with each :class:`NMFStateRelease` before it is dropped (tests, reports).
    options : NMFReleaseOptions, optional
        The states, the areas, the output policy, the integer product and its seed, the
        published table (:class:`NMFReleaseOptions`; defaults when omitted).
    **legacy
        The fields of :class:`NMFReleaseOptions` as keyword arguments, as before it existed
        (applied over ``options``; accepted for one release).

    Returns
    -------
    NMFRelease

    Raises
    ------
    DataError
        Every malformed row of the file, a missing state total, a bad BAF (naming file, row
        and column), a state or subtree not in the file.
    SpecError
        An output the policy refuses; areas with more than one state.
    TypeError
        A keyword that is no field of :class:`NMFReleaseOptions`.
    """
    opts = with_keywords(NMFReleaseOptions, options, legacy, "release_nmf")
    root = Path(root)
    totals_path = None if isinstance(state_totals, Mapping) else Path(state_totals)
    totals = dict(state_totals) if totals_path is None else read_state_totals(totals_path)
    groups = _state_groups(root, opts.states)
    if opts.areas is not None and len(groups) != 1:
        raise SpecError(
            f"--areas needs a release of one state (a block assignment file is per state); "
            f"the file has states {sorted(groups)[:8]}: pass --state SS"
        )
    noise = _LeastNoise()
    has_us = (root / "US.parquet").is_dir()
    # the national pass needs every state of the file (the US level measures their sum)
    national = has_us and len(groups) > 1 and set(groups) == set(_state_groups(root, None))
    inputs = [root, totals_path, None if opts.areas is None else Path(opts.areas),
              None if opts.published is None else Path(opts.published)]  # fmt: skip
    rng = KeyedRNG.from_seed(opts.seed) if opts.integers else None
    with output_dir(out, overwrite=opts.overwrite, inputs=inputs, command="nmf") as tmp:
        top = None
        if has_us:  # one node: estimated on in the national pass, read for ρ in any case
            (us,) = read_nmf(root, subtrees=["US"])
            noise.add(us.levels)
            if national:
                top = _national_top(root, groups, totals, us.levels[0], noise, opts.cache_bytes)
        done = _release_states(tmp, root, groups, totals, noise, opts, rng, on_state, top)
        if opts.published is not None:  # public against public: written in the release
            from censusdp.pipelines.products.nmf_evaluate import compare_published

            comparison = compare_published(tmp, opts.published)
            write_csv(comparison, tmp / "published_comparison.csv", index=False)
        rho = noise.rho()
        statement = release_statement(rho, invariant_totals=True, levels=noise.levels(),
                                      us_used=top is not None)  # fmt: skip
        manifest = _manifest(statement, rho, groups, (has_us, top), opts, done)
        (tmp / "manifest.json").write_text(
            json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    files = tuple(sorted([*done.tables, DICTIONARY_FILE])) + tuple(
        f"{INTEGER_FOLDER}/{f}" for f in sorted(done.integer_files)
    )
    files += ("published_comparison.csv",) if opts.published is not None else ()
    return NMFRelease(Path(out), tuple(sorted(groups)), rho, statement,
                      files + ("manifest.json",), done.seconds)  # fmt: skip


@dataclass(frozen=True)
class _StatesWritten:
    """What :func:`_release_states` wrote: the table files (the data dictionary aside), the
    per-state timings, the integer product's files and its hhgq bound counts per state."""

    tables: tuple[str, ...]
    seconds: dict
    integer_files: frozenset[str]
    violations: dict


def _release_states(
    tmp: Path,
    root: Path,
    groups: Mapping[str, list[str]],
    totals: Mapping[str, int],
    noise: _LeastNoise,
    opts: NMFReleaseOptions,
    rng: KeyedRNG | None,
    on_state: Callable[[NMFStateRelease], object] | None,
    top: tuple[NationalTop, dict, dict] | None = None,
) -> _StatesWritten:
    """One state at a time: read its subtrees (their noise added to ``noise``), estimate
    it (:func:`estimate_state`; with ``top``, the national pass's top, the first pass's
    timings and the upward states it kept, its downward pass from the root: the kept
    :class:`StateUpward`, or the state read and :func:`state_upward` again, then
    :meth:`NationalTop.estimate_state`), append its tables, with ``rng`` its integer
    product (:func:`~censusdp.pipelines.products.nmf_integers.nmf_integers`), hand it to
    ``on_state`` and drop it; then the nation's tables (with ``top``) and the data
    dictionary of every column written."""
    w = _Writer(tmp)
    seconds: dict = {}
    int_files: set[str] = set()
    violations: dict = {}
    kept = {} if top is None else top[2]
    for state, subtrees in groups.items():
        clock: dict[str, float] = {"read": 0.0, "up": 0.0}
        up = kept.pop(state, None)  # kept from the first half: neither read nor passed again
        if up is None:
            with stage(clock, "read"):
                m = collect_nmf(read_nmf(root, subtrees=subtrees), {state: _total(totals, state)})
                noise.add(m.levels.values())
        else:
            m = up.measurements
        if top is None:
            r = estimate_state(m, areas=opts.areas, block_column=opts.block_column,
                               area_column=opts.area_column, area_name=opts.area_name,
                               skip_blank_areas=opts.skip_blank_areas)  # fmt: skip
        else:
            if up is None:
                with stage(clock, "up"):
                    up = state_upward(m)
            r = top[0].estimate_state(up)
            del up
        with stage(clock, "write"):
            _write_state(w, r)
        first = {} if top is None else {**top[1][state], "up": clock["up"]}
        seconds[state] = {**first, "read": clock["read"], **r.seconds, "write": clock["write"]}
        if rng is not None:  # the biased integer product, from the same estimate
            with stage(clock, "integers"):
                ints = nmf_integers(r, rng)
                write_integers(tmp / INTEGER_FOLDER, r, ints, int_files)
                violations[state] = ints.bounds_repaired
            seconds[state]["integers"] = clock["integers"]
        if callable(on_state):
            on_state(r)
        del r, m
    if top is not None:
        _write_nation(w, top[0])
    w.dictionary()
    return _StatesWritten(tuple(w.started), seconds, frozenset(int_files), violations)


def _national_top(
    root: Path,
    groups: Mapping[str, list[str]],
    totals: Mapping[str, int],
    us: NMFLevel,
    noise: _LeastNoise,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
) -> tuple[NationalTop, dict, dict]:
    """The national pass's first half: each state read and its upward pass run in turn
    (:func:`state_upward`), its small root-level message kept and, while they fit in
    ``cache_bytes`` (:meth:`StateUpward.nbytes`, in state order), the whole upward state;
    then the root (:func:`national_top`). Returns the top, the timings of each state's
    first pass (``kept``: whether its state was kept) and the kept states."""
    items, seconds, kept, used = [], {}, {}, 0
    for state, subtrees in groups.items():
        clock: dict[str, float] = {}
        with stage(clock, "read"):
            m = collect_nmf(read_nmf(root, subtrees=subtrees), {state: _total(totals, state)})
            noise.add(m.levels.values())
        with stage(clock, "up"):
            up = state_upward(m)
            items.append(up.for_top())
        size = up.nbytes()
        if used + size <= cache_bytes:
            kept[state], used = up, used + size
        del m, up
        seconds[state] = {"first_read": clock["read"], "first_up": clock["up"],
                          "kept": state in kept}  # fmt: skip
    t: dict[str, float] = {}
    with stage(t, "top"):
        top = national_top(us, items)
    seconds[next(iter(groups))]["top"] = t["top"]
    return top, seconds, kept


def nation_tables(top: NationalTop) -> pd.DataFrame:
    """The nation's P1–P5 with exact SEs from the national pass (``pl94_nation.csv``): the
    figures the state totals hold (``P1_001N``, ``P2_001N``: the nation's total is the sum
    of the published state totals) written as that sum with SE exactly 0."""
    from censusdp.pipelines.products.ppmf_persons import held_pl94_columns

    est, se = pl94_columns(top.release, "nation")
    held = held_pl94_columns("total")
    est[:, held] = float(sum(int(v) for v in top.totals.values()))
    se[:, held] = 0.0
    return _frame({"GEOID": np.array(["US"], dtype=object)}, est, se)


def _write_nation(w: _Writer, top: NationalTop) -> None:
    w.add("pl94_nation.csv", nation_tables(top))


def _manifest(
    statement: str,
    rho: float,
    groups: Mapping[str, list[str]],
    us: tuple[bool, object],
    opts: NMFReleaseOptions,
    done: _StatesWritten,
) -> dict:
    """``manifest.json`` of the release: its privacy (derived ρ, production ρ, the induced
    subspace guarantee), estimator, what is held and not imposed, states, files and
    timings, and with them the published comparison and the integer product. ``us`` is
    whether the file has a US level and the national pass's top (None: states one by
    one)."""
    has_us, national = us[0], us[1] is not None
    manifest = {
        "route": "nmf",
        "statement": statement,
        "privacy": {
            "basis": "post-processing of the Census Bureau's published measurements",
            "rho_derived": rho,
            "rho_production": "293764/114921",
            "rho_production_value": float(PRODUCTION_RHO),
            "guarantee": "induced subspace differential privacy (state totals invariant)",
            "derivation": "Δ₂² = 1 per query; per level and query the least noisy node "
            "bounds the loss; levels and queries compose",
        },
        "estimator": ESTIMATOR_NATIONAL if national else ESTIMATOR_STATES,
        "structural_zeros": ZEROS_HELD,
        "not_imposed": NOT_IMPOSED if national else NOT_IMPOSED_STATES,
        "states": sorted(groups),
        "state_parts": {s: groups[s] for s in sorted(groups)},
        "us_level_read": has_us,
        "us_level_estimated": national,
        "areas": None
        if opts.areas is None
        else {
            "file": Path(opts.areas).name,
            "block_column": opts.block_column,
            "area_column": opts.area_column,
        },  # fmt: skip
        "files": sorted([*done.tables, DICTIONARY_FILE]),
        "seconds": done.seconds,
    }
    if opts.published is not None:
        manifest["published_comparison"] = {
            "file": "published_comparison.csv",
            "published": Path(opts.published).name,
            "what": "the release's P1_001N minus the published table's, by level and "
            "published size class (a difference from TopDown's published estimates, not "
            "an error against the truth); the Bureau's water-block patch applied first "
            "(nmf_evaluate.WATER_BLOCK_PATCH)",
        }
    if opts.integers:
        manifest["nonnegative"] = {
            "folder": INTEGER_FOLDER,
            "files": sorted(done.integer_files),
            "label": "BIASED: " + BIASED_NOTE,
            "statement": statement,
            "held": "structural zeros == 0 at every node, state totals == the published "
            "ones, every node the sum of its children, non-negative int64, hhgq lower <= "
            "persons of the type <= upper at every node with bounds",
            "hhgq_bounds_repaired": done.violations,
            "seed": "given (reproducible mode)" if opts.seed is not None else "fresh key",
        }
    return manifest


def _total(totals: Mapping[str, int], state: str) -> int:
    if state not in totals:
        raise DataError(
            f"state totals: no total for state {state} (read from the NMF); give the published "
            "P1 total of every state released"
        )
    return int(totals[state])
