"""The release covariances against slow, obviously correct references.

- :class:`NodeCovariance` (full): every query row's variance equals ``q Σ_v qᵀ`` computed
  node by node and row by row (hypothesis, random covariances and queries);
- :class:`NodeCovariance` (diagonal): a row of one cell with coefficient ``c`` has variance
  ``c² σ²`` (the full covariance's answer when it is diagonal), a row of several cells NaN;
  standard errors given to it come back as given (the written ``_se`` stay bit for bit);
- :class:`BlockCovariance`: every cell's variance equals the diagonal of the node's dense
  cell covariance (``BlockDiagonal.dense_cells``), node by node (1e-9), and a marginal
  row's variance ``q Σ_v qᵀ`` from it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.estimation.covariance import BlockCovariance, NodeCovariance
from censusdp.mechanisms.product_query import ProductQuery


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    n=st.integers(1, 4),
    cells=st.integers(1, 5),
    rows=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_full_node_covariance_equals_the_quadratic_form_node_by_node(n, cells, rows, seed):
    gen = np.random.default_rng(seed)  # test data only, not privacy noise
    a = gen.normal(size=(n, cells, cells))
    cov = a @ a.swapaxes(1, 2)
    q = gen.integers(-2, 3, size=(rows, cells)).astype(float)
    c = NodeCovariance((np.einsum("nkk->nk", cov),), (cov,))
    got = c.query_variances(0, q)
    ref = np.array([[q[r] @ cov[v] @ q[r] for r in range(rows)] for v in range(n)])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    assert np.array_equal(c.cell_standard_errors(0), np.sqrt(np.einsum("nkk->nk", cov)))


def test_a_diagonal_determines_single_cell_rows_only():
    gen = np.random.default_rng(3)  # test data only, not privacy noise
    var = gen.uniform(0.5, 2.0, size=(3, 4))
    q = np.array([[1, 0, 0, 0], [0, 0, -3, 0], [1, 1, 0, 0], [0, 0, 0, 2]], dtype=float)
    diag = NodeCovariance((var,))
    full = NodeCovariance((var,), (np.einsum("nk,kj->nkj", var, np.eye(4)),))
    got = diag.query_variances(0, q)
    single = [0, 1, 3]
    np.testing.assert_allclose(got[:, single], full.query_variances(0, q)[:, single], rtol=1e-15)
    assert np.array_equal(got[:, 0], var[:, 0])
    assert np.array_equal(got[:, 1], 9.0 * var[:, 2])
    assert np.isnan(got[:, 2]).all()  # a sum of two cells: not determined by a diagonal


def test_standard_errors_given_come_back_as_given():
    se = np.array([[0.0, 0.7071067811865476, 1e-3], [3.3, 12.25, 0.5]])
    c = NodeCovariance.from_standard_errors([se])
    assert c.cell_standard_errors(0) is not None
    assert np.array_equal(c.cell_standard_errors(0), se)
    assert np.array_equal(c.cell_variances(0), se**2)


def test_block_covariance_cells_equal_the_dense_diagonal():
    from tests.contracts.test_releases import _structured

    rel, detailed = _structured()
    cov = rel.covariance
    assert isinstance(cov, BlockCovariance)
    age = ProductQuery.parse(rel.schema, "ageband")
    qd = age.dense().astype(float)
    for k, lv in enumerate(rel.hierarchy.levels):
        cells = cov.cell_variances(k).reshape(lv.size, -1)
        rows = cov.query_variances(k, age)
        for v in range(lv.size):
            dense = rel.node_covariance(k, v).dense_cells()
            np.testing.assert_allclose(cells[v], np.diag(dense), rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(rows[v], np.diag(qd @ dense @ qd.T), rtol=1e-9, atol=1e-9)
    assert np.array_equal(cov.cell_standard_errors(1), np.sqrt(cov.cell_variances(1)))
    assert cov.query_variances(0, detailed).shape == (1, rel.schema.n_cells)
