"""Tampered or damaged release stores are refused with a message naming the part (file, key),
never a raw KeyError/IndexError; a store passes only if its checksums, manifest, dtypes,
shapes and values all hold. (Round trips: tests/pipelines/test_chained_stages.py.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError
from censusdp.estimation.rounding import round_release
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.pipelines.execute import open_executor
from censusdp.pipelines.gls_partitioned import partitioned_gls
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.release_store import read_release, write_release
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
