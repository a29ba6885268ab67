"""SIGTERM stops a command as Ctrl-C does (issue 33 item 7).

``kill PID``, ``timeout``, a batch scheduler or a service manager ends a run with SIGTERM.
Each case runs the CLI in a child process paused at one stage (after it has started writing
its temporary output, or with a Dask cluster up), sends SIGTERM, and checks: exit status 143
(128 + 15), exactly one line on stderr, no traceback, and the workspace byte for byte as it
was — no output, no temporary (the whole tree is hashed before and after). The same pattern
as the Ctrl-C test of ``test_cli_hostile.py``; the inputs are small synthetic files.
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

import pytest
from run_specs import SMALL_DATA, SMALL_NHGIS, SMALL_NHGIS_SPEC, SMALL_SPEC

from censusdp.app.cli import main
from censusdp.pipelines.interrupts import EXIT_TERMINATED, Terminated, terminate_as_interrupt

LINE = "censusdp: terminated (SIGTERM); nothing was written"

NHGIS = SMALL_NHGIS
NSPEC = SMALL_NHGIS_SPEC
PSPEC = """
[predict]
schema = "pl94"
invariants = { nation = ["total"], state = ["total"] }
tables = ["total", "hhgq"]
[hierarchy]
synthetic = "state"
blocks = 300
seed = 2
"""

#: Runs the CLI with ``module:attribute`` slowed down: the call goes through (so that the
#: temporary output holds something), then READY is touched and the process waits for the
#: signal. An ``open_executor`` is paused with its executor open (a Dask cluster up). The
#: child starts with SIGTERM's default action, whatever the test process does with it.
WRAPPER = """
import contextlib, importlib, signal, sys, time, pathlib
signal.signal(signal.SIGTERM, signal.SIG_DFL)
ready, where = pathlib.Path(sys.argv[1]), sys.argv[2]
module, _, attr = where.partition(":")
owner = importlib.import_module(module)
*path, name = attr.split(".")
for part in path:
    owner = getattr(owner, part)
orig = getattr(owner, name)
def pause():
    ready.touch()
    time.sleep(120)
if name == "open_executor":
    @contextlib.contextmanager
    def slow(*a, **k):
        with orig(*a, **k) as ex:
            pause()
            yield ex
else:
    def slow(*a, **k):
        result = orig(*a, **k)
        pause()
        return result
