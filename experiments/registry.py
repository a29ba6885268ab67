"""Discover and run experiments; the ``censusdp experiment`` command (:func:`register`).

``censusdp experiment NAME`` imports ``censusdp.experiments.<NAME with - replaced by _>`` and
calls its ``run(ctx)``. The experiment writes figures and ``report.md`` through ``ctx`` into a
temporary directory; the runner adds ``metrics.json`` (the returned dict) and renames the
directory into place only when everything succeeded. The output path follows the policy of
:mod:`censusdp.atomic` (new, or an earlier censusdp output with ``overwrite``), checked before
the experiment starts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from censusdp.atomic import output_dir
from censusdp.command_line import add_overwrite, seed_arg
from censusdp.config import check_run_options
from censusdp.errors import DataError, SpecError
from censusdp.jsonable import to_jsonable
from censusdp.paths import shared_data_file
from censusdp.rng import KeyedRNG

__all__ = ["ExperimentContext", "available", "register", "run_experiment"]


@dataclass
class ExperimentContext:
    """What an experiment gets: where to write, how big to run, its data and randomness.

    Attributes
    ----------
    out : Path
        The (temporary) output directory; write figures and the report here.
    quick : bool
        Run the small form (≤ 60 s).
    data : Path or None
        ``--data``: overrides the experiment's default input file.
    rng : KeyedRNG
        Secure by default; reproducible when ``--seed`` was given.
    timings : dict
        Stage timings the experiment may fill; written into ``metrics.json``.
    all_units : bool
        ``--all``: run every unit the study covers (e.g. every state) instead of its
        default one; experiments without such a choice ignore it.
    """

    out: Path
    quick: bool = False
    data: Path | None = None
    rng: KeyedRNG = field(default_factory=KeyedRNG.secure)
    timings: dict[str, float] = field(default_factory=dict)
    all_units: bool = False

    def input_file(self, default_name: str, *, required: bool = True) -> Path | None:
        """``--data`` if given, else ``../shared/data/<default_name>``.

        Raises
        ------
        DataError
            When the file is required and neither exists.
        """
        if self.data is not None:
            if not self.data.is_file():
                raise DataError(f"--data {self.data}: no such file")
            return self.data
        p = shared_data_file(default_name)
        if p is None and required:
            raise DataError(
                f"input {default_name!r} not found: pass --data PATH or place the shared "
                "data folder beside the repository (../shared/data)"
            )
        return p

    def savefig(self, fig: Any, name: str) -> Path:
        """Save a matplotlib figure as PNG and close it."""
        import matplotlib.pyplot as plt

        path = self.out / name
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return path

    def write_report(self, text: str) -> Path:
        path = self.out / "report.md"
        path.write_text(text, encoding="utf-8")
        return path


def available() -> list[str]:
    """Names of all experiments shipped in this package."""
    import censusdp.experiments as pkg

    names = []
    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name.startswith("_") or mod.name == "registry":
            continue
        names.append(mod.name.replace("_", "-"))
    return sorted(names)


def run_experiment(
    name: str,
    out: str | Path | None = None,
    *,
    quick: bool = False,
    data: str | Path | None = None,
    seed: int | None = None,
    all_units: bool = False,
    overwrite: bool = False,
) -> tuple[Path, dict]:
    """Run experiment ``name``; returns the output directory and its metrics.

    ``all_units`` is ``--all`` (see :class:`ExperimentContext`); ``overwrite`` replaces an
    earlier censusdp output at ``out`` (nothing else is ever replaced).

    Raises
    ------
    SpecError
        For an unknown experiment name.
    """
    if name not in available():
        raise SpecError(f"unknown experiment {name!r}; available: {', '.join(available())}")
    module = importlib.import_module(f"censusdp.experiments.{name.replace('-', '_')}")
    target = Path(out) if out is not None else Path("results") / name
    check_run_options(seed=seed)
    rng = KeyedRNG.from_seed(seed)
    with output_dir(
        target,
        overwrite=overwrite,
        inputs=[data],
        command=f"experiment {name}",
        option="--out" if out is not None else "the default output",
    ) as tmp:
        ctx = ExperimentContext(
            out=tmp,
            quick=quick,
            data=None if data is None else Path(data),
            rng=rng,
            all_units=all_units,
        )
        t0 = time.perf_counter()
        metrics = module.run(ctx)
        ctx.timings["total_seconds"] = time.perf_counter() - t0
        metrics = dict(metrics)
        metrics.setdefault("quick", quick)
        metrics.setdefault("timings", ctx.timings)
        (tmp / "metrics.json").write_text(
            json.dumps(to_jsonable(metrics), indent=2), encoding="utf-8"
        )
    return target, metrics


def _cmd_experiment(args: argparse.Namespace) -> int:
    if args.list or not args.name:
        print("\n".join(available()))
        return 0
    out, metrics = run_experiment(
        args.name,
        args.out,
        quick=args.quick,
        data=args.data,
        seed=args.seed,
        all_units=args.all_units,
        overwrite=args.overwrite,
    )
    summary = {k: v for k, v in metrics.items() if not isinstance(v, dict | list)}
    print(json.dumps(to_jsonable(summary), indent=2))
    print(f"wrote {out}/ (metrics.json, report.md, figures)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``censusdp experiment [NAME] [--list] [--quick] [--data F] [--out D] [--seed N]``."""
    exp = sub.add_parser("experiment", help="run a reproduced study (see --list)")
    exp.add_argument("name", nargs="?", help="experiment name, e.g. laplace-conditioning")
    exp.add_argument("--list", action="store_true", help="list the experiments")
    exp.add_argument("--quick", action="store_true", help="small settings (≤ 60 s)")
    exp.add_argument("--data", help="input file overriding the default in ../shared/data")
    exp.add_argument("--out", help="output directory (default results/NAME)")
    exp.add_argument("--seed", type=seed_arg, help="reproducible mode (never for a real release)")
    add_overwrite(exp)
    exp.add_argument(
        "--all",
        dest="all_units",
        action="store_true",
        help="every unit the study covers (e.g. all states) instead of its default one",
    )
    exp.set_defaults(func=_cmd_experiment)
