"""Execute the notebooks of ``notebooks/`` and store them WITH their outputs (issue 37).

    .venv/bin/python docs/gen/execute_notebooks.py [NAME ...]

The documentation site renders the committed outputs and never executes a notebook (a build
stays fast), so this script is how they are refreshed after a change: run it from the project
venv, look at ``git diff``, commit. Each notebook runs top to bottom in a fresh kernel pinned
to this interpreter (a ``python3`` kernelspec in a temporary ``JUPYTER_PATH``, as
tests/test_notebooks.py does), in a temporary working folder, with ``PYTHONHASHSEED=0``; the
notebooks draw their noise from ``KeyedRNG.reproducible`` seeds, so a rerun gives the same
numbers (wall-clock timings aside). The notebooks that read the optional shared data find it
through ``$CENSUSDP_SHARED_DATA`` (or ``../shared/data`` beside the checkout), and take their
no-data branch without it; the script says which.

A notebook is written back only when every cell ran and its outputs pass
:func:`output_problems` (no warning or traceback on stderr, no absolute local path); else the
script names the notebook and the problem, leaves the file as it was and exits 1.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"

#: the kernelspec stored in every committed notebook (what Jupyter offers a user by default)
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}

#: an absolute local path in an output: a home, temporary, project or virtual-env folder
ABSOLUTE = re.compile(r"(?<![\w.])/(?:home|Users|tmp|work|root|var|opt|usr|private)/[\w.-]")


def output_problems(nb) -> list[str]:
    """What a committed notebook's outputs must not carry, one line per problem: a stderr
    stream with a warning or traceback, an ``error`` output, an absolute local path in any
    text output; and a code cell left without ``execution_count`` (not executed)."""
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("execution_count") is None:
            problems.append(f"cell {i}: not executed")
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "error":
                problems.append(f"cell {i}: error {out.get('ename')}")
                continue
            texts = []
            if kind == "stream":
                texts.append(out.get("text", ""))
                if out.get("name") == "stderr" and re.search(r"Warning|Traceback", texts[-1]):
                    problems.append(f"cell {i}: a warning on stderr: {texts[-1].strip()[:120]}")
            for mime, value in out.get("data", {}).items():
                if mime.startswith("text/") or mime.endswith("json"):
                    texts.append(value if isinstance(value, str) else json.dumps(value))
            for text in texts:
                found = ABSOLUTE.search(text)
                if found:
                    problems.append(f"cell {i}: an absolute path {found.group(0)!r}...")
    return problems


def _kernel_env(base: Path) -> dict[str, str]:
    spec_dir = base / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        **KERNELSPEC,
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return {
        "JUPYTER_PATH": str(base / "jupyter"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "IPYTHONDIR": str(base / "ipython"),
        "PYTHONHASHSEED": "0",
    }


def execute(path: Path) -> tuple[object, float]:
    """Run one notebook in a fresh pinned kernel; return it with its outputs and the seconds."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="censusdp-nb-") as tmp:
        base = Path(tmp)
        saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "JUPYTER_RUNTIME_DIR",
                                                 "IPYTHONDIR", "PYTHONHASHSEED", "MPLBACKEND")}  # fmt: skip
        os.environ.update(_kernel_env(base))
        os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend: figures as PNG outputs
        work = base / "work"
        work.mkdir()
        try:
            t0 = time.perf_counter()
            nbclient.NotebookClient(
                nb,
                timeout=600,
                kernel_name="python3",
                record_timing=False,
                resources={"metadata": {"path": str(work)}},
            ).execute()
            seconds = time.perf_counter() - t0
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    return nb, seconds


def main(argv: list[str]) -> int:
    import nbclient.exceptions
    import nbformat

    from censusdp.paths import shared_data_dir

    names = argv or sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    shared = shared_data_dir()
    print(f"shared data: {'found' if shared else 'absent (no-data branches)'}", flush=True)
    failed = 0
    for name in names:
        path = NOTEBOOKS / f"{name}.ipynb"
        try:
            nb, seconds = execute(path)
        except nbclient.exceptions.CellExecutionError as exc:
            failed += 1
            print(f"{name}: NOT written (a cell failed)\n{exc}", file=sys.stderr)
            continue
        problems = output_problems(nb)
        if problems:
            failed += 1
            print(f"{name}: NOT written ({len(problems)} problems)", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            continue
        tmp = path.with_name(f".{path.name}.tmp")
        nbformat.write(nb, tmp)
        tmp.replace(path)
        print(f"{name}: executed in {seconds:.1f} s, written with its outputs", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
