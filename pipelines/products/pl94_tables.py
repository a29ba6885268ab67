"""The 2020 redistricting tables P1–P5 (PL 94-171) from ``pl94`` histograms, wide and long.

The Census Bureau's 2020 Redistricting Data (Public Law 94-171) Summary File publishes five
person tables, every one a set of marginals of the ``pl94`` histogram
(hhgq × votingage × hispanic × cenrace):

* **P1** Race (71 columns): the total; the population of one race and the six races alone;
  the population of two or more races, then for two, three, four, five and six races a
  subtotal followed by its combinations (15, 20, 15, 6, 1), in CENRACE order;
* **P2** Hispanic or Latino, and Not Hispanic or Latino by Race (73): the total, Hispanic or
  Latino, Not Hispanic or Latino, then P1's 70 rows below the total for the not-Hispanic
  population;
* **P3**, **P4**: P1 and P2 for the population 18 years and over;
* **P5** Group Quarters Population by Major Group Quarters Type (10): the group-quarters
  total, institutionalized (correctional facilities for adults, juvenile facilities,
  nursing/skilled-nursing facilities, other institutional) and noninstitutionalized
  (college/university student housing, military quarters, other noninstitutional).

Columns are named as the Bureau names them (``P1_001N`` … ``P5_010N``). Each column is one
row of a product query of the schema (``numraces``, ``adult * hispanic * cenrace``,
``hhinstlevels``, ...), gathered into a :class:`~censusdp.pipelines.io.codebook.Codebook`, so
every table is computed from the histogram by per-axis sums (never by hand-written sums of
cells) and every identity among the columns (P1_001N = P2_001N, P1_009N = P1_010N + P1_026N
+ … , P5_001N = P5_002N + P5_007N, ...) holds exactly for any integer histogram.

:func:`pl94_frames` builds the wide tables (one row per node: its code and its ancestors'
codes, then ``<column>`` as int64, and with standard errors ``<column>_se`` to six significant
digits and ``<column>_moe``, the integer 90% margin of error of an integer release,
:func:`~censusdp.pipelines.io.outputs.lattice_moe`) and the long one (one row per node and
column); :func:`pl94_dictionary` says what every column is; :func:`write_pl94_tables` writes
them and ``data_dictionary.csv`` atomically (:func:`censusdp.atomic.output_dir`: all files or
none).

References
----------
U.S. Census Bureau (2021). 2020 Census Redistricting Data (Public Law 94-171) Summary File,
    Technical Documentation, table shells P1–P5 (column names ``P1_001N`` …).
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (the tables as marginals of one histogram).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from censusdp.atomic import PathLike, output_dir
from censusdp.errors import DataError
from censusdp.hierarchy.core import Hierarchy
from censusdp.pipelines.io.codebook import Codebook
from censusdp.pipelines.io.outputs import (
    DictionaryEntry,
    code_entries,
    estimate_entries,
    long_entries,
    long_table,
    wide_table,
    write_data_dictionary,
    written_errors,
)
from censusdp.schema import Schema
from censusdp.spreadsheet import write_csv

__all__ = [
    "TABLES",
    "LevelTables",
    "level_tables",
    "pl94_codebook",
    "pl94_column_values",
    "pl94_dictionary",
    "pl94_frames",
    "pl94_labels",
    "tabulate",
    "write_pl94_tables",
]

#: The five tables: name → (title, universe).
TABLES: dict[str, tuple[str, str]] = {
    "P1": ("Race", "Total population"),
    "P2": ("Hispanic or Latino, and Not Hispanic or Latino by Race", "Total population"),
    "P3": ("Race for the Population 18 Years and Over", "Total population 18 years and over"),
    "P4": (
        "Hispanic or Latino, and Not Hispanic or Latino by Race for the Population 18 Years "
        "and Over",
        "Total population 18 years and over",
    ),
    "P5": (
        "Group Quarters Population by Major Group Quarters Type",
        "Population in group quarters",
    ),
}
_ADULT = "18 years and over"
_NOT_HISPANIC = "Not Hispanic or Latino"
_HISPANIC = "Hispanic or Latino"
_COUNT_WORDS = ("one race", "two races", "three races", "four races", "five races", "six races")


@dataclass(frozen=True)
class _Row:
    query: str
    key: tuple[str, ...]
    label: str


def _race_rows(schema: Schema) -> list[_Row]:
    """P1's rows below its total, over the whole population: (query, row, label)."""
    cenrace = schema.attribute("cenrace")
    numraces = cenrace.elements["numraces"].labels  # "One race", "Two races", ...
    combos = cenrace.labels
    size = [c.count(";") + 1 for c in combos]
    rows = [_Row("numraces", (numraces[0],), "Population of one race")]
    rows += [_Row("cenrace", (c,), c) for c, k in zip(combos, size, strict=True) if k == 1]
    rows.append(_Row("race7", ("Two or More Races",), "Population of two or more races"))
    for k in range(2, 7):
        rows.append(_Row("numraces", (numraces[k - 1],), f"Population of {_COUNT_WORDS[k - 1]}"))
        rows += [_Row("cenrace", (c,), c) for c, n in zip(combos, size, strict=True) if n == k]
    return rows


