"""The streamed pl94 engine (censusdp.pipelines.products.pl94_stream) and its store (pl94_store).

The reference is the slow obvious computation: every level's histogram held whole, every
measurement drawn over whole levels (:func:`measure_range` from node 0), the in-memory
``structured_gls`` and ``round_structured``. The engine must equal it bit for bit; any
partitioning, order, worker count or cache gives the same digest; the store gives back the
tables and standard errors and refuses a corrupted piece."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pl94_fixtures import PLAN, QUERIES, SCHEMA, TOTAL, small_us
from ppmf_fixtures import ppmf_persons

from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls.predict import allocation_plan
from censusdp.estimation.gls.structured import structured_gls
from censusdp.estimation.integer.controlled import round_structured
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.product_measure import ProductInvariant, ProductMeasurement
from censusdp.mechanisms.product_query import ProductQuery, apply_queries
from censusdp.mechanisms.queries import measure_range
from censusdp.pipelines.io.pl94_store import Pl94Store, Pl94StoreWriter
from censusdp.pipelines.io.ppmf import read_ppmf
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.products.pl94_stream import (
    Pl94StreamOptions,
    ReleaseChecks,
    SparseHistogram,
    answers_from_entries,
    stream_pl94,
)
from censusdp.pipelines.products.pl94_tables import tabulate
from censusdp.rng import CHUNK, KeyedRNG


@pytest.fixture(scope="module")
def state():
    """Two states, five counties, six levels, 360 blocks: small but every level branches."""
    return small_us(counties=5, tracts=9, block_groups=20, blocks=360, population=9000)


def _reference(h, source, rng):
    """The in-memory release: whole levels, whole-level measurements, structured_gls and
    round_structured (the obvious computation)."""
    leaf, cell, count = source(0, h.sizes[-1])
    x = np.zeros((h.sizes[-1], SCHEMA.n_cells), np.int64)
    x[leaf, cell] = count
    levels = [x]
    for k in range(h.depth - 1, 0, -1):
        levels.append(h.aggregate_up(k, levels[-1]))
    levels = [lv.reshape(-1, *SCHEMA.shape) for lv in levels[::-1]]
    meas = []
    for lvl, q, law in PLAN:
        k = h.level_index(lvl)
        values = measure_range(q.apply(levels[k]), lvl, h.sizes[k], 0, q, law, rng)
        meas.append(ProductMeasurement(lvl, q, values, law))
    invs = [
        ProductInvariant(lvl, TOTAL, TOTAL.apply(levels[k])) for k, lvl in enumerate(h.names[:2])
    ]
    rel = structured_gls(h, SCHEMA, meas, invs)
    # the engine's cut (county): each county's subtree is rounded as one network
    rounded = round_structured(
        rel, rng.child("rounding"), invariants=invs, spreads=False, cut=h.level_index("county")
    )
    return rel, rounded, levels


def _run(h, source, rng, **kw):
    """The engine's levels, gathered in node order from the callbacks."""
    got: dict = {}
    checks = ReleaseChecks(h, tables=True)

    def on_top(t):
        checks.top(t)
        got["top"] = t

    def on_partition(p):
        checks.partition(p)
        got[p.partition.units] = p

    res = stream_pl94(h, SCHEMA, source, PLAN, rng, on_top=on_top, on_partition=on_partition,
                      options=Pl94StreamOptions(**kw))  # fmt: skip
    cut = res.partitions[0].cut
    pieces = [got[u] for u in sorted(k for k in got if k != "top")]
    est = list(got["top"].piece.estimates[: cut + 1])
    counts = list(got["top"].counts[: cut + 1])
    for j in range(h.depth - cut - 1):
        est.append(np.concatenate([p.piece.estimates[j] for p in pieces]))
        counts.append(np.concatenate([p.counts[j] for p in pieces]))
    return res, est, counts, checks


