"""Atomic writers: all or nothing, never a half-written target or a stray temporary."""

from __future__ import annotations

import pytest

from censusdp.atomic import atomic_dir, atomic_file


class Boom(Exception):
    pass


def _names(path):
    return sorted(p.name for p in path.iterdir())


def test_atomic_dir_failure_leaves_nothing(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(Boom), atomic_dir(target) as tmp:
        (tmp / "estimates.parquet").write_text("partial")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "x.csv").write_text("partial")
        raise Boom
    assert _names(tmp_path) == []


def test_atomic_dir_failure_keeps_existing_target(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(Boom), atomic_dir(target) as tmp:
        (tmp / "new.txt").write_text("new")
        raise Boom
    assert _names(tmp_path) == ["out"]
    assert _names(target) == ["old.txt"]


def test_atomic_dir_success_replaces_target(tmp_path):
    target = tmp_path / "nested" / "out"
    target.mkdir(parents=True)
    (target / "old.txt").write_text("old")
    with atomic_dir(target) as tmp:
        assert tmp != target and not (tmp / "old.txt").exists()
        (tmp / "new.txt").write_text("new")
        assert _names(target) == ["old.txt"]  # untouched until the block succeeds
    assert _names(target) == ["new.txt"]
    assert (target / "new.txt").read_text() == "new"
    assert _names(target.parent) == ["out"]  # no temporary or old copy left behind


def test_atomic_dir_refuses_to_overwrite_when_asked(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(FileExistsError, match="--out"), atomic_dir(target, overwrite=False):
        pass
    assert _names(tmp_path) == ["out"]


def test_atomic_file_failure_leaves_nothing(tmp_path):
    target = tmp_path / "manifest.json"
    with pytest.raises(Boom), atomic_file(target) as tmp:
        tmp.write_text('{"partial": ')
        raise Boom
    assert _names(tmp_path) == []


def test_atomic_file_failure_keeps_existing_target(tmp_path):
    target = tmp_path / "manifest.json"
    target.write_text("old")
    with pytest.raises(Boom), atomic_file(target) as tmp:
        tmp.write_text("new")
        raise Boom
    assert _names(tmp_path) == ["manifest.json"]
    assert target.read_text() == "old"


def test_atomic_file_success_replaces_target(tmp_path):
    target = tmp_path / "a" / "metrics.csv"
    target.parent.mkdir()
    target.write_text("old")
    with atomic_file(target) as tmp:
        tmp.write_text("new")
        assert target.read_text() == "old"
    assert target.read_text() == "new"
    assert _names(target.parent) == ["metrics.csv"]


def test_keyboard_interrupt_also_cleans_up(tmp_path):
    with pytest.raises(KeyboardInterrupt), atomic_dir(tmp_path / "out"):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt), atomic_file(tmp_path / "f"):
        raise KeyboardInterrupt
    assert _names(tmp_path) == []