def _within(rows: Iterable[_Row], element: str, label: str) -> list[_Row]:
    """The same rows restricted to one group of another attribute (``adult``, ``hispanic``)."""
    out = []
    for r in rows:
        if r.query == "total":
            out.append(_Row(element, (label,), r.label))
        else:
            out.append(_Row(f"{element} * {r.query}", (label, *r.key), r.label))
    return out


def _table_rows(schema: Schema) -> dict[str, list[_Row]]:
    race = _race_rows(schema)
    total = _Row("total", (), "Total")
    p1 = [total, *race]
    p2 = [
        total,
        _Row("hispanic", (_HISPANIC,), _HISPANIC),
        _Row("hispanic", (_NOT_HISPANIC,), _NOT_HISPANIC),
        *_within(race, "hispanic", _NOT_HISPANIC),
    ]
    hhgq = schema.attribute("hhgq").labels
    p5 = [
        _Row("gqlevels", ("Group quarters",), "Total"),
        _Row("hhinstlevels", ("Institutionalized population",), "Institutionalized population"),
        *(_Row("hhgq", (g,), g) for g in hhgq[1:5]),
        _Row(
            "hhinstlevels", ("Noninstitutionalized population",), "Noninstitutionalized population"
        ),
        *(_Row("hhgq", (g,), g) for g in hhgq[5:8]),
    ]
    # P3 and P4 are P1 and P2 within the adult slice of votingage (the slice comes first:
    # votingage precedes hispanic and cenrace in the schema's axis order)
    p3 = _within(p1, "adult", _ADULT)
    p4 = [
        _Row("adult", (_ADULT,), "Total"),
        *(_Row(f"adult * {r.query}", (_ADULT, *r.key), r.label) for r in p2[1:]),
    ]
    return {"P1": p1, "P2": p2, "P3": p3, "P4": p4, "P5": p5}


@cache
def _tables() -> tuple[Codebook, tuple[str, ...]]:
    schema = Schema.load("pl94")
    columns: dict[str, dict[str, object]] = {}
    labels: list[str] = []
    for table, rows in _table_rows(schema).items():
        for i, r in enumerate(rows, start=1):
            columns[f"{table}_{i:03d}N"] = {"table": table, "query": r.query, "row": list(r.key)}
            labels.append(r.label)
    spec = {
        "schema": "pl94",
        "tables": {
            name: {"nhgis": name, "title": title, "universe": universe}
            for name, (title, universe) in TABLES.items()
        },
        "columns": columns,
    }
    return Codebook.from_dict(spec, "pl94 tables (2020 PL 94-171 P1-P5)"), tuple(labels)


def pl94_codebook() -> Codebook:
    """P1–P5 as a codebook over the ``pl94`` schema (built once): column ``P1_001N`` … →
    (table, product-query row)."""
    return _tables()[0]


def pl94_column_values(value_of: Callable[[object], np.ndarray]) -> np.ndarray:
    """Every P1–P5 column, ``(n_nodes, 298)``, from per-query arrays: ``value_of(q)`` gives
    the ``(n_nodes, q.n_rows)`` values of one product query of :func:`pl94_codebook`'s rows
    (estimates, standard errors, ...), and each column is the row of its query."""
    rows = pl94_codebook().rows
    out = None
    for qi, q in enumerate(rows.queries):
        v = value_of(q)
        if out is None:
            out = np.empty((v.shape[0], len(rows.query_of_row)))
        sel = np.flatnonzero(rows.query_of_row == qi)
        out[:, sel] = v[:, rows.row_of_row[sel]]
    assert out is not None
    return out


def pl94_labels() -> tuple[str, ...]:
    """The Bureau's label of each column (``"Total"``, ``"Population of one race"``,
    ``"White alone"``, ...), in column order."""
    return _tables()[1]


