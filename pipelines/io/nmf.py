"""Reader of the Census Bureau's 2020 PL94 Noisy Measurement File (NMF), with validation.

The Bureau published the measurements of its 2020 redistricting (PL 94-171) persons run as
Parquet (2023-06-15, public domain). Layout (docs/design.md § The Noisy Measurement File; as the open readers of the real
release read it, e.g. google-research/census-bluedown)::

    <root>/US.parquet/{DPQuery,Constraint}/<file>
    <root>/<Level>.parquet/{DPQuery,Constraint}/State=<fff>/<file>

for ``Level`` in State, County, Tract, Block_Group, Block, and ``fff`` = ``0ss`` (state
``ss`` outside AIAN areas) or ``1ss`` (its AIAN part), one *subtree* each. Any number of part
files per folder are read (names starting with ``_`` or ``.`` — Spark's ``_SUCCESS``,
checksums — are not data); a missing or empty folder means no rows. A missing
``<Level>.parquet`` folder (State … Block) is an error; ``US.parquet`` is optional (a single
state's subtree is a valid input).

DPQuery rows: ``geocode``, ``query_name`` (:data:`QUERY_NAMES`; the US has no
``total_dpq``), ``query_shape`` (4 ints over hhgq 8 × votingage 2 × hispanic 2 × cenrace 63,
1 = summed out; ``hhinstlevels_dpq`` is ``[3, 1, 1, 1]``), ``value`` (ints, C order),
``variance`` (σ² of the discrete Gaussian, one per row); other columns are ignored. Integer
and float widths may differ between files. Constraint rows: ``geocode``, ``query_name``
(:data:`CONSTRAINT_NAMES`), ``value``, ``sign``.

The typed in-memory form, per subtree (:class:`NMFSubtree`), per level (:class:`NMFLevel`):
the geocodes in spine order, per query (:class:`NMFQuery`) its ``(n_nodes, n_rows)`` int64
values and ``(n_nodes,)`` σ², the hhgq lower/upper bounds and the structural zeros they imply.
A node that is its parent's only child has no DPQuery rows (its counts are its parent's): it
is *unmeasured*, carried as values 0 and **variance +inf** (weight 0 in any GLS), with
``NMFQuery.measured`` the mask. :class:`NMFMeasurements` joins subtrees over the spine of
:mod:`censusdp.hierarchy.nmf_spine` (nation → virtual state → state part → …) and gives
:class:`~censusdp.mechanisms.product_measure.ProductMeasurement` objects with per-node
variances, the state-total invariants from a user's file of published P1 totals (tying the
two parts of a state), and the derived privacy statement.
:func:`~censusdp.estimation.gls.structured.structured_gls` reads a node variance of +inf as
weight 0 (the node's answers carry no information), and
:mod:`censusdp.pipelines.products.nmf_release` makes the release.

Privacy: a release made from the file is post-processing of the Census Bureau's published
measurements; ρ is *derived* from the file's own variances and queries (Δ₂² = 1 for each
query: a person is in one cell of each marginal; per level the least noisy node bounds the
loss; levels compose), to compare with the production ρ = 293764/114921 ≈ 2.556
(:data:`PRODUCTION_RHO`). With the state totals held invariant the guarantee is induced
subspace DP.

Every malformed row raises :class:`~censusdp.errors.DataError` naming folder, file, row and
geocode, never a value.

References
----------
U.S. Census Bureau (2023). 2020 Census Redistricting Data (P.L. 94-171) Noisy Measurement
    File and its README.
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (queries, spine, structural zeros).
Canonne, Kamath & Steinke (2020). The Discrete Gaussian for Differential Privacy (ρ = Δ²/2σ²).
Gao, Gong & Yu (2022). Subspace Differential Privacy (invariants: induced subspace DP).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError, SpecError
from censusdp.hierarchy.core import STRING_DTYPE, as_codes
from censusdp.hierarchy.nmf_spine import NMFSpine, code_index, nmf_spine
from censusdp.mechanisms.discrete import MAX_DENOMINATOR, DiscreteGaussian
from censusdp.mechanisms.product_measure import (
    ProductInvariant,
    ProductMeasurement,
    product_privacy,
)
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.schema import Schema

__all__ = [
    "NMF_LEVELS",
    "PART_NMF_LEVELS",
    "SPINE_LEVEL",
    "ALLOCATION_LEVEL",
    "NMF_GEOCODE_LENGTH",
    "QUERY_NAMES",
    "US_QUERY_NAMES",
    "CONSTRAINT_NAMES",
    "LOWER_BOUND",
    "UPPER_BOUND",
    "NURSING",
    "UNDER_18",
    "PRODUCTION_RHO",
    "BATCH_ROWS",
    "NMFQuery",
    "NMFLevel",
    "NMFSubtree",
    "NMFMeasurements",
    "nmf_queries",
    "nmf_subtree_ids",
    "read_nmf",
    "read_state_totals",
    "collect_nmf",
    "file_law",
    "level_measurements",
    "subtree_folder",
]

#: The run's levels, root first (folder ``<Level>.parquet``).
NMF_LEVELS = ("US", "State", "County", "Tract", "Block_Group", "Block")
#: The levels stored per subtree (``State=<fff>`` folders).
PART_NMF_LEVELS = NMF_LEVELS[1:]
#: NMF level → level of :mod:`censusdp.hierarchy.nmf_spine` (State holds the state parts).
SPINE_LEVEL = {
    "US": "nation",
    "State": "state_part",
    "County": "county",
    "Tract": "tract",
    "Block_Group": "block_group",
    "Block": "block",
}
#: NMF level → level of the ``pl94`` schema's production ``[allocation]``.
ALLOCATION_LEVEL = {
    "US": "nation",
    "State": "state",
    "County": "county",
    "Tract": "tract",
    "Block_Group": "block_group",
    "Block": "block",
}
#: Geocode length per level below the nation.
NMF_GEOCODE_LENGTH = {"State": 3, "County": 9, "Tract": 13, "Block_Group": 15, "Block": 31}
#: The 11 DPQuery names of the production strategy, in its order (total first).
QUERY_NAMES = (
    "total_dpq",
    "cenrace_dpq",
    "hispanic_dpq",
    "votingage_dpq",
    "hhinstlevels_dpq",
    "hhgq_dpq",
    "hispanic * cenrace_dpq",
    "votingage * cenrace_dpq",
    "votingage * hispanic_dpq",
    "votingage * hispanic * cenrace_dpq",
    "detailed_dpq",
)
#: The US level measures every query but the total (the nation's total is invariant).
US_QUERY_NAMES = QUERY_NAMES[1:]
LOWER_BOUND = "hhgq_total_lb_con"
UPPER_BOUND = "hhgq_total_ub_con"
#: Constraint names and the sign each must carry (normalised: ``le`` → ``<=``, ``ge`` → ``>=``;
#: None: any known sign — only the hhgq bounds are used, the nursing zero holds everywhere).
CONSTRAINT_NAMES = {
    LOWER_BOUND: ">=",
    UPPER_BOUND: "<=",
    "nurse_nva_0_con": None,
    "total_con": None,
}
_SIGNS = {"=": "=", "==": "=", "le": "<=", "<=": "<=", "ge": ">=", ">=": ">="}
#: hhgq 3 (nursing facilities) holds no one under 18 (votingage 0) at any node.
NURSING, UNDER_18 = 3, 0
#: ρ (zCDP) of the 2020 production persons run (docs/design.md § Census histograms).
PRODUCTION_RHO = Fraction(293764, 114921)
_N_HHGQ = 8
_DPQ_COLUMNS = ("geocode", "query_name", "query_shape", "value", "variance")
_CON_COLUMNS = ("geocode", "query_name", "value", "sign")


def subtree_folder(subtree: str) -> str:
    """The partition folder of a subtree, ``State=<fff>``."""
    return f"State={subtree}"


def nmf_queries(schema: Schema | None = None) -> dict[str, ProductQuery]:
    """NMF query name → the ``pl94`` product query (``"hispanic * cenrace_dpq"`` →
    ``hispanic * cenrace``), in the production strategy's order."""
    schema = Schema.load("pl94") if schema is None else schema
    return {name: ProductQuery.parse(schema, name[: -len("_dpq")]) for name in QUERY_NAMES}


