"""Atomic writers: all or nothing, never a half-written target or a stray temporary."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.atomic import (
    CLAIM,
    CLAIM_SUFFIX,
    MARKER,
    atomic_dir,
    atomic_file,
    check_output,
    claim_path,
    output_dir,
    output_file,
    read_claim,
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


def _killed_inside(tmp_path, kind: str, target: Path) -> Path:
    """Run ``atomic_dir``/``atomic_file`` on ``target`` in a child process that is killed
    (SIGKILL: no clean-up can run) inside the block; returns its temporary."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from pathlib import Path
        from censusdp.atomic import {kind}
        with {kind}(Path(sys.argv[1])) as tmp:
            (tmp / "half.parquet" if tmp.is_dir() else tmp).write_text("half")
            print(tmp, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(target)], capture_output=True, text=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    tmp = Path(proc.stdout.strip())
    assert tmp.exists() and tmp.parent == target.parent
    return tmp


def test_temporaries_of_killed_runs_are_removed_claims_and_all(tmp_path):
    d = _killed_inside(tmp_path, "atomic_dir", tmp_path / "out")
    f = _killed_inside(tmp_path, "atomic_file", tmp_path / "x.parquet")
    assert (d / CLAIM).is_file() and claim_path(f).is_file()  # each was claimed first
    assert read_claim(d / CLAIM)["name"] == d.name
    other = _killed_inside(tmp_path, "atomic_dir", tmp_path / "outer")  # another target's
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "a").write_text("a")
    with atomic_file(tmp_path / "x.parquet") as tmp:
        tmp.write_text("x")
    assert _names(tmp_path) == sorted(["out", "x.parquet", other.name])
    assert _names(tmp_path / "out") == ["a"]  # the claim is not part of the output
    assert remove_stale(tmp_path / "outer") == [other]
    assert _names(tmp_path) == ["out", "x.parquet"]
    # killed after its claim was written, its temporary file gone: the claim goes too
    gone = _killed_inside(tmp_path, "atomic_file", tmp_path / "y.csv")
    gone.unlink()
    assert remove_stale(tmp_path / "y.csv") == [claim_path(gone)]
    assert _names(tmp_path) == ["out", "x.parquet"]


def test_lookalikes_without_a_proof_are_left_untouched(tmp_path):
    """Everything here matches a temporary's name pattern (or an earlier version's) and a
    process that does not run, but no claim proves it censusdp's: nothing is removed."""
    real = _killed_inside(tmp_path, "atomic_dir", tmp_path / "out")
    doc = read_claim(real / CLAIM)
    token = doc["token"]

    def claimed(name: str, **change) -> Path:
        p = tmp_path / name
        p.mkdir()
        (p / "thesis.tex").write_text("a user's work")
        (p / CLAIM).write_text(json.dumps({**doc, "name": name, **change}))
        return p

    user = tmp_path / "out.censusdp-partial-99999-abcdef"  # the audit's reproduction
    user.mkdir()
    (user / "thesis.tex").write_text("a user's work")
    (tmp_path / ".out.backup01.tmp").write_text("a user's backup")  # the audit's second
    (tmp_path / f".out.old.{DEAD_PID}").mkdir()  # an earlier version's naming: unprovable
    (tmp_path / f"out.censusdp-partial-{DEAD_PID}-abcdef.csv").write_text("no claim beside")
    (tmp_path / f"out.censusdp-old-{DEAD_PID}-abcdef").mkdir()  # no claim beside
    pid = doc["pid"]
    lookalikes = [
        claimed(f"out.censusdp-partial-{pid}-{token[:6]}x"),  # not the pattern
        claimed(f"out.censusdp-partial-{pid}-aaaaaa"),  # token does not match the claim's
        claimed(f"out.censusdp-partial-{DEAD_PID}-{token[:6]}"),  # pid does not match
        claimed(f"out.censusdp-partial-{pid}-{token[:6]}.d", host="elsewhere"),
        claimed(f"out.censusdp-partial-{pid}-{token[:6]}.e", censusdp_temporary=2),
        claimed(f"out.censusdp-partial-{pid}-{token[:6]}.f", token=token[:6]),
    ]
    linked = tmp_path / f"out.censusdp-partial-{pid}-{token[:6]}.g"
    linked.mkdir()
    (linked / CLAIM).symlink_to(real / CLAIM)  # a link is not a claim
    (linked / CLAIM).unlink()
    (linked / CLAIM).symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps({**doc, "name": linked.name}))
    file_claim = tmp_path / f"out.censusdp-partial-{pid}-{token[:6]}.csv"
    file_claim.write_text("a user's table")  # its claim names another file
    claim_path(file_claim).write_text(json.dumps({**doc, "name": "out.csv"}))
    before = _snapshot(tmp_path)
    assert remove_stale(tmp_path / "out") == [real]  # only the real one
    del before[real.name], before[f"{real.name}/{CLAIM}"], before[f"{real.name}/half.parquet"]
    assert _snapshot(tmp_path) == before
    assert all(p.is_dir() for p in lookalikes)


