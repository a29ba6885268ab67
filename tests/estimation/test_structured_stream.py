"""Streaming structured GLS (partition by partition) against the in-memory structured GLS."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stream_fixtures import assert_same, problem, stream

from censusdp.budget import PrivacyStatement
from censusdp.errors import BudgetError, SpecError
from censusdp.estimation.gls.marginal_basis import node_axis_product, workload_basis
from censusdp.estimation.gls.structured import structured_gls
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.structured_stream import StreamOptions, given_values, structured_stream
from censusdp.schema import Schema


@pytest.mark.parametrize("cut,n_parts", [(1, 2), (1, 3), (2, 4), (2, 1), (3, 5)])
def test_stream_equals_in_memory_bit_for_bit(cut, n_parts):
    s, h, meas, invs = problem()
    rel = structured_gls(h, s, meas, invs)
    res, pieces, parts = stream(h, s, meas, invs, cut, n_parts, cache_bytes=0)
    assert_same(h, rel, res, pieces, parts, cut)
    assert res.privacy == rel.privacy
    assert res.diagnostics["partitions_regenerated"] == len(parts)
    assert res.diagnostics["max_invariant_residual"] <= 1e-9 * rel.estimates[0].sum()
    if cut == h.depth - 1:  # the leaves are the cut: the pieces hold no level
        assert all(piece.estimates == () for piece in pieces.values())
        return
    # the SE API of a piece equals the release's on its rows
    p = parts[-1]
    lo, hi = p.range(h.depth - 1)
    leaf = h.names[-1]
    np.testing.assert_array_equal(
        pieces[p.index].query_standard_errors(leaf, "sex * ageband"),
        rel.query_standard_errors(leaf, "sex * ageband")[lo:hi],
    )


def test_any_order_cache_and_number_of_threads_give_identical_output():
    s, h, meas, invs = problem(seed=3)
    rel = structured_gls(h, s, meas, invs)
    n = len(partition_units(h, 2, 5))
    assert n >= 4
    shuffled = [int(i) for i in np.random.default_rng(0).permutation(n)]
    reverse = list(range(n))[::-1]
    runs = [(None, 0, 1), (shuffled, 0, 2), (reverse, 1 << 30, 1), (None, 1 << 30, 3)]
    for order, cache, workers in runs:
        res, pieces, parts = stream(
            h, s, meas, invs, 2, 5, order=order, cache_bytes=cache, workers=workers
        )
        assert_same(h, rel, res, pieces, parts, 2)
        cached = res.diagnostics["partitions_cached"]
        assert cached == (n if cache else 0)
        assert res.diagnostics["partitions_regenerated"] == n - cached


def test_pl94_county_slice_bit_for_bit():
    """pl94 (2,016 cells, the 11 production queries, the state total invariant) on a small
    state: the streamed run cut at the county level equals the in-memory one on every county
    (estimates and covariance blocks, ``np.array_equal``)."""
    texts = Schema.load("pl94").strategy
    s, h, meas, invs = problem("pl94", fan=((2, 3), (1, 3), (1, 2)), seed=5, texts=texts)
    rel = structured_gls(h, s, meas, invs)
    res, pieces, parts = stream(h, s, meas, invs, 1, h.sizes[1])
    assert len(parts) == h.sizes[1]  # one county per partition
    assert_same(h, rel, res, pieces, parts, 1)


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(st.integers(0, 2**31), st.integers(1, 3), st.integers(1, 6))
def test_stream_equals_in_memory_random_trees(seed, cut, n_parts):
    s, h, meas, invs = problem(seed=seed)
    cut = min(cut, h.depth - 1)
    rel = structured_gls(h, s, meas, invs)
    res, pieces, parts = stream(h, s, meas, invs, cut, n_parts)
    assert_same(h, rel, res, pieces, parts, cut)


def test_node_axis_product_is_batch_invariant_and_exact():
    """Per-node products: a slice of nodes transformed alone has the bits of the whole batch
    (a 2-D BLAS product does not guarantee this), and the product is the mode product."""
    s = Schema.load("pl94")
    mb = workload_basis(s, s.strategy)
    x = np.random.default_rng(0).normal(size=(300, *s.shape))
    y = mb.to_basis(x)
    for lo, hi in [(0, 1), (7, 8), (13, 211), (1, 300)]:
        assert np.array_equal(mb.to_basis(x[lo:hi]), y[lo:hi])
        assert np.array_equal(mb.from_basis(y[lo:hi]), mb.from_basis(y)[lo:hi])
    m = np.random.default_rng(1).normal(size=(5, 63))
    ref = np.einsum("ij,nabcj->nabci", m, x)
    np.testing.assert_allclose(node_axis_product(x, 4, m), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mb.from_basis(y), x, atol=1e-12)


def test_refusals():
    s, h, meas, invs = problem()
    parts = partition_units(h, 1, 2)
    with pytest.raises(SpecError, match="tile the cut level"):
        structured_stream(h, s, meas, given_values(meas, h, 1), parts[1:], invs)
    with pytest.raises(SpecError, match="measure returned"):
        structured_stream(h, s, meas, lambda p: [], parts, invs)
    bad = PrivacyStatement("zcdp", rho=1e-6, mechanism="gaussian")
    with pytest.raises(BudgetError):
        structured_stream(h, s, meas, given_values(meas, h, 1), parts, invs,
                          options=StreamOptions(privacy=bad))  # fmt: skip


def test_options_given_one_by_one_as_before_equal_stream_options():
    """The pre-StreamOptions keyword arguments still run (one release), over ``options``, and
    give the same output bit for bit; a keyword that is no option is refused."""
    s, h, meas, invs = problem(seed=4)
    rel = structured_gls(h, s, meas, invs)
    parts = partition_units(h, 1, 3)
    got: dict = {}
    top: list = []
    res = structured_stream(
        h, s, meas, given_values(meas, h, 1), parts, invs,
        lambda p: got.__setitem__(p.partition, p),
        options=StreamOptions(workers=2), cache_bytes=1 << 30, on_top=top.append,
        order=[2, 0, 1],
    )  # fmt: skip
    assert_same(h, rel, res, got, parts, 1)
    assert res.diagnostics["workers"] == 2 and res.diagnostics["partitions_cached"] == 3
    assert len(top) == 1 and np.array_equal(top[0].estimates[0], rel.estimates[0])
    with pytest.raises(
        TypeError, match="'cache_byte'; its options are the fields of StreamOptions"
    ):
        structured_stream(h, s, meas, given_values(meas, h, 1), parts, invs, cache_byte=1)