# -- the typed in-memory form -------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class NMFQuery:
    """One query at every node of a level.

    Attributes
    ----------
    name : str
        The file's query name (``"votingage * cenrace_dpq"``).
    query : ProductQuery
    values : numpy.ndarray
        (n_nodes, query.n_rows) int64 noisy answers (0 at unmeasured nodes).
    variance : numpy.ndarray
        (n_nodes,) float64 σ² of the discrete Gaussian noise, as the file gives it;
        ``+inf`` at unmeasured nodes.
    """

    name: str
    query: ProductQuery
    values: np.ndarray
    variance: np.ndarray

    @property
    def measured(self) -> np.ndarray:
        """(n_nodes,) bool: the node has a row for this query."""
        return np.isfinite(self.variance)


@dataclass(frozen=True, eq=False)
class NMFLevel:
    """One level of a subtree (or of the nation), nodes in spine order (sorted geocodes).

    Attributes
    ----------
    name : str
        NMF level name (``"Block_Group"``).
    geocodes : numpy.ndarray
        (n_nodes,) sorted geocodes.
    parent : numpy.ndarray
        (n_nodes,) int64 index of each node's parent in the level above (-1 at the top).
    measured : numpy.ndarray
        (n_nodes,) bool: the node has DPQuery rows (else it is its parent's only child).
    queries : dict of str → NMFQuery
        In the production order.
    lower, upper : numpy.ndarray
        (n_nodes, 8) int64 hhgq lower and upper bounds (0 and -1 where ``has_bounds`` is
        False).
    has_bounds : numpy.ndarray
        (n_nodes,) bool: the node has both hhgq bound rows.
    """

    name: str
    geocodes: np.ndarray
    parent: np.ndarray
    measured: np.ndarray
    queries: dict[str, NMFQuery]
    lower: np.ndarray
    upper: np.ndarray
    has_bounds: np.ndarray

    @property
    def size(self) -> int:
        return int(self.geocodes.shape[0])

    @property
    def hhgq_zero(self) -> np.ndarray:
        """(n_nodes, 8) bool: hhgq type t is a structural zero at the node (upper bound 0)."""
        return self.has_bounds[:, None] & (self.upper == 0)

    @property
    def structural_zeros(self) -> np.ndarray:
        """(n_nodes, 8, 2, 2) bool over hhgq × votingage × hispanic: cells held at 0.

        hhgq type t is zero where its upper bound is 0 (docs/design.md § The Noisy Measurement File); nursing facilities
        (hhgq 3) hold no one under 18 at every node. Broadcast over cenrace.
        """
        z = np.repeat(self.hhgq_zero[:, :, None, None], 2, axis=2).repeat(2, axis=3)
        z[:, NURSING, UNDER_18, :] = True
        return z


