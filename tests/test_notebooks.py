"""Execute the notebooks of ``notebooks/`` end to end (each asserts its own invariants).

The kernel is pinned to this interpreter: a ``python3`` kernelspec whose argv starts with
``sys.executable`` is written into a temporary ``JUPYTER_PATH`` (searched first), so the
notebooks import the ``censusdp`` under test on a fresh machine whatever kernels are installed.
The notebooks that read ``../shared/data`` run twice: with the data (skipped when absent) and
with ``CENSUSDP_NO_SHARED=1``, which makes them take their no-data branch.

``make test`` executes :data:`FAST` (the quick notebook: the kernel, the pinned interpreter and
the output checks are exercised on every run); ``make test-all`` executes every notebook in
every form (the others are marked ``slow``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from censusdp.paths import shared_data_file

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

#: notebook → shared data files it reads (empty: runs the same everywhere)
SHARED = {
    "quickstart": (),
    "county_bias_study": ("county_totalpop_2010.csv",),
    "adding_a_geography_level": ("county_sex_age5_2010.csv", "ma_cousub_sex_age5_2010.csv"),
    "integer_mechanisms_and_mcmc": (),
}

#: the notebook run in the fast suite (`make test`); every other run is marked ``slow``
FAST = ("quickstart", False)

#: text the output of each run must contain: (notebook, shared data used) → strings
EXPECTED = {
    ("quickstart", False): ["quickstart: ALL CHECKS PASSED"],
    ("county_bias_study", True): [
        "48 states, 41 negative, 5 significantly negative",
        "county_bias_study: ALL CHECKS PASSED",
    ],
    ("county_bias_study", False): [
        "shared data not available",
        "county_bias_study: ALL CHECKS PASSED",
    ],
    ("adding_a_geography_level", True): [
        "Massachusetts: 357 county subdivisions under 14 counties",
        "adding_a_geography_level: ALL CHECKS PASSED",
    ],
    ("adding_a_geography_level", False): [
        "shared data not available",
        "adding_a_geography_level: ALL CHECKS PASSED",
    ],
    ("integer_mechanisms_and_mcmc", False): ["integer_mechanisms_and_mcmc: ALL CHECKS PASSED"],
}


def _cases():
    for name, files in SHARED.items():
        for shared in (True, False) if files else (False,):
            marks = [pytest.mark.shared] if shared else []
            if (name, shared) != FAST:
                marks.append(pytest.mark.slow)
            ident = name if not files else f"{name}-{'shared' if shared else 'no-shared'}"
            yield pytest.param(name, shared, marks=marks, id=ident)


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A ``python3`` kernelspec running ``sys.executable``, first on ``JUPYTER_PATH``."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (censusdp test)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("CENSUSDP_NO_SHARED", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    return work


def _text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out:
                parts.append(out["data"].get("text/plain", ""))
    return "\n".join(parts)


def test_notebooks_are_stored_without_outputs():
    for name in SHARED:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, name


@pytest.mark.parametrize(("name", "shared"), list(_cases()))
def test_notebook_executes(name, shared, kernel_env, monkeypatch):
    if shared:
        missing = [f for f in SHARED[name] if shared_data_file(f) is None]
        if missing:
            pytest.skip(f"../shared/data/{missing[0]} is not available")
    elif SHARED[name]:
        monkeypatch.setenv("CENSUSDP_NO_SHARED", "1")
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(kernel_env)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    text = _text(nb)
    for expected in EXPECTED[(name, shared)]:
        assert expected in text, f"{name}: {expected!r} not in the output"
