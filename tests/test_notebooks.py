"""The notebooks of ``notebooks/``: committed with their outputs, from the prelude, shipped, and
executed end to end (issue 37).

Fast (``make test``):

- every notebook is committed executed top to bottom (execution counts 1, 2, ... in order),
  its last cell printing ``ALL CHECKS PASSED``, and its outputs carry no warning or traceback
  on stderr and no absolute local path (``docs/gen/execute_notebooks.py``'s
  ``output_problems``; a doctored notebook is caught: power);
- every notebook imports censusdp from ``censusdp.prelude`` only (a doctored import is caught);
- a real Jupyter kernel imports the prelude and draws a bar with no ``TqdmWarning`` (the first
  output of every notebook before; a control shows the warning ``tqdm.auto`` gives there);
- the site lists every notebook (``mkdocs.yml``'s nav and ``docs/notebooks.md``);
- ``censusdp notebooks list / copy DIR`` give a pip user the shipped files, byte for byte;
  a second copy, an edited copy and an unknown name are refused with one line and status 2;
  the command loads none of the estimation stack (a fresh interpreter, with a control).
  (tests/app/test_wheel_install.py checks the wheel's file list holds them.)

Slow (``make test-all``): each notebook executed in a kernel pinned to this interpreter (a
``python3`` kernelspec whose argv starts with ``sys.executable``, first on a temporary
``JUPYTER_PATH``); those that read ``../shared/data`` run twice, with the data (skipped when
absent) and with ``CENSUSDP_NO_SHARED=1`` (their no-data branch). A run with the data the
committed outputs were made with must print what they print (stdout streams, equal).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from censusdp.paths import shared_data_file

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def _load_execute_script():
    spec = importlib.util.spec_from_file_location(
        "execute_notebooks", ROOT / "docs" / "gen" / "execute_notebooks.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


execute_script = _load_execute_script()

#: notebook → shared data files it reads (empty: runs the same everywhere)
SHARED = {
    "quickstart": (),
    "county_bias_study": ("county_totalpop_2010.csv",),
    "adding_a_geography_level": ("county_sex_age5_2010.csv", "ma_cousub_sex_age5_2010.csv"),
    "integer_mechanisms_and_mcmc": (),
}

#: text the output of each run must contain: (notebook, shared data used) → strings; the
#: committed outputs were made with the shared data present (``shared`` True where it reads any)
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


def _read(name: str):
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def _text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out:
                parts.append(out["data"].get("text/plain", ""))
    return "\n".join(parts)


def _stdout(nb) -> list[str]:
    """The stdout text of every code cell, in order."""
    return [
        "".join(o.get("text", "") for o in c.get("outputs", []) if o.get("name") == "stdout")
        for c in nb.cells
        if c.cell_type == "code"
    ]


def test_the_notebook_list_is_the_folder():
    assert sorted(SHARED) == sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))


# ---------------------------------------------------------------------------------------------
# committed outputs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SHARED))
def test_notebook_is_committed_executed_with_clean_outputs(name):
    nb = _read(name)
    code = [c for c in nb.cells if c.cell_type == "code"]
    # run top to bottom in one fresh kernel: 1, 2, 3, ... with nothing skipped or rerun
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), name
    assert all(c.outputs for c in code[-1:]), name
    assert execute_script.output_problems(nb) == [], name
    text = _text(nb)
    for expected in EXPECTED[(name, bool(SHARED[name]))]:
        assert expected in text, f"{name}: {expected!r} not in the committed output"
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_output_problems_catches_a_warning_a_path_an_error_and_an_unrun_cell():
    nb = _read("quickstart")
    assert execute_script.output_problems(nb) == []
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    bad = copy.deepcopy(nb)
    bad.cells[code[0]].outputs.insert(
        0,
        nbformat.v4.new_output(
            "stream",
            name="stderr",
            text="/x/tqdm/auto.py:21: TqdmWarning: IProgress not found.\n",
        ),
    )
    bad.cells[code[1]].outputs.append(
        nbformat.v4.new_output(
            "stream", name="stdout", text="wrote /home/someone/censusdp/out.csv\n"
        )
    )
    bad.cells[code[2]].outputs.append(
        nbformat.v4.new_output(
            "execute_result",
            data={"text/plain": "PosixPath('/tmp/censusdp-nb-x/work')"},
            execution_count=3,
        )
    )
    bad.cells[code[3]].outputs.append(
        nbformat.v4.new_output("error", ename="AssertionError", evalue="", traceback=[])
    )
    bad.cells[code[4]].execution_count = None
    problems = execute_script.output_problems(bad)
    assert len(problems) == 5, problems
    assert "TqdmWarning" in problems[0] and "/home/" in problems[1] and "/tmp/" in problems[2]
    assert "AssertionError" in problems[3] and "not executed" in problems[4]
    # a relative path or a URL is no local path
    fine = copy.deepcopy(nb)
    fine.cells[code[1]].outputs.append(
        nbformat.v4.new_output(
            "stream", name="stdout", text="wrote out/r.csv; see https://x.org/tmp/a\n"
        )
    )
    assert execute_script.output_problems(fine) == []


# ---------------------------------------------------------------------------------------------
# imports from the prelude
# ---------------------------------------------------------------------------------------------
def _censusdp_imports(nb) -> list[str]:
    """Every censusdp module a notebook's code cells import."""
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(
            ln for ln in cell.source.splitlines() if not ln.lstrip().startswith(("%", "!"))
        )
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.append(node.module)
            elif isinstance(node, ast.Import):
                found.extend(a.name for a in node.names)
    return [m for m in found if m == "censusdp" or m.startswith("censusdp.")]


