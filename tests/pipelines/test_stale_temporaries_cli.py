"""``censusdp run`` removes only the stale temporaries it can prove it wrote (issue 33 item 5).

The audit's reproductions: a user's folder ``o.censusdp-partial-99999-abcdef/thesis.tex``
and a file ``.o.backup01.tmp`` beside the output ``o`` were deleted by
``censusdp run spec.toml --out o``. They must survive byte for byte, while the temporary a
real run left when it was killed (SIGKILL: no clean-up could run) is removed.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from run_specs import SMALL_DATA, SMALL_SPEC

from censusdp.app.cli import main

#: The CLI, stopped for good (SIGKILL, by itself) once its release is written into the
#: temporary output: what a killed run leaves.
KILLED = """
import os, signal, sys
import censusdp.pipelines.runner as r
orig = r.write_evaluation
def killed(*a, **k):
    orig(*a, **k)
    os.kill(os.getpid(), signal.SIGKILL)
r.write_evaluation = killed
from censusdp.app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): "dir"
        if p.is_dir()
        else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def test_lookalikes_survive_a_run_and_a_killed_runs_temporary_is_cleaned(
    tmp_path, monkeypatch, capsys
):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "data.csv").write_text(SMALL_DATA)
    (ws / "spec.toml").write_text(textwrap.dedent(SMALL_SPEC))
    killed = subprocess.run(
        [sys.executable, "-c", KILLED, "run", "spec.toml", "--out", "o"],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (stale,) = [p for p in ws.iterdir() if p.name.startswith("o.censusdp-partial-")]
    assert (stale / "release" / "estimates.parquet").is_file()  # half a run's output
    pid = int(stale.name.split("-")[-2])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # reaped by subprocess.run; the pid is free

    user = ws / "o.censusdp-partial-99999-abcdef"  # the audit's first reproduction
    user.mkdir()
    (user / "thesis.tex").write_text("\\documentclass{article} % a user's thesis\n")
    (ws / ".o.backup01.tmp").write_text("a user's backup\n")  # the audit's second
    (ws / f"o.censusdp-partial-{pid}-abcdef.csv").write_text("a table, dead pid, no claim\n")
    before = _hashes(ws)

    monkeypatch.chdir(ws)
    assert main(["run", "spec.toml", "--out", "o"]) == 0, capsys.readouterr().err
    after = _hashes(ws)
    assert not stale.exists()  # ours, proved by its claim, its process gone: removed
    kept = {k: v for k, v in before.items() if not k.startswith(stale.name)}
    assert {k: v for k, v in after.items() if not k.startswith("o/") and k != "o"} == kept
    assert (ws / "o" / "censusdp-output.json").is_file()
    assert (user / "thesis.tex").read_text().startswith("\\documentclass")
    assert sorted(os.listdir(ws)) == sorted(
        [
            ".o.backup01.tmp",
            "data.csv",
            "o",
            "o.censusdp-partial-99999-abcdef",
            f"o.censusdp-partial-{pid}-abcdef.csv",
            "spec.toml",
        ]
    )
