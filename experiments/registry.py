"""Discover and run experiments (``censusdp experiment``, :mod:`censusdp.app.commands.experiment`).

Every experiment module declares its metadata as ``INFO = ExperimentInfo(...)`` (what it
reproduces, the paper, the data files, the measured run times); ``censusdp experiment --list``
and the README's table of experiments (:func:`readme_table`, checked by a test) are made from
it, so there is no second list to keep in step.

``censusdp experiment NAME`` imports ``censusdp.experiments.<NAME with - replaced by _>`` (or,
for another package's experiment, the module its ``censusdp.experiments`` entry point names)
and calls its ``run(ctx)``. The experiment writes figures and ``report.md`` through ``ctx`` into a
temporary directory; the runner adds ``metrics.json`` (the returned dict) and renames the
directory into place only when everything succeeded. The output path follows the policy of
:mod:`censusdp.atomic` (new, or an earlier censusdp output with ``overwrite``), checked before
the experiment starts. A study repeats its releases with :func:`repeat` (one keyed stream per
run) and times its stages with :meth:`ExperimentContext.timed`.

The module is light at import (the command line imports it, and every
experiment module imports it for ``ExperimentInfo``): the random generators, the run options'
check and the experiments themselves are imported when a command runs.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from censusdp.errors import DataError, SpecError
from censusdp.paths import shared_data_file
from censusdp.timing import CPU_PREFIX, stage

if TYPE_CHECKING:
    from censusdp.rng import KeyedRNG

__all__ = [
    "ExperimentContext",
    "ExperimentInfo",
    "PUBLIC_SOURCES",
    "available",
    "experiment_info",
    "listing",
    "readme_table",
    "repeat",
    "run_experiment",
]


_NHGIS = (
    "from IPUMS NHGIS (Van Riper, Kugler & Schroeder, IPUMS NHGIS Privacy-Protected 2010 "
    "Census Demonstration Data, v20200527, https://www.nhgis.org)"
)
#: Where each experiment's public input file comes from (named when it is missing).
PUBLIC_SOURCES = {
    "county_totalpop_2010.csv": (
        "the total population of every county in the 2010 Census (Summary File 1) and the "
        f"Census Bureau's 2020 DAS demonstration runs, {_NHGIS}; columns gisjoin, fips, "
        "state_fips, county_fips, pop_sf2010, pop_ddp_20191029, pop_ppdd_20200527"
    ),
    "county_sex_age5_2010.csv": (
        "every county's sex by 5-year age group counts in the 2010 Census and the Census "
        f"Bureau's DAS demonstration runs, {_NHGIS}; one row per county and version"
    ),
    "taxi_zone_lookup.csv": (
        "the NYC Taxi & Limousine Commission's public taxi zone lookup "
        "(https://www.nyc.gov/site/tlc/about/tlc-trip-record-data.page)"
    ),
    "taxi_pickups_2019-02_sample_by_zone.csv": (
        "yellow-taxi pickups per zone counted from a sample of the NYC Taxi & Limousine "
        "Commission's public February 2019 trip records "
        "(https://www.nyc.gov/site/tlc/about/tlc-trip-record-data.page)"
    ),
}


@dataclass(frozen=True)
class ExperimentInfo:
    """What an experiment is, for ``--list``, the README and its report's header.

    Attributes
    ----------
    reproduces : str
        One sentence: what it reproduces and what it shows (Markdown).
    paper : str
        The paper (authors, year, short title) and the figure or table reproduced; empty for
        the project's own studies.
    data : tuple of str
        Public files it reads (``--data`` gives one; :data:`PUBLIC_SOURCES` says where each
        comes from); empty when its data are embedded or synthetic.
    full_run : str
        Measured wall time of the full run on the 2-core development machine.
    all_units : str
        What ``--all`` adds; empty when the study has no such choice.
    """

    reproduces: str
    paper: str
    data: tuple[str, ...]
    full_run: str
    all_units: str = ""


def _secure_rng() -> KeyedRNG:
    """:meth:`KeyedRNG.secure`, imported when a context is made (numpy stays out of the parser)."""
    from censusdp.rng import KeyedRNG

    return KeyedRNG.secure()


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
    options : dict
        ``--opt KEY=VALUE``: the experiment's own options, every key in its ``OPTIONS``
        (key → allowed values, the first the default), defaults filled in.
    """

    out: Path
    quick: bool = False
    data: Path | None = None
    rng: KeyedRNG = field(default_factory=_secure_rng)
    timings: dict[str, float] = field(default_factory=dict)
    all_units: bool = False
    options: dict[str, str] = field(default_factory=dict)

    def input_file(self, default_name: str, *, required: bool = True) -> Path | None:
        """``--data`` if given, else the development copy of ``default_name``
        (:func:`censusdp.paths.shared_data_file`: ``$CENSUSDP_SHARED_DATA`` or a checkout's
        shared data folder).

        Raises
        ------
        DataError
            When the file is required and neither exists: the message says where the public
            file comes from (:data:`PUBLIC_SOURCES`) and to pass it with ``--data``.
        """
        if self.data is not None:
            if not self.data.is_file():
                raise DataError(f"--data {self.data}: no such file")
            return self.data
        p = shared_data_file(default_name)
        if p is None and required:
            source = PUBLIC_SOURCES.get(default_name, "a public file")
            raise DataError(
                f"this experiment reads {default_name!r}, {source}: download it and pass "
                "--data PATH"
            )
        return p

    @contextmanager
    def timed(self, name: str, *, cpu: bool = False) -> Iterator[None]:
        """Record the wall seconds of the ``with`` body as ``timings[name + "_seconds"]`` (with
        ``cpu``, the process CPU seconds as ``timings[name + "_cpu_seconds"]`` too), by
        :func:`~censusdp.timing.stage`."""
        clock: dict[str, float] = {}
        with stage(clock, name, cpu=time.process_time):
            yield
        self.timings[f"{name}_seconds"] = clock[name]
        if cpu:
            self.timings[f"{name}_cpu_seconds"] = clock[CPU_PREFIX + name]

    def savefig(self, fig: Any, name: str) -> Path:
        """Save a matplotlib figure as PNG and close it."""
        import matplotlib.pyplot as plt

        path = self.out / name
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return path

    def write_report(self, text: Any) -> Path:
        """Write ``report.md`` (a string, or a :class:`~censusdp.experiments.reporting.Report`)."""
        path = self.out / "report.md"
        path.write_text(str(text), encoding="utf-8")
        return path


