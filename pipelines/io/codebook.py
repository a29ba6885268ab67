"""Codebooks: published table columns as rows of product queries over a schema.

A codebook maps every column of a tabular product (an NHGIS column code such as ``H7V001``)
to its table and to one row of a product query over a :class:`~censusdp.schema.Schema`;
subtotal rows are rows of coarser queries. The shipped ``ppdd`` codebook
(``censusdp/pipelines/codebooks/ppdd.toml``) covers the 376 columns of the ten tables of
the NHGIS Privacy-Protected 2010 Census Demonstration Data. From a codebook follow the
structure of each table (its total, subtotal and detail rows, found from the row vectors)
and every linear identity among the columns — the integer vectors ``w`` with
``wᵀ M = 0`` for the columns' matrix ``M`` — without forming ``M``: its Gram ``M Mᵀ`` comes
from per-axis inner products (:meth:`QueryRows.gram`).

References
----------
Van Riper, D., Kugler, T. and Schroeder, J. (2020). IPUMS NHGIS Privacy-Protected 2010 Census
    Demonstration Data, version 20200527. Minneapolis, MN: IPUMS.
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (tables as marginals of one histogram).
Lenstra, A. K., Lenstra, H. W. and Lovász, L. (1982). Factoring polynomials with rational
    coefficients (LLL reduction of the identity basis).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import flint
import numpy as np

from censusdp.errors import SpecError
from censusdp.mechanisms.product_query import QueryRows
from censusdp.schema import Schema

__all__ = ["Codebook", "TableInfo", "TableStructure", "available_codebooks"]


@dataclass(frozen=True)
class TableInfo:
    """A table of a codebook: its name (``"P8"``), source code prefix, title and universe."""

    name: str
    nhgis: str
    title: str
    universe: str


@dataclass(frozen=True)
class TableStructure:
    """Column indices of one table: its total, its detail rows and its subtotal rows."""

    total: int
    details: tuple[int, ...]
    subtotals: tuple[int, ...]


def available_codebooks() -> list[str]:
    """Names of the codebooks shipped in ``censusdp/pipelines/codebooks/``."""
    d = resources.files("censusdp.pipelines") / "codebooks"
    return sorted(p.name[: -len(".toml")] for p in d.iterdir() if p.name.endswith(".toml"))


@dataclass(frozen=True, eq=False)
class Codebook:
    """Columns → (table, product-query row) over one schema.

    Attributes
    ----------
    schema : Schema
    tables : dict of str → TableInfo
    columns : tuple of str
        Column codes in file order.
    table_of : tuple of str
        The table of each column.
    rows : QueryRows
        One row per column (``rows.names == columns``).
    source : str
    strategy : tuple of (query text, share)
        The codebook's default measurement strategy (``[strategy]``: product queries the
        columns determine, with their shares of ρ) for ``censusdp privatize --codebook``.
    """

    schema: Schema
    tables: dict[str, TableInfo]
    columns: tuple[str, ...]
    table_of: tuple[str, ...]
    rows: QueryRows
    source: str
    strategy: tuple[tuple[str, float], ...] = ()

    @classmethod
    def load(cls, name_or_path: str | Path) -> Codebook:
        """A shipped codebook by name (``"ppdd"``) or a codebook TOML by path.

        Raises
        ------
        SpecError
            Naming the file and the column or table at fault.
        """
        p = Path(name_or_path)
        shipped = resources.files("censusdp.pipelines") / "codebooks" / f"{name_or_path}.toml"
        if p.suffix != ".toml" and shipped.is_file():
            text, source = shipped.read_text(encoding="utf-8"), f"codebooks/{p.name}.toml"
        elif p.is_file():
            text, source = p.read_text(encoding="utf-8"), str(p)
        else:
            raise SpecError(
                f"codebook {str(name_or_path)!r}: not shipped ({available_codebooks()}) and no "
                "such file; pass a shipped name or the path of a codebook TOML"
            )
        try:
            spec = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise SpecError(f"{source}: not valid TOML ({err})") from None
        return cls.from_dict(spec, source)

    @classmethod
    def from_dict(cls, spec: dict, source: str = "<dict>") -> Codebook:
        """Build and check a codebook from its TOML form (see ``codebooks/ppdd.toml``)."""
        unknown = set(spec) - {"schema", "tables", "columns", "strategy"}
        if unknown:
            raise SpecError(f"{source}: unknown keys {sorted(unknown)}")
        schema_ref = spec.get("schema")
        if not isinstance(schema_ref, str):
            raise SpecError(f"{source}: 'schema' must name a schema (shipped name or path)")
        schema = Schema.load(schema_ref)
        tables = {}
        for name, t in dict(spec.get("tables", {})).items():
            if not isinstance(t, dict) or {"nhgis", "title", "universe"} - set(t):
                raise SpecError(f"{source}: table {name!r} needs nhgis, title and universe")
            tables[name] = TableInfo(name, str(t["nhgis"]), str(t["title"]), str(t["universe"]))
        cols = spec.get("columns")
        if not isinstance(cols, dict) or not cols:
            raise SpecError(f"{source}: [columns] must map column codes to table, query and row")
        keys, table_of = [], []
        for code, c in cols.items():
            where = f"{source}: column {code!r}"
            if not isinstance(c, dict) or set(c) != {"table", "query", "row"}:
                raise SpecError(f"{where}: give exactly table, query and row")
            if c["table"] not in tables:
                raise SpecError(f"{where}: table {c['table']!r} is not in [tables] {list(tables)}")
            if not isinstance(c["row"], list):
                raise SpecError(f"{where}: 'row' must be a list of labels")
            keys.append((code, str(c["query"]), c["row"]))
            table_of.append(c["table"])
        try:
            rows = QueryRows.from_keys(schema, keys)
        except SpecError as err:
            raise SpecError(f"{source}: {err}") from None
        strategy = _strategy(spec.get("strategy"), source)
        return cls(schema, tables, tuple(cols), tuple(table_of), rows, source, strategy)

    # -- structure --------------------------------------------------------------------------
    def columns_of(self, table: str) -> np.ndarray:
        """Indices (into :attr:`columns`) of the columns of ``table``."""
        if table not in self.tables:
            raise SpecError(f"{self.source}: no table {table!r}; tables are {list(self.tables)}")
        return np.flatnonzero(np.asarray(self.table_of) == table)

    def structure(self, table: str, gram: np.ndarray | None = None) -> TableStructure:
        """The total, detail and subtotal columns of ``table``, from its row vectors.

        Row ``j`` lies inside row ``i`` when ``⟨m_i, m_j⟩ = ⟨m_j, m_j⟩`` (0/1 rows; of two
        equal rows the later counts as inside the earlier). The total contains every row;
        details contain no other row; the rest are subtotals.

        Raises
        ------
        SpecError
            When no column contains all the others.
        """
        g = self.rows.gram() if gram is None else gram
        idx = self.columns_of(table)
        sub = g[np.ix_(idx, idx)]
        diag = np.diag(sub)
        inside = (sub == diag[None, :]) & (diag[None, :] > 0)  # inside[i, j]: j ⊆ i
        # of two equal rows (P8: "six races" and its one combination) the later is the detail
        later = np.arange(idx.size)[None, :] > np.arange(idx.size)[:, None]
        inside &= (diag[None, :] < diag[:, None]) | later
        totals = np.flatnonzero(inside.sum(axis=1) == idx.size - 1)
        if totals.size != 1:
            raise SpecError(f"{self.source}: table {table!r} has no single total row")
        details = np.flatnonzero(~inside.any(axis=1))
        other = np.setdiff1d(np.arange(idx.size), np.concatenate([totals, details]))
        return TableStructure(int(idx[totals[0]]), tuple(idx[details]), tuple(idx[other]))

    def identities(self) -> np.ndarray:
        """An integer basis of every linear identity among the columns.

        The rows ``w`` (int64, ``(n_identities, n_columns)``) span ``{w : wᵀ M = 0}``, the
        left null space of the columns' matrix, found exactly as the integer kernel of the
        Gram ``M Mᵀ`` (same kernel) with python-flint and LLL-reduced, so each identity is
        short (such as ``H7X001 − H7V001``). Every exact tabulation of one histogram
        satisfies ``W @ columns == 0``.
        """
        g = self.rows.gram()
        ker, nullity = flint.fmpz_mat([[int(v) for v in row] for row in g.tolist()]).nullspace()
        basis = ker.transpose()  # rows: kernel vectors (the first `nullity` are non-zero)
        vecs = flint.fmpz_mat([[basis[i, j] for j in range(basis.ncols())] for i in range(nullity)])
        w = np.array([[int(v) for v in row] for row in vecs.lll().tolist()], dtype=np.int64)
        if np.any(w @ g):
            raise ArithmeticError("identity basis check failed: W M Mᵀ ≠ 0")
        return w


def _strategy(spec: object, source: str) -> tuple[tuple[str, float], ...]:
    """``[strategy] queries = [...], shares = [...]`` as (query, share) pairs."""
    if spec is None:
        return ()
    if not isinstance(spec, dict) or set(spec) != {"queries", "shares"}:
        raise SpecError(f"{source}: [strategy] must give exactly queries and shares")
    q, s = spec["queries"], spec["shares"]
    if (
        not isinstance(q, list)
        or not isinstance(s, list)
        or len(q) != len(s)
        or not all(isinstance(x, str) for x in q)
        or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in s)
    ):
        raise SpecError(f"{source}: [strategy] needs a list of query texts and one share each")
    return tuple(zip(q, (float(x) for x in s), strict=True))
