"""The one store format (censusdp.pipelines.io.store) and its one reader, ``read_release``.

Both kinds of release store (a ``Release``, a streamed ``pl94`` run) are written by one
:class:`StoreWriter` and checked by one set of readers. Here: the writer's guarantees
(nothing half-written, never replacing what it cannot prove it wrote, the temporaries of
killed tasks removed), the checks against slow obvious references (tiling, the
``sha256sum`` listing that ``files_digest`` binds), and that a store written by main's
writers before the fold (commit d38e758, ``data/pl94_store_d38e758``) is read, verified,
and written again byte for byte by the folded writer.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pl94_fixtures import PLAN, QUERIES, SCHEMA, small_us
from release_fixtures import release_for, two_level

from censusdp.errors import DataError, SpecError
from censusdp.pipelines.io.pl94_store import Pl94Store, Pl94StoreWriter
from censusdp.pipelines.io.release_store import read_release, write_release
from censusdp.pipelines.io.store import (
    CHECKSUMS,
    MANIFEST,
    StoreWriter,
    check_tiling,
    files_digest,
    load_array,
    load_piece,
    read_checksums,
    save_npy,
)
from censusdp.pipelines.products.pl94_stream import Pl94StreamOptions, stream_pl94
from censusdp.rng import KeyedRNG

#: A pl94 store written by main's Pl94StoreWriter (commit d38e758) on the tiny state below
#: (two partitions, seed 7), and the digests that run printed.
MAIN_STORE = Path(__file__).parent / "data" / "pl94_store_d38e758"
MAIN_RELEASE_DIGEST = "61e4ab53341093850dee91e02d6e54f089f9212a60df4d7fb1a3cfc303260b19"
MAIN_CONTENT_DIGEST = "8432df0cfceeca93dd3bc6c3f312df24d2f87117fae2c6eff44b67e1e0d1019b"


def _tiny():
    return small_us(counties=2, tracts=2, block_groups=3, blocks=12, population=200)


def _tree(root: Path) -> dict[str, str]:
    return {
        str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(root.rglob("*"))
        if f.is_file()
    }


def _array(path: Path) -> np.ndarray:
    data = path.read_bytes()
    return np.load(io.BytesIO(gzip.decompress(data) if path.suffix == ".gz" else data))


def _toy(path: Path, fmt: str = "toy/1", overwrite: bool = False) -> StoreWriter:
    """A store of a toy kind (named by ``fmt``): two pieces (one gzipped), a manifest."""
    with StoreWriter(path, (fmt,), fmt.split("/")[0], overwrite=overwrite) as w:
        w.save("a/x.npy", np.arange(6, dtype=np.int64).reshape(2, 3))
        w.save("b/y.npy.gz", np.linspace(0, 1, 5), compresslevel=1)
        w.finish({"format": fmt, "n": 2})
    return w


def test_a_store_written_by_main_is_read_and_written_again_byte_for_byte(tmp_path):
    store = read_release(MAIN_STORE, expected_digest=MAIN_RELEASE_DIGEST)
    assert isinstance(store, Pl94Store)
    assert store.verify() == MAIN_CONTENT_DIGEST == store.digest
    persons = store.manifest["persons"]
    for level in store.levels:  # P1's total (column 0) sums to the persons at every level
        assert int(store.tables(level)[:, 0].sum()) == persons
    h, source = _tiny()
    with Pl94StoreWriter(tmp_path / "s", h, SCHEMA) as w:
        res = stream_pl94(h, SCHEMA, source, PLAN, KeyedRNG.reproducible(7, warn=False),
                          on_top=w.top, on_partition=w.partition,
                          options=Pl94StreamOptions(partitions=2))  # fmt: skip
        out = w.finish(res, QUERIES)
    # the same files; the integer tables and owned/class arrays to the bit; the floats (the
    # structured blocks) to 1e-9 — the GLS kernels have a fixed summation order since main
    # wrote the fixture (BLAS-free block kernels), so their last bits may differ from it
    new, old = _tree(tmp_path / "s"), _tree(MAIN_STORE)
    assert new.keys() == old.keys()
    for name in sorted(set(new) - {"manifest.json", "checksums.json"}):
        a, b = _array(tmp_path / "s" / name), _array(MAIN_STORE / name)
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9, err_msg=name)
        else:
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert out["digest"] != "" and len(out["release_digest"]) == 64
    with pytest.raises(DataError, match="not the expected release digest"):
        read_release(MAIN_STORE, expected_digest="0" * 64)


def _release():
    gen = np.random.default_rng(3)
    h, cells, counts = two_level(gen)
    return h, release_for(gen, h, cells, counts)


def test_read_release_needs_the_hierarchy_of_a_release_store_and_takes_no_digest(tmp_path):
    h, rel = _release()
    path = write_release(rel, tmp_path / "r")
    with pytest.raises(SpecError, match="read with the hierarchy it was released on"):
        read_release(path)
    with pytest.raises(SpecError, match="records no release digest"):
        read_release(path, h, expected_digest=MAIN_RELEASE_DIGEST)
    back = read_release(path, h)
    assert all(np.array_equal(a, b) for a, b in zip(back.estimates, rel.estimates, strict=True))


def test_the_writer_replaces_only_a_store_of_its_kind_that_lists_every_file(tmp_path):
    path = tmp_path / "s"
    _toy(path)
    first = _tree(path)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        _toy(path)
    with pytest.raises(SpecError, match="not a other store's"):
        _toy(path, fmt="other/1", overwrite=True)
    (path / "notes.txt").write_text("mine")
    with pytest.raises(SpecError, match="notes.txt"):
        _toy(path, overwrite=True)
    (path / "notes.txt").unlink()
    assert _tree(path) == first
    _toy(path, overwrite=True)  # its own kind, every file listed: replaced
    assert _tree(path) == first  # the same bytes: nothing time-stamped
    foreign = tmp_path / "f"
    foreign.mkdir()
    (foreign / "data.csv").write_text("a,b\n")
    with pytest.raises(SpecError, match="no readable manifest.json"):
        _toy(foreign, overwrite=True)
    assert (foreign / "data.csv").read_text() == "a,b\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "s"]  # no temporary left


def test_release_overwrite_refuses_a_directory_it_did_not_write(tmp_path):
    _, rel = _release()
    other = tmp_path / "mine"
    other.mkdir()
    (other / "thesis.tex").write_text("x")
    with pytest.raises(SpecError, match="overwrite replaces only a release store"):
        write_release(rel, other, overwrite=True)
    assert [p.name for p in other.iterdir()] == ["thesis.tex"]


def test_nothing_is_kept_without_finish_or_on_failure_and_task_temporaries_go(tmp_path):
    path = tmp_path / "s"
    with pytest.raises(DataError, match="closed before finish"), StoreWriter(path, ("t/1",), "t"):
        pass
    with pytest.raises(OSError, match="disk full"), StoreWriter(path, ("t/1",), "t") as w:
        w.save("a.npy", np.zeros(3))
        raise OSError("disk full")
    assert not list(tmp_path.iterdir())
    with StoreWriter(path, ("t/1",), "t") as w:
        w.save("a.npy", np.zeros(3))
        (w.root / ".a.npy.999.tmp").write_bytes(b"half")  # a killed task's, run again
        w.finish({"format": "t/1"})
        with pytest.raises(DataError, match="called once"):
            w.finish({"format": "t/1"})
    assert sorted(_tree(path)) == sorted([CHECKSUMS, "a.npy", MANIFEST])


def test_pieces_round_trip_and_every_tampering_is_refused(tmp_path):
    path = tmp_path / "s"
    _toy(path)
    sums = read_checksums(path)
    assert set(sums) == {"a/x.npy", "b/y.npy.gz", MANIFEST}
    a = load_piece(path, "a/x.npy", sums, "int64", (2, None), "ints", "rows, cols")
    assert np.array_equal(a, np.arange(6).reshape(2, 3))
    raw = (path / "b/y.npy.gz").read_bytes()
    assert raw == gzip.compress(gzip.decompress(raw), compresslevel=1, mtime=0)
    y = load_piece(path, "b/y.npy.gz", sums, "float64", (5,), "reals", "values")
    assert np.array_equal(y, np.linspace(0, 1, 5))
    with pytest.raises(DataError, match=r"a/x.npy: shape \(2, 3\), expected \(3, any\)"):
        load_piece(path, "a/x.npy", sums, "int64", (3, None), "ints", "rows, cols")
    with pytest.raises(DataError, match="a/x.npy: dtype int64, expected float64"):
        load_piece(path, "a/x.npy", sums, "float64", (2, 3), "reals", "rows, cols")
    with pytest.raises(DataError, match="not a relative path inside the store"):
        load_piece(path, "../s/a/x.npy", sums, "int64", (2, 3), "ints", "rows, cols")
    data = bytearray((path / "a/x.npy").read_bytes())
    data[-1] ^= 1
    (path / "a/x.npy").write_bytes(bytes(data))
    with pytest.raises(DataError, match="a/x.npy: its SHA-256 does not match"):
        load_piece(path, "a/x.npy", sums, "int64", (2, 3), "ints", "rows, cols")
    (path / "a/x.npy").unlink()
    with pytest.raises(DataError, match="a/x.npy is missing"):
        load_piece(path, "a/x.npy", sums, "int64", (2, 3), "ints", "rows, cols")
    with pytest.raises(DataError, match="not a readable .npy array"):
        load_array(path / "b/y.npy.gz", b"junk")


def test_save_npy_returns_the_sha256_of_the_bytes_it_wrote(tmp_path):
    x = np.arange(10.0)
    for level in (None, 1, 9):
        file = tmp_path / f"x{level}.npy"
        digest = save_npy(file, x, level)
        data = file.read_bytes()
        assert digest == hashlib.sha256(data).hexdigest()
        plain = data if level is None else gzip.decompress(data)
        assert np.array_equal(np.load(io.BytesIO(plain)), x)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x1.npy", "x9.npy", "xNone.npy"]


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils sha256sum")
def test_files_digest_is_the_sha256_of_sha256sums_listing(tmp_path):
    path = tmp_path / "s"
    _toy(path)
    pieces = sorted(str(f.relative_to(path)) for f in path.rglob("*.npy*"))
    listing = subprocess.run(["sha256sum", *pieces], cwd=path, capture_output=True, check=True)
    want = hashlib.sha256(listing.stdout).hexdigest()
    assert files_digest(read_checksums(path)) == want
    sums = json.loads((path / CHECKSUMS).read_text())["files"]
    sums["a/x.npy"] = "0" * 64
    assert files_digest(sums) != want  # it sees a piece's checksum


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 12), st.lists(st.tuples(st.integers(0, 14), st.integers(0, 14)), max_size=5))
def test_check_tiling_equals_the_obvious_concatenation(size, rows):
    """Rows tile a level iff there is a piece, read in order they give each node once, in
    node order, and each piece starts at the node after those before it (even when empty)."""
    nodes: list[int] = []
    obvious = bool(rows)
    for lo, hi in rows:
        obvious = obvious and lo <= hi and lo == len(nodes)
        nodes.extend(range(lo, hi))
    obvious = obvious and nodes == list(range(size))
    try:
        check_tiling(Path("m.json"), "block", size, rows)
        tiles = True
    except DataError as exc:
        assert "manifest key 'partitions'" in str(exc) and "'block'" in str(exc)
        tiles = False
    assert tiles == obvious