@pytest.mark.parametrize("name", sorted(SHARED))
def test_notebook_imports_censusdp_from_the_prelude_only(name):
    modules = _censusdp_imports(_read(name))
    assert modules and set(modules) == {"censusdp.prelude"}, (name, modules)


def test_a_deep_import_is_caught():
    nb = copy.deepcopy(_read("quickstart"))
    first = next(c for c in nb.cells if c.cell_type == "code")
    first.source += "\nfrom censusdp.estimation.gls.tree import tree_gls\n"
    assert "censusdp.estimation.gls.tree" in _censusdp_imports(nb)


# ---------------------------------------------------------------------------------------------
# a real kernel: no TqdmWarning
# ---------------------------------------------------------------------------------------------
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


def _execute(nb, work: Path) -> None:
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(work)}}
    ).execute()  # raises CellExecutionError on the first failing cell


def test_a_kernel_imports_the_prelude_and_draws_a_bar_without_warning(kernel_env):
    has_widgets = importlib.util.find_spec("ipywidgets") is not None
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import warnings\nwarnings.simplefilter('always')"),
        nbformat.v4.new_code_cell("from censusdp.prelude import *"),
        nbformat.v4.new_code_cell(
            "from censusdp.progress import progress_bar, tqdm_class\n"
            "with progress_bar(3, 'censusdp test', 'step', default=True) as bar:\n"
            "    bar.update(3)\n"
            "print(tqdm_class().__module__)"
        ),
        # control: what tqdm.auto does in the same kernel (imported last, after the checks)
        nbformat.v4.new_code_cell("from tqdm.auto import tqdm as auto_tqdm"),
    ]
    _execute(nb, kernel_env)
    streams = [[(o.get("name"), o.get("text", "")) for o in c.outputs] for c in nb.cells]
    assert streams[1] == [], streams[1]  # importing the prelude prints nothing
    err = "".join(t for n, t in streams[2] if n == "stderr")
    out = "".join(t for n, t in streams[2] if n == "stdout")
    assert "Warning" not in err
    assert out.strip() == ("tqdm.notebook" if has_widgets else "tqdm.std")
    if not has_widgets:
        assert "censusdp test: 100%" in err and "3/3" in err
        control = "".join(t for n, t in streams[3] if n == "stderr")
        assert "TqdmWarning: IProgress not found" in control  # the warning the fix avoids


# ---------------------------------------------------------------------------------------------
# the site lists every notebook
# ---------------------------------------------------------------------------------------------
def test_the_site_renders_every_notebook_with_its_outputs_unexecuted():
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    page = (ROOT / "docs" / "notebooks.md").read_text(encoding="utf-8")
    assert "- mkdocs-jupyter:" in mkdocs and "execute: false" in mkdocs
    for name in SHARED:
        assert f": notebooks/{name}.ipynb\n" in mkdocs, name
        assert f"(notebooks/{name}.ipynb)" in page, name


