"""Parents of one shape share their matrices; sharing never changes a result.

The TopDown-style sub-problems of :mod:`censusdp.estimation.topdown.sparse` cache every
structure that depends only on the parent's pattern (children, active cells, queries): the
restricted query blocks, ``I_n ⊗ Q_a``, the rounding passes' constraint matrices and the
Clarabel constraint matrix of an L2 pass. These tests check the cached structures against
fresh ones (bit for bit), that the order parents are solved in does not matter, that keys are
by content (equal queries parsed twice share, different ones never collide), and the direct
pieces against obvious references.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

import censusdp.estimation.topdown.sparse as ts
from censusdp.estimation.topdown.sparse import (
    ChildrenLayout,
    _block_diagonal,
    _highs_solve,
    _query_key,
    l1_multipass,
    l2_multipass,
    pattern_cache_stats,
)
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.schema import Schema

TEXTS = ("total", "sex", "age5", "detailed")


def _parent(seed: int, n: int, schema: Schema, queries, zero_cells=()):
    """A parent histogram (with ``zero_cells`` empty) split among ``n`` children, and noisy
    answers of every query."""
    gen = np.random.default_rng(seed)
    parent = gen.integers(1, 9, schema.n_cells)
    parent[list(zero_cells)] = 0
    truth = np.stack([gen.multinomial(int(p), np.full(n, 1 / n)) for p in parent], axis=1)
    meas = []
    for q in queries:
        vals = q.apply(truth.reshape(n, *schema.shape)) + gen.normal(0, 2.0, (n, q.n_rows))
        meas.append((q, vals, 4.0))
    invs = [(queries[0], queries[0].apply(truth.reshape(n, *schema.shape)))]
    return parent, meas, invs


def _solve(schema, queries, problem, n, method):
    parent, meas, invs = problem
    layout = ChildrenLayout(n, schema.n_cells, parent)
    passes = [["total"], [q.name for q in queries[1:]]]
    xt, _ = l2_multipass(layout, meas, invs, passes, method=method)
    rounder = [[queries[0]], [queries[1]], [queries[-1]]]
    counts, _ = l1_multipass(layout, xt, invs, rounder)
    return xt, counts


@pytest.fixture
def fresh_cache(monkeypatch):
    """An empty shared-structure cache for the test (restored afterwards)."""
    monkeypatch.setattr(ts, "_PATTERNS", type(ts._PATTERNS)())
    monkeypatch.setattr(ts, "_PATTERN_STATS", {"hits": 0, "misses": 0})


def test_shared_structures_give_the_results_of_fresh_ones(fresh_cache, monkeypatch):
    """Clarabel for the L2 passes (its constraint matrix is shared), HiGHS for the rounding."""
    method = "clarabel"
    schema = Schema.load("sex_age5")
    queries = [ProductQuery.parse(schema, t) for t in TEXTS]
    n = 4
    problems = [_parent(s, n, schema, queries, zero_cells=(3, 20)) for s in (1, 2, 3)]
    shared = [_solve(schema, queries, p, n, method) for p in problems]
    stats = pattern_cache_stats()
    assert stats["hits"] > 0 and stats["entries"] > 0  # the later parents reused the first's
    monkeypatch.setattr(ts, "PATTERN_CACHE_SIZE", 0)  # nothing kept: every parent builds
    monkeypatch.setattr(ts, "_PATTERNS", type(ts._PATTERNS)())
    # queries parsed again: the same content, new objects
    again = [ProductQuery.parse(Schema.load("sex_age5"), t) for t in TEXTS]
    fresh = [_solve(schema, again, p, n, method) for p in problems]
    assert pattern_cache_stats()["entries"] == 0
    for (x1, c1), (x2, c2) in zip(shared, fresh, strict=True):
        assert np.array_equal(x1, x2)  # bit for bit
        assert np.array_equal(c1, c2)
        assert c1.dtype == np.int64 and c1.min() >= 0


def test_the_order_of_parents_does_not_matter(fresh_cache):
    schema = Schema.load("sex_age5")
    queries = [ProductQuery.parse(schema, t) for t in TEXTS]
    problems = [_parent(s, 3, schema, queries) for s in (5, 6)]
    forward = [_solve(schema, queries, p, 3, "auto") for p in problems]
    ts._PATTERNS.clear()
    backward = [_solve(schema, queries, p, 3, "auto") for p in problems[::-1]][::-1]
    for (x1, c1), (x2, c2) in zip(forward, backward, strict=True):
        assert np.array_equal(x1, x2) and np.array_equal(c1, c2)


def test_keys_are_by_content():
    a = ProductQuery.parse(Schema.load("sex_age5"), "age5")
    b = ProductQuery.parse(Schema.load("sex_age5"), "age5")
    assert a is not b and _query_key(a) == _query_key(b)
    assert _query_key(a) != _query_key(ProductQuery.parse(Schema.load("sex_age5"), "ageband"))
    # the same name over another schema is another key
    t1 = ProductQuery.parse(Schema.load("sex_age5"), "total")
    t2 = ProductQuery.parse(Schema.load("pl94"), "total")
    assert _query_key(t1) != _query_key(t2)
    # layouts: the active set is part of the pattern
    p = np.ones(36, np.int64)
    q = p.copy()
    q[5] = 0
    assert ChildrenLayout(3, 36, p).pattern != ChildrenLayout(3, 36, q).pattern
    assert ChildrenLayout(3, 36, p).pattern == ChildrenLayout(3, 36, 2 * p).pattern


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 7),
    st.integers(1, 9),
    st.floats(0.0, 1.0),
    st.integers(0, 2**31),
)
def test_block_diagonal_is_the_kronecker_product(n, r, c, density, seed):
    mat = sp.random(r, c, density=density, format="csr", random_state=seed)
    got = _block_diagonal(mat, n)
    want = sp.kron(sp.identity(n), mat, format="csr")
    assert got.shape == want.shape
    assert np.array_equal(got.toarray(), want.toarray())


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.booleans())
def test_direct_highs_equals_scipy(seed, integer):
    """A random feasible transportation-like LP (and its 0/1 version): same optimum."""
    gen = np.random.default_rng(seed)
    rows, cols = gen.integers(2, 5), gen.integers(2, 6)
    nv = rows * cols
    A = sp.vstack(
        [sp.kron(sp.identity(rows), np.ones((1, cols))), sp.kron(np.ones((1, rows)), sp.identity(cols))],
        "csc",
    )  # fmt: skip
    y = (gen.random(nv) < 0.5).astype(float)  # a feasible 0/1 point
    rhs = A @ y
    c = gen.normal(size=nv)
    ub = np.ones(nv)
    x, fun, _ = _highs_solve(c, A, rhs, ub, nv if integer else 0)
    ref = linprog(c, A_eq=A, b_eq=rhs, bounds=np.column_stack([np.zeros(nv), ub]), method="highs")
    assert x is not None and ref.status == 0
    assert fun == pytest.approx(ref.fun, abs=1e-9)
    np.testing.assert_allclose(A @ x, rhs, atol=1e-9)
    infeasible, _, message = _highs_solve(c, A, rhs + np.r_[0.5, np.zeros(rhs.size - 1)], ub, nv)
    assert infeasible is None and message
