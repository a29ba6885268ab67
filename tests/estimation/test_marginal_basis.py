"""The per-axis basis of docs/design.md § The structured algebra against dense Kronecker products."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from schema_strategies import query_texts, schemas

from censusdp.errors import SpecError
from censusdp.estimation.gls.marginal_basis import MarginalBasis, workload_basis
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.schema import Schema


def close(a, b, tol=1e-12):
    scale = max(1.0, float(np.abs(b).max()))
    assert np.abs(a - b).max() <= tol * scale


def check_workload(data, max_cells):
    s = data.draw(schemas(max_cells=max_cells))
    texts = data.draw(st.lists(query_texts(s), min_size=1, max_size=5))
    qs = [ProductQuery.parse(s, t) for t in texts]
    w = data.draw(st.lists(st.floats(0.01, 100), min_size=len(qs), max_size=len(qs)))
    mb = MarginalBasis.for_queries(s, qs)
    n = s.n_cells
    b = mb.dense_basis()
    close(b.T @ b, np.eye(n))
    gen = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = gen.normal(size=(3, *s.shape))
    close(mb.to_basis(x).reshape(3, -1), x.reshape(3, -1) @ b)
    close(mb.from_basis(mb.to_basis(x)), x)
    # coordinates: every (S, contrast index) block covers the cells exactly once
    assert sum(mb.block_size(m) * mb.multiplicity(m) for m in mb.subsets) == n
    assert all(mb.block_size(m) <= int(np.prod(mb.ranks)) for m in mb.subsets)
    total = np.zeros((n, n))
    for q, wi in zip(qs, w, strict=True):
        g = wi * (q.dense().T @ q.dense()).astype(float)
        blocks = mb.gram(q, wi)
        close(blocks.dense_cells(), g)  # Gram from blocks = dense QᵀQ
        close(blocks.dense(), b.T @ g @ b)  # and nothing off the blocks
        total += g
    f = sum(mb.gram(q, wi) for q, wi in zip(qs, w, strict=True))
    close(f.dense_cells(), total)
    # unidentified directions: the pseudo-inverse block by block is the dense one
    close(f.pinv().dense_cells(), np.linalg.pinv(total, rtol=1e-10, hermitian=True), 1e-8)
    # the algebra is closed under inverses: (F + I)⁻¹ block by block
    inv = (f + mb.identity()).inv()
    close(inv.dense_cells(), np.linalg.inv(total + np.eye(n)), 1e-9)
    # every row variance of every workload query from the blocks: diag(Q Σ Qᵀ)
    cov = np.linalg.inv(total + np.eye(n))
    extra = ProductQuery.parse(s, data.draw(query_texts(s)))  # measured or not
    for q in [*qs, extra]:
        m = q.dense().astype(float)
        close(inv.query_variances(q), np.einsum("ij,jk,ik->i", m, cov, m), 1e-9)
    y = gen.normal(size=(2, *s.shape))
    close(
        inv.quadratic_form(y),
        np.einsum("ni,ij,nj->n", y.reshape(2, -1), inv.dense(), y.reshape(2, -1)),
        1e-9,
    )


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_workload_grams_are_block_diagonal_and_exact(data):
    """1–4 attributes, domains 1–7, at most 36 cells (the fast form)."""
    check_workload(data, 36)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.data())
def test_workload_grams_full_range(data):
    """1–4 attributes, domains 1–7 without a cell cap (up to 2,401 cells)."""
    check_workload(data, None)


def test_pl94_production_blocks_are_size_1_or_3():
    s = Schema.load("pl94")
    texts = s.strategy  # the 11 production queries
    mb = workload_basis(s, texts)
    assert mb.ranks == (3, 1, 1, 1)
    assert {mb.block_size(m) for m in mb.subsets} == {1, 3}
    assert len(mb.subsets) == 16
    # with P10-style slices and both race recodes the refinements are 2 (age) and 11 (race)
    pp = workload_basis(
        Schema.load("ppdd"), ["adult * cenrace", "race7", "numraces * hispanic", "sex * age"]
    )
    assert pp.ranks == (1, 1, 2, 1, 11)
    assert pp.axes[4].sizes.tolist() == [1] * 6 + [15, 20, 15, 6, 1]


def test_batched_blocks_act_per_node():
    s = Schema.load("sex_age5")
    mb = workload_basis(s, ["sex * ageband", "age65", "total"])
    qs = [ProductQuery.parse(s, t) for t in ["sex * ageband", "age65", "total", "detailed"]]
    node_w = np.array([1.0, 2.0, 5.0])
    f = sum(mb.gram(q) * (node_w * (i + 1)) for i, q in enumerate(qs))
    y = np.random.default_rng(1).normal(size=(3, *s.shape))
    out = f.apply(y)
    var = f.inv().query_variances(qs[0])
    assert var.shape == (3, qs[0].n_rows)
    for node in range(3):
        dense = sum(node_w[node] * (i + 1) * (q.dense().T @ q.dense()) for i, q in enumerate(qs))
        b = mb.dense_basis()
        close(out[node].ravel(), (b.T @ dense @ b) @ y[node].ravel())
        m = qs[0].dense().astype(float)
        close(var[node], np.diag(m @ np.linalg.inv(dense) @ m.T))


def test_element_outside_workload_is_refused():
    s = Schema.load("sex_age5")
    mb = workload_basis(s, ["age65"])
    with pytest.raises(SpecError, match="splits a group of the common refinement"):
        mb.gram(ProductQuery.parse(s, "ageband"))
