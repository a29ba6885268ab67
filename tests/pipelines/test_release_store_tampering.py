"""Tampered or damaged release stores are refused with a message naming the part (file, key),
never a raw KeyError/IndexError; a store passes only if its checksums, manifest, dtypes,
shapes and values all hold. (Round trips: tests/pipelines/test_chained_stages.py.)

The store keeps the variances of a rounded release's tracked sums
(:class:`~censusdp.estimation.release.SumVariances`): read back, ``sum_variances`` and
``sum_standard_errors`` equal the original's bit for bit, plain or partitioned."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError
from censusdp.estimation.integer.laminar import round_release
from censusdp.estimation.release import Release
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.pipelines.execute import open_executor
from censusdp.pipelines.gls_partitioned import partitioned_gls, partitioned_round
from censusdp.pipelines.io.release_store import read_release, write_release
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.partitioned_release import PartitionedRelease
from censusdp.rng import KeyedRNG

CELLS = ["a", "b"]
PRIVACY = PrivacyStatement(
    "zcdp", rho=0.5, invariants=("state: total",), mechanism="discrete_gaussian"
)


def _problem():
    gen = np.random.default_rng(4)  # fixture shape only
    fan1 = gen.integers(1, 5, 4)
    fan2 = gen.integers(1, 4, int(fan1.sum()))
    h = Hierarchy.from_parents(
        ["nation", "state", "county", "tract"],
        [
            ["US"],
            [f"s{i}" for i in range(4)],
            [f"c{i}" for i in range(int(fan1.sum()))],
            [f"t{i}" for i in range(int(fan2.sum()))],
        ],
        [
            None,
            np.zeros(4, int),
            np.repeat(np.arange(4), fan1),
            np.repeat(np.arange(fan1.sum()), fan2),
        ],
    )
    counts = h.aggregate(gen.integers(0, 30, (h.leaves.size, 2)))
    plan = [(k, Query.detailed(CELLS), DiscreteGaussian(2.0)) for k in range(4)]
    rng = KeyedRNG.reproducible(2, warn=False)
    meas = measure(h.names, counts, plan, rng)
    invs = [invariant(counts, 1, Query.total(CELLS))]
    return h, meas, invs, rng


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A partitioned real store (cut at states, 3 partitions) and a plain integer store."""
    h, meas, invs, rng = _problem()
    root = tmp_path_factory.mktemp("stores")
    with open_executor("sync") as ex:
        kept = partitioned_gls(
            h, CELLS, meas, invs, PRIVACY, partition_units(h, 1, 3), ex, keep=True
        )
        real = write_release(kept, root / "real")
        gls = kept.gather()
    integer = write_release(round_release(gls, rng, method="totals"), root / "integer")
    return h, real, integer, gls


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _reseal(store: Path) -> None:
    """Rewrite checksums.json to match the files (a tamperer who also fixes the checksums):
    what is then refused is refused by the independent checks."""
    sums = json.loads((store / "checksums.json").read_text())
    for rel in sums["files"]:
        sums["files"][rel] = hashlib.sha256((store / rel).read_bytes()).hexdigest()
    (store / "checksums.json").write_text(json.dumps(sums))


def _edit_manifest(store: Path, **changes) -> None:
    m = json.loads((store / "manifest.json").read_text())
    for key, value in changes.items():
        if "." in key:
            outer, inner = key.split(".")
            m[outer][inner] = value
        else:
            m[key] = value
    (store / "manifest.json").write_text(json.dumps(m))


def test_a_sound_store_reads_back_bit_exact(stores):
    h, real, integer, gls = stores
    got = read_release(real, h)
    assert all(np.array_equal(a, b) for a, b in zip(got.estimates, gls.estimates, strict=True))
    assert got.privacy == gls.privacy and not got.integer
    back = read_release(integer, h)
    assert back.integer and all(e.dtype == np.int64 for e in back.estimates)
    sums = json.loads((real / "checksums.json").read_text())
    files = {str(p.relative_to(real)) for p in real.rglob("*") if p.is_file()}
    assert set(sums["files"]) == files - {"checksums.json"}


