"""How long the ``censusdp`` command takes to answer when it has little to do: prints JSON.

Each case runs the command line in a fresh interpreter (``python -m censusdp.app ...``, a
subprocess, as a user's shell would) ``--repeats`` times and reports the median, minimum and
maximum wall seconds, the exit status and the heavy modules loaded (from a separate
``-X importtime`` run):

- ``help``: ``censusdp --help``;
- ``missing_spec``: ``censusdp run missing.toml`` (exit 2, one line);
- ``bad_spec``: ``censusdp run bad.toml`` with an unknown top-level key (exit 2, one line);
- ``spec_list``: ``censusdp spec list``.

The goal (issue 37) is ≤ 1 s wall for the first three on the 2-core development machine.
``--baseline REF`` also times a git commit (``git archive`` into a temporary folder, its
packages imported from there through a small import hook, with the same interpreter and
installed dependencies) for before/after figures on the same machine and load.

Measured (2026-11-28, the shared 2-core machine under a load of about 11, ``--repeats 3
--baseline d26614e``, medians): ``--help`` 17.6 s before → 0.30 s after; ``run missing.toml``
16.3 s → 0.38 s; ``run bad.toml`` 14.3 s → 0.37 s; ``spec list`` (new) 0.29 s. Before, every
case imported cvxpy, numba, numpy, pandas, pyarrow and scipy; after, none of them.

Usage: ``python benchmarks/startup.py [--repeats N] [--baseline REF]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Modules whose import at start-up would mean the parser is not light.
HEAVY = ("numpy", "pandas", "scipy", "numba", "dask", "cvxpy", "matplotlib", "pyarrow")

ROOT = Path(__file__).resolve().parents[1]


def cases(work: Path) -> dict[str, list[str]]:
    """The command lines timed, by name (paths inside ``work``)."""
    bad = work / "bad.toml"
    bad.write_text("[bogus]\nx = 1\n", encoding="utf-8")
    return {
        "help": ["--help"],
        "missing_spec": ["run", str(work / "missing.toml")],
        "bad_spec": ["run", str(bad)],
        "spec_list": ["spec", "list"],
    }


def _command(args: list[str], source: Path | None) -> list[str]:
    """``python -m censusdp.app ARGS``, or the same against an other source tree."""
    if source is None:
        return [sys.executable, "-m", "censusdp.app", *args]
    shim = (
        "import sys, importlib.util as u\n"
        f"root = {str(source)!r}\n"
        "dirs = {'censusdp': 'censusdp', 'censusdp.hierarchy': 'hierarchy',\n"
        "        'censusdp.mechanisms': 'mechanisms', 'censusdp.estimation': 'estimation',\n"
        "        'censusdp.pipelines': 'pipelines', 'censusdp.experiments': 'experiments',\n"
        "        'censusdp.app': 'app'}\n"
        "class Finder:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        "        if name in dirs:\n"
        "            d = root + '/' + dirs[name]\n"
        "            return u.spec_from_file_location(name, d + '/__init__.py',\n"
        "                                             submodule_search_locations=[d])\n"
        "sys.meta_path.insert(0, Finder)\n"
        "from censusdp.app.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return [sys.executable, "-c", shim, *args]


def time_case(args: list[str], repeats: int, source: Path | None = None) -> dict:
    """Median, min and max wall seconds of ``repeats`` runs, the exit status, the heavy
    modules imported and the first line of stderr."""
    walls, status, err = [], None, ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = subprocess.run(_command(args, source), capture_output=True, text=True, cwd=ROOT)
        walls.append(time.perf_counter() - t0)
        status, err = res.returncode, res.stderr
    trace = subprocess.run(
        [*_command(args, source)[:1], "-X", "importtime", *_command(args, source)[1:]],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stderr
    loaded = {m.group(1).split(".")[0] for m in re.finditer(r"\|\s+([\w.]+)\s*$", trace, re.M)}
    return {
        "median_s": round(statistics.median(walls), 3),
        "min_s": round(min(walls), 3),
        "max_s": round(max(walls), 3),
        "exit_status": status,
        "heavy_imported": sorted(loaded & set(HEAVY)),
        "stderr_first_line": err.splitlines()[0] if err else "",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="runs per case (default 5)")
    ap.add_argument("--baseline", help="a git commit to time as well (before/after)")
    opts = ap.parse_args()
    out: dict = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "repeats": opts.repeats,
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        out["current"] = {name: time_case(args, opts.repeats) for name, args in cases(work).items()}
        if opts.baseline:
            tree = work / "baseline"
            tree.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", opts.baseline],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
            # compiled first, as an installed package is: the timings are of imports, not of
            # bytecode compilation
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree)], check=True)
            out["baseline"] = {"commit": opts.baseline}
            for name, args in cases(work).items():
                if name == "spec_list":
                    continue  # not in the baseline
                out["baseline"][name] = time_case(args, opts.repeats, source=tree)
    out["goal_met"] = all(
        out["current"][c]["median_s"] <= 1.0 for c in ("help", "missing_spec", "bad_spec")
    )
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
