"""The wheel a user installs: built from the tracked files, installed into a fresh venv outside
the repository, and run from there (issue 37).

The tracked files are copied into ``tmp_path`` first, so the build leaves nothing in the
checkout; the venv gets the wheel and its dependencies by ``uv`` (the one the Makefile puts
into ``.venv``) from its local cache, falling back to the registry. From a directory outside
the repository, ``censusdp --help``, ``censusdp spec list`` and ``censusdp spec show`` must
work from the installed package alone (the packaged specs, schemas, codebooks and the demo
CSV are package data), and the wheel must carry ``LICENSE`` and ``py.typed`` and no
``plotnine``/``sympy`` requirement. ``censusdp demo --quick`` in that venv is marked slow.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _uv() -> str:
    uv = Path(sys.executable).parent / "uv"
    found = str(uv) if uv.is_file() else shutil.which("uv")
    if found is None:
        pytest.skip("uv is not installed (make install puts it into .venv)")
    return found


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """Build the wheel from a copy of the tracked files and install it into a fresh venv."""
    uv = _uv()
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, files.split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = base / "dist"
    subprocess.run(
        [uv, "build", "--wheel", "--quiet", "-o", str(dist), str(src)], check=True, timeout=600
    )
    (wheel,) = dist.glob("censusdp-*.whl")
    venv = base / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [uv, "pip", "install", "--quiet", "--python", str(python), str(wheel)]
    if subprocess.run([*install, "--offline"], capture_output=True).returncode != 0:
        res = subprocess.run(install, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            pytest.skip(f"cannot install the wheel's dependencies: {res.stderr.strip()[-200:]}")
    away = base / "elsewhere"
    away.mkdir()
    return {"wheel": wheel, "bin": venv / "bin", "cwd": away}


def _run(installed: dict, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(installed["bin"] / "censusdp"), *args],
        cwd=installed["cwd"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_wheel_contents(installed):
    with zipfile.ZipFile(installed["wheel"]) as z:
        names = set(z.namelist())
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = z.read(meta).decode()
    assert {"censusdp/py.typed", "censusdp/data/midwest.csv", "censusdp/data/README.md"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "censusdp/experiments/midwest_demo.toml" in names
    runtime = [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert runtime and not [r for r in runtime if r.startswith(("plotnine", "sympy"))]
    assert "License-Expression: MIT" in metadata


def test_installed_command_runs_outside_the_repository(installed):
    res = _run(installed, "--help")
    assert res.returncode == 0, res.stderr
    assert "spec" in res.stdout and "demo" in res.stdout
    res = _run(installed, "spec", "list")
    assert res.returncode == 0, res.stderr
    listed = [line.split()[0] for line in res.stdout.splitlines()]
    assert "spec/midwest_demo" in listed and "codebook/ppdd" in listed
    assert "schema/pl94" in listed
    res = _run(installed, "spec", "show", "schema/h1")
    assert res.returncode == 0, res.stderr
    assert res.stdout == (ROOT / "censusdp" / "schemas" / "h1.toml").read_text(encoding="utf-8")
    # the package imported is the installed one, not this checkout
    where = subprocess.run(
        [str(installed["bin"] / "python"), "-c", "import censusdp; print(censusdp.__file__)"],
        cwd=installed["cwd"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert not Path(where).resolve().is_relative_to(ROOT)


@pytest.mark.slow
def test_installed_demo_quick(installed):
    """The demo reads the packaged CSV and spec from the installed wheel."""
    res = _run(installed, "demo", "--quick", "--out", "demo", timeout=900)
    assert res.returncode == 0, res.stderr
    assert "Running HiGHS" not in res.stdout
    out = installed["cwd"] / "demo"
    assert (out / "report.md").is_file() and (out / "bias_slopes.png").is_file()
    assert res.stdout.splitlines()[0].split()[:2] == ["budget", "estimator"]
