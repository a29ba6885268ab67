"""The streamed structured GLS caches upward states by default, within its budget (issue 36).

With the default options every partition of a small problem fits in the budget, so none is
measured twice; a budget smaller than the states caches some and recomputes the rest; either
way the release is the in-memory one bit for bit (and the same as recomputing all)."""

from __future__ import annotations

from stream_fixtures import assert_same, problem, stream

from censusdp.estimation.gls.structured import structured_gls
from censusdp.pipelines.structured_stream import DEFAULT_CACHE_BYTES, StreamOptions


def test_default_budget_caches_and_changes_no_bit() -> None:
    assert StreamOptions().cache_bytes == DEFAULT_CACHE_BYTES == 1 << 30
    s, h, meas, invs = problem(seed=5)
    rel = structured_gls(h, s, meas, invs)
    res, pieces, parts = stream(h, s, meas, invs, 2, 5)
    assert_same(h, rel, res, pieces, parts, 2)
    d = res.diagnostics
    assert d["partitions_cached"] == len(parts) and d["partitions_regenerated"] == 0
    assert 0 < d["cache_bytes_used"] <= DEFAULT_CACHE_BYTES
    # a budget of about two states: some cached, the rest recomputed, the same release
    tight = 2 * d["largest_cached_state_bytes"]
    res, pieces, parts = stream(h, s, meas, invs, 2, 5, cache_bytes=tight)
    assert_same(h, rel, res, pieces, parts, 2)
    d = res.diagnostics
    assert 0 < d["partitions_cached"] < len(parts) and d["cache_bytes_used"] <= tight
    assert d["partitions_regenerated"] == len(parts) - d["partitions_cached"]