def tabulate(histograms: np.ndarray) -> np.ndarray:
    """Every P1–P5 column of each node: int64 ``(n_nodes, 298)`` from int64
    ``(n_nodes, 8, 2, 2, 63)`` histograms (per-axis sums of the schema's product queries).

    Raises
    ------
    DataError
        When the histograms are not integers of the ``pl94`` shape.
    """
    x = np.asarray(histograms)
    book = pl94_codebook()
    shape = book.schema.shape
    if x.ndim != len(shape) + 1 or x.shape[1:] != shape:
        raise DataError(
            f"pl94 tables: histograms have shape {x.shape}; expected (n_nodes, "
            f"{', '.join(map(str, shape))})"
        )
    if x.dtype.kind not in "iu":
        raise DataError(
            f"pl94 tables: histograms are {x.dtype}; tables are tabulated from integer "
            "histograms (round the release first)"
        )
    return book.rows.apply(x.astype(np.int64, copy=False))


@dataclass(frozen=True)
class LevelTables:
    """The nodes of one level to tabulate.

    Attributes
    ----------
    codes : array of str
        One code per node (GEOID or GISJOIN).
    histograms : numpy.ndarray
        int64 ``(n_nodes, 8, 2, 2, 63)``.
    standard_errors : numpy.ndarray or None
        ``(n_nodes, 298)``: the standard error of every column of every node (computed by
        the estimator, e.g. from the GLS covariance of each query row), or None.
    parents : mapping of str to array of str, optional
        The codes of each node's ancestors, one column each (``state_GEOID`` → codes, ...;
        :func:`~censusdp.pipelines.io.outputs.parent_codes`), written after the node's code.
    """

    codes: np.ndarray | Sequence[str]
    histograms: np.ndarray
    standard_errors: np.ndarray | None = None
    parents: Mapping[str, np.ndarray | Sequence[str]] | None = None


def _checked(level: str, t: LevelTables) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    codes = np.asarray(t.codes, dtype=object)
    values = tabulate(t.histograms)
    if codes.shape != (values.shape[0],):
        raise DataError(
            f"pl94 tables, level {level!r}: {codes.size} codes for {values.shape[0]} histograms"
        )
    se = None
    if t.standard_errors is not None:
        se = np.asarray(t.standard_errors, dtype=np.float64)
        if se.shape != values.shape:
            raise DataError(
                f"pl94 tables, level {level!r}: standard errors have shape {se.shape}; "
                f"expected {values.shape} (one per node and column)"
            )
        bad = ~np.isfinite(se) | (se < 0)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise DataError(
                f"pl94 tables, level {level!r}, node {codes[i]!r}, column "
                f"{pl94_codebook().columns[j]}: standard errors must be finite and non-negative"
            )
    for name, col in (t.parents or {}).items():
        if np.shape(col) != codes.shape:
            raise DataError(
                f"pl94 tables, level {level!r}: {np.size(col)} {name} codes for {codes.size} nodes"
            )
    return codes, values, se


def level_tables(
    hierarchy: Hierarchy,
    block: np.ndarray,
    cell: np.ndarray,
    count: np.ndarray,
    levels: Sequence[str] | None = None,
) -> dict[str, LevelTables]:
    """Every level's histograms from sparse leaf (block, cell, count) triples (such as
    :class:`~censusdp.pipelines.io.ppmf.PPMFHistogram` or a non-negative integer release), summed
    up the hierarchy exactly, so the tables of every level are consistent with each other.

    Parameters
    ----------
    hierarchy : Hierarchy
    block, cell, count : numpy.ndarray
        int64: leaf index, flat ``pl94`` cell and count of each entry.
    levels : sequence of str, optional
        Levels to tabulate (default: all); each is dense, 2,016 int64 per node.

    Returns
    -------
    dict of level → LevelTables
        Without standard errors (the sums of a release's leaves carry the estimator's SEs,
        which the estimator provides).
    """
    book = pl94_codebook()
    n_cells = book.schema.n_cells
    block = np.asarray(block, dtype=np.int64)
    cell = np.asarray(cell, dtype=np.int64)
    count = np.asarray(count, dtype=np.int64)
    if not (block.shape == cell.shape == count.shape) or block.ndim != 1:
        raise DataError("pl94 tables: block, cell and count must be 1-D arrays of one length")
    n_leaves = hierarchy.leaves.size
    if block.size and (block.min() < 0 or block.max() >= n_leaves):
        raise DataError(f"pl94 tables: a block index is outside [0, {n_leaves})")
    if cell.size and (cell.min() < 0 or cell.max() >= n_cells):
        raise DataError(f"pl94 tables: a cell index is outside [0, {n_cells})")
    out: dict[str, LevelTables] = {}
    for level in levels if levels is not None else hierarchy.names:
        node = hierarchy.ancestor_index(hierarchy.leaves.name, level)[block]
        size = hierarchy[level].size
        hist = np.zeros(size * n_cells, dtype=np.int64)
        np.add.at(hist, node * n_cells + cell, count)  # exact int64 sums
        out[level] = LevelTables(
            hierarchy[level].codes.astype(object), hist.reshape((size, *book.schema.shape))
        )
    return out


