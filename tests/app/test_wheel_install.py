"""The wheel a user installs: built from the tracked files, installed into a fresh venv outside
the repository, and run from there (issue 37).

The tracked files are copied into ``tmp_path`` first, so the build leaves nothing in the
checkout; the venv gets the wheel and its dependencies by ``uv`` (the one the Makefile puts
into ``.venv``) from its local cache, falling back to the registry. From a directory outside
the repository, ``censusdp --help``, ``censusdp spec list``, ``censusdp spec show`` and
``censusdp notebooks copy`` must work from the installed package alone (the packaged specs,
schemas, codebooks, notebooks and the demo CSV are package data), and the wheel must carry
``LICENSE`` and ``py.typed`` and no ``plotnine``/``sympy`` requirement. A data experiment (``census-county-integer --quick``)
runs with ``--data`` on a small county file the test writes in the NHGIS column layout, and
without it says where the public file comes from (IPUMS NHGIS), never a folder beside a
checkout the user does not have. ``censusdp demo --quick`` in that venv is marked slow.
"""

from __future__ import annotations

import json
import os
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
    # the notebooks, with their outputs, for `censusdp notebooks copy DIR`
    notebooks = {f"censusdp/notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert len(notebooks) == 4 and notebooks <= names
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
    res = _run(installed, "notebooks", "copy", "nb", "--only", "quickstart")
    assert res.returncode == 0, res.stderr
    copied = installed["cwd"] / "nb" / "quickstart.ipynb"
    assert copied.read_bytes() == (ROOT / "notebooks" / "quickstart.ipynb").read_bytes()
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


#: Five counties in the layout of the public county file (IPUMS NHGIS extract): four of
#: Illinois, the study's state, and one elsewhere (left out by the study). Made-up counts.
COUNTIES = (
    "gisjoin,fips,state_fips,county_fips,pop_sf2010,pop_ddp_20191029,pop_ppdd_20200527\n"
    "G1700010,17001,17,001,67103,67050,67120\n"
    "G1700030,17003,17,003,8238,8200,8260\n"
    "G1700050,17005,17,005,17768,17700,17790\n"
    "G1700070,17007,17,007,54165,54100,54180\n"
    "G0100010,01001,01,001,54571,54562,54603\n"
)


def test_installed_data_experiment_with_data(installed):
    """One data experiment from the installed wheel, its input given with ``--data``; and
    without ``--data`` (no checkout, no shared folder) one line naming the public source."""
    data = installed["cwd"] / "counties.csv"
    data.write_text(COUNTIES, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "CENSUSDP_SHARED_DATA"}
    args = ("experiment", "census-county-integer", "--quick")
    res = subprocess.run(
        [str(installed["bin"] / "censusdp"), *args, "--seed", "1", "--data", str(data)]
        + ["--out", "exp"],
        cwd=installed["cwd"], capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = installed["cwd"] / "exp"
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["states"] == ["17"] and metrics["n_counties"] == 4  # read from --data
    assert metrics["invariant_exact"] is True and metrics["all_integer"] is True
    assert (out / "report.md").is_file()
    missing = subprocess.run(
        [str(installed["bin"] / "censusdp"), *args, "--out", "exp2"],
        cwd=installed["cwd"], capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    lines = missing.stderr.strip().splitlines()
    assert missing.returncode == 2 and len(lines) == 1, missing.stderr
    assert "IPUMS NHGIS" in lines[0] and "--data PATH" in lines[0]
    assert "shared" not in lines[0] and not (installed["cwd"] / "exp2").exists()