def repeat(
    runs: int,
    rng: KeyedRNG,
    measure: Callable[[KeyedRNG], Any],
    estimators: Mapping[str, Callable[[Any, KeyedRNG], Any]],
    clock: dict[str, float] | None = None,
    *,
    stream: str = "run/{}",
) -> tuple[dict[str, list], list]:
    """The studies' simulate-and-summarise loop: ``runs`` independent releases.

    Run ``r`` has its own keyed stream ``rr = rng.child(stream.format(r))`` (run ``r`` is the
    same whatever the number of runs): its measurements ``measure(rr)``, then every
    estimator's ``f(measurements, rr)`` (an error vector, a release), timed by
    :func:`~censusdp.timing.stage` into ``clock`` under its name (wall and process CPU
    seconds).

    Returns
    -------
    outputs : dict
        Estimator name → its outputs, one per run.
    measurements : list
        Each run's measurements.
    """
    clock = {} if clock is None else clock
    out: dict[str, list] = {name: [] for name in estimators}
    measured = []
    for r in range(runs):
        rr = rng.child(stream.format(r))
        measured.append(meas := measure(rr))
        for name, fn in estimators.items():
            with stage(clock, name, cpu=time.process_time):
                out[name].append(fn(meas, rr))
    return out, measured


#: Modules of the package that serve the experiments and are not experiments themselves
#: (private helpers start with ``_``).
SUPPORT_MODULES = frozenset({"registry", "reporting"})


#: The entry-point group of other packages' experiments: ``NAME = "package.module"``, a
#: module with ``INFO`` and ``run(ctx)`` like a shipped one (read when experiments are listed
#: or looked up, never when the parser is built).
ENTRY_POINTS = "censusdp.experiments"


def plugin_experiments() -> dict[str, str]:
    """Other packages' experiments: name → module, from the :data:`ENTRY_POINTS` group.

    Raises
    ------
    SpecError
        A plug-in that takes a shipped experiment's name.
    """
    from importlib.metadata import entry_points

    shipped = set(_shipped())
    found = {}
    for ep in entry_points(group=ENTRY_POINTS):
        if ep.name in shipped:
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown"
            raise SpecError(
                f"experiment plug-in {ep.name!r} (entry point {ep.value!r} of the installed "
                f"package {dist}) takes the name of a shipped experiment; rename it"
            )
        found[ep.name] = ep.value
    return found


