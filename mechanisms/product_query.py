"""Product (marginal) queries on a schema histogram, applied per axis, never formed densely.

A :class:`ProductQuery` picks one element per attribute of a :class:`~censusdp.schema.Schema`
(``"votingage * hispanic * cenrace"``, ``"hhinstlevels"``, ``"total"``, ``"detailed"``); its
matrix is the Kronecker product ``⊗_a R_a`` of the elements' 0/1 matrices (``I`` for a
detailed attribute, ``1ᵀ`` for one summed out). It acts on a batch of node tensors
``(n_nodes, d_1, …, d_k)`` one axis at a time (a sum, or a small ``r_a × d_a`` product),
so the 2,016-cell ``pl94`` or the 46,368-cell ``ppdd`` histogram never meets a
cells × cells matrix. :class:`QueryRows` is a list of rows taken from several product
queries — a published table with its subtotal rows, whose rows overlap.

Sensitivities are computed from the matrices, never assumed: a person is one detailed cell
``c``, so adding or removing them changes the answers by column ``c`` of the matrix; the L1
sensitivity is the largest column L1 norm and the L2 sensitivity the square root of the
largest column sum of squares. For one product query both equal 1 when every element
partitions its attribute (Kifer et al. 2022; Abowd et al. 2022, Section 7); a row set that
counts a person twice (P8's subtotal rows) has more, and :meth:`QueryRows.column_counts` says
how much in which cell.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (the marginal queries of the 2020 run).
Kifer, D. et al. (2022). Bayesian and Frequentist Semantics for Common Variations of
    Differential Privacy: Applications to the 2020 Census.
McKenna, R. et al. (2018). Optimizing error of high-dimensional statistical queries under
    differential privacy (HDMM): Kronecker-product workloads evaluated per axis.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np
import scipy.sparse as sp

from censusdp.errors import DataError, SpecError
from censusdp.mechanisms.queries import Query
from censusdp.schema import Recode, Schema

__all__ = ["ProductQuery", "QueryRows", "apply_queries", "axis_product", "max_weighted_column"]


def _check_batch(schema: Schema, x: np.ndarray, what: str) -> tuple[np.ndarray, bool]:
    x = np.asarray(x)
    k = len(schema.shape)
    if x.shape == schema.shape:
        return x[None], True
    if x.ndim != k + 1 or x.shape[1:] != schema.shape:
        raise DataError(
            f"schema {schema.name!r}: {what} has shape {x.shape}; expected {schema.shape} or "
            f"(n_nodes, {', '.join(map(str, schema.shape))})"
        )
    return x, False


def axis_product(x: np.ndarray, axis: int, m: np.ndarray) -> np.ndarray:
    """``x`` with axis ``axis`` (length ``d``) replaced by ``m @`` it (``m``: ``r × d``).

    One mode product of the Kronecker algebra: ``(I ⊗ m ⊗ I) vec(x)`` as a batched matrix
    product over a ``(before, d, after)`` view, with no transposed copies.
    """
    sh = x.shape
    pre = int(np.prod(sh[:axis], dtype=np.int64))
    post = int(np.prod(sh[axis + 1 :], dtype=np.int64))
    if post == 1:
        y = x.reshape(pre, sh[axis]) @ m.T
    else:
        y = np.matmul(m, x.reshape(pre, sh[axis], post))
    return y.reshape((*sh[:axis], m.shape[0], *sh[axis + 1 :]))


def apply_queries(queries: Sequence[ProductQuery], x: np.ndarray) -> dict[str, np.ndarray]:
    """Exact answers of every query on a batch of integer count tensors,
    ``{name: (n, n_rows)}``.

    The same integers as ``q.apply(x)`` for each query, but each marginal is summed from the
    smallest one already computed (the lattice of marginals: ``votingage * cenrace`` from
    ``votingage * hispanic * cenrace``, not from the 2,016 cells), then its recodes applied:
    about one pass over the histogram instead of one per query. For integers only: floats
    summed in another order differ in their last bits.
    """
    return dict(zip((q.name for q in queries), _lattice_answers(queries, x), strict=True))


def _lattice_answers(queries: Sequence[ProductQuery], x: np.ndarray) -> list[np.ndarray]:
    if x.dtype.kind not in "iu":
        raise DataError(f"lattice answers: the counts are {x.dtype}; they must be integers")
    summed: dict[frozenset, np.ndarray] = {frozenset(): x}
    out: list = [None] * len(queries)
    order = sorted(range(len(queries)), key=lambda i: sum(f.is_all for f in queries[i].factors))
    for i in order:
        q = queries[i]
        drop = frozenset(ax for ax, f in enumerate(q.factors) if f.is_all)
        src = min((S for S in summed if S <= drop), key=lambda S: summed[S].size)
        y = summed[src]
        for ax in sorted(drop - src):
            y = y.sum(axis=ax + 1, keepdims=True)
        summed[drop] = y
        for ax, f in enumerate(q.factors):
            if not (f.is_detailed or f.is_all):
                y = axis_product(y, ax + 1, f.matrix.astype(y.dtype, copy=False))
        out[i] = y.reshape(y.shape[0], -1)
    return out


class _ZeroOneRows:
    """The sensitivity of 0/1 rows from their :attr:`l1_sensitivity` (the most rows counting
    one cell): a column's sum of squares is its sum, so ℓ₂ = √ℓ₁ (the
    :class:`~censusdp.mechanisms.queries.LinearQuery` protocol's ``sensitivity``)."""

    @property
    def l2_sensitivity(self) -> float:
        """Square root of the largest column sum of squares."""
        return float(np.sqrt(self.l1_sensitivity))

    def sensitivity(self, norm: int) -> float:
        """:attr:`l1_sensitivity` (``norm=1``) or :attr:`l2_sensitivity` (``norm=2``)."""
        if norm not in (1, 2):
            raise SpecError(f"sensitivity norm must be 1 or 2, got {norm!r}")
        return float(self.l1_sensitivity) if norm == 1 else self.l2_sensitivity