def test_engine_equals_in_memory_gls_and_rounding_bit_for_bit(state) -> None:
    h, source = state
    rng = KeyedRNG.reproducible(11, warn=False)
    rel, rounded, levels = _reference(h, source, rng)
    res, est, counts, checks = _run(h, source, rng, partitions=0)
    assert len(res.partitions) > 1
    for k in range(h.depth):
        assert np.array_equal(est[k], rel.estimates[k]), h.names[k]
        assert np.array_equal(counts[k], rounded.counts[k]), h.names[k]
    # every invariant exact: the nation and each state
    for k in (0, 1):
        assert np.array_equal(TOTAL.apply(counts[k]), TOTAL.apply(levels[k]))
    result = checks.result(res.persons)
    assert res.persons == int(levels[0].sum())
    assert result["every_level_total_equals_the_persons"]
    assert result["invariants_exact"] and result["every_cell_floor_or_ceil"]
    assert result["children_sum_to_parent_cell_by_cell"]
    assert result["table_identities_exact_at_every_node"]
    assert res.noisy_counts == sum(h.sizes[h.level_index(lvl)] * q.n_rows for lvl, q, _ in PLAN)


def test_checks_see_a_broken_release(state) -> None:
    """The checks can fail: a rounded cell moved by one breaks consistency and floor/ceil."""
    h, source = state
    rng = KeyedRNG.reproducible(11, warn=False)
    checks = ReleaseChecks(h, tables=True)
    seen = []

    def on_partition(p):
        if not seen:
            p.counts[-1][0].flat[0] += 2
            seen.append(1)
        checks.partition(p)

    stream_pl94(h, SCHEMA, source, PLAN, rng, on_top=checks.top, on_partition=on_partition,
                options=Pl94StreamOptions(partitions=2))  # fmt: skip
    out = checks.result(0)
    assert not out["children_sum_to_parent_cell_by_cell"]
    assert not out["every_cell_floor_or_ceil"]


def _store(h, source, rng, path: Path, legacy: bool = False, **kw) -> dict:
    """One run written to a store at ``path``; ``kw`` are its :class:`Pl94StreamOptions`,
    given as the options object or (``legacy``) as the keywords of before it existed."""
    if path.exists():
        shutil.rmtree(path)
    with Pl94StoreWriter(path, h, SCHEMA) as w:
        opts = kw if legacy else {"options": Pl94StreamOptions(**kw)}
        res = stream_pl94(h, SCHEMA, source, PLAN, rng, on_top=w.top, on_partition=w.partition,
                          **opts)  # fmt: skip
        return {**w.finish(res, QUERIES), "n_files": len(list(path.parent.glob("**/*.npy*")))}


def test_digest_is_independent_of_partitions_order_workers_and_cache(state, tmp_path) -> None:
    h, source = state
    rng = KeyedRNG.reproducible(12, warn=False)
    n = len(partition_units(h, 2, h.sizes[2]))
    runs = [
        _store(h, source, rng, tmp_path / "a" / "s", partitions=1),
        _store(
            h,
            source,
            rng,
            tmp_path / "b" / "s",
            partitions=0,
            workers=2,
            order=list(range(n))[::-1],
        ),  # fmt: skip
        _store(h, source, rng, tmp_path / "c" / "s", partitions=3, cache_bytes=1 << 30),
    ]
    assert len({r["digest"] for r in runs}) == 1
    assert len({r["n_files"] for r in runs}) == 3  # the files differ, the content does not
    other = _store(h, source, KeyedRNG.reproducible(13, warn=False), tmp_path / "d" / "s")
    assert other["digest"] != runs[0]["digest"]  # the digest sees the noise


def test_old_keywords_still_run_and_an_unknown_one_is_refused(state, tmp_path) -> None:
    """The settings given one by one as keywords, as before :class:`Pl94StreamOptions`
    (accepted for one release), write the same store as the options object, and win over
    it; a misspelt one is refused naming the options' fields."""
    h, source = state
    rng = KeyedRNG.reproducible(12, warn=False)
    new = _store(h, source, rng, tmp_path / "a" / "s", partitions=3, cache_bytes=1 << 30)
    old = _store(h, source, rng, tmp_path / "b" / "s", legacy=True, partitions=3,
                 cache_bytes=1 << 30)  # fmt: skip
    assert old["digest"] == new["digest"] and old["n_files"] == new["n_files"]
    mixed = _store(h, source, rng, tmp_path / "c" / "s", legacy=True,
                   options=Pl94StreamOptions(partitions=1), partitions=3)  # fmt: skip
    assert mixed["n_files"] == new["n_files"]  # the keyword won: three partitions' files
    with pytest.raises(TypeError, match="'partition'; its options are the fields of Pl94"):
        stream_pl94(h, SCHEMA, source, PLAN, rng, partition=3)
    with pytest.raises(TypeError, match="options must be a Pl94StreamOptions"):
        stream_pl94(h, SCHEMA, source, PLAN, rng, options={"partitions": 3})