def test_a_manifest_claiming_another_budget_is_refused(stores, tmp_path):
    h, real, *_ = stores
    store = _copy(real, tmp_path / "s")
    _edit_manifest(store, **{"privacy.rho": 1e-9})
    with pytest.raises(
        DataError, match=r"manifest.json: its SHA-256 does not match checksums.json"
    ):
        read_release(store, h)
    _reseal(store)
    assert read_release(store, h).privacy.rho == 1e-9  # the checksum is no signature
    for bad in (-1.0, 0.0, "1", None, True):
        _edit_manifest(store, **{"privacy.rho": bad})
        _reseal(store)
        with pytest.raises(DataError, match=r"manifest.json: manifest key 'privacy"):
            read_release(store, h)


def test_integer_claimed_over_float_arrays_is_refused(stores, tmp_path):
    h, real, integer, _ = stores
    store = _copy(real, tmp_path / "s")
    _edit_manifest(store, integer=True)
    with pytest.raises(DataError, match="manifest.json: its SHA-256"):
        read_release(store, h)
    _reseal(store)
    with pytest.raises(
        DataError, match=r"estimates/nation.npy: dtype float64, expected int64 \(integer: true\)"
    ):
        read_release(store, h)
    store = _copy(integer, tmp_path / "i")
    _edit_manifest(store, integer=False)
    _reseal(store)
    with pytest.raises(DataError, match=r"dtype int64, expected float64 \(integer: false\)"):
        read_release(store, h)
    _edit_manifest(store, integer="yes")
    _reseal(store)
    with pytest.raises(DataError, match="manifest key 'integer': expected true or false"):
        read_release(store, h)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_estimates_are_refused(stores, tmp_path, value):
    h, real, *_ = stores
    store = _copy(real, tmp_path / "s")
    file = store / "estimates" / "tract" / "part-00001.npy"
    a = np.load(file)
    a[0, 1] = value
    np.save(file, a)
    with pytest.raises(DataError, match="part-00001.npy: its SHA-256 does not match"):
        read_release(store, h)
    _reseal(store)
    with pytest.raises(
        DataError, match=r"tract/part-00001.npy: 1 non-finite values \(NaN or inf\)"
    ):
        read_release(store, h)


