"""Stages chained through executor handles (measurements, upward states and the release's
pieces left where they were computed) give the single-process numbers bit for bit."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil

import numpy as np
import pytest

from censusdp.errors import DataError
from censusdp.estimation.gls.tree import tree_gls
from censusdp.estimation.integer.laminar import round_release
from censusdp.hierarchy import Hierarchy
from censusdp.jsonable import to_jsonable
from censusdp.mechanisms.laws import Gaussian, Laplace
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.pipelines.execute import open_executor
from censusdp.pipelines.gls_partitioned import partitioned_gls, partitioned_round
from censusdp.pipelines.io import release_store
from censusdp.pipelines.io.release_store import read_release, write_release
from censusdp.pipelines.measure import PartitionedMeasurements, measure_partitioned
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.partitioned_release import PartitionedRelease
from censusdp.rng import KeyedRNG

CELLS = ["a", "b", "c"]


def _tree():
    gen = np.random.default_rng(11)  # test fixture shape only
    f1 = gen.integers(1, 6, 9)
    f2 = gen.integers(1, 8, int(f1.sum()))
    f3 = gen.integers(1, 5, int(f2.sum()))
    sizes = [1, 9, int(f1.sum()), int(f2.sum()), int(f3.sum())]
    names = ["nation", "state", "county", "tract", "block"]
    codes = [[f"{n[0]}{i}" for i in range(s)] for n, s in zip(names, sizes, strict=True)]
    parents = [None, np.zeros(9, int)] + [
        np.repeat(np.arange(s), f) for s, f in zip(sizes[1:4], (f1, f2, f3), strict=True)
    ]
    h = Hierarchy.from_parents(names, codes, parents)
    return h, h.aggregate(gen.integers(0, 30, (h.leaves.size, len(CELLS))))


def _plan(kind: str):
    tot, det = Query.total(CELLS), Query.detailed(CELLS)
    if kind == "diagonal":
        return [(k, det, Gaussian(s)) for k, s in ((2, 2.0), (3, 1.5), (4, 3.0))]
    half = Query.marginal("halves", CELLS, {"x": CELLS[:1], "y": CELLS[1:]})
    return [(1, half, Laplace(2.0)), (2, tot, Gaussian(1.5)), (3, half, Gaussian(2.0))] + [
        (3, tot, Laplace(1.0)),
        (4, det, Gaussian(2.5)),
    ]


def _equal(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _check(ex, kinds=("diagonal", "general"), cuts=(1, 2, 4), n_parts=(1, 3, 17)) -> None:
    h, counts = _tree()
    rng = KeyedRNG.reproducible(7, warn=False)
    for kind in kinds:
        plan = _plan(kind)
        det = Query.detailed(CELLS) if kind == "diagonal" else Query.total(CELLS)
        invs = [invariant(counts, 0, det), invariant(counts, 1, det)]
        meas = measure(h.names, counts, plan, rng)
        ref = tree_gls(h, CELLS, meas, invs, None)
        want = {m: round_release(ref, rng, method=m) for m in ("cells", "totals", "bipartite")}
        for cut in cuts:
            for n in n_parts:
                parts = partition_units(h, cut, n)
                where = f"{kind}, cut {cut}, {len(parts)} partitions"
                pm = measure_partitioned(h.names, counts, plan, rng, parts, ex, keep=True)
                assert isinstance(pm, PartitionedMeasurements)
                pm.wait()
                for method, w in want.items():
                    _check_kept(h, pm, invs, parts, ex, rng, ref, method, w, where)
                    if method == "bipartite":
                        continue
                    got = partitioned_gls(h, CELLS, pm, invs, None, parts, ex)
                    assert _equal(got.estimates, ref.estimates), where
                    assert _equal(got.variances, ref.variances), where
                    r = partitioned_round(got, rng, parts, ex, method=method)
                    assert r.integer and _equal(r.estimates, w.estimates), (where, method)
                    assert _equal(r.variances, w.variances), (where, method)
                    assert (
                        r.diagnostics["rounding_variance_max"]
                        == w.diagnostics["rounding_variance_max"]
                    )
                # the plain list, and handles used with other partitions, give the same
                assert all(
                    np.array_equal(a.values, b.values)
                    for a, b in zip(pm.gather(), meas, strict=True)
                )
                other = partition_units(h, cut, n + 1)
                got2 = partitioned_gls(h, CELLS, pm, invs, None, other, ex)
                assert _equal(got2.estimates, ref.estimates), where
                r2 = partitioned_round(got2, rng, parts, ex, method="cells")
                assert _equal(r2.estimates, want["cells"].estimates), where


def _check_kept(h, pm, invs, parts, ex, rng, ref, method, want, where) -> None:
    """GLS kept with the executor, rounded there, then gathered: the same numbers."""
    cut = parts[0].cut
    kept = partitioned_gls(h, CELLS, pm, invs, None, parts, ex, keep=True)
    assert isinstance(kept, PartitionedRelease)
    assert _equal(kept.estimates, ref.estimates[: cut + 1]), where
    for key in ("max_consistency_residual", "max_invariant_residual"):
        assert kept.diagnostics[key] == ref.diagnostics[key], (where, key)
    r = partitioned_round(kept, rng, parts, ex, method=method)
    if cut < h.depth - 1 and not (method == "bipartite" and cut > h.depth - 2):
        assert isinstance(r, PartitionedRelease) and r.integer
        assert np.array_equal(r.totals(cut), want.estimates[cut].sum(1)), (where, method)
        r = r.gather()
    assert r.integer and _equal(r.estimates, want.estimates), (where, method)
    assert _equal(r.variances, want.variances), (where, method)
    assert r.diagnostics["rounding_variance_max"] == want.diagnostics["rounding_variance_max"]
    if isinstance(kept, PartitionedRelease) and kept.pieces:
        whole = kept.gather()
        assert _equal(whole.estimates, ref.estimates) and _equal(whole.variances, ref.variances)
        kept.drop()
        with pytest.raises(ValueError, match="dropped"):
            kept.gather()


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_chained_stages_are_bit_identical(scheduler):
    with open_executor(scheduler, workers=2) as ex:
        _check(ex)


def _executor(scheduler: str, request: pytest.FixtureRequest):
    """The shared cluster (``dask_executor`` in conftest) for ``distributed``, a fresh
    executor otherwise."""
    if scheduler == "distributed":
        return contextlib.nullcontext(request.getfixturevalue("dask_executor"))
    return open_executor(scheduler, workers=2)


@pytest.mark.parametrize(
    ("kinds", "cuts", "n_parts"),
    [
        (("general",), (1,), (3,)),
        pytest.param(("diagonal", "general"), (1, 3), (3, 17), marks=pytest.mark.slow),
    ],
    ids=["fast", "full"],
)
def test_chained_stages_on_a_dask_local_cluster_are_bit_identical(
    dask_executor, kinds, cuts, n_parts
):
    _check(dask_executor, kinds=kinds, cuts=cuts, n_parts=n_parts)


def test_non_finite_kept_measurements_are_refused():
    h, counts = _tree()
    plan = _plan("diagonal")
    rng = KeyedRNG.reproducible(7, warn=False)
    parts = partition_units(h, 1, 3)
    det = Query.detailed(CELLS)
    invs = [invariant(counts, 0, det), invariant(counts, 1, det)]
    with open_executor("sync") as ex:
        pm = measure_partitioned(h.names, counts, plan, rng, parts, ex, keep=True)
        pm.handles[1][2][0, 0] = np.nan
        with pytest.raises(DataError, match="non-finite"):
            partitioned_gls(h, CELLS, pm, invs, None, parts, ex)


def test_dask_gather_rebuilds_a_cancelled_chain(dask_executor):
    import operator

    ex = dask_executor
    first = ex.submit(operator.neg, [1, 2, 3])
    second = ex.submit(sum, [(h, 10) for h in first])
    ex.release(first)  # the chain still knows how to recompute them
    assert ex.gather(second) == [9, 8, 7]
    ex.client.cancel([h.future for h in second])  # what Dask does to a lost task
    assert ex.gather(second) == [9, 8, 7]
    ex.release(second)


def test_a_kept_release_rounded_on_other_partitions_stays_usable():
    h, counts = _tree()
    plan = _plan("diagonal")
    rng = KeyedRNG.reproducible(7, warn=False)
    det = Query.detailed(CELLS)
    invs = [invariant(counts, 0, det), invariant(counts, 1, det)]
    ref = tree_gls(h, CELLS, measure(h.names, counts, plan, rng), invs, None)
    parts, other = partition_units(h, 2, 3), partition_units(h, 2, 5)
    with open_executor("threads", workers=2) as ex:
        pm = measure_partitioned(h.names, counts, plan, rng, parts, ex, keep=True)
        kept = partitioned_gls(h, CELLS, pm, invs, None, parts, ex, keep=True)
        r = partitioned_round(kept, rng, other, ex, method="totals")  # gathered, then rounded
        assert _equal(r.estimates, round_release(ref, rng, method="totals").estimates)
        assert _equal(kept.gather().estimates, ref.estimates)  # still the caller's
        kept.drop()


@pytest.mark.parametrize("scheduler", ["sync", "distributed"])
def test_a_plain_release_cut_into_pieces_gathers_back_whole(scheduler, request):
    h, counts = _tree()
    rng = KeyedRNG.reproducible(7, warn=False)
    det = Query.detailed(CELLS)
    invs = [invariant(counts, 0, det), invariant(counts, 1, det)]
    ref = tree_gls(h, CELLS, measure(h.names, counts, _plan("general"), rng), invs, None)
    with _executor(scheduler, request) as ex:
        kept = PartitionedRelease.of(ref, partition_units(h, 2, 4), ex)
        got = kept.gather()
        kept.drop()
    assert _equal(got.estimates, ref.estimates) and _equal(got.variances, ref.variances)


def _kept_releases(ex, cut: int, n: int):
    """A kept GLS release (with covariances) of the fixture and its kept rounding."""
    h, counts = _tree()
    rng = KeyedRNG.reproducible(7, warn=False)
    det = Query.detailed(CELLS)
    invs = [invariant(counts, 0, det), invariant(counts, 1, det)]
    parts = partition_units(h, cut, n)
    pm = measure_partitioned(h.names, counts, _plan("diagonal"), rng, parts, ex, keep=True)
    gls = partitioned_gls(h, CELLS, pm, invs, None, parts, ex, keep=True, covariance=True)
    return h, gls, partitioned_round(gls, rng, parts, ex, method="cells")


def _same_release(got, want) -> None:
    assert got.estimator == want.estimator and got.cells == want.cells
    assert got.integer == want.integer and got.privacy == want.privacy
    assert got.diagnostics == to_jsonable(want.diagnostics)
    for name in ("estimates", "variances", "covariances"):
        a, b = getattr(got, name), getattr(want, name)
        assert _equal(a, b), name
        assert b is None or [x.dtype for x in a] == [y.dtype for y in b], name


@pytest.mark.parametrize(
    "scheduler, cut, n_parts",
    [
        ("sync", 1, (1, 3, 17)),
        ("sync", 3, (4,)),
        ("threads", 2, (3,)),
        ("distributed", 2, (3,)),
        pytest.param("distributed", 2, (17,), marks=pytest.mark.slow),
    ],
)
def test_a_release_written_where_it_was_computed_reads_back_whole(
    scheduler, cut, n_parts, tmp_path, request
):
    with _executor(scheduler, request) as ex:
        for n in n_parts:
            h, gls, rounded = _kept_releases(ex, cut, n)
            for name, kept in (("gls", gls), ("rounded", rounded)):
                where = write_release(kept, tmp_path / f"{name}-{n}")
                _same_release(read_release(where, h), kept.gather())
                plain = kept.gather()
                _same_release(
                    read_release(write_release(plain, tmp_path / f"p{name}-{n}"), h), plain
                )
                bare = dataclasses.replace(plain, variances=None, covariances=None)  # TopDown's
                _same_release(read_release(write_release(bare, tmp_path / f"b{name}-{n}"), h), bare)
                kept.drop()


def test_a_release_store_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    with open_executor("sync") as ex:
        h, gls, rounded = _kept_releases(ex, 2, 3)
        target = tmp_path / "store"
        write_release(rounded, target)
        with pytest.raises(FileExistsError, match="overwrite=True"):
            write_release(gls, target)
        write_release(gls, target, overwrite=True)
        assert not read_release(target, h).integer  # replaced by the GLS release

        calls = []

        def failing_save(path, array):
            calls.append(path)
            if path.name.startswith("part-00002"):
                raise OSError("disk full")
            return save(path, array)

        def killed_first(path, array):  # a task that died mid-write, then its rerun
            path.with_name(f".{path.name}.999.tmp").write_bytes(b"half")
            return save(path, array)

        save = release_store._save
        monkeypatch.setattr(release_store, "_save", killed_first)
        write_release(rounded, tmp_path / "rerun")
        assert not list((tmp_path / "rerun").rglob("*.tmp"))
        shutil.rmtree(tmp_path / "rerun")
        monkeypatch.setattr(release_store, "_save", failing_save)
        with pytest.raises(OSError, match="disk full"):
            write_release(rounded, tmp_path / "half")
        assert calls and not (tmp_path / "half").exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # no temporary left
        monkeypatch.undo()
        with pytest.raises(DataError, match="not visible where partition 0's task runs"):
            release_store._write_piece((None, 0), str(tmp_path / "elsewhere"), [], [])
        rounded.drop()
        with pytest.raises(ValueError, match="dropped"):
            write_release(rounded, tmp_path / "dropped")
        assert not (tmp_path / "dropped").exists()
        gls.drop()


def test_reading_a_damaged_or_foreign_release_store_names_the_problem(tmp_path):
    with open_executor("sync") as ex:
        h, gls, rounded = _kept_releases(ex, 2, 3)
        store = write_release(rounded, tmp_path / "store")
        gls.drop()
        rounded.drop()
    lv = h.levels
    fewer_blocks = Hierarchy.from_parents(
        h.names,
        [v.codes for v in lv[:-1]] + [lv[-1].codes[:-1]],
        [v.parent for v in lv[:-1]] + [lv[-1].parent[:-1]],
    )
    with pytest.raises(DataError, match=r"level 4 is 'block' with \d+ nodes in the store but"):
        read_release(store, fewer_blocks)
    with pytest.raises(DataError, match="not a release store"):
        read_release(tmp_path, h)
    part = store / "variances" / "block" / "part-00001.npy"
    part.rename(part.with_suffix(".bak"))
    with pytest.raises(DataError, match="part-00001.npy is missing"):
        read_release(store, h)
    part.with_suffix(".bak").rename(part)
    (store / "estimates" / "tract" / "part-00002.npy").write_bytes(b"not an array")
    with pytest.raises(DataError, match="part-00002.npy: its SHA-256 does not match"):
        read_release(store, h)
    manifest = json.loads((store / "manifest.json").read_text())
    (store / "manifest.json").write_text(json.dumps({**manifest, "format": 99}))
    with pytest.raises(DataError, match="format 99"):
        read_release(store, h)