@dataclass(frozen=True, eq=False)
class ProductQuery(_ZeroOneRows):
    """The query ``⊗_a R_a``: one element (detailed, recode, slice or all) per attribute.

    Attributes
    ----------
    schema : Schema
    factors : tuple of Recode
        One element per attribute, in axis order.
    name : str
        The query as written (``"votingage * hispanic * cenrace"``).
    """

    schema: Schema
    factors: tuple[Recode, ...]
    name: str

    @classmethod
    def parse(cls, schema: Schema, text: str) -> ProductQuery:
        """The product query ``text`` over ``schema`` (see :meth:`Schema.resolve`)."""
        factors = schema.resolve(text)
        return cls(schema, factors, _canonical_name(factors))

    # -- shape and labels -----------------------------------------------------------------
    @property
    def row_shape(self) -> tuple[int, ...]:
        """Rows per axis (1 for an attribute summed out)."""
        return tuple(f.n_rows for f in self.factors)

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64))

    @property
    def kept_axes(self) -> tuple[int, ...]:
        """Axes not summed out (their labels make up the row labels)."""
        return tuple(i for i, f in enumerate(self.factors) if not f.is_all)

    @property
    def row_keys(self) -> list[tuple[str, ...]]:
        """Per row, the labels of the kept axes (C order, as in ``np.kron``)."""
        kept = [self.factors[i].labels for i in self.kept_axes]
        return [tuple(p) for p in itertools.product(*kept)]

    @property
    def labels(self) -> tuple[str, ...]:
        """Row labels: the kept axes' labels joined by `` × ``; ``"total"`` for the total."""
        if not self.kept_axes:
            return ("total",)
        return tuple(" × ".join(k) for k in self.row_keys)

    def row_index(self, key: Sequence[str]) -> int:
        """The flat row of ``key`` (one label per kept axis, in axis order).

        Raises
        ------
        SpecError
            When ``key`` has the wrong length or a label that is not a row.
        """
        key = tuple(key)
        kept = self.kept_axes
        if len(key) != len(kept):
            names = [self.factors[i].name for i in kept]
            raise SpecError(
                f"query {self.name!r}: row {list(key)} needs one label for each of {names}"
            )
        idx = [0] * len(self.factors)
        for ax, lab in zip(kept, key, strict=True):
            idx[ax] = self.factors[ax].row(lab)
        return int(np.ravel_multi_index(idx, self.row_shape))

    # -- the linear map -------------------------------------------------------------------
    def apply(self, x: np.ndarray) -> np.ndarray:
        """Answers ``(⊗_a R_a) vec(x)`` for a node tensor or a batch of them.

        Parameters
        ----------
        x : array, shape ``schema.shape`` or ``(n_nodes, *schema.shape)``

        Returns
        -------
        numpy.ndarray
            ``(n_rows,)`` or ``(n_nodes, n_rows)``; integer input stays integer.
        """
        xb, single = _check_batch(self.schema, x, f"query {self.name!r} input")
        y = xb
        for ax, f in enumerate(self.factors):
            if f.is_detailed:
                continue
            if f.is_all:
                y = y.sum(axis=ax + 1, keepdims=True)
            else:
                y = axis_product(y, ax + 1, f.matrix.astype(y.dtype, copy=False))
        out = y.reshape(y.shape[0], -1)
        return out[0] if single else out

    def adjoint(self, z: np.ndarray) -> np.ndarray:
        """``(⊗_a R_a)ᵀ z`` for answers of shape ``(n_rows,)`` or ``(n_nodes, n_rows)``.

        Returns tensors of shape ``schema.shape`` or ``(n_nodes, *schema.shape)``.
        """
        z = np.asarray(z)
        single = z.ndim == 1
        zb = z[None] if single else z
        if zb.ndim != 2 or zb.shape[1] != self.n_rows:
            raise DataError(
                f"query {self.name!r}: answers have shape {z.shape}; expected ({self.n_rows},) "
                f"or (n_nodes, {self.n_rows})"
            )
        y = zb.reshape((zb.shape[0], *self.row_shape))
        for ax, f in enumerate(self.factors):
            if not f.is_detailed:
                y = axis_product(y, ax + 1, f.matrix.T.astype(y.dtype, copy=False))
        return y[0] if single else y

    def dense(self) -> np.ndarray:
        """The (n_rows × n_cells) int64 matrix ``⊗_a R_a`` — for tests and small schemas."""
        return reduce(np.kron, [f.matrix for f in self.factors], np.ones((1, 1), np.int64))

    def sparse(self) -> sp.csr_matrix:
        """The (n_rows × n_cells) int64 matrix ``⊗_a R_a`` as CSR: :meth:`dense` without its
        zeros, for any schema (answers of sparse histograms by one sparse product)."""
        m = sp.csr_matrix(np.ones((1, 1), np.int64))
        for f in self.factors:
            m = sp.kron(m, sp.csr_matrix(f.matrix.astype(np.int64)), format="csr")
        return m

    def to_query(self) -> Query:
        """This query as a dense :class:`~censusdp.mechanisms.queries.Query` (small schemas).

        The existing flat-cell estimators accept it with ``schema.cells`` as their cells.
        """
        return Query(self.name, self.dense(), self.labels)

    # -- sensitivity ----------------------------------------------------------------------
    def column_counts(self) -> np.ndarray:
        """Per detailed cell, the number of rows that count it (tensor ``schema.shape``).

        The matrix is 0/1, so this is each column's L1 norm and its sum of squares.
        """
        sums = [f.matrix.sum(axis=0) for f in self.factors]
        return reduce(np.multiply.outer, sums)

    @property
    def l1_sensitivity(self) -> int:
        """Largest column L1 norm: ``∏_a`` (largest column sum of ``R_a``)."""
        return int(np.prod([f.matrix.sum(axis=0).max() for f in self.factors]))

    def gram(self) -> np.ndarray:
        """``A Aᵀ`` as the Kronecker product of the factors' ``R_a R_aᵀ`` (rows in
        :meth:`apply`'s order), without forming ``A``."""
        return reduce(np.kron, [f.matrix @ f.matrix.T for f in self.factors])


