"""The streamed structured GLS with structural zeros and per-node variances below the cut
(what the NMF needs): the in-memory ``structured_gls(..., zeros=)`` bit for bit, held cells
``== 0``, and each partition's task sent only its own nodes' masks and weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stream_fixtures import assert_same, stream, zeros_problem

from censusdp.estimation.gls.structured import structured_gls
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.execute import SyncExecutor, ThreadExecutor
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.structured_stream import (
    StreamOptions,
    given_values,
    structured_stream,
)


def in_memory(seed=0, **kw):
    s, h, meas, invs, zeros = zeros_problem(seed=seed, **kw)
    rel = structured_gls(h, s, meas, invs, zeros=zeros)
    return s, h, meas, invs, zeros, rel


def held_cells_are_zero(h, zeros, res, pieces, parts, cut):
    """Every masked cell of every streamed level is exactly 0 with variance 0."""
    for k in range(h.depth):
        z = zeros[h.names[k]]
        if k <= cut:
            got = [(res.top.estimates[k], res.top.covariances[k], slice(None))]
        else:
            got = [(pieces[p.index].estimates[k - cut - 1],
                    pieces[p.index].covariances[k - cut - 1], slice(*p.range(k)))
                   for p in parts]  # fmt: skip
        for est, cov, rows in got:
            zk = z[rows]
            assert np.all(est[zk] == 0)
            var = cov.query_variances(ProductQuery.parse(cov.basis.schema, "detailed"))
            var = var.reshape(est.shape)
            assert np.all(var[zk] == 0)


@pytest.mark.parametrize("cut,n_parts,cache,workers", [(1, 2, 0, 1), (2, 4, 1 << 30, 2),
                                                        (2, 9, 0, 1), (3, 5, 1 << 30, 1)])  # fmt: skip
def test_stream_with_zeros_equals_in_memory_bit_for_bit(cut, n_parts, cache, workers):
    """Zeros at every level and per-node variances (one node unmeasured) at the levels below
    the cut: the streamed run equals the in-memory one bit for bit, recomputed or cached,
    on one or two threads; the masked cells are == 0 with variance 0."""
    s, h, meas, invs, zeros, rel = in_memory(seed=2)
    assert any(z.any() for z in zeros.values())
    res, pieces, parts = stream(h, s, meas, invs, cut, n_parts, zeros=zeros,
                                cache_bytes=cache, workers=workers)  # fmt: skip
    assert_same(h, rel, res, pieces, parts, cut)
    held_cells_are_zero(h, zeros, res, pieces, parts, cut)
    assert res.diagnostics["partitions_cached"] == (len(parts) if cache else 0)


def test_without_the_zeros_the_stream_is_another_release():
    """Power: the zeros are used — the stream without them differs from the in-memory
    release with them (and leaves masked cells nonzero)."""
    s, h, meas, invs, zeros, rel = in_memory(seed=2)
    res, pieces, parts = stream(h, s, meas, invs, 2, 4)
    leaf = pieces[parts[0].index].estimates[-1]
    lo, hi = parts[0].range(h.depth - 1)
    assert not np.array_equal(leaf, rel.estimates[-1][lo:hi])
    assert np.any(leaf[zeros[h.names[-1]][lo:hi]] != 0)


class RecordingExecutor(SyncExecutor):
    """The sync executor, keeping every task's inputs."""

    def __init__(self) -> None:
        self.items: list = []

    def map(self, fn, items, *extra):
        self.items.extend(items)
        return super().map(fn, items, *extra)


def test_executors_and_tasks_get_only_their_rows():
    """The sync and thread executors give the in-memory release; the context every task
    shares holds no per-node mask, weight or information block below the cut, and each
    upward task is sent its own partition's rows of them."""
    s, h, meas, invs, zeros, rel = in_memory(seed=5)
    threads, rec = ThreadExecutor(2), RecordingExecutor()
    try:
        for ex in (rec, threads):
            res, pieces, parts = stream(h, s, meas, invs, 2, 4, zeros=zeros, executor=ex)
            assert_same(h, rel, res, pieces, parts, 2)
    finally:
        threads.close()
    ctx = [x for x in rec.items if hasattr(x, "setup")]
    ups = [x for x in rec.items if isinstance(x, tuple) and len(x) == 5]
    assert len(ctx) == 1 and len(ups) == len(parts)
    shared = ctx[0].setup
    assert all(z is None for z in shared.zeros[2:])
    assert all(w is None or w.shape[0] == 1 for k, _, w in shared.heads if k >= 2)
    assert all(b is None or b.shape[0] == 1 for J in shared.J[2:] for b in J.values())
    for _, p, _, _, nodes in ups:
        for k in range(2, h.depth):
            lo, hi = p.range(k)
            z = zeros[h.names[k]]  # over sex only: the split axis, as given
            assert np.array_equal(nodes.zeros[k], z[lo:hi]) if z.any() else nodes.zeros[k] is None
            for (lvl, _, _w), mine in zip(shared.heads, nodes.weights, strict=True):
                if lvl == k and mine is not None and mine.shape[0] != 1:
                    assert mine.shape[0] == hi - lo
            for b in nodes.J[k].values():
                assert b.shape[0] in (1, hi - lo)


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(st.integers(0, 2**31), st.integers(1, 3), st.integers(1, 7), st.booleans())
def test_stream_with_zeros_random_trees(seed, cut, n_parts, cache):
    """Random trees (single-node partitions included), zeros and per-node variances: the
    stream equals the in-memory release bit for bit."""
    s, h, meas, invs, zeros, rel = in_memory(seed=seed, fan=((1, 3), (1, 3), (1, 3)))
    cut = min(cut, h.depth - 1)
    res, pieces, parts = stream(h, s, meas, invs, cut, n_parts, zeros=zeros,
                                cache_bytes=(1 << 30) if cache else 0)  # fmt: skip
    assert_same(h, rel, res, pieces, parts, cut)


def test_zero_masks_of_the_wrong_shape_are_refused():
    s, h, meas, invs, zeros, _ = in_memory(seed=1)
    parts = partition_units(h, 1, 2)
    bad = {**zeros, h.names[-1]: zeros[h.names[-1]][1:]}
    with pytest.raises(Exception, match="structural zeros at level"):
        structured_stream(h, s, meas, given_values(meas, h, 1), parts, invs,
                          options=StreamOptions(zeros=bad))  # fmt: skip