@dataclass(frozen=True, eq=False)
class NMFSubtree:
    """The levels of one subtree folder ``State=<fff>`` (or the US level alone).

    Attributes
    ----------
    subtree : str
        ``"0ss"`` / ``"1ss"``, or ``"US"``.
    levels : tuple of NMFLevel
        State … Block for a state part; the US level alone for ``"US"``.
    """

    subtree: str
    levels: tuple[NMFLevel, ...]

    def level(self, name: str) -> NMFLevel:
        for lvl in self.levels:
            if lvl.name == name:
                return lvl
        raise KeyError(name)

    @property
    def state(self) -> str | None:
        """The state's two FIPS digits (None for the US)."""
        return None if self.subtree == "US" else self.subtree[1:]


# -- reading one folder ---------------------------------------------------------------------


@dataclass
class _Rows:
    """Every row of one folder's part files (parsed, not yet validated against the tree)."""

    folder: Path
    files: list[str]
    file: np.ndarray
    row: np.ndarray
    geocode: np.ndarray
    name: np.ndarray
    offsets: np.ndarray
    values: np.ndarray
    shape: np.ndarray | None = None
    variance: np.ndarray | None = None
    sign: np.ndarray | None = None
    paths: list[Path] | None = None

    @property
    def n(self) -> int:
        return int(self.geocode.shape[0])

    def where(self, i: int) -> str:
        return (
            f"NMF folder {self.folder}, file {self.files[int(self.file[i])]}, row {int(self.row[i])}, "
            f"geocode {str(self.geocode[i])!r}"
        )


def _data_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))


