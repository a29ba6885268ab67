"""Run a spec: measure every level's queries, hold the invariants, run every estimator on the
same measurements, score them against the truth, and write the results atomically.

Outputs (in ``--out``, written to a temporary directory renamed into place when complete, under
the output policy of :mod:`censusdp.atomic`): ``release/`` — what may be published —
``estimates.parquet`` (repetition 0: level, code, cell, estimator, value, se, moe:
:func:`release_frame`), ``privacy.md``
and ``manifest.json`` (the spec without its seed, package versions, timings, privacy
statements, diagnostics); ``evaluation/`` — the comparison with the confidential truth,
labelled "contains confidential comparisons; not for publication" — ``metrics.csv`` (per
repetition, estimator and level), ``regressions.parquet`` (per repetition, estimator and
group: OLS of the leaf-total error on log true size), ``size_classes.csv`` (leaf-total errors
by size class), bounded PNG figures, ``report.md`` and a manifest flagged ``confidential``.

The work is cut at the deepest invariant level (:mod:`censusdp.pipelines.partition`); noise is
keyed by node, so the output is identical, bit for bit, for every scheduler and partition count.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import platform
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from censusdp import __version__
from censusdp.atomic import CLAIM, check_output, output_dir
from censusdp.errors import SpecError
from censusdp.estimation.release import Release
from censusdp.hierarchy.table import Table
from censusdp.jsonable import to_jsonable
from censusdp.mechanisms.queries import Invariant, Query, invariant
from censusdp.pipelines.data import RunData, load_data
from censusdp.pipelines.execute import open_executor
from censusdp.pipelines.interrupts import workers_ignore_interrupts
from censusdp.pipelines.io.outputs import written_errors
from censusdp.pipelines.measure import measure_partitioned
from censusdp.pipelines.metrics import error_metrics, group_regressions, size_class_metrics
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.plan import MeasurementPlan, build_plan
from censusdp.pipelines.report import CONFIDENTIAL_LABEL, write_figures, write_report
from censusdp.pipelines.spec import RunSpec, check_run_options
from censusdp.pipelines.specs import check_spec
from censusdp.progress import show_progress
from censusdp.progress import tqdm_bar as tqdm
from censusdp.rng import KeyedRNG
from censusdp.spreadsheet import write_csv
from censusdp.timing import stage

log = logging.getLogger(__name__)

__all__ = [
    "RunResult",
    "make_plan",
    "run_spec",
    "execute_spec",
    "cut_level",
    "output_target",
    "package_versions",
    "release_frame",
    "run_inputs",
    "size_classes",
    "write_release",
    "write_evaluation",
    "RELEASE_DIR",
    "EVALUATION_DIR",
    "separate_evaluation",
]

#: Folder of a run's output holding what may be published.
RELEASE_DIR = "release"
#: Folder of a run's output holding the (confidential) comparison with the truth.
EVALUATION_DIR = "evaluation"

_VERSIONED = (
    "numpy",
    "scipy",
    "pandas",
    "pyarrow",
    "cvxpy",
    "clarabel",
    "highspy",
    "dask",
    "distributed",
    "randomgen",
)


@dataclass(eq=False)
class RunResult:
    """What a run produced (the files are in ``out``)."""

    out: Path | None
    metrics: pd.DataFrame
    regressions: pd.DataFrame
    releases: dict[str, Release]
    manifest: dict
    table: Table

    @property
    def release_dir(self) -> Path | None:
        """The publishable folder (estimates, privacy statement, manifest)."""
        return None if self.out is None else self.out / RELEASE_DIR

    @property
    def evaluation_dir(self) -> Path | None:
        """The confidential comparison with the truth."""
        return None if self.out is None else self.out / EVALUATION_DIR


def _query(spec: RunSpec, name: str, cells: Sequence[str]) -> Query:
    if name == "total":
        return Query.total(cells)
    if name == "detailed":
        return Query.detailed(cells)
    marginal = spec.marginals[name]
    return Query.marginal(name, cells, marginal.groups)


def make_plan(spec: RunSpec, table: Table) -> MeasurementPlan:
    """The measurement plan (calibrated laws, invariants, privacy statement) of a spec."""
    cells = table.cells
    queries = {lvl: [_query(spec, q, cells) for q in names] for lvl, names in spec.queries.items()}
    invariants = {
        lvl: [_query(spec, q, cells) for q in names] for lvl, names in spec.invariants.items()
    }
    return build_plan(
        table.hierarchy.names,
        queries,
        invariants,
        spec.allocation(),
        accounting=spec.privacy.accounting,
        noise=spec.mechanism.noise,
        delta=spec.privacy.delta,
        acknowledge_exact_release=spec.acknowledge_exact_release,
    )


def cut_level(plan: MeasurementPlan, depth: int) -> int:
    """The deepest invariant level (at least 1 when the tree has more than one level)."""
    deepest = max((k for k, _ in plan.invariants), default=0)
    return min(max(deepest, 1), depth - 1)


def package_versions() -> dict[str, str]:
    """Versions of censusdp, Python and the numerical packages, for manifests."""
    out = {"censusdp": __version__, "python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _score(
    release: Release, truth: list[np.ndarray], rep: int, group_level: int
) -> tuple[list[dict], pd.DataFrame]:
    h = release.hierarchy
    rows = []
    for k, lv in enumerate(h.levels):
        m = error_metrics(release.estimates[k], truth[k], l1_denominator=sum(h.sizes))
        node = error_metrics(release.estimates[k].sum(axis=1), truth[k].sum(axis=1))
        rows.append(
            {
                "repetition": rep,
                "estimator": release.estimator,
                "level": lv.name,
                "nodes": lv.size,
                **{f"cell_{key}": v for key, v in m.items() if key != "n"},
                **{
                    f"total_{key}": v
                    for key, v in node.items()
                    if key not in ("n", "normalized_l1")
                },
            }
        )
    leaf = h.depth - 1
    err = release.estimates[leaf].sum(axis=1) - truth[leaf].sum(axis=1)
    group = h.levels[group_level].codes[h.ancestor_index(leaf, group_level)].astype(object)
    reg = group_regressions(err, truth[leaf].sum(axis=1), group)
    reg.insert(0, "estimator", release.estimator)
    reg.insert(0, "repetition", rep)
    return rows, reg


def execute_spec(
    spec: RunSpec,
    run_data: RunData,
    *,
    seed: int | None = None,
    scheduler: str | None = None,
    partitions: int | None = None,
    progress: bool | None = None,
    rng: KeyedRNG | None = None,
) -> tuple[dict[str, Release], pd.DataFrame, pd.DataFrame, dict]:
    """Run the spec in memory: releases of repetition 0, metrics, regressions, manifest.

    ``rng`` (e.g. an experiment's key) takes precedence over ``seed`` and ``[run] seed``.
    """
    check_spec(spec)
    table = run_data.table
    h = table.hierarchy
    clock: dict[str, float] = {}  # plan, runs
    work: dict[str, float] = {}  # measure and each estimator, summed over repetitions
    with stage(clock, "plan"):
        plan = make_plan(spec, table)
        seed = spec.run.seed if seed is None else seed
        if rng is None:
            with warnings.catch_warnings():
                # the CLI prints its own reproducible-mode warning
                warnings.simplefilter("ignore")
                rng = KeyedRNG.from_seed(seed)
        truth = table.all_levels()
        inv = [invariant(truth, k, q) for k, q in plan.invariants]
        cut = cut_level(plan, h.depth)
        sched = scheduler or spec.run.address or spec.run.scheduler
        check_run_options(seed=seed, partitions=partitions)
        n_parts = partitions if partitions is not None else spec.run.partitions
        group_level = max(h.depth - 2, 0)
        metric_rows: list[dict] = []
        regressions: list[pd.DataFrame] = []
        releases: dict[str, Release] = {}
    reps = spec.run.repetitions
    with (
        stage(clock, "runs"),  # opening and closing the executor included
        workers_ignore_interrupts(sched),
        open_executor(sched, address=spec.run.address, **spec.run.network()) as executor,
    ):
        n_parts = n_parts or max(1, 4 * executor.workers)
        parts = partition_units(h, cut, n_parts)
        steps = reps * (1 + len(spec.estimators.run))
        # the command line's -q / default decide; a library call draws long runs only
        show = progress if progress is not None else show_progress(steps > 20)
        log.info(
            "%d repetition(s): measure, then %s (%d units, %s scheduler, %d partitions)",
            reps,
            ", ".join(spec.estimators.run),
            h.sizes[-1],
            executor.name,
            len(parts),
        )
        # closed (on an error too) before the error propagates: it stays the last line
        with tqdm(total=steps, disable=not show, desc="censusdp run", unit="step") as bar:
            for rep in range(reps):
                rep_rng = rng.child(f"repetition/{rep}")
                with stage(work, "measure"):
                    meas = measure_partitioned(
                        h.names, truth, plan.as_tuples(), rep_rng.child("measure"), parts, executor
                    )
                bar.update()
                for name in spec.estimators.run:
                    with stage(work, name):
                        release = _estimate(
                            name, table, meas, inv, plan, rep_rng, spec, executor, parts
                        )
                    rows, reg = _score(release, truth, rep, group_level)
                    metric_rows.extend(rows)
                    regressions.append(reg)
                    if rep == 0:
                        releases[name] = release
                    bar.update()
        used_scheduler, used_workers = executor.name, executor.workers
    # the manifest's fields: wall seconds only, in the order the stages first ran
    timings = {"plan": clock["plan"]}
    timings.update((k, work[k]) for k in ("measure", *spec.estimators.run) if k in work)
    timings["total"] = clock["plan"] + clock["runs"]
    manifest = {
        "censusdp": __version__,
        "spec": spec.to_dict(redact_seed=True),
        "data": {
            "source": run_data.source,
            "levels": list(h.names),
            "nodes": list(h.sizes),
            "cells": list(table.cells),
        },
        "reproducible_mode": rng.reproducible_mode,
        "scheduler": used_scheduler,
        "workers": used_workers,
        "partitions": len(parts),
        "cut_level": h.names[cut],
        "repetitions": reps,
        "measurements": [
            {
                "level": h.names[p.level],
                "query": p.query.name,
                "budget": p.budget,
                "law": repr(p.law),
                "variance": p.law.variance,
            }
            for p in plan.measured
        ],
        "privacy": {name: r.privacy.to_dict() for name, r in releases.items()},
        "diagnostics": {name: to_jsonable(r.diagnostics) for name, r in releases.items()},
        "timings_seconds": timings,
        "versions": package_versions(),
    }
    return releases, pd.DataFrame(metric_rows), pd.concat(regressions, ignore_index=True), manifest


def _estimate(
    name, table, meas, inv: list[Invariant], plan, rep_rng, spec, executor, parts
) -> Release:
    from censusdp.pipelines.estimators import run_estimator

    return run_estimator(
        name,
        table.hierarchy,
        table.cells,
        meas,
        inv,
        plan.privacy,
        rep_rng.child(name),
        spec.estimators,
        executor=executor,
        partitions=parts,
    )


def output_target(spec: RunSpec, out: str | Path | None) -> tuple[Path, str]:
    """Where a run writes (``out``, else ``[output] dir``, else ``results/<spec name>``) and
    the option that named it (for messages)."""
    if out is not None:
        if not str(out).strip():
            raise SpecError("--out: empty path; name a new directory")
        return Path(out), "--out"
    if spec.output.dir is not None:
        return Path(spec.output.dir), f"{spec.source}: [output] dir"
    return Path("results") / Path(spec.source).stem, "the default output"


def run_inputs(spec: RunSpec, data: str | Path | None) -> list[Path]:
    """The files a run reads (the spec and its data): no output may replace or hold them."""
    files = [Path(spec.source)] if Path(spec.source).is_file() else []
    path = Path(data) if data is not None else spec.data.path
    return files + ([Path(path)] if path is not None else [])


def run_spec(
    spec: RunSpec,
    *,
    data: str | Path | None = None,
    out: str | Path | None = None,
    seed: int | None = None,
    scheduler: str | None = None,
    partitions: int | None = None,
    progress: bool | None = None,
    title: str | None = None,
    rng: KeyedRNG | None = None,
    overwrite: bool = False,
) -> RunResult:
    """Run a spec end to end and write its outputs into ``out`` (atomically).

    The output holds two folders. ``release/`` is what may be published: ``estimates.parquet``
    (repetition 0), ``privacy.md`` and ``manifest.json``. ``evaluation/`` compares the
    releases with the confidential truth (signed errors, bias regressions, figures,
    ``report.md``); from it and the release the truth can be recovered, so it is labelled
    confidential and flagged so in its manifest. Nothing is written when the run fails, and
    the output path is checked first (:func:`censusdp.atomic.check_output`).

    Parameters
    ----------
    spec : RunSpec
    data : path, optional
        Overrides ``[data] path``.
    out : path, optional
        Output directory (default ``[output] dir`` or ``results/<spec name>``).
    seed : int, optional
        Overrides ``[run] seed`` (reproducible mode; never written to outputs).
    scheduler : str, optional
        ``sync``, ``threads``, ``distributed`` or ``tcp://HOST:PORT``; overrides ``[run]``.
    partitions : int, optional
        Number of partitions, at least 1 (the output does not depend on it).
    overwrite : bool
        Replace an earlier censusdp output at ``out``; anything else is never replaced.

    Raises
    ------
    SpecError, DataError, HierarchyError, BudgetError, SolverError, ConvergenceError
        Nothing is written when a run fails.
    """
    check_spec(spec)
    check_run_options(seed=seed, partitions=partitions)
    target, option = output_target(spec, out)
    inputs = run_inputs(spec, data)
    check_output(target, kind="dir", overwrite=overwrite, inputs=inputs, option=option)
    log.info("reading the data (%s)", spec.data.source)
    run_data = load_data(spec, data)
    releases, metrics, regressions, manifest = execute_spec(
        spec,
        run_data,
        seed=seed,
        scheduler=scheduler,
        partitions=partitions,
        progress=progress,
        rng=rng,
    )
    sizes = pd.concat(
        [size_classes(r, run_data.table, name) for name, r in releases.items()], ignore_index=True
    )
    log.info("writing release/ and the confidential evaluation/")
    with output_dir(
        target, overwrite=overwrite, inputs=inputs, command="run", option=option
    ) as tmp:
        write_release(tmp / RELEASE_DIR, releases, manifest)
        write_evaluation(tmp / EVALUATION_DIR, metrics, regressions, sizes, manifest, title=title)
    return RunResult(target, metrics, regressions, releases, manifest, run_data.table)


def size_classes(release: Release, table: Table, estimator: str) -> pd.DataFrame:
    """Leaf-total errors of a release by size class of the true leaf total.

    The Census Bureau's size classes and metric set
    (:func:`~censusdp.pipelines.metrics.size_class_metrics`), the non-empty classes only: a
    bounded summary of the small-area bias at any scale (a mean signed error that moves with
    size is the bias the per-group regressions measure).

    Returns
    -------
    pandas.DataFrame
        ``estimator, size_class, leaves, mae, rmse, mean_error, mape, over_10pct``.
    """
    leaf = release.hierarchy.depth - 1
    truth = table.leaf_counts.sum(axis=1)
    m = size_class_metrics(release.estimates[leaf].sum(axis=1), truth)
    m = m[m["n"] > 0].rename(columns={"n": "leaves"}).reset_index(drop=True)
    m.insert(0, "estimator", estimator)
    return m


def release_frame(releases: dict[str, Release]) -> pd.DataFrame:
    """The table ``estimates.parquet`` holds: every release's :meth:`Release.to_frame`
    (level, code, cell, estimator, value, se) with ``moe``, the 90% margin of error, beside
    ``se``.

    For an integer release the MOE is the integer half-width of the lattice interval
    (:func:`~censusdp.pipelines.io.outputs.lattice_moe`), for a real-valued one ``1.645 ·
    se`` (:func:`~censusdp.pipelines.io.outputs.real_moe`); NaN where the estimator has no
    standard error (TopDown-style). ``se`` is written to six significant digits
    (:func:`~censusdp.pipelines.io.outputs.significant`). ``value`` is int64 when every
    release is integer; one real-valued estimator among them makes the column float64 (one
    column holds one dtype; every integer release's values are still whole numbers there).
    """
    frames = []
    for r in releases.values():
        f = r.to_frame()
        f["se"], moe = written_errors(f["se"], integer=r.integer)
        f["moe"] = moe.astype(np.float64)  # one column for every estimator, NaN without SEs
        frames.append(f)
    return pd.concat(frames, ignore_index=True)


def write_release(out: Path, releases: dict[str, Release], manifest: dict) -> None:
    """The publishable part of a run: estimates with standard errors and margins of error
    (:func:`release_frame`), privacy, manifest."""
    out.mkdir()
    release_frame(releases).to_parquet(out / "estimates.parquet", index=False)
    lines = [
        "# censusdp release",
        "",
        "Estimates, standard errors and 90% margins of error: `estimates.parquet` "
        "(level, code, cell, estimator, value, se, moe; value int64 when every estimator "
        "releases integers; se to 6 significant digits; moe the integer lattice margin for "
        "integer releases, 1.645 x se for real-valued ones, empty without a standard error).",
        "",
        "## Privacy",
        "",
    ]
    lines += [f"- **{name}**: {st['text']}" for name, st in manifest["privacy"].items()]
    (out / "privacy.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    release_manifest = {k: v for k, v in manifest.items() if k != "repetitions"}
    release_manifest["confidential"] = False
    release_manifest["release"] = "repetition 0 of every estimator"
    (out / "manifest.json").write_text(
        json.dumps(to_jsonable(release_manifest), indent=2), encoding="utf-8"
    )


def write_evaluation(
    out: Path,
    metrics: pd.DataFrame,
    regressions: pd.DataFrame,
    sizes: pd.DataFrame,
    manifest: dict,
    *,
    title: str | None = None,
) -> None:
    """The comparison with the truth: confidential, labelled so in a file, the report and
    its manifest. Bounded summaries and figures; the per-group detail in Parquet."""
    out.mkdir()
    (out / "CONFIDENTIAL.txt").write_text(CONFIDENTIAL_LABEL + "\n", encoding="utf-8")
    write_csv(metrics, out / "metrics.csv", index=False)
    regressions.to_parquet(out / "regressions.parquet", index=False)
    write_csv(sizes, out / "size_classes.csv", index=False)
    figures = write_figures(out, metrics, regressions, manifest, sizes=sizes)
    write_report(out, metrics, regressions, manifest, figures, title=title, sizes=sizes)
    (out / "manifest.json").write_text(
        json.dumps(
            to_jsonable(
                {
                    "censusdp": manifest["censusdp"],
                    "confidential": True,
                    "label": CONFIDENTIAL_LABEL,
                    "evaluation_of": f"../{RELEASE_DIR}/manifest.json",
                    "repetitions": manifest["repetitions"],
                    "reproducible_mode": manifest["reproducible_mode"],
                }
            ),
            indent=2,
        ),
        encoding="utf-8",
    )


def separate_evaluation(out: Path) -> Path:
    """Lay out an output holding a confidential ``evaluation/`` as :func:`run_spec` does:
    everything else (what may be published) moves into ``out/release/``, and
    ``out/evaluation/`` stays its sibling, labelled ``CONFIDENTIAL.txt``, so that publishing
    the release folder can never publish the comparison with the truth.

    ``out`` is the temporary directory of :func:`censusdp.atomic.output_dir`, before it is
    renamed into place (``privatize --evaluate`` on the PPMF routes). Returns the release
    folder.
    """
    release = out / RELEASE_DIR
    if release.exists():
        raise SpecError(f"{out.name}: holds {RELEASE_DIR}/ already; cannot separate it")
    # the temporary's claim stays where output_dir removes it on commit (moved into release/
    # it was published: its pid, host and token listed among the release's files)
    published = sorted(p for p in out.iterdir() if p.name not in (EVALUATION_DIR, CLAIM))
    release.mkdir()
    for p in published:
        p.rename(release / p.name)
    evaluation = out / EVALUATION_DIR
    if evaluation.is_dir():
        (evaluation / "CONFIDENTIAL.txt").write_text(CONFIDENTIAL_LABEL + "\n", encoding="utf-8")
    return release


def with_budget(spec: RunSpec, total: float) -> RunSpec:
    """A copy of ``spec`` with another total budget (same shares)."""
    return dataclasses.replace(spec, privacy=dataclasses.replace(spec.privacy, total=float(total)))
