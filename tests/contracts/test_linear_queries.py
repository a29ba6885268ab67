"""Contract test of the one query protocol (:class:`~censusdp.mechanisms.queries.LinearQuery`).

Every query kind — the matrix :class:`~censusdp.mechanisms.queries.Query`, the per-axis
:class:`~censusdp.mechanisms.product_query.ProductQuery` and rows drawn from several product
queries (:class:`~censusdp.mechanisms.product_query.QueryRows`) — on random schemas
(hypothesis), checked against its dense matrix, computed the slow obvious way:

- ``n_rows`` is the matrix's row count;
- ``apply`` of integer counts (one tensor and a batch) equals ``matrix @ x`` exactly (``==``);
- ``gram()`` equals ``A Aᵀ`` exactly;
- ``sensitivity(1)`` and ``sensitivity(2)`` equal the largest column ℓ₁ and ℓ₂ norms, looped
  over columns in Python; any other norm is refused.

The power check: the reference rejects a matrix with one entry changed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_strategies import query_texts, schemas

from censusdp.errors import SpecError
from censusdp.mechanisms.product_query import ProductQuery, QueryRows
from censusdp.mechanisms.queries import LinearQuery, Query

KINDS = ("matrix", "product", "rows")


def _slow_sensitivity(matrix: np.ndarray, norm: int) -> float:
    best = 0.0
    for j in range(matrix.shape[1]):
        col = [abs(float(matrix[i, j])) for i in range(matrix.shape[0])]
        best = max(best, sum(col) if norm == 1 else math.sqrt(sum(c * c for c in col)))
    return best


def _slow_matrix(query: ProductQuery, n_cells: int) -> np.ndarray:
    """Column ``c`` = the query's answers on the unit histogram of cell ``c``."""
    cols = []
    for c in range(n_cells):
        e = np.zeros(n_cells, np.int64)
        e[c] = 1
        cols.append(query.apply(e.reshape(query.schema.shape)).reshape(-1))
    return np.stack(cols, axis=1)


@st.composite
def cases(draw):
    schema = draw(schemas(max_attributes=3, max_domain=4))
    texts = draw(st.lists(query_texts(schema), min_size=1, max_size=3, unique=True))
    queries = [ProductQuery.parse(schema, t) for t in texts]
    mats = [_slow_matrix(q, schema.n_cells) for q in queries]
    picks = draw(
        st.lists(
            st.tuples(st.integers(0, len(queries) - 1), st.integers(0, 10**6)),
            min_size=1,
            max_size=6,
        )
    )
    qi = np.array([i for i, _ in picks], np.int64)
    ri = np.array([r % queries[i].n_rows for i, r in picks], np.int64)
    rows = QueryRows(schema, tuple(queries), qi, ri, tuple(f"r{j}" for j in range(len(picks))))
    rows_matrix = np.stack([mats[i][r] for i, r in zip(qi, ri, strict=True)])
    x = draw(st.lists(st.integers(0, 9), min_size=2 * schema.n_cells, max_size=2 * schema.n_cells))
    x = np.asarray(x, np.int64).reshape(2, *schema.shape)
    return {
        "matrix": (queries[0].to_query(), mats[0], x.reshape(2, -1)),
        "product": (queries[0], mats[0], x),
        "rows": (rows, rows_matrix, x),
    }


def _check(query, matrix: np.ndarray, x: np.ndarray) -> None:
    assert isinstance(query, LinearQuery)
    assert query.n_rows == matrix.shape[0]
    assert np.array_equal(query.dense(), matrix)
    flat = x.reshape(x.shape[0], -1)
    assert np.array_equal(query.apply(x), flat @ matrix.T)
    assert np.array_equal(query.apply(x[0]), matrix @ flat[0])
    assert np.array_equal(query.gram(), matrix @ matrix.T)
    for norm in (1, 2):
        assert query.sensitivity(norm) == pytest.approx(_slow_sensitivity(matrix, norm), rel=1e-12)
    with pytest.raises(SpecError, match="norm must be 1 or 2"):
        query.sensitivity(3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_query_kind_keeps_the_protocol(case):
    for kind in KINDS:
        _check(*case[kind])


def test_the_reference_rejects_a_changed_matrix():
    """Power: the checks fail for a query whose matrix is not the reference's."""
    m = np.array([[1, 1, 0], [0, 0, 1]], np.int64)
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    _check(Query("q", m, ("a", "b")), m, x)
    wrong = m.copy()
    wrong[1, 0] = 1
    with pytest.raises(AssertionError):
        _check(Query("q", m, ("a", "b")), wrong, x)
