"""The streamed engine's non-negative product (``Pl94StreamOptions.nonnegative``), the
integers' fingerprint of the checks, and the memory budget of the partitions' threads.

The reference is the in-memory non-negative product of the in-memory GLS release
(:func:`~censusdp.estimation.integer.nonnegative.nonnegative_structured`, every level in one
call): the streamed product, computed partition by partition where each partition is
rounded, equals it bit for bit, holds the invariants ``==``, has no negative cell and its
children sum to their parents; the unbiased integers do not change with it. The fingerprint
of a level is the sum of its pieces' (checked against a slow reference), the same for any
partitioning, worker count, budget or executor, and it sees a changed cell."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pl94_fixtures import PLAN, SCHEMA, TOTAL, small_us

from censusdp.estimation.gls.structured import structured_gls
from censusdp.estimation.integer.nonnegative import nonnegative_structured
from censusdp.pipelines.execute import open_executor
from censusdp.pipelines.products import pl94_stream
from censusdp.pipelines.products.pl94_stream import (
    NONNEGATIVE,
    Pl94StreamOptions,
    ReleaseChecks,
    Sinks,
    fingerprint,
    measure_whole,
    stream_pl94,
)
from censusdp.rng import KeyedRNG


@pytest.fixture(scope="module")
def state():
    """Two states, five counties, six levels, 360 blocks."""
    return small_us(counties=5, tracts=9, block_groups=20, blocks=360, population=9000)


def _levels(h, res, top, parts, product) -> list[np.ndarray]:
    """One product's integers of every level, in node order."""
    cut = res.partitions[0].cut
    first = top if product == "unbiased" else top.nonnegative
    out = list(first.counts[: cut + 1])
    pieces = [p if product == "unbiased" else p.nonnegative for p in parts]
    pieces.sort(key=lambda p: p.partition.units)
    for j in range(h.depth - cut - 1):
        out.append(np.concatenate([p.counts[j] for p in pieces]))
    return out


def _stream(h, source, rng, **kw):
    got: dict = {"parts": []}
    checks = {p: ReleaseChecks(h, tables=True, nonnegative=p == "nn") for p in ("u", "nn")}

    def on_top(t):
        got["top"] = t
        for c in checks.values():
            c.top(t)

    def on_partition(p):
        got["parts"].append(p)
        for c in checks.values():
            c.partition(p)

    res = stream_pl94(h, SCHEMA, source, PLAN, rng, on_top=on_top, on_partition=on_partition,
                      options=Pl94StreamOptions(nonnegative=True, **kw))  # fmt: skip
    return res, got, {p: c.result(res.persons) for p, c in checks.items()}


@pytest.mark.parametrize("chunk", [8192, 16])
def test_nonnegative_product_equals_the_in_memory_one_and_holds_its_identities(
    state, chunk, monkeypatch
) -> None:
    """Whole partitions, and (``chunk`` 16) each made a few tracts' subtrees at a time."""
    monkeypatch.setattr(pl94_stream, "NONNEGATIVE_LEAVES", chunk)
    h, source = state
    rng = KeyedRNG.reproducible(21, warn=False)
    res, got, checked = _stream(h, source, rng, partitions=0)
    assert len(res.partitions) > 1
    meas, invs = measure_whole(h, SCHEMA, source, PLAN, rng)
    rel = structured_gls(h, SCHEMA, meas, invs)
    ref = nonnegative_structured(rel, rng.child(NONNEGATIVE), invariants=invs)
    nn = _levels(h, res, got["top"], got["parts"], "nonnegative")
    for k in range(h.depth):
        assert np.array_equal(nn[k], ref.counts[k]), h.names[k]
        assert int(nn[k].min()) >= 0
        assert int(nn[k].sum()) == res.persons
    for k in (0, 1):  # the nation and every state ==
        assert np.array_equal(TOTAL.apply(nn[k]), invs[k].values)
    for k in range(1, h.depth):  # children sum to their parent, cell by cell
        assert np.array_equal(h.aggregate_up(k, nn[k].reshape(nn[k].shape[0], -1)),
                              nn[k - 1].reshape(nn[k - 1].shape[0], -1))  # fmt: skip
    c = checked["nn"]
    assert c["every_cell_non_negative"] and c["invariants_exact"]
    assert c["children_sum_to_parent_cell_by_cell"] and c["table_identities_exact_at_every_node"]
    assert c["every_level_total_equals_the_persons"]
    # the unbiased product is the one made without the option; the two differ (46% negative)
    plain = stream_pl94(h, SCHEMA, source, PLAN, rng, on_top=(u := ReleaseChecks(h)).top,
                        on_partition=u.partition, options=Pl94StreamOptions(partitions=0))  # fmt: skip
    assert u.result(plain.persons)["integers_fingerprint"] == checked["u"]["integers_fingerprint"]
    assert checked["u"]["integers_fingerprint"] != c["integers_fingerprint"]
    assert checked["u"]["every_cell_floor_or_ceil"]