def _canonical_name(factors: Sequence[Recode]) -> str:
    kept = [f.name for f in factors if not f.is_all]
    if not kept:
        return "total"
    if all(f.is_detailed for f in factors):
        return "detailed"
    return " * ".join(kept)


@dataclass(frozen=True, eq=False)
class QueryRows(_ZeroOneRows):
    """Rows drawn from product queries of one schema: a table with subtotals, a workload.

    Attributes
    ----------
    schema : Schema
    queries : tuple of ProductQuery
        The distinct queries the rows come from.
    query_of_row : numpy.ndarray
        int64 (n,): index into ``queries`` of each row.
    row_of_row : numpy.ndarray
        int64 (n,): the row within its query.
    names : tuple of str
        A name per row (e.g. an NHGIS column code).
    """

    schema: Schema
    queries: tuple[ProductQuery, ...]
    query_of_row: np.ndarray
    row_of_row: np.ndarray
    names: tuple[str, ...]

    @classmethod
    def from_keys(cls, schema: Schema, rows: Sequence[tuple[str, str, Sequence[str]]]) -> QueryRows:
        """Rows given as ``(name, query text, row key)``; queries are parsed once each."""
        by_text: dict[str, int] = {}
        queries: list[ProductQuery] = []
        qi = np.empty(len(rows), dtype=np.int64)
        ri = np.empty(len(rows), dtype=np.int64)
        for i, (name, text, key) in enumerate(rows):
            try:
                if text not in by_text:
                    queries.append(ProductQuery.parse(schema, text))
                    by_text[text] = len(queries) - 1
                qi[i] = by_text[text]
                ri[i] = queries[qi[i]].row_index(key)
            except SpecError as err:
                raise SpecError(f"row {name!r}: {err}") from None
        return cls(schema, tuple(queries), qi, ri, tuple(r[0] for r in rows))

    def __len__(self) -> int:
        return int(self.query_of_row.size)

    @property
    def name(self) -> str:
        """The queries the rows come from, e.g. ``rows of total, sex * ageband``."""
        return "rows of " + ", ".join(q.name for q in self.queries)

    @property
    def n_rows(self) -> int:
        return len(self)

    def subset(self, mask: np.ndarray) -> QueryRows:
        """The rows where ``mask`` is true (or the given row indices), in that order."""
        idx = np.arange(len(self))[mask]
        return QueryRows(
            self.schema,
            self.queries,
            self.query_of_row[idx],
            self.row_of_row[idx],
            tuple(self.names[i] for i in idx),
        )

    def apply(self, x: np.ndarray) -> np.ndarray:
        """Answers of every row: ``(n,)`` for one tensor, ``(n_nodes, n)`` for a batch."""
        xb, single = _check_batch(self.schema, x, "row-set input")
        out = np.empty((xb.shape[0], len(self)), dtype=np.result_type(xb.dtype, np.int64))
        exact = xb.dtype.kind in "iu"  # integers: every marginal once, from the smallest
        answers = _lattice_answers(self.queries, xb) if exact else None
        for q, query in enumerate(self.queries):
            sel = np.flatnonzero(self.query_of_row == q)
            y = answers[q] if exact else query.apply(xb)
            out[:, sel] = y[:, self.row_of_row[sel]]
        return out[0] if single else out

    def weighted_adjoint(self, w: np.ndarray) -> np.ndarray:
        """``Mᵀ w`` for row weights ``w`` of shape ``(n,)`` or ``(n_nodes, n)``."""
        w = np.asarray(w)
        single = w.ndim == 1
        wb = w[None] if single else w
        out = np.zeros((wb.shape[0], *self.schema.shape), dtype=np.result_type(wb.dtype, np.int64))
        for q, query in enumerate(self.queries):
            sel = np.flatnonzero(self.query_of_row == q)
            z = np.zeros((wb.shape[0], query.n_rows), dtype=out.dtype)
            np.add.at(z, (slice(None), self.row_of_row[sel]), wb[:, sel])
            out += query.adjoint(z)
        return out[0] if single else out

    def dense(self) -> np.ndarray:
        """The (n × n_cells) int64 matrix — for tests and small schemas."""
        return self.weighted_adjoint(np.eye(len(self), dtype=np.int64)).reshape(
            len(self), self.schema.n_cells
        )

    def column_counts(self) -> np.ndarray:
        """Per detailed cell, how many rows count it (tensor ``schema.shape``)."""
        return self.weighted_adjoint(np.ones(len(self), dtype=np.int64))

    @property
    def l1_sensitivity(self) -> int:
        """Largest column L1 norm (rows are 0/1: the most rows counting one person)."""
        return int(self.column_counts().max())

    def gram(self) -> np.ndarray:
        """``M Mᵀ`` (n × n, int64) from per-axis inner products, without forming ``M``.

        Row ``i`` is ``⊗_a m_{i,a}``, so ``⟨row_i, row_j⟩ = ∏_a ⟨m_{i,a}, m_{j,a}⟩``.
        """
        g = np.ones((len(self), len(self)), dtype=np.int64)
        for ax in range(len(self.schema.shape)):
            per_q = []
            for q, r in zip(self.query_of_row, self.row_of_row, strict=True):
                query = self.queries[q]
                idx = np.unravel_index(r, query.row_shape)
                per_q.append(query.factors[ax].matrix[idx[ax]])
            m = np.vstack(per_q)
            g *= m @ m.T
        return g


def max_weighted_column(
    queries: Sequence[ProductQuery | QueryRows], weights: Sequence[float]
) -> float:
    """``max_c Σ_q w_q · (rows of query q counting cell c)``.

    With ``w_q = 1/(2σ_q²)`` this is the ρ of Gaussian measurements of every query
    (zCDP composes over a person's column, Bun and Steinke 2016); with ``w_q = 1/b_q`` the
    ε of Laplace measurements (column L1 norms). Computing the per-cell sum before the max
    is exact and never looser than adding per-query sensitivities.

    Raises
    ------
    SpecError
        When the queries are over different schemas or the lengths differ.
    """
    if len(queries) != len(weights) or not queries:
        raise SpecError("max_weighted_column: give one weight per query (and at least one query)")
    schema = queries[0].schema
    if any(q.schema is not schema for q in queries):
        raise SpecError("max_weighted_column: every query must be over the same schema")
    total = sum(float(w) * q.column_counts() for q, w in zip(queries, weights, strict=True))
    return float(np.max(total))