def test_noise_of_a_range_inside_a_level_equals_the_whole_level_draw() -> None:
    """Mid-chunk: a node range's keyed noise (drawn alone, from inside a chunk and across
    chunk boundaries) equals the slice of the whole level's."""
    rng = KeyedRNG.reproducible(3, warn=False)
    law = DiscreteGaussian.from_sigma2(5)
    n = CHUNK + 4000
    truth = np.arange(n, dtype=np.int64)[:, None] % 7
    whole = measure_range(truth, "block", n, 0, TOTAL, law, rng)
    for a, b in [(10, 20), (CHUNK - 3, CHUNK + 3), (CHUNK + 17, n), (0, 1)]:
        part = measure_range(truth[a:b], "block", n, a, TOTAL, law, rng)
        assert np.array_equal(part, whole[a:b]), (a, b)


def test_store_round_trip_and_a_corrupted_piece_is_refused(state, tmp_path) -> None:
    h, source = state
    rng = KeyedRNG.reproducible(11, warn=False)
    rel, rounded, _ = _reference(h, source, rng)
    path = tmp_path / "store"
    summary = _store(h, source, rng, path, partitions=2)
    store = Pl94Store(path)
    assert store.verify() == summary["digest"] == store.digest
    q = ProductQuery.parse(SCHEMA, "votingage * hispanic * cenrace")
    for k, lvl in enumerate(h.names):
        assert np.array_equal(store.tables(lvl), tabulate(rounded.counts[k]))
        se = store.standard_errors(lvl, q)
        ref = rel.query_standard_errors(lvl, q)
        np.testing.assert_allclose(se, ref, rtol=1e-12)
        assert store.column_standard_errors(lvl).shape == (h.sizes[k], 298)
    assert np.array_equal(store.tables("block", 5, 40), tabulate(rounded.counts[-1][5:40]))

    piece = next(path.glob("tables/block/part-*.npy.gz"))
    data = bytearray(piece.read_bytes())
    data[-1] ^= 1
    piece.write_bytes(bytes(data))
    with pytest.raises(DataError, match=piece.name):
        Pl94Store(path).tables("block")
    with pytest.raises(DataError, match="SHA-256"):
        Pl94Store(path).verify()
    (path / "checksums.json").unlink()
    with pytest.raises(DataError):
        Pl94Store(path)


def test_a_failed_run_leaves_no_store(state, tmp_path) -> None:
    h, source = state
    path = tmp_path / "store"

    def broken(lo, hi):
        leaf, cell, count = source(lo, hi)
        return leaf + (hi - lo), cell, count  # leaves outside the range asked for

    with pytest.raises(DataError, match="outside that range"):
        _store(h, broken, KeyedRNG.reproducible(1, warn=False), path)
    assert not path.exists()


def test_a_ppmf_histogram_is_a_source(tmp_path) -> None:
    """The PPMF reader's histogram streams through the engine (SparseHistogram.of)."""
    gen = np.random.default_rng(5)
    blocks = [("01", "001", "000100", "1", "1001"), ("01", "001", "000100", "1", "1002"),
              ("01", "003", "000200", "2", "2001"), ("02", "005", "000300", "1", "1001")]  # fmt: skip
    csv = tmp_path / "ppmf.csv"
    ppmf_persons(gen, 400, blocks, 0.9).to_csv(csv, index=False)
    hist = read_ppmf(csv)
    h = hist.hierarchy
    rng = KeyedRNG.reproducible(2, warn=False)
    plan = allocation_plan(SCHEMA, levels=h.names)
    checks = ReleaseChecks(h, tables=True)
    res = stream_pl94(h, SCHEMA, SparseHistogram.of(hist), plan, rng, on_top=checks.top,
                      on_partition=checks.partition, options=Pl94StreamOptions())  # fmt: skip
    assert res.persons == hist.persons == 400
    out = checks.result(res.persons)
    assert out["every_level_total_equals_the_persons"] and out["invariants_exact"]
    assert (
        out["children_sum_to_parent_cell_by_cell"] and out["table_identities_exact_at_every_node"]
    )


def test_a_store_closed_without_its_manifest_is_not_kept(state, tmp_path) -> None:
    h, _ = state
    path = tmp_path / "store"
    with pytest.raises(DataError, match="finish"), Pl94StoreWriter(path, h, SCHEMA):
        pass
    assert not path.exists() and not list(tmp_path.iterdir())