def pl94_frames(
    levels: Mapping[str, LevelTables], *, code_column: str = "GEOID"
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """The wide tables and the long table of every level.

    Wide (one frame per level): the code, the ancestors' codes (:attr:`LevelTables.parents`),
    then ``P1_001N`` (int64) and, with standard errors, ``P1_001N_se`` (six significant
    digits, :func:`~censusdp.pipelines.io.outputs.significant`) and ``P1_001N_moe`` (the
    integer 90% margin of error of an integer release,
    :func:`~censusdp.pipelines.io.outputs.lattice_moe`), ... Long: level, code, the
    ancestors' codes, table, column, label, value, se, moe (se and moe empty without
    standard errors).
    """
    book = pl94_codebook()
    names = list(book.columns)
    words = {"table": book.table_of, "column": names, "label": pl94_labels()}
    wide: dict[str, pd.DataFrame] = {}
    longs = []
    for level, t in levels.items():
        codes, values, se = _checked(level, t)
        parents = {p: np.asarray(c, dtype=object) for p, c in (t.parents or {}).items()}
        errors = None if se is None else written_errors(se, integer=True)
        wide[level] = wide_table({code_column: codes, **parents}, names, values, errors)
        ids = {code_column: codes, **parents}
        longs.append(long_table(level, ids, values, errors, labels=words))
        if errors is None:  # the columns are there, empty
            longs[-1]["se"] = longs[-1]["moe"] = np.nan
    long = pd.concat(longs, ignore_index=True) if longs else pd.DataFrame()
    return wide, long


def pl94_dictionary(
    *,
    code_column: str = "GEOID",
    parents: Sequence[str] = (),
    with_se: bool = True,
    integer: bool = True,
    long: bool = True,
) -> list[DictionaryEntry]:
    """What every column of :func:`pl94_frames`' wide and long tables is (the rows of
    ``data_dictionary.csv``): the geography codes, each P1–P5 column with its table and the
    Bureau's label (persons; integer, or float for a real-valued release with ``integer``
    False), its ``_se`` and ``_moe`` (with ``with_se``), and with ``long`` the long table's
    columns."""
    book = pl94_codebook()
    names = list(book.columns)
    out = code_entries(code_column, parents)
    out += estimate_entries(
        names, list(book.table_of), list(pl94_labels()), unit="persons", integer=integer,
        with_se=with_se,
    )  # fmt: skip
    if not long:
        return out
    errors = (
        "its standard error (blank without)",
        "its integer 90% margin of error, as the _moe columns (blank without a standard error)",
    )
    return out + long_entries("pl94_long.csv", "persons", "P1 ... P5", "P1_001N", errors)


def write_pl94_tables(
    out: PathLike,
    levels: Mapping[str, LevelTables],
    *,
    overwrite: bool = False,
    inputs: Iterable[PathLike | None] = (),
    code_column: str = "GEOID",
) -> Path:
    """Write ``pl94_<level>.csv`` (wide) for every level, ``pl94_long.csv`` and
    ``data_dictionary.csv`` (:func:`pl94_dictionary`) into the directory ``out``, all or
    nothing (:func:`censusdp.atomic.output_dir`).

    Returns
    -------
    Path
        The output directory.

    Raises
    ------
    DataError
        Histograms of the wrong shape or type, codes or standard errors that do not match.
    SpecError
        An output the policy refuses (someone else's directory, an input's, ...).
    """
    wide, long = pl94_frames(levels, code_column=code_column)  # checked before any write
    with output_dir(out, overwrite=overwrite, inputs=inputs, command="pl94-tables") as tmp:
        for level, frame in wide.items():
            write_csv(frame, tmp / f"pl94_{level}.csv", index=False)
        write_csv(long, tmp / "pl94_long.csv", index=False)
        parents = dict.fromkeys(p for t in levels.values() for p in (t.parents or {}))
        with_se = any(t.standard_errors is not None for t in levels.values())
        write_data_dictionary(
            tmp, pl94_dictionary(code_column=code_column, parents=list(parents), with_se=with_se)
        )
    return Path(out)