# ---------------------------------------------------------------------------------------------
# censusdp notebooks list / copy
# ---------------------------------------------------------------------------------------------
def _cli(*argv: str) -> tuple[int, str, str]:
    from censusdp.app.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_notebooks_list_names_every_notebook_with_its_title():
    code, out, _ = _cli("notebooks", "list")
    assert code == 0
    rows = [line.split(None, 1) for line in out.splitlines()]
    assert [r[0] for r in rows] == sorted(SHARED)
    titles = dict(rows)
    assert titles["quickstart"].startswith("Quickstart: from a confidential table")


def test_notebooks_copy_writes_the_shipped_files_and_refuses_to_clobber(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = _cli("notebooks", "copy", "nb")
    assert code == 0 and out.startswith("wrote nb (4 notebooks:")
    for name in SHARED:
        got = (tmp_path / "nb" / f"{name}.ipynb").read_bytes()
        assert got == (NOTEBOOKS / f"{name}.ipynb").read_bytes(), name
    assert not (tmp_path / "nb" / "__init__.py").exists()
    # a second copy needs --overwrite
    code, _, err = _cli("notebooks", "copy", "nb", "--only", "quickstart")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--overwrite" in err
    code, out, _ = _cli("notebooks", "copy", "--overwrite", "nb", "--only", "quickstart")
    assert code == 0 and out.strip() == "wrote nb (1 notebook: quickstart)"
    assert sorted(p.name for p in (tmp_path / "nb").glob("*.ipynb")) == ["quickstart.ipynb"]
    # an edited notebook is the user's: never replaced
    edited = tmp_path / "nb" / "quickstart.ipynb"
    edited.write_bytes(edited.read_bytes() + b"\n")
    code, _, err = _cli("notebooks", "copy", "--overwrite", "nb")
    assert code == 2 and "changed since censusdp wrote it" in err
    assert edited.read_bytes().endswith(b"\n\n")
    # an unknown name: one line naming the shipped ones, nothing written
    code, _, err = _cli("notebooks", "copy", "other", "--only", "nope")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "'nope'" in err and "quickstart" in err and not (tmp_path / "other").exists()


def test_notebooks_list_and_copy_import_no_heavy_module(tmp_path):
    """The command answers from the package's resources: in a fresh interpreter, building the
    parser and running ``list`` and ``copy`` load none of the estimation stack (a control run
    that imports the prelude shows the probe sees it)."""
    heavy = ("numpy", "pandas", "scipy", "numba", "cvxpy", "dask", "matplotlib")
    probe = (
        "import contextlib, io, json, sys\n"
        "{setup}\n"
        f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))"
    )
    setup = (
        "from censusdp.app.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['notebooks', 'list']) == 0\n"
        f"    assert main(['notebooks', 'copy', {str(tmp_path / 'nb')!r}]) == 0"
    )

    def loaded(code: str) -> list[str]:
        res = subprocess.run(
            [sys.executable, "-c", probe.format(setup=code)],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        return json.loads(res.stdout.strip().splitlines()[-1])

    assert loaded(setup) == []
    assert len(list((tmp_path / "nb").glob("*.ipynb"))) == len(SHARED)
    assert {"numpy", "pandas"} <= set(loaded("import censusdp.prelude"))


# ---------------------------------------------------------------------------------------------
# executing every notebook (slow)
# ---------------------------------------------------------------------------------------------
def _cases():
    for name, files in SHARED.items():
        for shared in (True, False) if files else (False,):
            marks = [pytest.mark.slow] + ([pytest.mark.shared] if shared else [])
            ident = name if not files else f"{name}-{'shared' if shared else 'no-shared'}"
            yield pytest.param(name, shared, marks=marks, id=ident)


@pytest.mark.parametrize(("name", "shared"), list(_cases()))
def test_notebook_executes(name, shared, kernel_env, monkeypatch):
    if shared:
        missing = [f for f in SHARED[name] if shared_data_file(f) is None]
        if missing:
            pytest.skip(f"../shared/data/{missing[0]} is not available")
    elif SHARED[name]:
        monkeypatch.setenv("CENSUSDP_NO_SHARED", "1")
    nb = _read(name)
    committed = _stdout(nb)
    _execute(nb, kernel_env)
    text = _text(nb)
    for expected in EXPECTED[(name, shared)]:
        assert expected in text, f"{name}: {expected!r} not in the output"
    assert execute_script.output_problems(nb) == [], name
    if shared == bool(SHARED[name]):  # the run the committed outputs were made from
        assert _stdout(nb) == committed, f"{name}: stale outputs: rerun execute_notebooks.py"
