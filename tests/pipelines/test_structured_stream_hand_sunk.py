"""``StreamOptions.hand_sunk``: the sink's value of each partition goes to ``on_partition``,
in order, computed on the thread that smoothed the partition (so work done in a sink, e.g.
the pl94 rounding, runs on every worker), and no value is kept in ``sunk``."""

from __future__ import annotations

import threading

from stream_fixtures import problem

from censusdp.estimation.gls.structured import StructuredPiece
from censusdp.mechanisms.product_measure import ProductMeasurement
from censusdp.pipelines.partition import Partition, partition_units
from censusdp.pipelines.structured_stream import StreamOptions, given_values, structured_stream

CUT, N_PARTS = 2, 5


def _sink(piece: StructuredPiece, part: Partition, payload: int) -> tuple:
    """The piece's first estimates' bytes, the thread it ran on and its payload."""
    return piece.estimates[-1].tobytes(), threading.get_ident(), payload


def _run(h, s, meas, invs, on_partition, **kw):
    heads = [
        m if h.level_index(m.level) < CUT else ProductMeasurement(m.level, m.query, m.values[:0], m.law)
        for m in meas
    ]  # fmt: skip
    return structured_stream(
        h, s, heads, given_values(meas, h, CUT), partition_units(h, CUT, N_PARTS), invs,
        on_partition, StreamOptions(sink=_sink, sink_payload=lambda p: 10 * p.index, **kw),
    )  # fmt: skip


def test_hand_sunk_gives_on_partition_the_sink_values_in_order_from_the_workers() -> None:
    s, h, meas, invs = problem(seed=4)
    kept = _run(h, s, meas, invs, None).sunk  # the values kept, without hand_sunk
    assert len(kept) == N_PARTS
    order = list(range(N_PARTS))[::-1]
    for workers in (1, 2):
        got: list = []
        res = _run(h, s, meas, invs, got.append, workers=workers, order=order, hand_sunk=True)
        assert res.sunk == ()
        assert [(b, pay) for b, _, pay in got] == [(kept[i][0], kept[i][2]) for i in order]
        ran_on = {tid for _, tid, _ in got}
        if workers == 1:
            assert ran_on == {threading.get_ident()}
        else:  # on the pool's threads, not the one consuming the values
            assert threading.get_ident() not in ran_on


def test_the_pool_threads_cpu_is_reported_per_pass() -> None:
    """With two workers the diagnostics give each pass's pool threads' CPU seconds (the
    balance of the two cores); one worker has no pool."""
    s, h, meas, invs = problem(seed=4)
    one = _run(h, s, meas, invs, None, workers=1).diagnostics["worker_thread_cpu_seconds"]
    two = _run(h, s, meas, invs, None, workers=2).diagnostics["worker_thread_cpu_seconds"]
    assert one == []
    assert len(two) == 2  # upward, downward
    assert all(1 <= len(p) <= 2 and all(c > 0 for c in p) for p in two)
