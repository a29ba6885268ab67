"""``censusdp nmf`` limits BLAS threads to what it asks for: the limit is set before numpy
loads (the parser imports no numpy), and numpy's BLAS then starts that many threads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from censusdp.app.cli import main
from censusdp.app.commands.nmf import BLAS_THREAD_VARIABLES

PROBE = """
import os, sys
from censusdp.app.commands.nmf import limit_blas_threads
with limit_blas_threads({threads}):
    assert "numpy" not in sys.modules
    import numpy
    numpy.ones((64, 64)) @ numpy.ones((64, 64))  # BLAS loaded and used
    print(len(os.listdir("/proc/self/task")), os.environ["OPENBLAS_NUM_THREADS"])
"""


def _threads(threads, env_value=None):
    """(threads of a fresh interpreter after numpy loads, its OPENBLAS_NUM_THREADS)."""
    env = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARIABLES}
    if env_value is not None:
        env["OPENBLAS_NUM_THREADS"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE.format(threads=threads))],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    n, var = out.stdout.split()
    return int(n), var


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc (Linux)")
def test_blas_starts_the_threads_the_command_asks_for():
    assert _threads(1) == (1, "1")
    assert _threads(None) == (1, "1")  # the command's default: one thread
    assert _threads(None, "2")[1] == "2"  # the environment's own setting is kept
    if (os.cpu_count() or 1) > 1:  # power: without the limit OpenBLAS starts more threads
        assert _threads(2) == (2, "2")


def test_blas_threads_must_be_a_positive_whole_number(tmp_path, capsys):
    argv = ["nmf", str(tmp_path), "--state-totals", "p1.csv", "--out", str(tmp_path / "o")]
    assert main([*argv, "--blas-threads", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--blas-threads" in err and "'0'" in err
    assert not (tmp_path / "o").exists()