def test_checks_of_the_nonnegative_product_see_a_negative_cell(state) -> None:
    h, source = state
    rng = KeyedRNG.reproducible(21, warn=False)
    checks = ReleaseChecks(h, nonnegative=True)
    seen: list = []

    def on_partition(p):
        if not seen:
            p.nonnegative.counts[-1].flat[0] = -1
            seen.append(1)
        checks.partition(p)

    stream_pl94(h, SCHEMA, source, PLAN, rng, on_top=checks.top, on_partition=on_partition,
                options=Pl94StreamOptions(partitions=2, nonnegative=True))  # fmt: skip
    out = checks.result(0)
    assert not out["every_cell_non_negative"]
    assert not out["children_sum_to_parent_cell_by_cell"]


def test_both_products_are_the_same_for_any_partitioning_budget_and_executor(state) -> None:
    """Fingerprints of both products: one partition, one per county on two threads under a
    budget that lets one partition run at a time, three partitions rounded and checked in
    the sink of a thread executor; another key changes them."""
    h, source = state
    rng = KeyedRNG.reproducible(22, warn=False)
    fps = []
    for kw in ({"partitions": 1}, {"partitions": 0, "workers": 2, "memory_bytes": 1}):
        _, _, checked = _stream(h, source, rng, **kw)
        fps.append((checked["u"]["integers_fingerprint"], checked["nn"]["integers_fingerprint"]))
    checks = {p: ReleaseChecks(h, tables=True, nonnegative=p == "nn") for p in ("u", "nn")}
    with open_executor("threads", workers=2) as ex:
        res = stream_pl94(
            h, SCHEMA, source, PLAN, rng, on_top=lambda t: [c.top(t) for c in checks.values()],
            options=Pl94StreamOptions(
                partitions=3, executor=ex, nonnegative=True,
                sink=Sinks(tuple(c.for_partition() for c in checks.values())),
            ),
        )  # fmt: skip
    for checked in res.sunk:
        for c, one in zip(checks.values(), checked, strict=True):
            c.add(one)
    fps.append(tuple(checks[p].result(res.persons)["integers_fingerprint"] for p in ("u", "nn")))
    assert len(set(fps)) == 1, fps
    assert checks["nn"].result(res.persons)["every_cell_non_negative"]
    _, _, other = _stream(h, source, KeyedRNG.reproducible(23, warn=False), partitions=1)
    assert other["nn"]["integers_fingerprint"] != fps[0][1]


def test_a_memory_budget_runs_one_partition_at_a_time(state) -> None:
    """With a budget below any partition's working set, two threads still run the
    partitions one at a time (each alone), and the integers do not change."""
    h, source = state
    rng = KeyedRNG.reproducible(24, warn=False)
    lock, now, most, both = threading.Lock(), [0], [0], threading.Event()

    def sink(release, payload):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
            if now[0] == 2:
                both.set()
        both.wait(0.5)  # for the other thread, if it may run beside this one
        with lock:
            now[0] -= 1
        return int(release.counts[-1].sum())

    for budget, expect in ((1, 1), (None, 2)):
        most[0] = 0
        both.clear()
        res = stream_pl94(h, SCHEMA, source, PLAN, rng, options=Pl94StreamOptions(
            partitions=0, workers=2, memory_bytes=budget, sink=sink))  # fmt: skip
        assert most[0] == expect, budget
        waited = res.diagnostics["stream"]["partitions_waiting_for_memory"]
        assert (waited > 0) == (budget is not None), budget


def _slow_fingerprint(counts: np.ndarray, first: int, level: int) -> int:
    """The fingerprint's definition in Python integers (mod 2⁶⁴)."""
    m = (1 << 64) - 1

    def mix(x: int) -> int:
        x = (x + 0x9E3779B97F4A7C15) & m
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
        return x ^ (x >> 31)

    flat = counts.reshape(counts.shape[0], -1)
    total = 0
    for n in range(flat.shape[0]):
        w = mix(first + n + (level << 48))
        row = sum(int(flat[n, c]) * mix(c + (1 << 40)) for c in range(flat.shape[1]))
        total += w * row
    return total & m


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 6), k=st.integers(1, 5), cut=st.integers(0, 6), first=st.integers(0, 10**6),
    level=st.integers(0, 5), seed=st.integers(0, 2**31),
)  # fmt: skip
def test_fingerprint_equals_its_definition_and_adds_over_pieces(n, k, cut, first, level, seed):
    x = np.random.default_rng(seed).integers(-(2**40), 2**40, size=(n, k))
    whole = fingerprint(x, first, level)
    assert int(whole) == _slow_fingerprint(x, first, level)
    cut = min(cut, n)
    parts = int(fingerprint(x[:cut], first, level)) + int(fingerprint(x[cut:], first + cut, level))
    assert parts % (1 << 64) == int(whole)
    y = x.copy()
    y.flat[seed % y.size] += 1
    assert fingerprint(y, first, level) != whole
