"""Atomic writers: all or nothing, never a half-written target or a stray temporary."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from censusdp.atomic import (
    MARKER,
    atomic_dir,
    atomic_file,
    check_output,
    output_dir,
    output_file,
    remove_stale,
    sidecar_path,
)
from censusdp.errors import SpecError


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


# -- visible temporaries, stale ones, and the output policy -------------------------------------

DEAD_PID = 2**31 - 7  # above any pid_max: no such process


def test_temporaries_have_visible_names_beside_the_target(tmp_path):
    with atomic_dir(tmp_path / "out") as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith("out.censusdp-partial-")
    with atomic_file(tmp_path / "x.parquet") as tmp:
        assert tmp.name.startswith("x.parquet.censusdp-partial-") and tmp.suffix == ".parquet"
        tmp.write_text("x")
    assert _names(tmp_path) == ["out", "x.parquet"]


def test_stale_temporaries_of_killed_runs_are_removed_live_ones_kept(tmp_path):
    dead = tmp_path / f"out.censusdp-partial-{DEAD_PID}-abcdef"
    dead.mkdir()
    (dead / "estimates.parquet").write_text("half")
    (tmp_path / f"out.censusdp-old-{DEAD_PID}-012345").mkdir()
    (tmp_path / ".out.k2j4_x9a.tmp").mkdir()  # the hidden temporary of earlier versions
    (tmp_path / f".out.old.{DEAD_PID}").mkdir()
    live = tmp_path / f"out.censusdp-partial-{os.getpid()}-fedcba"
    live.mkdir()  # a concurrent write of a running process
    (tmp_path / "out.censusdp-partial-notes.txt").write_text("a user's file")  # not ours
    other = tmp_path / f"outer.censusdp-partial-{DEAD_PID}-abcdef"
    other.mkdir()  # another target's
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "a").write_text("a")
    assert _names(tmp_path) == sorted(
        ["out", live.name, "out.censusdp-partial-notes.txt", other.name]
    )
    assert remove_stale(tmp_path / "outer") == [other]


def test_check_output_refuses_what_censusdp_did_not_write(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.csv").write_text("x")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "f").write_text("x")
    (tmp_path / "empty").mkdir()
    refused = {
        ".": "current",
        "": "empty",
        "data.csv": "is the input",
        str(tmp_path): "current directory",
        "theirs": "not a censusdp output",
    }
    for target, fragment in refused.items():
        with pytest.raises(SpecError, match=fragment):
            check_output(target, kind="dir", inputs=[tmp_path / "data.csv"])
    assert check_output("new", kind="dir") == Path("new")
    assert check_output("empty", kind="dir") == Path("empty")  # an empty folder is new
    with pytest.raises(SpecError, match="cannot write '.xlsx'"):
        check_output("o.xlsx", kind="file", formats=(".csv", ".parquet"))


def test_output_dir_is_replaced_only_when_ours_and_asked(tmp_path):
    target = tmp_path / "out"
    with output_dir(target, command="test") as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "a.csv").write_text("1")
    marker = json.loads((target / MARKER).read_text())
    assert marker["command"] == "test" and list(marker["files"]) == ["sub/a.csv"]
    with pytest.raises(SpecError, match="--overwrite"), output_dir(target):
        pass
    with output_dir(target, overwrite=True) as tmp:
        (tmp / "b.csv").write_text("2")
    assert _names(target) == sorted([MARKER, "b.csv"]) and _names(tmp_path) == ["out"]
    (target / "notes.txt").write_text("mine")
    with pytest.raises(SpecError, match="'notes.txt', which censusdp did not write"):
        with output_dir(target, overwrite=True):
            pass
    assert (target / "notes.txt").read_text() == "mine"


def test_output_dir_rechecks_before_replacing(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(SpecError, match="not a censusdp output"):
        with output_dir(target) as tmp:
            (tmp / "a").write_text("a")
            target.mkdir()
            (target / "theirs.txt").write_text("written meanwhile")
    assert _names(target) == ["theirs.txt"] and _names(tmp_path) == ["out"]


def test_output_file_has_a_sidecar_and_refuses_changed_files(tmp_path):
    target = tmp_path / "o.csv"
    with output_file(target, formats=(".csv",), command="privatize") as tmp:
        assert tmp.suffix == ".csv"
        tmp.write_text("a\n1\n")
    side = json.loads(sidecar_path(target).read_text())
    assert side["kind"] == "file" and side["command"] == "privatize"
    assert _names(tmp_path) == ["o.csv", "o.csv.censusdp.json"]
    with output_file(target, overwrite=True) as tmp:
        tmp.write_text("a\n2\n")
    assert target.read_text() == "a\n2\n"
    target.write_text("edited by hand")
    with pytest.raises(SpecError, match="changed since censusdp wrote it"):
        with output_file(target, overwrite=True):
            pass
    assert target.read_text() == "edited by hand"
    (tmp_path / "theirs.csv").write_text("a\n")
    with pytest.raises(SpecError, match="not a censusdp output"):
        with output_file(tmp_path / "theirs.csv", overwrite=True):
            pass
    assert (tmp_path / "theirs.csv").read_text() == "a\n"


def test_failed_and_interrupted_output_leave_nothing(tmp_path):
    for exc in (Boom, KeyboardInterrupt):
        with pytest.raises(exc), output_dir(tmp_path / "d") as tmp:
            (tmp / "a").write_text("a")
            raise exc
        with pytest.raises(exc), output_file(tmp_path / "f.csv") as tmp:
            tmp.write_text("a")
            raise exc
    assert _names(tmp_path) == []