def _list_parts(
    col: pa.ChunkedArray | pa.Array, where: str, column: str, *, integer: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """(lengths, flat values as int64, first bad row or -1) of a list column."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)
            or pa.types.is_fixed_size_list(arr.type)):  # fmt: skip
        raise DataError(f"{where}: column {column!r} is not a list column; give a list of integers")
    vt = arr.type.value_type
    if integer and not pa.types.is_integer(vt):
        raise DataError(f"{where}: column {column!r} holds {vt}, not integers; give integer lists")
    lengths = pc.list_value_length(arr)
    bad = -1
    if lengths.null_count:
        bad = int(np.flatnonzero(lengths.is_null().to_numpy(zero_copy_only=False))[0])
    lens = lengths.fill_null(0).to_numpy().astype(np.int64)
    flat = pc.list_flatten(arr)
    if flat.null_count:
        first_null = int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0])
        r = int(np.searchsorted(np.cumsum(lens), first_null, side="right"))
        bad = r if bad < 0 else min(bad, r)
        flat = flat.fill_null(0)
    try:
        vals = flat.cast(pa.int64()).to_numpy()
    except pa.ArrowInvalid as e:
        raise DataError(
            f"{where}: column {column!r} has entries outside int64; {type(e).__name__}"
        ) from None
    return lens, vals, bad


def _strings(col: pa.ChunkedArray, where: str, column: str) -> tuple[np.ndarray, int]:
    arr = col.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
            or pa.types.is_string_view(arr.type)):  # fmt: skip
        raise DataError(f"{where}: column {column!r} is {arr.type}, not text; give strings")
    bad = -1
    if arr.null_count:
        bad = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        arr = arr.fill_null("")
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=STRING_DTYPE), bad


def _open(path: Path, where: str, columns: Sequence[str], kind: str) -> pq.ParquetFile:
    try:
        pf = pq.ParquetFile(path)
        names = set(pf.schema_arrow.names)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{where}: not a readable Parquet file ({type(e).__name__}); "
                        "give the NMF's part files unchanged") from None  # fmt: skip
    missing = [c for c in columns if c not in names]
    if missing:
        raise DataError(f"{where}: missing column {missing[0]!r}; a {kind} file has columns "
                        f"{list(columns)}")  # fmt: skip
    return pf


def _read_folder(folder: Path, kind: str) -> _Rows:
    """Parse every part file of a Constraint folder (``kind='con'``), or the geocodes and
    query names of a DPQuery folder (``kind='dpq'``; values, shapes and variances are read
    afterwards in bounded batches by :func:`_dpq_batches`)."""
    columns = _DPQ_COLUMNS if kind == "dpq" else _CON_COLUMNS
    first = ["geocode", "query_name"] if kind == "dpq" else list(columns)
    files, paths, parts = [], [], []
    for path in _data_files(folder):
        where = f"NMF folder {folder}, file {path.name}"
        pf = _open(path, where, columns, kind)
        try:
            t = pf.read(columns=first)
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{where}: cannot be read ({type(e).__name__})") from None
        k = len(files)
        files.append(path.name)
        paths.append(path)
        n = t.num_rows
        geo, bad_g = _strings(t.column("geocode"), where, "geocode")
        qn, bad_q = _strings(t.column("query_name"), where, "query_name")
        part = {"file": np.full(n, k, np.int64), "row": np.arange(1, n + 1, dtype=np.int64),
                "geocode": geo, "name": qn}  # fmt: skip
        bad = [(bad_g, "geocode"), (bad_q, "query_name")]
        if kind == "con":
            part["lens"], part["values"], bad_v = _list_parts(t.column("value"), where, "value",
                                                              integer=True)  # fmt: skip
            part["sign"], bad_s = _strings(t.column("sign"), where, "sign")
            bad += [(bad_v, "value"), (bad_s, "sign")]
        for b, col in bad:
            if b >= 0:
                raise DataError(f"{where}, row {b + 1}: column {col!r} is null (or holds a null); "
                                "every row needs it")  # fmt: skip
        parts.append(part)
    if not parts:
        empty = np.zeros(0, np.int64)
        rows = _Rows(
            folder, [], empty, empty, as_codes([]), as_codes([]), np.zeros(1, np.int64), empty
        )
        rows.sign, rows.paths = as_codes([]), []
        return rows

    def cat(key: str) -> np.ndarray:
        return np.concatenate([p[key] for p in parts])

    if kind == "dpq":
        empty = np.zeros(0, np.int64)
        rows = _Rows(
            folder, files, cat("file"), cat("row"), cat("geocode"), cat("name"), empty, empty
        )
    else:
        lens = cat("lens")
        rows = _Rows(folder, files, cat("file"), cat("row"), cat("geocode"), cat("name"),
                     np.concatenate(([0], np.cumsum(lens))), cat("values"))  # fmt: skip
        rows.sign = cat("sign")
    rows.paths = paths
    return rows


#: Default rows per batch when DPQuery values are read (a block's detailed row has 2,016).
BATCH_ROWS = 4096


def _dpq_batches(
    rows: _Rows, batch_rows: int
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(first row, value lengths, flat values, (n, 4) query shapes, variances) of every batch
    of a DPQuery folder, in the order of :func:`_read_folder`'s rows."""
    start = 0
    for path in rows.paths:
        where = f"NMF folder {rows.folder}, file {path.name}"
        pf = _open(path, where, _DPQ_COLUMNS, "dpq")
        try:
            batches = pf.iter_batches(
                batch_size=batch_rows, columns=["query_shape", "value", "variance"]
            )
            for batch in batches:
                n = batch.num_rows
                lens, vals, bad_v = _list_parts(batch.column("value"), where, "value", integer=True)
                slens, svals, bad_s = _list_parts(batch.column("query_shape"), where, "query_shape",
                                                  integer=True)  # fmt: skip
                for b, col in ((bad_v, "value"), (bad_s, "query_shape")):
                    if b >= 0:
                        raise DataError(f"{rows.where(start + b)}: column {col!r} is null (or holds "
                                        "a null); every row needs it")  # fmt: skip
                wrong = np.flatnonzero(slens != 4)
                if wrong.size:
                    raise DataError(f"{rows.where(start + int(wrong[0]))}: query_shape must have 4 "
                                    "entries (hhgq, votingage, hispanic, cenrace)")  # fmt: skip
                var = batch.column("variance")
                if not (pa.types.is_floating(var.type) or pa.types.is_integer(var.type)):
                    raise DataError(f"{where}: column 'variance' is {var.type}, not a number")
                var = var.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
                yield start, lens, vals, svals.reshape(n, 4), var
                start += n
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{where}: cannot be read ({type(e).__name__})") from None


def _fail(rows: _Rows, idx: np.ndarray, problem: str) -> None:
    if idx.size:
        raise DataError(f"{rows.where(int(idx[0]))}: {problem}")


def _gather(rows: _Rows, sel: np.ndarray, width: int) -> np.ndarray:
    """(len(sel), width) values of rows ``sel`` (every one of length ``width``)."""
    start = rows.offsets[sel]
    return rows.values[start[:, None] + np.arange(width)[None, :]]


def _check_geocodes(rows: _Rows, level: str, subtree: str) -> None:
    if level == "US":
        return
    want = NMF_GEOCODE_LENGTH[level]
    _fail(rows, np.flatnonzero(np.strings.str_len(rows.geocode) != want),
          f"a {level} geocode has {want} characters; this one does not")  # fmt: skip
    _fail(rows, np.flatnonzero(np.strings.slice(rows.geocode, 0, 3) != subtree),
          f"the geocode does not start with its folder's subtree {subtree!r}")  # fmt: skip


def _duplicates(rows: _Rows, key: np.ndarray, what: str) -> None:
    if key.size < 2:
        return
    order = np.argsort(key, kind="stable")
    same = np.flatnonzero(key[order][1:] == key[order][:-1])
    if same.size:
        first, second = order[same[0]], order[same[0] + 1]
        raise DataError(
            f"{rows.where(int(second))}: duplicate {what} (also {rows.files[int(rows.file[first])]}, "
            f"row {int(rows.row[first])}); give each (geocode, query_name) once"
        )


def _level_queries(
    dpq: _Rows,
    level: str,
    nodes: np.ndarray,
    queries: Mapping[str, ProductQuery],
    batch_rows: int,
) -> tuple[dict[str, NMFQuery], np.ndarray]:
    names = US_QUERY_NAMES if level == "US" else QUERY_NAMES
    qidx = np.full(dpq.n, -1, np.int64)
    for i, nm in enumerate(names):
        qidx[dpq.name == nm] = i
    _fail(dpq, np.flatnonzero(qidx < 0),
          f"unknown query_name at level {level}; expected one of {list(names)}")  # fmt: skip
    node = code_index(nodes, dpq.geocode)
    _duplicates(dpq, node * len(names) + qidx, "query row")
    has_row = np.zeros(nodes.size, bool)
    has_row[node] = True
    qs = [queries[nm] for nm in names]
    values = [np.zeros((nodes.size, q.n_rows), np.int64) for q in qs]
    variance = [np.full(nodes.size, np.inf) for _ in qs]
    for start, lens, flat, shape, var in _dpq_batches(dpq, batch_rows):
        n = lens.size
        qi, nd = qidx[start : start + n], node[start : start + n]
        offsets = np.concatenate(([0], np.cumsum(lens)))
        for i, (nm, q) in enumerate(zip(names, qs, strict=True)):
            sel = np.flatnonzero(qi == i)
            if sel.size == 0:
                continue
            _fail(dpq, start + sel[np.any(shape[sel] != np.asarray(q.row_shape), axis=1)],
                  f"query_shape does not match the schema's query {nm!r} (expected "
                  f"{list(q.row_shape)}; 1 = summed out)")  # fmt: skip
            _fail(dpq, start + sel[lens[sel] != q.n_rows],
                  f"the length of value does not match query_shape of {nm!r}")  # fmt: skip
            v = var[sel]
            _fail(dpq, start + sel[~(np.isfinite(v) & (v > 0))],
                  "variance must be a finite positive number (σ² of the noise)")  # fmt: skip
            values[i][nd[sel]] = flat[offsets[sel][:, None] + np.arange(q.n_rows)[None, :]]
            variance[i][nd[sel]] = v
    out = {}
    for i, (nm, q) in enumerate(zip(names, qs, strict=True)):
        lacking = np.flatnonzero(has_row & ~np.isfinite(variance[i]))
        if lacking.size:
            r = np.flatnonzero(node == lacking[0])
            raise DataError(
                f"{dpq.where(int(r[0]))}: this node has DPQuery rows but none for {nm!r}; a measured "
                "node has every query of its level"
            )
        out[nm] = NMFQuery(nm, q, values[i], variance[i])
    return out, has_row


def _level_bounds(con: _Rows, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    known = code_index(list(CONSTRAINT_NAMES), con.name) >= 0
    _fail(con, np.flatnonzero(~known),
          f"unknown constraint query_name; expected one of {list(CONSTRAINT_NAMES)}")  # fmt: skip
    norm = np.full(con.n, "", dtype=object)
    for raw, canon in _SIGNS.items():
        norm[con.sign == raw] = canon
    _fail(con, np.flatnonzero(norm == ""), f"unknown sign; expected one of {list(_SIGNS)}")
    for nm, sign in CONSTRAINT_NAMES.items():
        if sign is None:
            continue
        _fail(con, np.flatnonzero((con.name == nm) & (norm != sign)),
              f"constraint {nm!r} must have sign {sign!r}")  # fmt: skip
    node = code_index(nodes, con.geocode)
    name_idx = np.zeros(con.n, np.int64)
    for i, nm in enumerate(CONSTRAINT_NAMES):
        name_idx[con.name == nm] = i
    _duplicates(con, node * len(CONSTRAINT_NAMES) + name_idx, "constraint row")
    lens = np.diff(con.offsets)
    out, present = [], []
    for nm in (LOWER_BOUND, UPPER_BOUND):
        sel = np.flatnonzero(con.name == nm)
        _fail(
            con, sel[lens[sel] != _N_HHGQ], f"{nm!r} must have {_N_HHGQ} values (one per hhgq type)"
        )
        v = _gather(con, sel, _N_HHGQ)
        _fail(
            con, sel[np.any(v < 0, axis=1)], f"{nm!r} has a negative bound; bounds are counts ≥ 0"
        )
        arr = np.zeros((nodes.size, _N_HHGQ), np.int64)
        arr[node[sel]] = v
        got = np.zeros(nodes.size, bool)
        got[node[sel]] = True
        out.append(arr)
        present.append(got)
    lower, upper = out
    has = present[0] & present[1]
    one = np.flatnonzero(present[0] != present[1])
    if one.size:
        r = np.flatnonzero(node == one[0])
        raise DataError(f"{con.where(int(r[0]))}: a node has one hhgq bound row but not the other; "
                        f"give both {LOWER_BOUND!r} and {UPPER_BOUND!r}")  # fmt: skip
    crossed = np.flatnonzero(has & np.any(lower > upper, axis=1))
    if crossed.size:
        r = np.flatnonzero((node == crossed[0]) & (con.name == LOWER_BOUND))
        raise DataError(f"{con.where(int(r[0]))}: an hhgq lower bound exceeds its upper bound")
    upper[~has] = -1
    lower[~has] = 0
    return lower, upper, has


def _orphan(rows: Sequence[_Rows], geocode: str, problem: str) -> DataError:
    for r in rows:
        hit = np.flatnonzero(r.geocode == geocode)
        if hit.size:
            return DataError(f"{r.where(int(hit[0]))}: {problem}")
    return DataError(f"geocode {geocode!r}: {problem}")  # pragma: no cover


def _read_level(
    root: Path,
    level: str,
    subtree: str,
    parent_nodes: np.ndarray | None,
    queries: Mapping[str, ProductQuery],
    batch_rows: int,
) -> NMFLevel:
    base = root / f"{level}.parquet"
    sub = () if level == "US" else (subtree_folder(subtree),)
    dpq = _read_folder(base.joinpath("DPQuery", *sub), "dpq")
    con = _read_folder(base.joinpath("Constraint", *sub), "con")
    for rows in (dpq, con):
        _check_geocodes(rows, level, subtree)
    nodes = as_codes(np.unique(np.concatenate([dpq.geocode, con.geocode]).astype(object)))
    if nodes.size == 0:
        where = base / "DPQuery" / sub[0] if sub else base / "DPQuery"
        raise DataError(f"NMF folder {where}: no rows for subtree {subtree} at level {level}; every "
                        "level of a subtree has nodes")  # fmt: skip
    if level == "US" and nodes.size != 1:
        raise _orphan([dpq, con], str(nodes[1]), "the US level has exactly one geocode")
    if parent_nodes is not None:
        up = NMF_LEVELS[NMF_LEVELS.index(level) - 1]
        prefix = np.strings.slice(nodes, 0, NMF_GEOCODE_LENGTH[up])
        parent = code_index(parent_nodes, prefix)
        bad = np.flatnonzero(parent < 0)
        if bad.size:
            raise _orphan([dpq, con], str(nodes[bad[0]]),
                          f"no {up} node has this geocode's prefix (the node has no parent in "
                          "the file); every node's parent must be in the level above")  # fmt: skip
    qs, measured = _level_queries(dpq, level, nodes, queries, batch_rows)
    lower, upper, has = _level_bounds(con, nodes)
    if parent_nodes is None:
        parent = np.full(nodes.size, -1, np.int64)
        lacking = np.flatnonzero(~measured)
        if lacking.size:
            raise _orphan([con], str(nodes[lacking[0]]),
                          "the node has constraints but no measurements (DPQuery rows)")  # fmt: skip
    else:
        only = np.bincount(parent, minlength=parent_nodes.size)[parent] == 1
        lacking = np.flatnonzero(~measured & ~only)
        if lacking.size:
            raise _orphan([con], str(nodes[lacking[0]]),
                          "the node has constraints but no measurements (DPQuery rows), and it is "
                          "not its parent's only child")  # fmt: skip
    return NMFLevel(level, nodes, parent, measured, qs, lower, upper, has)


# -- the whole file -------------------------------------------------------------------------


def _subtree_key(s: str) -> tuple[str, str]:
    return (s[1:], s[0])


def nmf_subtree_ids(root: str | Path) -> list[str]:
    """The subtrees (``0ss``/``1ss``) with a folder at any level, by state then part.

    Raises
    ------
    DataError
        A missing ``<Level>.parquet`` folder (State … Block), or a ``State=`` folder whose
        name is not three digits starting with 0 or 1.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"NMF root {root} is not a folder; give the folder holding US.parquet, "
                        "State.parquet, …, Block.parquet")  # fmt: skip
    found: set[str] = set()
    for level in PART_NMF_LEVELS:
        base = root / f"{level}.parquet"
        if not base.is_dir():
            raise DataError(f"NMF root {root}: missing level folder {base.name}; the file has "
                            f"{[f'{lvl}.parquet' for lvl in PART_NMF_LEVELS]} (US.parquet optional)")  # fmt: skip
        for kind in ("DPQuery", "Constraint"):
            folder = base / kind
            if not folder.is_dir():
                continue
            for d in folder.iterdir():
                if not d.is_dir() or d.name.startswith(("_", ".")):
                    continue
                fff = d.name.removeprefix("State=")
                if d.name == fff or len(fff) != 3 or not fff.isdigit() or fff[0] not in "01":
                    raise DataError(f"NMF folder {folder}: subfolder {d.name!r} is not State=<fff> "
                                    "with fff = 0ss or 1ss")  # fmt: skip
                found.add(fff)
    return sorted(found, key=_subtree_key)


def read_nmf(
    root: str | Path,
    *,
    subtrees: Iterable[str] | None = None,
    schema: Schema | None = None,
    batch_rows: int = BATCH_ROWS,
) -> Iterator[NMFSubtree]:
    """Read an NMF subtree by subtree (never the nation at once), validating every row.

    A DPQuery folder is read in two passes: its geocodes and query names (which fix the
    nodes and find duplicates), then its values, shapes and variances in batches of
    ``batch_rows`` rows scattered straight into the level's arrays, so the peak memory is
    the subtree's arrays plus one batch.

    Parameters
    ----------
    root : path
        The folder holding ``US.parquet`` (optional) and ``State.parquet`` … ``Block.parquet``.
    subtrees : iterable of str, optional
        Which subtrees to read (``"001"``, ``"101"``, …; ``"US"`` for the US level). Default:
        the US level if present, then every subtree found, by state then part.
    schema : Schema, optional
        The ``pl94`` schema (loaded when omitted).
    batch_rows : int
        DPQuery rows per batch (at least 1).

    Yields
    ------
    NMFSubtree
        The US level first (when read), then one per state part, by state then part.

    Raises
    ------
    DataError
        Naming folder, file, row and geocode: unknown query names, a ``query_shape`` that
        does not match the query or ``value``'s length, a variance that is not finite and
        positive, a geocode of the wrong length or that does not nest, duplicate rows, a
        node with constraints but no measurements that is not an only child, a missing level
        folder, or a requested subtree with no folder.
    """
    root = Path(root)
    if int(batch_rows) < 1:
        raise SpecError(f"read_nmf: batch_rows must be at least 1, got {batch_rows!r}")
    batch_rows = int(batch_rows)
    found = nmf_subtree_ids(root)
    has_us = (root / "US.parquet").is_dir()
    if subtrees is None:
        wanted = (["US"] if has_us else []) + found
    else:
        wanted = list(dict.fromkeys(subtrees))
        for s in wanted:
            if s == "US" and not has_us:
                raise DataError(
                    f"NMF root {root}: no US.parquet folder; leave 'US' out of subtrees"
                )
            if s != "US" and s not in found:
                raise DataError(f"NMF root {root}: no State={s} folder at any level; subtrees found: "
                                f"{found[:6]}{' …' if len(found) > 6 else ''}")  # fmt: skip
        wanted = [s for s in wanted if s == "US"] + sorted(
            (s for s in wanted if s != "US"), key=_subtree_key
        )
    queries = nmf_queries(schema)
    for s in wanted:
        if s == "US":
            yield NMFSubtree("US", (_read_level(root, "US", "US", None, queries, batch_rows),))
            continue
        levels: list[NMFLevel] = []
        for level in PART_NMF_LEVELS:
            up = levels[-1].geocodes if levels else None
            levels.append(_read_level(root, level, s, up, queries, batch_rows))
        yield NMFSubtree(s, tuple(levels))


_STATE_COLUMNS = ("state", "geocode", "STATE", "state_fips")
_TOTAL_COLUMNS = ("total", "value", "P1_001N", "pop")


def read_state_totals(path: str | Path) -> dict[str, int]:
    """Published P1 state totals (the production invariants), ``{ss: total}``.

    A CSV or Parquet file with one row per state: a state column (``state``, ``geocode``,
    ``STATE`` or ``state_fips``: two FIPS digits) and a total column (``total``, ``value``,
    ``P1_001N`` or ``pop``: a non-negative integer).

    Raises
    ------
    DataError
        Naming file, row and column: missing columns, a code that is not two digits, a
        duplicate state, a total that is not a non-negative integer.
    """
    path = Path(path)
    try:
        if path.suffix.lower() == ".parquet":
            t = pq.read_table(path)
            cols = {c: [None if v is None else str(v) for v in t.column(c).to_pylist()]
                    for c in t.column_names}  # fmt: skip
        else:
            with path.open(newline="", encoding="utf-8-sig") as f:
                reader = csv.DictReader(f)
                data = list(reader)
                cols = {c: [r.get(c) for r in data] for c in (reader.fieldnames or [])}
    except (OSError, UnicodeDecodeError, pa.ArrowException, csv.Error) as e:
        raise DataError(f"state totals {path}: cannot be read ({type(e).__name__})") from None
    sc = next((c for c in _STATE_COLUMNS if c in cols), None)
    tc = next((c for c in _TOTAL_COLUMNS if c in cols), None)
    if sc is None or tc is None:
        raise DataError(f"state totals {path}: needs a state column (one of {list(_STATE_COLUMNS)}) "
                        f"and a total column (one of {list(_TOTAL_COLUMNS)})")  # fmt: skip
    out: dict[str, int] = {}
    for i, (s, v) in enumerate(zip(cols[sc], cols[tc], strict=True), start=1):
        s = (s or "").strip()
        if len(s) != 2 or not s.isdigit():
            raise DataError(f"state totals {path}, row {i}, column {sc!r}: not a 2-digit state FIPS "
                            "code")  # fmt: skip
        v = (v or "").strip()
        if not v.isdigit():
            raise DataError(f"state totals {path}, row {i}, column {tc!r} (state {s}): not a "
                            "non-negative integer")  # fmt: skip
        if s in out:
            raise DataError(f"state totals {path}, row {i}, column {sc!r}: state {s} appears twice")
        out[s] = int(v)
    return out


# -- joined over the spine ----------------------------------------------------------------


def _dg_variance(sigma2: np.ndarray) -> np.ndarray:
    """Noise variance of the discrete Gaussian of each σ² (inf stays inf): Σ k² e^{−k²/2σ²}
    / Σ e^{−k²/2σ²} summed to |k| ≤ 12σ + 2 (Canonne, Kamath & Steinke 2020, Cor. 9: slightly
    below σ²), once per distinct σ²."""
    out = np.full(sigma2.shape, np.inf)
    fin = np.isfinite(sigma2)
    u, inv = np.unique(sigma2[fin], return_inverse=True)
    var = np.empty(u.size)
    for i, s2 in enumerate(u):  # a handful of distinct σ² per (level, query)
        half = math.ceil(math.sqrt(s2) * 12.0) + 2
        if half > 4_000_000:  # Poisson summation: the correction is below e^{−2π²σ²}
            var[i] = s2
            continue
        k = np.arange(1, half + 1, dtype=np.float64)
        w = np.exp(-(k * k) / (2.0 * s2))
        var[i] = 2.0 * (k * k * w).sum() / (1.0 + 2.0 * w.sum())
    out[fin] = var[inv]
    return out


def file_law(sigma2: float) -> DiscreteGaussian:
    """The discrete Gaussian to *account* a published measurement of σ² ``sigma2`` with.

    The noise was drawn by the Bureau, so the statement must not understate its loss: σ² is
    rounded *down* onto the sampler's rational grid (denominator a power of two ≤
    :data:`~censusdp.mechanisms.discrete.MAX_DENOMINATOR`), which leaves a σ² already on
    the grid (e.g. every σ² :mod:`.nmf_writer` writes) exact, and otherwise overstates ρ by a
    relative 2⁻¹⁰/σ² at most. (:meth:`DiscreteGaussian.from_sigma2` rounds *up*, the safe
    direction for noise about to be drawn, not for noise already drawn.)
    """
    exact = Fraction(float(sigma2))
    q = MAX_DENOMINATOR
    while q > 1 and exact * q > (1 << 20):
        q //= 2
    down = Fraction(math.floor(exact * q), q)
    if not down > 0:
        raise DataError(f"a variance below 1/{q} cannot be accounted on the sampler's grid")
    return DiscreteGaussian.from_sigma2(down)


def level_measurements(level: NMFLevel) -> list[ProductMeasurement]:
    """One :class:`ProductMeasurement` per query of one NMF level, on its spine level
    (:data:`SPINE_LEVEL`): ``node_variance`` the exact variance of each node's discrete
    Gaussian (+inf at unmeasured nodes: weight 0), the law the least noisy node's (it bounds
    the loss of every node of the level); a query measured at no node is left out. What
    :meth:`NMFMeasurements.measurements` gives per level, and the US level alone for the
    national pass (:mod:`censusdp.pipelines.products.nmf_release`)."""
    out = []
    for q in level.queries.values():
        fin = q.variance[np.isfinite(q.variance)]
        if fin.size == 0:  # no node of the level measured (only children): no query
            continue
        law = file_law(float(fin.min()))
        out.append(ProductMeasurement(SPINE_LEVEL[level.name], q.query, q.values, law,
                                      _dg_variance(q.variance)))  # fmt: skip
    return out


@dataclass(frozen=True, eq=False)
class NMFMeasurements:
    """Subtrees of an NMF joined over their spine (a state, a few states, or the nation).

    Attributes
    ----------
    spine : NMFSpine
        nation → state (virtual) → state_part → county → tract → block_group → block.
    levels : dict of str → NMFLevel
        Per NMF level read (``"US"`` when read, then State … Block), nodes in spine order
        (``parent`` indexes the spine level above).
    state_totals : dict of str → int
        The published totals of the spine's states (empty when none were given).
    """

    spine: NMFSpine
    levels: dict[str, NMFLevel]
    state_totals: dict[str, int]

    def measurements(self) -> list[ProductMeasurement]:
        """One :class:`ProductMeasurement` per (level, query), spine level names.

        ``node_variance`` is the exact variance of each node's discrete Gaussian (+inf at
        unmeasured nodes: weight 0); the law is the least noisy node's (it bounds the
        privacy loss of every node of the level).
        """
        return [x for lvl in self.levels.values() for x in level_measurements(lvl)]

    def zeros(self) -> dict[str, np.ndarray]:
        """Spine level → ``(n_nodes, 8, 2, 2)`` bool over hhgq × votingage × hispanic: the
        structural zeros of every level read (:attr:`NMFLevel.structural_zeros`: hhgq upper
        bounds of 0, no one under 18 in nursing facilities), each node its own mask, for
        :func:`~censusdp.estimation.gls.structured.structured_gls`'s ``zeros``."""
        return {SPINE_LEVEL[lvl.name]: lvl.structural_zeros for lvl in self.levels.values()}

    def invariants(self) -> list[ProductInvariant]:
        """The state totals on the virtual state level (empty without totals)."""
        if not self.state_totals:
            return []
        total = next(iter(next(iter(self.levels.values())).queries.values())).query.schema
        q = ProductQuery.parse(total, "total")
        states = self.spine.hierarchy["state"].codes
        vals = np.array([[self.state_totals[str(s)]] for s in states], dtype=np.int64)
        return [ProductInvariant("state", q, vals)]

    def privacy(self) -> PrivacyStatement:
        """The statement the file's own variances and queries imply (Δ₂² = 1 per query)."""
        meas = self.measurements()
        return product_privacy(meas, level_names=list(self.spine.hierarchy.names))

    def release_note(self) -> str:
        """What a release made from these measurements may say about privacy (one line).

        Post-processing of published measurements costs nothing more; the ρ restated is the
        one the file's own variances and queries imply (:meth:`derived_rho`), set beside the
        production ρ; with the state totals held invariant the guarantee is induced subspace
        DP (Gao, Gong & Yu 2022), never plain ρ-zCDP.
        """
        rho = self.derived_rho()
        guarantee = (
            "induced subspace differential privacy (the published state totals are invariant)"
            if self.state_totals
            else "zero-concentrated differential privacy"
        )
        return (
            "Post-processing of the Census Bureau's published measurements (2020 PL94 Noisy "
            f"Measurement File, {len(self.levels)} levels read): {guarantee}, ρ = {rho:.6g} derived "
            "from the file's own variances and queries (Δ₂² = 1 per query; production ρ = "
            f"293764/114921 ≈ {float(PRODUCTION_RHO):.6g}); no further privacy loss."
        )

    def derived_rho(self) -> float:
        """ρ = Σ_levels Σ_q Δ₂(q)² / (2 min_v σ²_v): the least noisy node of each level
        bounds the loss of its level (parallel composition over nodes, sequential over
        levels and queries)."""
        return float(sum(q.query.l2_sensitivity ** 2 / (2.0 * q.variance[q.measured].min())
                         for lvl in self.levels.values() for q in lvl.queries.values()
                         if q.measured.any()))  # fmt: skip