def test_temporaries_of_running_processes_are_kept(tmp_path):
    with atomic_dir(tmp_path / "out") as mine, atomic_file(tmp_path / "f.csv") as f:
        assert remove_stale(tmp_path / "out") == [] and remove_stale(tmp_path / "f.csv") == []
        assert mine.is_dir() and f.is_file() and claim_path(f).is_file()
        # what another process sees while this one runs: the same claims, a live pid
        with atomic_dir(tmp_path / "out") as second:
            assert second != mine and mine.is_dir()
        assert mine.is_dir()
    assert _names(tmp_path) == ["f.csv", "out"]


def test_earlier_output_moved_aside_is_kept_until_a_target_stands_again(tmp_path):
    """Killed between the two renames of a replacement: the earlier output, moved aside,
    is the only copy, so it stays until something is at the target again."""
    target = tmp_path / "out"
    target.mkdir()
    (target / "earlier.csv").write_text("earlier")
    script = textwrap.dedent(
        """
        import os, signal, sys
        from pathlib import Path
        from censusdp.atomic import atomic_dir
        real = os.replace
        def replace(src, dst):
            if ".censusdp-partial-" in str(src):
                os.kill(os.getpid(), signal.SIGKILL)
            real(src, dst)
        os.replace = replace
        with atomic_dir(Path(sys.argv[1])) as tmp:
            (tmp / "new.csv").write_text("new")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (old,) = tmp_path.glob("out.censusdp-old-*[0-9a-f]")
    assert not target.exists() and (old / "earlier.csv").read_text() == "earlier"
    assert claim_path(old).is_file()
    assert old not in remove_stale(target) and old.is_dir()
    with atomic_dir(target) as tmp:  # a later write lands at the target ...
        (tmp / "later.csv").write_text("later")
    assert remove_stale(target) == [old]  # ... and the next one clears the earlier output
    assert not old.exists() and not claim_path(old).exists()
    # the new output had shed its claim just before its rename: unprovable, so left alone
    (partial,) = tmp_path.glob("out.censusdp-partial-*")
    assert _names(partial) == ["new.csv"]
    assert _names(tmp_path) == sorted(["out", partial.name])


def _snapshot(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = f"-> {os.readlink(p)}"
        elif p.is_file():
            out[rel] = p.read_bytes()
        else:
            out[rel] = "dir"
    return out


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


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["partial", "old"]),
    pid=st.integers(2**22 + 1, 2**31 - 1),  # above Linux's pid_max: no such process
    token=st.text("0123456789abcdef", min_size=6, max_size=6),
    ext=st.sampled_from(["", ".csv", ".parquet", ".tmp", ".json", CLAIM_SUFFIX]),
    is_dir=st.booleans(),
    content=st.binary(max_size=64),
    wrong=st.sampled_from([None, "", "censusdp_temporary", "name", "pid", "host", "token"]),
)
def test_nothing_without_a_claim_of_ours_is_ever_removed(
    tmp_path_factory, kind, pid, token, ext, is_dir, content, wrong
):
    """Whatever a user puts under a temporary's name — a dead pid, any token, extension or
    content, even a claim-shaped file wrong in one field — stays; with the claim right in
    every field (``wrong == ""``: what censusdp writes) it goes, so the claims are real."""
    root = tmp_path_factory.mktemp("ws")
    (root / "out").mkdir()  # a target stands: moved-aside outputs would be removable
    entry = root / f"out.censusdp-{kind}-{pid}-{token}{ext}"
    if is_dir:
        entry.mkdir()
        (entry / "thesis.tex").write_bytes(content)
    else:
        entry.write_bytes(content)
    if wrong is not None:  # a claim right in every field but ``wrong``
        doc = {
            "censusdp_temporary": 1,
            "name": entry.name,
            "pid": pid,
            "host": socket.gethostname(),
            "token": token + "0" * 26,
        }
        bad = {
            "censusdp_temporary": 2,
            "name": entry.name + "x",
            "pid": pid - 1,
            "host": socket.gethostname() + "x",
            "token": ("f" if token[0] != "f" else "e") + token[1:] + "0" * 26,
        }
        if wrong:
            doc[wrong] = bad[wrong]
        where = entry / CLAIM if is_dir and kind == "partial" else claim_path(entry)
        where.write_text(json.dumps(doc))
    before = _snapshot(root)
    ours = wrong == "" and not entry.name.endswith(CLAIM_SUFFIX)  # censusdp names no such
    assert remove_stale(root / "out") == ([entry] if ours else [])
    if ours:
        assert _names(root) == ["out"]
    else:
        assert _snapshot(root) == before