setattr(owner, name, slow)
from censusdp.app.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _workspace(ws: Path) -> None:
    ws.mkdir()
    (ws / "data.csv").write_text(SMALL_DATA)
    (ws / "spec.toml").write_text(textwrap.dedent(SMALL_SPEC))
    (ws / "nhgis.csv").write_text(NHGIS)
    (ws / "nspec.toml").write_text(textwrap.dedent(NSPEC))
    (ws / "pspec.toml").write_text(textwrap.dedent(PSPEC))
    (ws / "notes.txt").write_text("my notes, not censusdp's\n")
    (ws / "earlier").mkdir()
    (ws / "earlier" / "keep.txt").write_text("someone else's folder\n")


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` with the SHA-256 of its bytes (``dir`` for directories)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = f"link:{os.readlink(p)}"
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.getpgid(int(p.name)) == pgid:
                    alive.append(int(p.name))
            except OSError:
                continue
    return alive


def _terminate(
    tmp_path: Path, where: str, argv: list[str], *, group: bool, writing: bool = True
) -> tuple[int, str]:
    """Run ``censusdp ARGV`` paused at ``where``, SIGTERM it (the process, or its whole
    process group), and return its exit status and stderr; the workspace must be unchanged
    and no process of the group left."""
    ws = tmp_path / "ws"
    _workspace(ws)
    before = tree(tmp_path)
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, str(ready), where, *argv],
        cwd=ws,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        t0 = time.monotonic()
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 90, "the command never reached the stage"
            time.sleep(0.05)
        partial = [p.name for p in ws.iterdir() if ".censusdp-partial-" in p.name]
        assert bool(partial) == writing, partial  # a temporary output is being written
        if group:
            os.killpg(proc.pid, signal.SIGTERM)  # timeout(1), a service manager, a job kill
        else:
            os.kill(proc.pid, signal.SIGTERM)  # kill PID
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ready.unlink()
    assert "Traceback" not in out + err, err
    assert tree(tmp_path) == before, "the workspace changed or something was left behind"
    deadline = time.monotonic() + 10
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(proc.pid), "worker processes outlived the run"
    return proc.returncode, err


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("censusdp: warning:")]


COMMANDS = {
    "run": ("censusdp.pipelines.runner:write_evaluation", ["run", "spec.toml", "--out", "o"]),
    "privatize": (
        "censusdp.pipelines.io.nhgis:write_batch",
        ["privatize", "nhgis.csv", "--spec", "nspec.toml", "-o", "p.csv"],
    ),
    "predict": ("pandas:DataFrame.to_csv", ["predict", "pspec.toml", "--out", "pred"]),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_sigterm_while_writing_one_line_exit_143_nothing_left(command, tmp_path):
    where, argv = COMMANDS[command]
    code, err = _terminate(tmp_path, where, argv, group=False)
    assert code == EXIT_TERMINATED == 143, err
    assert _lines(err) == [LINE], err


@pytest.mark.parametrize(
    "scheduler",
    [
        pytest.param("threads", marks=pytest.mark.slow),
        pytest.param("distributed", marks=pytest.mark.slow),  # ~30 s: a cluster
    ],
)
def test_sigterm_to_the_process_group_with_workers_up(scheduler, tmp_path):
    """SIGTERM to every process of the job (workers of a local cluster included) while the
    executor is open: the driver alone stops, closing its workers; one line, 143."""
    argv = ["run", "spec.toml", "--out", "o", "--scheduler", scheduler]
    where = "censusdp.pipelines.runner:open_executor"
    code, err = _terminate(tmp_path, where, argv, group=True, writing=False)
    assert code == EXIT_TERMINATED, err
    assert _lines(err) == [LINE], err


@pytest.mark.slow  # ~5 CPU s; the three tests above are the acceptance tests
def test_sigterm_without_the_handler_leaves_a_temporary(tmp_path):
    """The check above has power: with SIGTERM's default action the same run dies by the
    signal, silently, and leaves its half-written temporary behind."""
    ws = tmp_path / "ws"
    _workspace(ws)
    ready = tmp_path / "ready"
    script = WRAPPER.replace(
        "from censusdp.app.cli import main",
        "import censusdp.app.cli as c, contextlib\n"
        "c.terminate_as_interrupt = contextlib.nullcontext\nfrom censusdp.app.cli import main",
    )
    where, argv = COMMANDS["run"]
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(ready), where, *argv],
        cwd=ws,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        t0 = time.monotonic()
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() - t0 < 90
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGTERM and _lines(err) == []
    assert [p for p in ws.iterdir() if ".censusdp-partial-" in p.name]


def test_terminated_in_process_is_one_line_and_143(monkeypatch, tmp_path, capsys):
    import censusdp.pipelines.runner as runner

    def terminated(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        raise AssertionError("SIGTERM was not raised")

    ws = tmp_path / "ws"
    _workspace(ws)
    monkeypatch.chdir(ws)
    before = tree(tmp_path)
    monkeypatch.setattr(runner, "write_evaluation", terminated)
    previous = signal.getsignal(signal.SIGTERM)
    assert main(["run", "spec.toml", "--out", "o"]) == 143
    assert capsys.readouterr().err == LINE + "\n"
    assert tree(tmp_path) == before
    assert signal.getsignal(signal.SIGTERM) is previous  # restored


def test_terminate_as_interrupt_raises_once_and_restores():
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as caught, terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert isinstance(caught.value, KeyboardInterrupt)  # every Ctrl-C clean-up runs for it
    assert caught.value.exit_status == 143
    assert signal.getsignal(signal.SIGTERM) is previous
    with pytest.raises(Terminated), terminate_as_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:  # a second SIGTERM during the clean-up does not break it off
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is previous