def collect_nmf(
    subtrees: Iterable[NMFSubtree], state_totals: Mapping[str, int] | None = None
) -> NMFMeasurements:
    """Join subtrees (from :func:`read_nmf`) over their spine, in memory.

    Parameters
    ----------
    subtrees : iterable of NMFSubtree
        State parts (and optionally the US level).
    state_totals : mapping of str → int, optional
        Published totals by 2-digit state (:func:`read_state_totals`); every state of the
        subtrees must have one; states not read are ignored.

    Raises
    ------
    DataError
        A state without a total, or a subtree given twice.
    """
    subs = list(subtrees)
    us = [s for s in subs if s.subtree == "US"]
    parts = sorted((s for s in subs if s.subtree != "US"), key=lambda s: _subtree_key(s.subtree))
    ids = [s.subtree for s in parts]
    if len(set(ids)) != len(ids) or len(us) > 1:
        raise DataError("collect_nmf: a subtree is given twice; read each once")
    if not parts:
        raise DataError("collect_nmf: no state part; give at least one State=<fff> subtree")
    geocodes = {
        SPINE_LEVEL[lvl]: np.concatenate([s.levels[k].geocodes for s in parts])
        for k, lvl in enumerate(PART_NMF_LEVELS)
    }
    spine = nmf_spine(geocodes)
    levels: dict[str, NMFLevel] = {}
    if us:
        levels["US"] = us[0].levels[0]
    h = spine.hierarchy
    for k, lvl in enumerate(PART_NMF_LEVELS):
        order = spine.orders[SPINE_LEVEL[lvl]]
        src = [s.levels[k] for s in parts]

        def cat(get, order=order, src=src):
            return np.concatenate([get(x) for x in src])[order]

        qs = {nm: NMFQuery(nm, q.query, cat(lambda x, nm=nm: x.queries[nm].values),
                           cat(lambda x, nm=nm: x.queries[nm].variance))
              for nm, q in src[0].queries.items()}  # fmt: skip
        levels[lvl] = NMFLevel(
            lvl, h[SPINE_LEVEL[lvl]].codes, h[SPINE_LEVEL[lvl]].parent,
            cat(lambda x: x.measured), qs, cat(lambda x: x.lower), cat(lambda x: x.upper),
            cat(lambda x: x.has_bounds),
        )  # fmt: skip
    totals: dict[str, int] = {}
    if state_totals is not None:
        for s in h["state"].codes:
            s = str(s)
            if s not in state_totals:
                raise DataError(f"state totals: no total for state {s} (read from the NMF); give "
                                "the published P1 total of every state read")  # fmt: skip
            totals[s] = int(state_totals[s])
    return NMFMeasurements(spine, levels, totals)
