"""The pl94 release store refuses what it cannot vouch for (issue 33, item 5).

Every reproduction of the audit is a test here: a piece rewritten with ``checksums.json``, a
digest recomputed to pass :meth:`Pl94Store.verify`, a privacy statement edited in the
manifest, a NaN cell, a piece three rows short, entries leading out of the store (``..``, an
absolute path, a symbolic link) and a manifest naming a schema file elsewhere. Each must end
in a :class:`~censusdp.errors.DataError` (exit 2 from the CLI) of one line that names the
store's file or key and holds no value of the release (the forged pieces carry a sentinel the
message must not echo).

A forgery is *consistent* when the forger rewrote everything a store can check by itself
(the piece, ``checksums.json``, the manifest's ``files_digest`` and its content ``digest``):
only the release digest recorded apart from the store (``expected_digest``) can refuse it, and
the tests say so by showing both sides. The ``files_digest`` is recomputed here the obvious
way (``sha256sum`` lines of the pieces' checksums, sorted by path), independently of the
store's code.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from pl94_fixtures import PLAN, QUERIES, SCHEMA, small_us

from censusdp.errors import DataError, SpecError
from censusdp.pipelines.io.pl94_store import Pl94Store, Pl94StoreWriter
from censusdp.pipelines.io.release_store import check_array, store_file
from censusdp.pipelines.products.pl94_stream import Pl94StreamOptions, stream_pl94
from censusdp.rng import KeyedRNG

SENTINEL = 987_654_321  # planted in forged pieces: no message may show it
PIECE = "tables/block/part-00000.npy.gz"


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """A small store (six levels, 60 blocks, two partitions, histograms kept), the writer's
    summary and the tables the writer saw, per level."""
    h, source = small_us(counties=3, tracts=5, block_groups=8, blocks=60, population=2000)
    path = tmp_path_factory.mktemp("pl94") / "store"
    tables: dict = {}

    with Pl94StoreWriter(path, h, SCHEMA, histograms=True) as w:

        def on_top(t) -> None:
            for j, lvl in enumerate(t.piece.names):
                tables.setdefault(lvl, []).append((t.piece.ranges[j][0], np.array(t.tables[j])))
            w.top(t)

        def on_partition(p) -> None:
            for j, lvl in enumerate(p.piece.names):
                tables.setdefault(lvl, []).append((p.piece.ranges[j][0], np.array(p.tables[j])))
            w.partition(p)

        res = stream_pl94(h, SCHEMA, source, PLAN, KeyedRNG.reproducible(11, warn=False),
                          on_top=on_top, on_partition=on_partition,
                          options=Pl94StreamOptions(partitions=2))  # fmt: skip
        summary = w.finish(res, QUERIES)
    whole = {lvl: np.concatenate([t for _, t in sorted(v, key=lambda x: x[0])])
             for lvl, v in tables.items()}  # fmt: skip
    return path, summary, whole


@pytest.fixture
def store(original, tmp_path) -> Path:
    """A fresh copy of the original store, to tamper with."""
    path = tmp_path / "store"
    shutil.copytree(original[0], path, symlinks=True)
    return path


# -- forging ----------------------------------------------------------------------------------
def _gz(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return gzip.compress(buf.getvalue(), mtime=0)


def _read(path: Path, rel: str) -> np.ndarray:
    data = (path / rel).read_bytes()
    return np.load(io.BytesIO(gzip.decompress(data) if rel.endswith(".gz") else data))


def _sums(path: Path) -> dict:
    return json.loads((path / "checksums.json").read_text())


def _write_sums(path: Path, sums: dict) -> None:
    (path / "checksums.json").write_text(json.dumps(sums, indent=1) + "\n")


def _forge(path: Path, pieces: dict[str, bytes], *, manifest: bool, edit=None) -> None:
    """Replace ``pieces`` (path → bytes) and rewrite ``checksums.json`` to match; with
    ``manifest`` also rewrite the manifest's ``files_digest`` (and apply ``edit`` to it) so
    that the store is consistent with itself."""
    sums = _sums(path)
    for rel, data in pieces.items():
        (path / rel).write_bytes(data)
        sums["files"][rel] = hashlib.sha256(data).hexdigest()
    if manifest:
        m = json.loads((path / "manifest.json").read_text())
        lines = "".join(
            f"{sums['files'][r]}  {r}\n" for r in sorted(sums["files"]) if r != "manifest.json"
        )
        m["files_digest"] = hashlib.sha256(lines.encode()).hexdigest()
        if edit is not None:
            edit(m)
        text = (json.dumps(m, indent=1) + "\n").encode()
        (path / "manifest.json").write_bytes(text)
        sums["files"]["manifest.json"] = hashlib.sha256(text).hexdigest()
    _write_sums(path, sums)


def _refused(exc: pytest.ExceptionInfo, where: str, *secrets: object) -> str:
    """The message: one line, naming ``where``, echoing none of ``secrets``."""
    msg = str(exc.value)
    assert "\n" not in msg, msg
    assert where in msg, msg
    for s in (SENTINEL, *secrets):
        assert str(s) not in msg, msg
    return msg


def _altered_tables(path: Path) -> bytes:
    """The block piece with one cell changed to the sentinel (dtype kept wide enough)."""
    a = _read(path, PIECE).astype(np.int64)
    a[3, 0] = SENTINEL
    return _gz(a)


# -- the honest store -------------------------------------------------------------------------
def test_an_honest_store_reads_back_under_its_release_digest(original, store) -> None:
    _, summary, tables = original
    release = summary["release_digest"]
    assert release == hashlib.sha256((store / "manifest.json").read_bytes()).hexdigest()
    s = Pl94Store(store, expected_digest=release)
    assert s.release_digest == release and s.digest == summary["digest"]
    assert s.verify(release) == summary["digest"] == Pl94Store(store).verify()
    assert _content_digest(store) == summary["digest"]
    for lvl, want in tables.items():
        got = s.tables(lvl)
        assert got.dtype == np.int64 and np.array_equal(got, want), lvl
    assert np.array_equal(s.tables("block", 30, 40), tables["block"][30:40])  # across pieces
    assert np.array_equal(s.tables("tract", np.int64(1), np.int64(4)), tables["tract"][1:4])
    assert s.tables("block", 7, 7).shape == s.tables("block", 33, 33).shape == (0, 298)
    assert s.standard_errors("block", "total", 33, 33).shape == (0, 1)
    se = s.standard_errors("block", "votingage * hispanic")
    assert se.shape == (60, 4) and np.isfinite(se).all() and (se > 0).all()
    with pytest.raises(SpecError, match="expected_digest: not a SHA-256"):
        Pl94Store(store, expected_digest=release.upper())
    with pytest.raises(SpecError, match=r"nodes \[5, 61\) of level 'block'"):
        s.tables("block", 5, 61)
    with pytest.raises(SpecError, match="level 'blocks' is not in the store"):
        s.tables("blocks")


# -- the audit's reproductions ----------------------------------------------------------------
def test_a_piece_rewritten_with_the_checksums_is_refused_without_a_reference(store) -> None:
    """Audit: ``tables()`` returned altered data after a piece and ``checksums.json`` were
    rewritten. The manifest binds the pieces' checksums (``files_digest``): refused on
    opening, before any reader can return."""
    _forge(store, {PIECE: _altered_tables(store)}, manifest=False)
    with pytest.raises(DataError) as exc:
        Pl94Store(store)
    assert "files_digest" in _refused(exc, "checksums.json")


def test_standard_errors_from_rewritten_blocks_are_refused(store) -> None:
    """The same for the covariance blocks that ``standard_errors()`` reads."""
    rel = "blocks/block/part-00000.npy.gz"
    _forge(store, {rel: _gz(_read(store, rel) * 4.0)}, manifest=False)
    with pytest.raises(DataError) as exc:
        Pl94Store(store).standard_errors("block", "total")
    _refused(exc, "checksums.json")


def test_a_recomputed_digest_passes_only_without_the_release_digest(original, store) -> None:
    """Audit: a consistent forgery (piece, checksums, files_digest and content digest all
    recomputed) passed ``verify()``. No check inside a store can refuse it — its content
    digest is that of the forged content — but its release digest changed: a reader or
    ``verify`` given the recorded one refuses it, before returning anything."""
    _, summary, _ = original
    _forge(store, {PIECE: _altered_tables(store)}, manifest=True)
    with pytest.raises(DataError, match="digest of the content does not match"):
        Pl94Store(store).verify()  # the forger must recompute the content digest too
    forged_digest = _content_digest(store)
    _forge(store, {}, manifest=True, edit=lambda d: d.update(digest=forged_digest))
    assert Pl94Store(store).verify() == forged_digest != summary["digest"]  # consistent
    assert Pl94Store(store).tables("block")[3, 0] == SENTINEL  # what no reference can see
    with pytest.raises(DataError) as exc:
        Pl94Store(store, expected_digest=summary["release_digest"])
    _refused(exc, "manifest.json: its SHA-256 is not the expected release digest")
    with pytest.raises(DataError) as exc:
        Pl94Store(store).verify(summary["release_digest"])
    _refused(exc, "expected release digest")


def _content_digest(path: Path) -> str:
    """The content digest the obvious way, from the files: per level its tables (int64)
    and classes (int32) piece by piece in node order, then its class blocks (float64) in
    class order."""
    m = json.loads((path / "manifest.json").read_text())
    cut, parts = m["cut"], m["partitions"]
    hsh = hashlib.sha256()
    for k, lvl in enumerate(m["levels"]):
        if k <= cut:
            names = ["top.npy.gz"]
        else:
            names = [f"part-{i:05d}.npy.gz" for i in np.argsort([p[k - cut][0] for p in parts])]
        hsh.update(f"level {lvl}\n".encode())
        for n in names:
            hsh.update(np.ascontiguousarray(_read(path, f"tables/{lvl}/{n}"), "<i8"))
        for n in names:
            hsh.update(np.ascontiguousarray(_read(path, f"classes/{lvl}/{n}"), "<i4"))
        owned = np.concatenate([_read(path, f"owned/{lvl}/{n}") for n in names])
        flat = np.concatenate([_read(path, f"blocks/{lvl}/{n}") for n in names])
        hsh.update(np.ascontiguousarray(flat[np.argsort(owned, kind="stable")], "<f8"))
    return hsh.hexdigest()


def test_the_privacy_statement_is_inside_the_release_digest(original, store) -> None:
    """Audit: the manifest's ρ was outside the digest. Editing it (checksums rewritten)
    changes the release digest, so a reader given the recorded one refuses the store."""
    _, summary, _ = original
    rho = Pl94Store(store).privacy.rho

    def edit(m: dict) -> None:
        m["privacy"]["rho"] = rho / 10

    _forge(store, {}, manifest=True, edit=edit)
    assert Pl94Store(store).privacy.rho == rho / 10  # consistent: only a reference sees it
    assert Pl94Store(store).release_digest != summary["release_digest"]
    with pytest.raises(DataError) as exc:
        Pl94Store(store, expected_digest=summary["release_digest"])
    _refused(exc, "expected release digest", rho / 10)
    for key, value in [("schema", "h1"), ("levels", ["nation", "state", "county", "tract",
                                                     "bg", "block"])]:  # fmt: skip
        shutil.rmtree(store)
        shutil.copytree(original[0], store)
        _forge(store, {}, manifest=True, edit=lambda m, k=key, v=value: m.update({k: v}))
        with pytest.raises(DataError):
            Pl94Store(store, expected_digest=summary["release_digest"])


@pytest.mark.parametrize(
    ("rel", "forge", "match"),
    [
        (
            PIECE,
            lambda a: np.where(
                np.arange(a.size).reshape(a.shape) == 5, np.nan, a.astype(np.float64)
            ),
            r"dtype float64, expected int8 or int16 or int32 or int64",
        ),
        (
            PIECE,
            lambda a: np.full(a.shape, SENTINEL)[:-3],
            r"shape \(30, 298\), expected \(33, 298\)",
        ),
        (
            "classes/block/part-00000.npy.gz",
            lambda a: a + np.int32(8),
            r"ids outside 0 to 7 \(nodes\)",
        ),
        (
            "blocks/block/part-00000.npy.gz",
            lambda a: np.where(np.arange(a.size).reshape(a.shape) == 2, np.inf, a),
            r"1 non-finite values",
        ),
        ("owned/block/part-00000.npy.gz", lambda a: a.astype(np.int32), "dtype int32"),
    ],  # fmt: skip
    ids=["nan-cell", "three-rows-short", "class-out-of-range", "inf-block", "owned-dtype"],
)
def test_every_piece_read_has_its_dtype_shape_and_values_checked(store, rel, forge, match):
    """Audit: a NaN cell came back as −9223372036854775808 and a piece three rows short
    returned 57 rows. Even in a store consistent with itself (a writer's bug, or a forger's
    store read without a reference) a reader refuses a piece of the wrong dtype, shape or
    values, naming the file."""
    _forge(store, {rel: _gz(forge(_read(store, rel)))}, manifest=True)
    s = Pl94Store(store)
    reader = s.tables if rel.startswith("tables") else lambda lvl: s.standard_errors(lvl, "total")
    with pytest.raises(DataError, match=match) as exc:
        reader("block")
    _refused(exc, rel, np.iinfo(np.int64).min)
    with pytest.raises(DataError, match=match):
        s.verify()


def test_a_projector_of_the_wrong_shape_is_refused_on_opening(store) -> None:
    rel = "identified/3.npy"
    buf = io.BytesIO()
    np.save(buf, np.load(store / rel)[:, :-1])
    _forge(store, {rel: buf.getvalue()}, manifest=True)
    with pytest.raises(DataError, match=r"shape \(\d+, \d+\), expected") as exc:
        Pl94Store(store)
    _refused(exc, rel)


@pytest.mark.parametrize("entry", ["../outside.npy", "ABSOLUTE", "tables/../../outside.npy"])
def test_checksum_entries_leading_out_of_the_store_are_refused(store, entry) -> None:
    """Audit: ``verify()`` followed ``..`` and absolute entries out of the store. Only the
    files the manifest describes may be listed; nothing outside is opened."""
    outside = store.parent / "outside.npy"
    outside.write_bytes(b"not the store's")
    entry = str(outside) if entry == "ABSOLUTE" else entry
    sums = _sums(store)
    sums["files"][entry] = hashlib.sha256(outside.read_bytes()).hexdigest()
    _write_sums(store, sums)
    with pytest.raises(DataError, match="which the manifest does not describe") as exc:
        Pl94Store(store).verify()
    _refused(exc, "checksums.json")


def test_a_symlink_leaving_the_store_is_refused_even_with_the_right_bytes(store) -> None:
    """A piece replaced by a link to a file outside the store (the genuine bytes, so its
    checksum holds) is refused: the store reads only files inside it."""
    outside = store.parent / "elsewhere.npy.gz"
    shutil.copyfile(store / PIECE, outside)
    (store / PIECE).unlink()
    os.symlink(outside, store / PIECE)
    s = Pl94Store(store)
    with pytest.raises(DataError, match="symbolic link leading out of the store") as exc:
        s.tables("block")
    _refused(exc, PIECE)
    with pytest.raises(DataError, match="symbolic link"):
        s.verify()
    link = store.parent / "link"
    os.symlink(store, link)  # a link *to* a store is the store
    assert Pl94Store(link).tables("block", 40, 60).shape == (20, 298)


def test_the_manifest_names_a_shipped_schema_never_a_path(store, tmp_path) -> None:
    """Audit: ``manifest["schema"]`` opened any ``.toml`` on disk. A valid schema file
    elsewhere is not opened; a level name that is a path is refused too."""
    toml = tmp_path / "evil.toml"
    shipped = Path(__import__("censusdp").__file__).parent / "schemas" / "pl94.toml"
    shutil.copyfile(shipped, toml)
    _forge(store, {}, manifest=True, edit=lambda m: m.update(schema=str(toml)))
    with pytest.raises(DataError, match="manifest key 'schema': not a shipped schema") as exc:
        Pl94Store(store)
    _refused(exc, "manifest.json")

    def level_path(m: dict) -> None:
        m.update(schema="pl94")
        m["levels"][-1] = "../../block"

    _forge(store, {}, manifest=True, edit=level_path)
    with pytest.raises(DataError, match="manifest key 'levels'"):
        Pl94Store(store)


def test_a_store_read_then_changed_is_refused_by_the_reader(original, store) -> None:
    """The checksums are read once, when the store is opened under its release digest: a
    piece rewritten afterwards (checksums and manifest too) is refused by the reader."""
    s = Pl94Store(store, expected_digest=original[1]["release_digest"])
    _forge(store, {PIECE: _altered_tables(store)}, manifest=True)
    with pytest.raises(DataError, match="SHA-256 does not match") as exc:
        s.tables("block")
    _refused(exc, PIECE)


def test_an_older_store_is_read_but_not_bound_to_a_release_digest(original, store) -> None:
    """A format /2 store (no files_digest) reads as before; given a release digest it is
    refused, since its manifest does not bind its pieces."""
    _, summary, tables = original

    def older(m: dict) -> None:
        m["format"] = "censusdp-pl94-store/2"
        del m["files_digest"]

    _forge(store, {}, manifest=True, edit=older)
    old = Pl94Store(store)
    assert old.verify() == summary["digest"]
    assert np.array_equal(old.tables("tract"), tables["tract"])
    with pytest.raises(DataError, match="does not bind its pieces") as exc:
        Pl94Store(store, expected_digest=old.release_digest)
    _refused(exc, "manifest.json")


# -- the shared kernels -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "rel", ["", "../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a/.", "a\\..\\b", "a/\0"]
)
def test_store_file_refuses_paths_that_are_not_plain_and_inside(tmp_path, rel) -> None:
    with pytest.raises(DataError, match="not a relative path inside the store"):
        store_file(tmp_path, rel)


def test_store_file_follows_links_only_inside(tmp_path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "f").write_text("x")
    os.symlink(root / "a" / "f", root / "inside")
    os.symlink(tmp_path, root / "up")
    (tmp_path / "outside").write_text("y")
    os.symlink(tmp_path / "outside", root / "a" / "out")
    assert store_file(root, "a/f") == root / "a" / "f"
    assert store_file(root, "inside") == root / "inside"
    assert store_file(root, "up/root/a/f") == root / "up" / "root" / "a" / "f"  # lands inside
    assert store_file(root, "missing") == root / "missing"  # absence is the reader's to report
    for rel in ("up/outside", "a/out", "up"):
        with pytest.raises(DataError, match="symbolic link leading out"):
            store_file(root, rel)


def test_check_array_checks_dtype_shape_and_finiteness() -> None:
    a = np.zeros((4, 3))
    assert check_array(a, "f", "float64", (4, None), "w", "rows, cols") is a
    with pytest.raises(DataError, match=r"f: dtype float64, expected int8 or int64 \(w\)"):
        check_array(a, "f", ("int8", "int64"), (4, 3), "w", "rows, cols")
    with pytest.raises(DataError, match=r"f: shape \(4, 3\), expected \(5, any\) \(rows, cols\)"):
        check_array(a, "f", "float64", (5, None), "w", "rows, cols")
    with pytest.raises(DataError, match=r"shape \(4, 3\), expected \(12,\)"):
        check_array(a, "f", "float64", (12,), "w", "cells")
    a[1, 2], a[3, 0] = np.nan, -np.inf
    with pytest.raises(DataError, match="f: 2 non-finite values"):
        check_array(a, "f", "float64", (4, 3), "w", "rows, cols")
    assert check_array(a, "f", "float64", (4, 3), "w", "rows, cols", finite=False) is a
    with pytest.raises(DataError, match="dtype list"):
        check_array([1.0], "f", "float64", (1,), "w", "cells")