def _shipped() -> list[str]:
    import censusdp.experiments as pkg

    names = []
    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name.startswith("_") or mod.name in SUPPORT_MODULES:
            continue
        names.append(mod.name.replace("_", "-"))
    return names


def available() -> list[str]:
    """Names of all experiments: every module of this package but the support modules and
    private helpers (each declares ``INFO``; a test checks), and other packages' through
    their entry points (:func:`plugin_experiments`)."""
    return sorted([*_shipped(), *plugin_experiments()])


def _module(name: str) -> Any:
    """The module of experiment ``name`` (known to :func:`available`)."""
    plugin = plugin_experiments().get(name)
    return importlib.import_module(plugin or f"censusdp.experiments.{name.replace('-', '_')}")


def experiment_info(name: str) -> ExperimentInfo:
    """The ``INFO`` of experiment ``name``.

    Raises
    ------
    SpecError
        For an unknown name, or a module that declares no ``INFO``.
    """
    if name not in available():
        raise SpecError(f"unknown experiment {name!r}; available: {', '.join(available())}")
    module = _module(name)
    info = getattr(module, "INFO", None)
    if not isinstance(info, ExperimentInfo):
        raise SpecError(
            f"experiment module {module.__name__} declares no INFO = ExperimentInfo(...); every "
            "experiment states what it reproduces, its paper, data and run time"
        )
    return info


def readme_table() -> str:
    """The README's table of experiments, made from every experiment's ``INFO``."""
    import pandas as pd

    from censusdp.pipelines.report import markdown_table

    rows = []
    for name in available():
        info = experiment_info(name)
        label = "`censusdp demo` / `midwest-demo`" if name == "midwest-demo" else f"`{name}`"
        rows.append(
            {
                "experiment": label,
                "what it reproduces": info.reproduces + (f" ({info.paper})" if info.paper else ""),
                "data": ", ".join(f"`{d}`" for d in info.data) or "embedded or synthetic",
                "full run": info.full_run
                + (f" (`--all`: {info.all_units})" if info.all_units else ""),
            }
        )
    return markdown_table(pd.DataFrame(rows))


def listing() -> str:
    """``censusdp experiment --list``: one line per experiment (name, full run time, paper,
    data files), from each module's ``INFO``."""
    rows = [(name, experiment_info(name)) for name in available()]
    width = max(len(name) for name, _ in rows)
    return "\n".join(
        f"{name:<{width}}  {info.full_run:>7}  {info.paper or info.reproduces}"
        + (f" [data: {', '.join(info.data)}]" if info.data else "")
        for name, info in rows
    )


def _options(name: str, module: Any, given: dict[str, str] | None) -> dict[str, str]:
    """``given`` checked against the module's ``OPTIONS``, with the defaults filled in."""
    allowed: dict[str, tuple[str, ...]] = getattr(module, "OPTIONS", {})
    given = dict(given or {})
    for key, value in given.items():
        if key not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise SpecError(
                f"experiment {name!r} has no option {key!r} (--opt); its options: {known}"
            )
        if value not in allowed[key]:
            raise SpecError(f"experiment {name!r}: --opt {key}={value!r} is not one of "
                            f"{', '.join(allowed[key])}")  # fmt: skip
    return {key: given.get(key, values[0]) for key, values in allowed.items()}


def run_experiment(
    name: str,
    out: str | Path | None = None,
    *,
    quick: bool = False,
    data: str | Path | None = None,
    seed: int | None = None,
    all_units: bool = False,
    overwrite: bool = False,
    options: dict[str, str] | None = None,
) -> tuple[Path, dict]:
    """Run experiment ``name``; returns the output directory and its metrics.

    ``all_units`` is ``--all`` and ``options`` ``--opt`` (see :class:`ExperimentContext`);
    ``overwrite`` replaces an earlier censusdp output at ``out`` (nothing else is ever
    replaced).

    Raises
    ------
    SpecError
        For an unknown experiment name, or an option or value it does not declare.
    """
    from censusdp.atomic import output_dir
    from censusdp.jsonable import to_jsonable
    from censusdp.pipelines.spec import check_run_options
    from censusdp.rng import KeyedRNG

    experiment_info(name)
    module = _module(name)
    opts = _options(name, module, options)
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
            options=opts,
        )
        with ctx.timed("total"):
            metrics = module.run(ctx)
        metrics = dict(metrics)
        metrics.setdefault("quick", quick)
        metrics.setdefault("timings", ctx.timings)
        (tmp / "metrics.json").write_text(
            json.dumps(to_jsonable(metrics), indent=2), encoding="utf-8"
        )
    return target, metrics