def test_overwrite_replaces_only_a_pl94_store(state, tmp_path) -> None:
    """``overwrite`` replaces an earlier store once the new one is complete, and refuses,
    touching nothing, a directory that is not a store or a store holding a file it does not
    list (the national benchmark's ``--out`` reuses its store path)."""
    h, source = state
    rng = KeyedRNG.reproducible(5, warn=False)
    path = tmp_path / "store"
    first = _store(h, source, rng, path, partitions=2)

    def write_again() -> dict:
        with Pl94StoreWriter(path, h, SCHEMA, overwrite=True) as w:
            res = stream_pl94(h, SCHEMA, source, PLAN, rng, on_top=w.top,
                              on_partition=w.partition,
                              options=Pl94StreamOptions(partitions=3))  # fmt: skip
            return w.finish(res, QUERIES)

    assert write_again()["digest"] == first["digest"] == Pl94Store(path).verify()
    (path / "notes.txt").write_text("mine")
    with pytest.raises(SpecError, match="notes.txt"):
        write_again()
    assert (path / "notes.txt").read_text() == "mine"
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("a,b\n")
    with pytest.raises(SpecError, match="not a pl94 store|no readable"):
        with Pl94StoreWriter(other, h, SCHEMA, overwrite=True):
            pass
    assert (other / "data.csv").read_text() == "a,b\n" and len(list(other.iterdir())) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "store"]


def test_compressed_pieces_keep_the_digest_of_the_content(state, tmp_path) -> None:
    """The same store with its pieces decompressed (format /1, plain ``.npy``) reads back
    the same tables and the same digest: the digest is of the content, not the bytes; the
    gzip tables take well under their plain bytes (2.1× smaller here)."""
    import gzip
    import json

    h, source = state
    rng = KeyedRNG.reproducible(11, warn=False)
    path = tmp_path / "z" / "store"
    summary = _store(h, source, rng, path, partitions=2)
    plain = tmp_path / "plain"
    sums = json.loads((path / "checksums.json").read_text())
    files, packed, unpacked = {}, 0, 0
    for rel in sums["files"]:
        data = (path / rel).read_bytes()
        if rel.endswith(".gz"):
            size = len(data)
            data = gzip.decompress(data)
            if rel.startswith("tables/"):
                packed, unpacked = packed + size, unpacked + len(data)
            rel = rel[: -len(".gz")]
        (plain / rel).parent.mkdir(parents=True, exist_ok=True)
        (plain / rel).write_bytes(data)
        files[rel] = hashlib.sha256(data).hexdigest()
    manifest = json.loads((plain / "manifest.json").read_text())
    manifest["format"] = "censusdp-pl94-store/1"
    text = json.dumps(manifest).encode()
    (plain / "manifest.json").write_bytes(text)
    files["manifest.json"] = hashlib.sha256(text).hexdigest()
    (plain / "checksums.json").write_text(json.dumps({**sums, "files": files}))
    old = Pl94Store(plain)
    assert old.verify() == summary["digest"] == Pl94Store(path).verify()
    for lvl in h.names:
        assert np.array_equal(old.tables(lvl), Pl94Store(path).tables(lvl))
    assert packed < unpacked / 1.8


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(0, 3000), st.integers(0, 2**32 - 1))
def test_answers_from_entries_equal_the_dense_answers(n: int, n_entries: int, seed: int) -> None:
    """Leaves' answers from their entries (repeats adding, empty leaves, large counts) are
    the integers of the per-axis sums over the dense histograms."""
    gen = np.random.default_rng(seed)
    node = np.sort(gen.integers(0, n, n_entries))
    cell = gen.integers(0, SCHEMA.n_cells, n_entries)
    count = gen.integers(1, 2**40, n_entries) if seed % 2 else gen.integers(1, 5, n_entries)
    dense = np.zeros((n, SCHEMA.n_cells), np.int64)
    np.add.at(dense, (node, cell), count)
    want = apply_queries(QUERIES, dense.reshape(n, *SCHEMA.shape))
    got = answers_from_entries(QUERIES, node, cell, count, n, SCHEMA.n_cells)
    assert set(got) == set(want)
    for name, w in want.items():
        assert got[name].dtype == np.int64 and np.array_equal(got[name], w), name