def test_writing_a_non_finite_release_is_refused(stores, tmp_path):
    *_, gls = stores
    import dataclasses

    bad = dataclasses.replace(gls, estimates=[e.copy() for e in gls.estimates])
    bad.estimates[2][0, 0] = np.nan
    with pytest.raises(DataError, match="estimates/county.npy: 1 non-finite"):
        write_release(bad, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("dtype", ["int8", "int32", "float32", "float16", "uint64", "complex128"])
def test_arrays_of_another_dtype_are_refused(stores, tmp_path, dtype):
    h, real, integer, _ = stores
    for name, src in (("real", real), ("integer", integer)):
        store = _copy(src, tmp_path / name)
        file = store / "estimates" / "state.npy"
        np.save(file, np.load(file).astype(dtype))
        _reseal(store)
        with pytest.raises(DataError, match=f"estimates/state.npy: dtype {dtype}, expected"):
            read_release(store, h)


def test_an_object_array_is_refused_without_unpickling(stores, tmp_path):
    h, real, *_ = stores
    store = _copy(real, tmp_path / "s")
    file = store / "variances" / "state.npy"
    np.save(file, np.array([[1.0, 2.0]] * 4, dtype=object), allow_pickle=True)
    _reseal(store)
    with pytest.raises(DataError, match="variances/state.npy: not a readable .npy array"):
        read_release(store, h)


@pytest.mark.parametrize(
    "fields",
    [
        ["estimates", "../x"],
        ["estimates", "/etc/passwd"],
        ["estimates", "variances/../../x"],
        ["estimates", "a\\b"],
        ["estimates", ""],
        ["estimates", 7],
        "estimates",
        ["variances"],
        ["estimates", "estimates"],
    ],
)
def test_path_like_or_bad_fields_are_refused(stores, tmp_path, fields):
    h, real, *_ = stores
    store = _copy(real, tmp_path / "s")
    _edit_manifest(store, fields=fields)
    _reseal(store)
    with pytest.raises(DataError, match="manifest.json: manifest key 'fields'"):
        read_release(store, h)


@pytest.mark.parametrize("cut", [4, 99, -1, "1", 1.0, True, None, [1]])
def test_bad_cut_values_are_refused(stores, tmp_path, cut):
    h, real, *_ = stores
    store = _copy(real, tmp_path / "s")
    _edit_manifest(store, cut=cut)
    _reseal(store)
    with pytest.raises(DataError, match="manifest.json: manifest key 'cut'"):
        read_release(store, h)


@pytest.mark.parametrize(
    "edit",
    [
        {"cut": 2},  # another valid level, inconsistent with the partitions
        {"partitions": []},
        {"partitions": [[[0, 3]]]},
        {"partitions": "x"},
        {"partitions": [[[0, 1], [0, 2]], [[1, 99], [2, 3]]]},
        {"cells": ["a"]},
        {"cells": []},
        {"cells": ["a", "a"]},
        {"levels": "nation"},
        {"sizes": [1, "4", 3, 5]},
        {"estimator": 3},
        {"diagnostics": []},
        {"privacy": "ε = 1"},
        {"privacy.accounting": "renyi"},
    ],
)
def test_other_malformed_manifests_name_the_key(stores, tmp_path, edit):
    h, real, *_ = stores
    store = _copy(real, tmp_path / "s")
    _edit_manifest(store, **edit)
    _reseal(store)
    with pytest.raises(DataError, match=r"manifest\.json|\.npy"):
        read_release(store, h)


def test_a_flipped_byte_in_any_array_is_refused(stores, tmp_path):
    h, real, *_ = stores
    for i, file in enumerate(sorted(real.rglob("*.npy"))):
        store = _copy(real, tmp_path / f"s{i}")
        target = store / file.relative_to(real)
        data = bytearray(target.read_bytes())
        data[-1] ^= 0x01  # the last byte of the array data
        target.write_bytes(bytes(data))
        with pytest.raises(DataError, match=f"{target.name}: its SHA-256 does not match"):
            read_release(store, h)


def test_missing_or_damaged_checksums_are_refused(stores, tmp_path):
    h, real, *_ = stores
    store = _copy(real, tmp_path / "s")
    (store / "checksums.json").unlink()
    with pytest.raises(DataError, match="checksums.json is missing"):
        read_release(store, h)
    for bad in ("{", "[]", '{"algorithm": "md5", "files": {}}', '{"algorithm": "sha256"}'):
        (store / "checksums.json").write_text(bad)
        with pytest.raises(DataError, match="checksums.json"):
            read_release(store, h)
    _copy(real, tmp_path / "t")
    sums = json.loads((real / "checksums.json").read_text())
    rel = "estimates/state.npy"
    for files, match in (
        ({k: v for k, v in sums["files"].items() if k != rel}, f"no checksum for {rel}"),
        ({**sums["files"], rel: "00"}, "is not a SHA-256 hex digest"),
        ({**sums["files"], "../../etc/passwd": "0" * 64}, "lists ../../etc/passwd"),
    ):
        (tmp_path / "t" / "checksums.json").write_text(json.dumps({**sums, "files": files}))
        with pytest.raises(DataError, match=match):
            read_release(tmp_path / "t", h)


def test_a_store_of_the_previous_format_is_refused(stores, tmp_path):
    h, real, *_ = stores
    store = _copy(real, tmp_path / "s")
    _edit_manifest(store, format=1)
    (store / "checksums.json").unlink()
    with pytest.raises(DataError, match="format 1 is not 3; write the release again"):
        read_release(store, h)


# Variances of tracked sums

QUERIES = (Query.total(CELLS), Query.detailed(CELLS))


def _same_sums(got: Release, want: Release) -> None:
    """Equal tracked sums, array by array (NaN where NaN), and equal ``sum_variances`` and
    ``sum_standard_errors`` wherever the original has them."""
    a, b = got.sums, want.sums
    assert a is not None and b is not None
    assert a.labels == b.labels and np.array_equal(a.masks, b.masks) and a.masks.dtype == bool
    for x, y in zip([*a.estimator, *a.rounding], [*b.estimator, *b.rounding], strict=True):
        assert x.dtype == y.dtype == np.float64
        assert np.array_equal(x, y, equal_nan=True)
    h = want.hierarchy
    for k in range(h.depth):
        for q in QUERIES:
            r = want.sum_variances(k, q, rounding_only=True)
            assert np.array_equal(got.sum_variances(k, q, rounding_only=True), r)
            if not np.isnan(want.sums.estimator[k][:, want.sums.index(q.matrix)]).any():
                assert np.array_equal(got.sum_variances(k, q), want.sum_variances(k, q))
                assert np.array_equal(got.sum_standard_errors(k, q), want.sum_standard_errors(k, q))


@pytest.fixture(scope="module")
def rounded(tmp_path_factory):
    """Rounded releases (with and without the estimator's covariances: the latter's sums of
    several cells have NaN estimator variances) and their plain stores."""
    h, meas, invs, rng = _problem()
    root = tmp_path_factory.mktemp("sums")
    out = {}
    with open_executor("sync") as ex:
        for cov in (True, False):
            gls = partitioned_gls(
                h, CELLS, meas, invs, PRIVACY, partition_units(h, 1, 2), ex, covariance=cov
            )
            r = round_release(gls, rng.child("round"), method="totals", invariants=invs)
            out[cov] = (r, write_release(r, root / f"cov{cov}"))
    return h, invs, rng, out


@pytest.mark.parametrize("cov", [True, False])
def test_a_rounded_release_keeps_its_sum_variances(rounded, cov):
    h, _, _, out = rounded
    release, store = out[cov]
    assert np.isnan(release.sums.estimator[0]).any() != cov  # both cases are exercised
    _same_sums(read_release(store, h), release)
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["sums"] == {"masks": [[0], [1], [0, 1]], "labels": ["a", "b", "total"]}


@pytest.mark.parametrize("cut,n_parts", [(1, 3), (2, 2), (2, 5)])
def test_a_partitioned_rounded_release_keeps_its_sum_variances(rounded, tmp_path, cut, n_parts):
    h, invs, rng, out = rounded
    _, meas, *_ = _problem()
    parts = partition_units(h, cut, n_parts)
    with open_executor("sync") as ex:
        kept = partitioned_gls(h, CELLS, meas, invs, PRIVACY, parts, ex, keep=True, covariance=True)
        r = partitioned_round(kept, rng.child("round"), parts, ex, method="totals", invariants=invs)
        assert isinstance(r, PartitionedRelease) and r.sums is not None
        store = write_release(r, tmp_path / "p")
        whole = r.gather()
    files = {str(p.relative_to(store)) for p in store.rglob("*.npy")}
    assert f"sums_rounding/{h.names[-1]}/part-{n_parts - 1:05d}.npy" in files
    assert f"sums_estimator/{h.names[cut]}.npy" in files
    got = read_release(store, h)
    _same_sums(got, whole)
    _same_sums(got, out[True][0])  # and the single-process rounding's


def test_a_release_without_sums_still_round_trips(rounded, tmp_path):
    h, _, _, out = rounded
    bare = dataclasses.replace(out[True][0], sums=None)
    store = write_release(bare, tmp_path / "bare")
    assert json.loads((store / "manifest.json").read_text())["sums"] is None
    assert not any(p.name.startswith("sums_") for p in store.iterdir())
    got = read_release(store, h)
    assert got.sums is None and got.integer
    assert all(np.array_equal(a, b) for a, b in zip(got.estimates, bare.estimates, strict=True))


def _sum_file(store: Path) -> Path:
    return store / "sums_rounding" / "county.npy"


@pytest.mark.parametrize(
    "value,match",
    [
        (np.inf, "1 infinite values"),
        (-np.inf, "1 infinite values"),
        (-1e-3, "1 negative values"),
    ],
)
def test_tampered_sum_values_are_refused(rounded, tmp_path, value, match):
    h, _, _, out = rounded
    store = _copy(out[True][1], tmp_path / "s")
    a = np.load(_sum_file(store))
    a[1, 2] = value
    np.save(_sum_file(store), a)
    with pytest.raises(DataError, match="sums_rounding/county.npy: its SHA-256 does not match"):
        read_release(store, h)
    _reseal(store)
    with pytest.raises(DataError, match=f"sums_rounding/county.npy: {match}"):
        read_release(store, h)


def test_nan_is_a_legitimate_sum_variance(rounded, tmp_path):
    h, _, _, out = rounded
    store = _copy(out[True][1], tmp_path / "s")
    a = np.load(_sum_file(store))
    a[1, 2] = np.nan
    np.save(_sum_file(store), a)
    _reseal(store)
    got = read_release(store, h)
    assert np.isnan(got.sums.rounding[2][1, 2])


@pytest.mark.parametrize(
    "shape,dtype,match",
    [
        ((None, 2), "float64", r"shape \(\d+, 2\), expected \(\d+, 3\) \(rows, sums\)"),
        ((None, 4), "float64", r"shape \(\d+, 4\), expected"),
        ((3, 3), "float64", r"shape \(3, 3\), expected"),
        ((None, 3), "float32", "dtype float32, expected float64 \\(variances of sums\\)"),
    ],
)
def test_sum_arrays_of_the_wrong_shape_or_dtype_are_refused(rounded, tmp_path, shape, dtype, match):
    h, _, _, out = rounded
    store = _copy(out[True][1], tmp_path / "s")
    a = np.load(_sum_file(store))
    rows = a.shape[0] if shape[0] is None else shape[0]
    np.save(_sum_file(store), np.resize(a, (rows, shape[1])).astype(dtype))
    _reseal(store)
    with pytest.raises(DataError, match=f"sums_rounding/county.npy: {match}"):
        read_release(store, h)


@pytest.mark.parametrize(
    "sums,key",
    [
        ({"masks": [[0], [1], [0, 2]], "labels": ["a", "b", "total"]}, "sums.masks"),  # width
        ({"masks": [[0], [1], [-1]], "labels": ["a", "b", "total"]}, "sums.masks"),
        ({"masks": [[0], [1], [1, 0]], "labels": ["a", "b", "total"]}, "sums.masks"),
        ({"masks": [[0], [1], [0, 0]], "labels": ["a", "b", "total"]}, "sums.masks"),
        ({"masks": [[0], [1], [0]], "labels": ["a", "b", "total"]}, "sums.masks"),  # twice
        ({"masks": [[0], [1], ["0"]], "labels": ["a", "b", "total"]}, "sums.masks"),
        ({"masks": [[0], [1], [True]], "labels": ["a", "b", "total"]}, "sums.masks"),
        ({"masks": [], "labels": []}, "sums.masks"),
        ({"masks": "0,1", "labels": ["a"]}, "sums.masks"),
        ({"masks": [[0], [1], [0, 1]], "labels": ["a", "b"]}, "sums.labels"),
        ({"masks": [[0], [1], [0, 1]], "labels": ["a", "b", 3]}, "sums.labels"),
        ({"masks": [[0], [1], [0, 1]], "labels": "abc"}, "sums.labels"),
        ({"masks": [[0], [1], [0, 1]]}, "sums"),
        ({"masks": [[0], [1], [0, 1]], "labels": ["a", "b", "t"], "path": "/x"}, "sums"),
        ([[0], [1]], "sums"),
    ],
)
def test_malformed_sum_manifests_name_the_key(rounded, tmp_path, sums, key):
    h, _, _, out = rounded
    store = _copy(out[True][1], tmp_path / "s")
    _edit_manifest(store, sums=sums)
    with pytest.raises(DataError, match="manifest.json: its SHA-256 does not match"):
        read_release(store, h)
    _reseal(store)
    with pytest.raises(DataError, match=f"manifest.json: manifest key '{key}'"):
        read_release(store, h)


def test_a_wider_mask_list_than_the_arrays_is_refused(rounded, tmp_path):
    h, _, _, out = rounded
    store = _copy(out[True][1], tmp_path / "s")
    _edit_manifest(store, sums={"masks": [[0], [1], [0, 1], []], "labels": ["a", "b", "t", "e"]})
    _reseal(store)
    with pytest.raises(DataError, match=r"sums_estimator/nation.npy: shape \(1, 3\), expected"):
        read_release(store, h)


def test_sums_dropped_from_the_manifest_are_refused(rounded, tmp_path):
    h, _, _, out = rounded
    store = _copy(out[True][1], tmp_path / "s")
    _edit_manifest(store, sums=None)
    _reseal(store)
    with pytest.raises(DataError, match="lists sums_estimator/.*which the manifest does not"):
        read_release(store, h)
    m = json.loads((store / "manifest.json").read_text())
    del m["sums"]
    (store / "manifest.json").write_text(json.dumps(m))
    _reseal(store)
    with pytest.raises(DataError, match="the manifest has no 'sums'"):
        read_release(store, h)


def test_a_store_of_format_2_is_refused(rounded, tmp_path):
    h, _, _, out = rounded
    store = _copy(out[True][1], tmp_path / "s")
    _edit_manifest(store, format=2)
    _reseal(store)
    with pytest.raises(DataError, match="format 2 is not 3; write the release again"):
        read_release(store, h)


@pytest.mark.parametrize("value", [np.inf, -1.0])
def test_writing_bad_sum_variances_is_refused(rounded, tmp_path, value):
    _, _, _, out = rounded
    r = out[True][0]
    bad = [x.copy() for x in r.sums.rounding]
    bad[1][0, 0] = value
    broken = dataclasses.replace(r, sums=dataclasses.replace(r.sums, rounding=bad))
    with pytest.raises(DataError, match="sums_rounding/state.npy: 1 (infinite|negative)"):
        write_release(broken, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
