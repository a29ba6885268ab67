"""``nyc-taxi``: ℳ_MH and conditioning (MCMC) vs TopDown-style vs GLS on NYC taxi zones
(seed Table 2).

Hierarchy: NYC (1) → boroughs (6: Bronx, Brooklyn, EWR, Manhattan, Queens, Staten Island; EWR
is its own borough with the single zone Newark Airport) → TLC taxi zones (263, from
``taxi_zone_lookup.csv``; zones 264/265 "Unknown" are left out, as in the paper).

Data (``data`` in ``metrics.json``):

* ``"sample"`` — yellow-taxi pickups per zone counted from a public 10,000-trip sample of
  February 2019 (``taxi_pickups_2019-02_sample_by_zone.csv``; the trips in zones 264/265 are
  dropped with those zones).
* ``"synthetic_month"`` (the headline table) — a synthetic full month of 2,979,431 trips (the
  row count of the paper's February 2022 file) spread like the sample: zone counts
  ~ Multinomial(2,979,431, p) with add-one smoothed sample shares
  p_i = (s_i + 1) / (Σ s + 263), drawn from the run's keyed RNG
  (stream ``nyc-taxi/synthetic-month``). Smoothing gives every zone a positive share, so the
  smallest synthetic zones hold a few hundred trips: non-negativity rarely binds there, unlike
  in the real month (and in the sample, which the full run also reports).

Mechanism: the 270-vector x = (263 zones, 6 boroughs, city) answers each trip's zone once at
every level, so its L1 sensitivity is 3 and the paper's Laplace mechanism on x is Laplace(3/ε)
on every node — ε split equally over the three levels (ε/3 each), composing to ε-DP.
Estimators:

* ``mh`` — ℳ_MH, the paper's mechanism (seed Alg. 1) without its inequality constraint: the
  curator releases x + e′ with e′ drawn from the Laplace noise law conditioned on
  consistency (:func:`~censusdp.estimation.conditioning.mechanism.conditioned_mechanism`; the
  chains sample the noise alone, never x); one release per run, its own noise;

and, from the same noisy measurements y of a run:

* ``conditioning`` — belief revision as post-processing: one draw z from the noise law
  conditioned on consistency given y, π(z | y) ∝ Π p(y − z); its error e − e′ has about twice
  ℳ_MH's variance;
* ``conditioning_nonneg`` — the same conditioned also on non-negative zone counts (the
  inequality constraint A x̃ ≥ a of Alg. 1); data-dependent, see the report;
* ``topdown`` — the TopDown-style baseline (non-negative integers, parent-equality);
* ``gls`` — the Σ⁻¹-weighted projection (belief update / imaging; unbiased, minimum variance).

Metric (the paper's): per level, (1/270)‖x_level − x̃_level‖₁, 270 = 263 + 6 + 1 the dimension
of x, averaged over the runs.

Every MCMC release goes through
:func:`censusdp.estimation.conditioning.estimator.condition` or ``conditioned_mechanism`` (the same
chains with zero measurements): all noise laws are Laplace, so the moves are
:class:`~censusdp.estimation.conditioning.gibbs_moves.GibbsTreeMoves` (level sweeps: a random perfect
matching of a level's nodes within each parent, every pair's line redrawn exactly; single
moves of one zone at the city level), and the draw is released only at an iteration T where
the L-lag coupling bound on its total-variation distance from the conditioned law (200
coupled pairs) is below ``TV_TARGET``. Each call costs minutes on the full geography (the
coupled pairs meet after a few thousand sweeps), so conditioning runs on the first
``COND_RUNS`` runs' measurements of every (data, ε); GLS, TopDown-style and ℳ_MH on all
``RUNS`` (ℳ_MH's chains never see the data, so one certificate per ε serves every run: one
call of :func:`~censusdp.estimation.conditioning.mechanism.conditioned_releases`). The lag L comes
from the first call's pilot and is reused (it affects the tightness of the bound, not its
validity); the other calls are independent and run in a process pool over the machine's
cores (same numbers as one after another: every call has its own key). The full run also
reports GLS and TopDown-style on the sample's own counts; the MCMC estimators on them (where
non-negativity binds and a release takes tens of minutes) run only with ``--all``.
``--quick`` restricts the geography to at most ``QUICK_ZONES``
zones of each of ``QUICK_BOROUGHS`` (city → 2 boroughs → 11 zones) and runs on the
synthetic month only.

References
----------
Liu, Sun, Zhou & Feng, "Two Views of Constrained Differential Privacy: Belief Revision and
Update", AAAI 2023 (seed ``constrained_dp_belief_revision_update``): §4 "MCMC Method and
Comparative Experiment", Algorithm 1 ℳ_MH and Table 2 (NYC yellow taxi, February 2022).
NYC Taxi & Limousine Commission, TLC Trip Record Data and Taxi Zone Lookup Table.
Abowd et al. (2022), "The 2020 Census Disclosure Avoidance System TopDown Algorithm", HDSR.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from censusdp.budget import Accounting, PrivacyStatement
from censusdp.errors import DataError
from censusdp.estimation.conditioning.estimator import ConditioningOptions, certificate, condition
from censusdp.estimation.conditioning.mechanism import ChainOptions, conditioned_releases
from censusdp.estimation.gls.tree import tree_gls
from censusdp.estimation.topdown.flat import topdown
from censusdp.experiments.registry import ExperimentContext, ExperimentInfo, repeat
from censusdp.experiments.reporting import Report, pyplot
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.builders import from_columns
from censusdp.mechanisms import Query, measure
from censusdp.mechanisms.laws import Laplace
from censusdp.mechanisms.queries import Measurement
from censusdp.pipelines.metrics import error_metrics
from censusdp.spreadsheet import write_csv
from censusdp.timing import stage

__all__ = [
    "PAPER_TABLE2",
    "load_taxi",
    "restrict",
    "synthetic_month",
    "run",
]

#: What this study reproduces, for ``censusdp experiment --list`` and the README.
INFO = ExperimentInfo(
    reproduces="NYC → boroughs → 263 zones, ε ∈ {0.5, 1, 2}, GLS, TopDown-style and the paper's ℳ_MH (curator-side, without x̃ ≥ 0; one certificate per ε serves all runs, its chains never seeing the data) on 20 runs, conditioning with and without x̃ ≥ 0 on 1 (certified Gibbs MCMC, TV bound < 0.01, 5.5–9.5 min per call, two calls at a time); zone-level error of ℳ_MH 5.49 / 2.92 / 1.41 against TopDown-style's 5.92 / 2.92 / 1.43 (± 0.02–0.10) and conditioning's 8.80 / 4.00 / 2.13 (about √2 above)",
    paper="Liu, Sun, Zhou & Feng (2023), Two Views of Constrained Differential Privacy, Table 2",
    data=("taxi_zone_lookup.csv", "taxi_pickups_2019-02_sample_by_zone.csv"),
    full_run="37 min",
    all_units="ℳ_MH and conditioning on the sample too",
)

LOOKUP_FILE = "taxi_zone_lookup.csv"
SAMPLE_FILE = "taxi_pickups_2019-02_sample_by_zone.csv"
LEVELS = ("city", "borough", "zone")
CELLS = ("trips",)
EPSILONS = (0.5, 1.0, 2.0)
ESTIMATORS = ("mh", "conditioning", "conditioning_nonneg", "topdown", "gls")
CONDITIONING = (("conditioning", False), ("conditioning_nonneg", True))
#: The estimators released by certified MCMC, in the order their calls are made (the first
#: call's pilot sets the lag of all).
MCMC_ESTIMATORS = ("conditioning", "conditioning_nonneg", "mh")
#: Normalising dimension of the paper's metric: 263 zones + 6 boroughs + the city (the number
#: of nodes of the geography; a --quick run divides by its own node count).
L1_DENOMINATOR = 270
#: Rows of the paper's February 2022 file (the synthetic month has as many trips).
MONTH_TRIPS = 2_979_431
N_ZONES, N_BOROUGHS = 263, 6
RUNS, RUNS_QUICK = 20, 2
#: Runs (the first ones) whose measurements are conditioned, per (data set, ε, variant).
COND_RUNS, COND_RUNS_QUICK = 1, 1
#: Requested L-lag coupling bound on d_TV of every conditioning release.
TV_TARGET = 0.01
#: ``--quick``: the geography is cut down to these boroughs and at most ``QUICK_ZONES`` zones
#: of each (city → 2 boroughs → 11 zones).
QUICK_BOROUGHS, QUICK_ZONES = ("EWR", "Staten Island"), 10

#: The paper's Table 2 (February 2022 data): (ε, level) → (ℳ_MH, TopDown), normalised L1.
PAPER_TABLE2: dict[tuple[float, int], tuple[float, float]] = {
    (0.5, 1): (0.013352, 0.036806),
    (0.5, 2): (0.028890, 0.162698),
    (0.5, 3): (1.680823, 2.345461),
    (1.0, 1): (0.018244, 0.023974),
    (1.0, 2): (0.057345, 0.091148),
    (1.0, 3): (1.534053, 1.526361),
    (2.0, 1): (0.003445, 0.005173),
    (2.0, 2): (0.015032, 0.027614),
    (2.0, 3): (1.052862, 1.260267),
}


# ---------------------------------------------------------------------------- data
def load_taxi(lookup_path: Path, counts_path: Path) -> tuple[Hierarchy, np.ndarray, pd.DataFrame]:
    """NYC → borough → zone hierarchy and the sample's pickups per zone.

    Parameters
    ----------
    lookup_path : Path
        TLC zone lookup (``LocationID, Borough, Zone, service_zone``).
    counts_path : Path
        Pickups per zone (``LocationID, ..., trips``).

    Returns
    -------
    hierarchy : Hierarchy
        Levels ``city`` (code ``NYC``), ``borough`` (borough names), ``zone`` (3-digit
        ``LocationID``), canonical order.
    leaf_counts : numpy.ndarray
        int64 (263, 1), the sample's pickups per zone in canonical leaf order.
    zones : pandas.DataFrame
        One row per leaf (canonical order): ``zone`` code, ``borough``, ``name``.

    Raises
    ------
    DataError
        Missing columns, a zone absent from the counts file, negative counts, or a zone table
        that is not 263 zones in 6 boroughs.

    References
    ----------
    NYC Taxi & Limousine Commission, Taxi Zone Lookup Table; Liu, Sun, Zhou & Feng (AAAI
    2023), Fig. 3 (the hierarchy T₃).
    """
    lookup = _read(lookup_path, ("LocationID", "Borough", "Zone"))
    counts = _read(counts_path, ("LocationID", "trips"))
    lookup = lookup[lookup["Borough"].astype(str) != "Unknown"]
    if len(lookup) != N_ZONES or lookup["Borough"].nunique() != N_BOROUGHS:
        raise DataError(
            f"{lookup_path.name}: expected {N_ZONES} zones in {N_BOROUGHS} boroughs after "
            f"dropping 'Unknown', got {len(lookup)} zones in {lookup['Borough'].nunique()}"
        )
    trips = counts.set_index(counts["LocationID"].astype(np.int64))["trips"]
    ids = lookup["LocationID"].astype(np.int64).to_numpy()
    missing = np.setdiff1d(ids, trips.index.to_numpy())
    if missing.size:
        raise DataError(
            f"{counts_path.name}: no 'trips' row for zone LocationID {int(missing[0])} "
            f"({missing.size} zones missing); every zone of {lookup_path.name} needs a row"
        )
    values = pd.to_numeric(trips.loc[ids], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values < 0) | (values != np.round(values))
    if bad.any():
        raise DataError(
            f"{counts_path.name}: zone LocationID {int(ids[bad][0])}: 'trips' must be a "
            "non-negative integer"
        )
    frame = pd.DataFrame(
        {
            "zone": [f"{i:03d}" for i in ids],
            "borough": lookup["Borough"].astype(str).to_numpy(),
            "name": lookup["Zone"].astype(str).to_numpy(),
        }
    )
    h, leaf_row = from_columns(
        frame,
        [("borough", "borough"), ("zone", "zone")],
        root_name="city",
        root_code="NYC",
        source=lookup_path.name,
    )
    leaf = values.astype(np.int64)[leaf_row][:, None]
    return h, leaf, frame.iloc[leaf_row].reset_index(drop=True)


def _read(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    df = pd.read_csv(path)
    absent = [c for c in columns if c not in df.columns]
    if absent:
        raise DataError(f"{path.name}: missing column(s) {absent}; found {list(df.columns)}")
    return df


def synthetic_month(
    sample: np.ndarray, gen: np.random.Generator, n_trips: int = MONTH_TRIPS
) -> np.ndarray:
    """A synthetic month spread like the sample: Multinomial(n_trips, add-one shares).

    Parameters
    ----------
    sample : numpy.ndarray
        Sample counts per zone, (n_zones, 1).
    gen : numpy.random.Generator
    n_trips : int
        Trips in the month (default: the paper's 2,979,431).

    Returns
    -------
    numpy.ndarray
        int64 (n_zones, 1), summing to ``n_trips``.
    """
    s = np.asarray(sample, dtype=np.float64).reshape(-1)
    share = (s + 1.0) / (s.sum() + s.size)
    return gen.multinomial(n_trips, share).astype(np.int64)[:, None]


# ---------------------------------------------------------------------------- the study
def _privacy(eps: float, nonneg: bool = False, nodes: int = L1_DENOMINATOR) -> PrivacyStatement:
    notes = (
        f"Laplace(3/ε) on all {nodes} nodes (ε/3 per level: city, boroughs, zones; L1 "
        f"sensitivity 3), total ε = {eps:g}",
    )
    return PrivacyStatement(
        Accounting.PURE, epsilon=eps, mechanism="laplace", notes=notes, data_dependent=nonneg
    )


def restrict(
    h: Hierarchy,
    leaf: np.ndarray,
    zones: pd.DataFrame,
    boroughs: Sequence[str],
    max_zones: int | None = None,
) -> tuple[Hierarchy, np.ndarray]:
    """The city → ``boroughs`` → their zones sub-hierarchy and its leaf counts.

    Parameters
    ----------
    h : Hierarchy
        The full city → borough → zone hierarchy of :func:`load_taxi`.
    leaf : numpy.ndarray
        (n_zones, 1) counts in ``h``'s leaf order.
    zones : pandas.DataFrame
        :func:`load_taxi`'s zone table (leaf order).
    boroughs : sequence of str
        Borough names to keep.
    max_zones : int, optional
        Keep at most this many zones of each borough (the first in leaf order).

    Returns
    -------
    (Hierarchy, numpy.ndarray)
    """
    keep = zones["borough"].isin(list(boroughs)).to_numpy().copy()
    if max_zones is not None:
        keep &= zones.groupby("borough").cumcount().to_numpy() < max_zones
    if not keep.any():
        raise DataError(f"no zone in the boroughs {list(boroughs)}")
    sub = zones[keep].reset_index(drop=True)
    hs, leaf_row = from_columns(
        sub, [("borough", "borough"), ("zone", "zone")], root_name="city", root_code="NYC"
    )
    return hs, np.asarray(leaf)[keep][leaf_row]


def _conditioning_job(job: tuple) -> tuple[list[list[np.ndarray]], dict]:
    """One certified MCMC call: ``(name, h, eps, measurements, counts, n, rng, lag)`` →
    (released levels of each release, the certificate with seconds, release count and
    privacy text). Conditioning makes one release from the measurements; ℳ_MH makes ``n``
    from one certificate (:func:`conditioned_releases`: its chains never see the data). Module
    level, so a process pool can run it."""
    name, h, eps, meas, counts, n, rng, lag = job
    nodes = sum(lv.size for lv in h.levels)
    clock: dict[str, float] = {}
    with stage(clock, "release"):
        if name == "mh":
            plan = [(m.level, m.query, m.law) for m in meas]
            rels = conditioned_releases(
                h,
                list(CELLS),
                counts,
                plan,
                [],
                _privacy(eps, nodes=nodes),
                rng,
                n_releases=n,
                options=ChainOptions(tv_bound=TV_TARGET, lag=lag),
            )
        else:
            nonneg = dict(CONDITIONING)[name]
            rel = condition(
                h,
                list(CELLS),
                meas,
                [],
                _privacy(eps, nonneg, nodes),
                rng,
                ConditioningOptions(tv_bound=TV_TARGET, lag=lag, nonnegative=nonneg),
            )
            rels = [rel]
    cert = {**certificate(rels[0]), "seconds": clock["release"], "releases": len(rels)}
    return [r.estimates for r in rels], {**cert, "privacy": rels[0].privacy.text()}


def _condition_runs(
    ctx: ExperimentContext,
    label: str,
    h: Hierarchy,
    counts: list[np.ndarray],
    runs_meas: dict[float, Sequence[Sequence[Measurement]]],
    mh_runs: int,
    lags: dict[str, int],
) -> tuple[dict[float, dict[str, list[list[np.ndarray]]]], dict[str, dict]]:
    """Every MCMC release of one data set, for every ε: both conditioning variants of the
    given runs' measurements (one call per run), and ℳ_MH for ``mh_runs`` runs (one call,
    one certificate, a release per run: :func:`conditioned_releases`).

    ``lags["L"]``, when present, is the lag passed to every call; otherwise the first call
    runs its pilot, alone, and its lag is stored there and used by the others. The calls are
    independent (each has its own key), so the rest run in a process pool over the machine's
    cores; the numbers do not depend on it.

    Returns
    -------
    released : dict
        ε → estimator → list (per run) of released levels.
    diagnostics : dict
        Estimator → ε (``f"{eps:g}"``) → ``{"certified", "tv_bound" (max over runs),
        "burn_in", "lag", "rhat_max", "seconds", "runs": [per-run certificates]}``.
    """
    keys = [
        (eps, name, r)
        for eps, meas in runs_meas.items()
        for name in MCMC_ESTIMATORS
        for r in range(1 if name == "mh" else len(meas))
    ]

    def job(key: tuple) -> tuple:
        eps, name, r = key
        if name == "mh":
            rng = ctx.rng.child(f"{label}/eps={eps:g}/mh")
            return (name, h, eps, runs_meas[eps][0], counts, mh_runs, rng, lags.get("L"))
        rng = ctx.rng.child(f"{label}/eps={eps:g}/{name}/run={r}")
        return (name, h, eps, runs_meas[eps][r], counts, 1, rng, lags.get("L"))

    results = {}
    if "L" not in lags:
        results[keys[0]] = _conditioning_job(job(keys[0]))
        lags["L"] = results[keys[0]][1]["lag"]
    rest = [k for k in keys if k not in results]
    workers = min(len(rest), os.cpu_count() or 1)
    if workers > 1:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            results.update(
                zip(rest, pool.map(_conditioning_job, [job(k) for k in rest]), strict=True)
            )
    else:
        results.update((k, _conditioning_job(job(k))) for k in rest)

    released: dict[float, dict[str, list[list[np.ndarray]]]] = {}
    diagnostics: dict[str, dict] = {}
    for eps, name, r in keys:
        per_release, cert = results[(eps, name, r)]
        released.setdefault(eps, {}).setdefault(name, []).extend(per_release)
        diagnostics.setdefault(name, {}).setdefault(f"{eps:g}", []).append({"run": r, **cert})
    for per_eps in diagnostics.values():
        for e, per_run in per_eps.items():
            per_eps[e] = {
                "certified": True,
                "tv_bound": max(x["tv_bound"] for x in per_run),
                "tv_requested": TV_TARGET,
                "lag": per_run[0]["lag"],
                "burn_in": max(x["burn_in"] for x in per_run),
                "meeting_time_max": max(x["meeting_time_quantiles"][-1] for x in per_run),
                "rhat_max": max(x["rhat_max"] for x in per_run),
                "seconds": float(sum(x["seconds"] for x in per_run)),
                "releases": sum(x["releases"] for x in per_run),
                "kernel": per_run[0]["kernel"],
                "runs": per_run,
            }
    return released, diagnostics


def _study(
    ctx: ExperimentContext,
    label: str,
    h: Hierarchy,
    leaf: np.ndarray,
    runs: int,
    cond_runs: int,
    lags: dict[str, int],
) -> tuple[list[dict], dict, dict, dict]:
    """All ε, runs and estimators on one data set.

    Returns the table rows, the certificates per (estimator, ε), the largest consistency
    residual per estimator, and the first run's released tables.
    """
    counts = h.aggregate(leaf)
    cells = list(CELLS)
    denominator = sum(lv.size for lv in h.levels)
    rows: list[dict] = []
    diagnostics: dict = {}
    names = ESTIMATORS if cond_runs else tuple(n for n in ESTIMATORS if n not in MCMC_ESTIMATORS)
    residual = dict.fromkeys(names, 0.0)
    first_run: dict = {}
    released: dict[float, dict[str, list[list[np.ndarray]]]] = {}
    measured: dict[float, list[list[Measurement]]] = {}
    clock: dict[str, float] = {}
    for eps in EPSILONS:
        law = Laplace.from_epsilon(eps / 3.0)
        plan = [(k, Query.total(cells), law) for k in range(h.depth)]
        privacy = _privacy(eps, nodes=denominator)
        released[eps], measured[eps] = repeat(
            runs,
            ctx.rng,
            lambda rr, plan=plan: measure(h.names, counts, plan, rr),
            {
                name: lambda m, _, fn=fn, p=privacy: fn(h, cells, m, [], p).estimates
                for name, fn in (("gls", tree_gls), ("topdown", topdown))
            },
            seconds := {},
            stream=f"{label}/eps={eps:g}/run={{}}",
        )
        ctx.timings.update({f"{label}/{k}/eps={eps:g}": seconds[k] for k in released[eps]})
    if cond_runs:
        with stage(clock, f"{label}/mcmc releases"):
            cond, diagnostics = _condition_runs(
                ctx, label, h, counts, {e: m[:cond_runs] for e, m in measured.items()}, runs, lags
            )
            for eps in EPSILONS:
                released[eps].update(cond[eps])
        ctx.timings[f"{label}/mcmc releases"] = clock[f"{label}/mcmc releases"]
    for eps in EPSILONS:
        for name in names:
            est = released[eps][name]
            for levels in est:
                residual[name] = max(residual[name], _consistency_residual(h, levels))
            first_run.setdefault(f"{eps:g}", {})[name] = est[0]
            for k, level in enumerate(LEVELS):
                l1 = [
                    error_metrics(levels[k], counts[k], l1_denominator=denominator)["normalized_l1"]
                    for levels in est
                ]
                rows.append(
                    {
                        "epsilon": eps,
                        "level": k + 1,
                        "level_name": level,
                        "estimator": name,
                        "normalized_l1": float(np.mean(l1)),
                        "normalized_l1_se": float(np.std(l1, ddof=1) / np.sqrt(len(l1)))
                        if len(l1) > 1
                        else None,
                        "runs": len(l1),
                    }
                )
    return rows, diagnostics, residual, first_run


def _consistency_residual(h: Hierarchy, levels: Sequence[np.ndarray]) -> float:
    """Largest |parent − Σ children| over the released levels."""
    worst = 0.0
    for k in range(1, h.depth):
        up = h.aggregate_up(k, np.asarray(levels[k], dtype=np.float64))
        worst = max(worst, float(np.max(np.abs(up - np.asarray(levels[k - 1], np.float64)))))
    return worst


def run(ctx: ExperimentContext) -> dict:
    lookup_path = ctx.input_file(LOOKUP_FILE)
    counts_path = ctx.input_file(SAMPLE_FILE)
    if lookup_path is None or counts_path is None:  # pragma: no cover - required=True raises
        raise DataError("nyc-taxi: the zone lookup and the trip counts are required")
    h, sample, zones = load_taxi(lookup_path, counts_path)
    month = synthetic_month(sample, ctx.rng.generator("nyc-taxi/synthetic-month"))
    runs = RUNS_QUICK if ctx.quick else RUNS
    cond_runs = COND_RUNS_QUICK if ctx.quick else COND_RUNS
    datasets = (
        {"synthetic_month": month} if ctx.quick else {"synthetic_month": month, "sample": sample}
    )
    if ctx.quick:
        restricted = {
            k: restrict(h, v, zones, QUICK_BOROUGHS, QUICK_ZONES) for k, v in datasets.items()
        }
        h = next(iter(restricted.values()))[0]
        datasets = {k: v[1] for k, v in restricted.items()}
    # conditioning on the sample (slow: see the report) only with --all
    conditioned = set(datasets) if ctx.all_units else {"synthetic_month"}

    tables, diags, residuals, first = {}, {}, {}, {}
    lags: dict[str, int] = {}
    for label, leaf in datasets.items():
        tables[label], diags[label], residuals[label], first[label] = _study(
            ctx, label, h, leaf, runs, cond_runs if label in conditioned else 0, lags
        )
    primary = "synthetic_month"
    _write_estimates(ctx.out / "estimates_run0.csv", h, first)
    tv_bounds = {
        name: {e: d["tv_bound"] for e, d in per_eps.items()}
        for name, per_eps in diags[primary].items()
    }
    every = [d for per in diags.values() for x in per.values() for d in x.values()]
    metrics = {
        "quick": ctx.quick,
        "data": primary,
        "table": tables[primary],
        "tv_bounds": tv_bounds,
        "tv_bound_max": max(d["tv_bound"] for d in every),
        "conditioning_diagnostics": diags,
        "conditioning_seconds_per_call": float(
            np.mean([x["seconds"] for d in every for x in d["runs"]])
        ),
        "tables": tables,
        "consistency_max_residual": residuals,
        "runs": runs,
        "conditioning_runs": cond_runs,
        "conditioned_data": sorted(conditioned),
        "epsilons": list(EPSILONS),
        "estimators": list(ESTIMATORS),
        "l1_denominator": sum(lv.size for lv in h.levels),
        "budget_split": "epsilon/3 per level (city, borough, zone); Laplace(3/epsilon)",
        "geography": "full"
        if not ctx.quick
        else f"quick: {', '.join(QUICK_BOROUGHS)}, at most {QUICK_ZONES} zones each",
        "zones": int(h.leaves.size),
        "boroughs": int(h.levels[1].size),
        "trips": {label: int(leaf.sum()) for label, leaf in datasets.items()},
        "zero_zones": {label: int((leaf == 0).sum()) for label, leaf in datasets.items()},
        "paper_table2": [
            {"epsilon": e, "level": k, "M_MH": v[0], "TopDown": v[1]}
            for (e, k), v in PAPER_TABLE2.items()
        ],
    }
    _figure(ctx, tables[primary])
    ctx.write_report(_report(ctx, metrics, datasets))
    return metrics


def _write_estimates(path: Path, h: Hierarchy, first: dict) -> None:
    """The first run's released tables: data, epsilon, estimator, level, code, parent, value."""
    codes = [np.asarray(lv.codes, dtype=object) for lv in h.levels]
    parents = [np.full(codes[0].size, "", dtype=object)]
    parents += [codes[k - 1][lv.parent] for k, lv in enumerate(h.levels) if k]
    frames = [
        pd.DataFrame(
            {"data": label, "epsilon": float(eps), "estimator": name, "level": lv.name}
            | {"code": codes[k], "parent": parents[k], "value": np.asarray(levels[k], float)[:, 0]}
        )
        for label, per_eps in first.items()
        for eps, per_est in per_eps.items()
        for name, levels in per_est.items()
        for k, lv in enumerate(h.levels)
    ]
    write_csv(pd.concat(frames, ignore_index=True), path, index=False)


# ---------------------------------------------------------------------------- outputs
_LABELS = {
    "mh": "ℳ_MH (curator, MCMC)",
    "conditioning": "conditioning (MCMC)",
    "conditioning_nonneg": "conditioning, x̃ ≥ 0 (MCMC)",
    "topdown": "TopDown-style",
    "gls": "GLS (projection)",
}


def _lookup(table: list[dict]) -> dict[tuple[float, int, str], dict]:
    return {(r["epsilon"], r["level"], r["estimator"]): r for r in table}


def _figure(ctx: ExperimentContext, table: list[dict]) -> None:
    plt = pyplot()
    cell = _lookup(table)
    colours = {
        "mh": "tab:purple",
        "conditioning": "tab:blue",
        "conditioning_nonneg": "tab:cyan",
        "topdown": "tab:red",
        "gls": "tab:green",
    }
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for k, ax in enumerate(axes, start=1):
        for name in ESTIMATORS:
            ys = [cell[(e, k, name)]["normalized_l1"] for e in EPSILONS]
            ax.plot(EPSILONS, ys, "o-", color=colours[name], label=_LABELS[name])
        for j, (lab, mk) in enumerate((("paper ℳ_MH", "s"), ("paper TopDown", "^"))):
            ys = [PAPER_TABLE2[(e, k)][j] for e in EPSILONS]
            ax.plot(EPSILONS, ys, mk, mfc="none", color="grey", ls=":", label=lab + " (Feb 2022)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(list(EPSILONS), [f"{e:g}" for e in EPSILONS])
        ax.set_xlabel("ε")
        ax.set_title(f"level {k}: {LEVELS[k - 1]}")
        if k == 1:
            ax.set_ylabel("(1/dim) ‖x − x̃‖₁ at this level")
    axes[-1].legend(fontsize=7)
    fig.suptitle("NYC taxi zones: normalised L1 error per level (synthetic month)")
    ctx.savefig(fig, "error_by_level.png")


def _fmt(v: float | None, digits: int = 4) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _error_table(table: list[dict], diags: dict, with_paper: bool) -> list[dict[str, str]]:
    """The error table; the two TV columns are the largest bound over that ε's releases."""
    cell = _lookup(table)
    names = [n for n in ESTIMATORS if (EPSILONS[0], 1, n) in cell]
    tv = [n for n in ESTIMATORS if n in diags]
    runs = {n: cell[(EPSILONS[0], 1, n)]["runs"] for n in names}
    rows = []
    for e in EPSILONS:
        for k in (1, 2, 3):
            row = {"ε": f"{e:g}", "level": f"{k} ({LEVELS[k - 1]})"}
            row |= {
                f"{_LABELS[n]} [{runs[n]}]": _fmt(cell[(e, k, n)]["normalized_l1"]) for n in names
            }
            row |= {f"TV bound, {_LABELS[n]}": _fmt(diags[n][f"{e:g}"]["tv_bound"]) for n in tv}
            if with_paper:
                row["paper ℳ_MH"] = f"{PAPER_TABLE2[(e, k)][0]:.6f}"
                row["paper TopDown"] = f"{PAPER_TABLE2[(e, k)][1]:.6f}"
            rows.append(row)
    return rows


def _diag_table(diags: dict) -> list[dict]:
    return [
        {
            "data": label,
            "estimator": name,
            "ε": e,
            "kernel": d["kernel"],
            "MCMC calls": len(d["runs"]),
            "releases": d["releases"],
            "TV bound (max)": d["tv_bound"],
            "lag L": d["lag"],
            "burn-in T (max)": d["burn_in"],
            "meeting time (max)": d["meeting_time_max"],
            "split-R̂ (max)": d["rhat_max"],
            "seconds per call": d["seconds"] / len(d["runs"]),
        }
        for label, per_name in diags.items()
        for name, per_eps in per_name.items()
        for e, d in per_eps.items()
    ]


_DIAG_FORMATS = {"TV bound (max)": ".4f", "meeting time (max)": ".0f", "split-R̂ (max)": ".3f",
                 "seconds per call": ".0f"}  # fmt: skip


def _report(ctx: ExperimentContext, metrics: dict, datasets: dict) -> Report:
    """The experiment's report: what was run, the error tables, the conditioning
    certificates, consistency and privacy."""
    rep = _report_what_was_run(Report("nyc-taxi", ctx), metrics, datasets)
    _report_errors(rep, metrics)
    _report_certificates(rep, metrics)
    return _report_consistency_and_privacy(rep, metrics)


def _report_what_was_run(rep: Report, metrics: dict, datasets: dict) -> Report:
    """The reference, the hierarchy, noise, runs, metric, data sets and estimators."""
    runs, cond_runs = metrics["runs"], metrics["conditioning_runs"]
    dim = metrics["l1_denominator"]
    data_sets = [
        f"**synthetic_month** (headline): {metrics['trips']['synthetic_month']:,} trips "
        "(the full month has as many as the paper's Feb 2022 file) drawn as Multinomial(n, p) "
        "with add-one smoothed zone shares of the 10,000-trip Feb 2019 sample, "
        "p_i = (s_i + 1)/(Σs + 263), from the run's keyed RNG. "
        f"{metrics['zero_zones']['synthetic_month']} zones are empty."
    ]
    if "sample" in datasets:
        data_sets.append(
            f"**sample**: the Feb 2019 sample itself, {metrics['trips']['sample']:,} trips in "
            f"the {metrics['zones']} zones ({metrics['zero_zones']['sample']} zones empty): "
            "small counts, where non-negativity matters."
        )
    return (
        rep.reference(
            "Liu, Sun, Zhou & Feng, *Two Views of Constrained Differential Privacy: Belief "
            "Revision and Update* (AAAI 2023), §4 and Table 2. Data: NYC TLC taxi zone lookup "
            "and yellow-taxi trip records (public)."
        )
        .section("What was run")
        .text(
            f"Hierarchy NYC → {metrics['boroughs']} boroughs → {metrics['zones']} taxi zones "
            "(TLC zone lookup; zones 264/265 'Unknown' excluded; EWR is its own borough)"
            + (
                f" — **{metrics['geography']}**: a --quick run on a cut-down geography, whose "
                "numbers are not comparable with the paper's"
                if metrics["quick"]
                else ""
            )
            + ". Laplace(3/ε) noise on every node (ε/3 per level; the vector of all node counts "
            "has L1 sensitivity 3), "
            f"ε ∈ {{{', '.join(f'{e:g}' for e in EPSILONS)}}}; GLS and TopDown-style on {runs} "
            f"runs per ε (ℳ_MH too, from one certificate per ε), conditioning on the first "
            f"{cond_runs} of them (each "
            "release is one certified MCMC call; see below) for the data "
            f"{', '.join(metrics['conditioned_data'])}. GLS, TopDown-style and "
            "conditioning of a run use the same noisy measurements; ℳ_MH draws its own noise. "
            f"Metric: the paper's (1/{dim})‖x − x̃‖₁ restricted to one "
            f"level ({dim} = the number of nodes), averaged over the runs.",
            "Data sets:",
        )
        .bullets(data_sets)
        .text(
            "Estimators: ℳ_MH = the paper's curator-side mechanism without its inequality "
            "constraint: x + e′ with e′ drawn from the Laplace noise law conditioned on "
            "consistency (`conditioned_mechanism`; the chains sample the noise alone and never "
            "see x); conditioning = post-processing of the run's noisy measurements y: one draw "
            "from π(z | y) ∝ Π p(y − z) over consistent tables (belief revision); conditioning "
            "x̃ ≥ 0 = also conditioned on non-negative zone counts; TopDown-style (non-negative "
            "integers, parent equality); GLS = the Σ⁻¹-weighted projection (belief update / "
            "imaging).",
            "ℳ_MH against conditioning: the error of ℳ_MH is e′ alone; the error of "
            "conditioning is e − e′, the measurement noise minus an independent draw given the "
            "same inconsistency, with about twice the variance (exactly twice for Gaussian "
            "noise), i.e. roughly √2 times the L1 error. ℳ_MH is a mechanism the curator runs "
            "on the confidential counts instead of releasing measurements; conditioning can be "
            "run by anyone holding the measurements.",
        )
    )


def _report_errors(rep: Report, metrics: dict) -> None:
    """The normalised L1 error tables: the synthetic month beside the paper's, the sample."""
    diag = metrics["conditioning_diagnostics"]
    (
        rep.section("Normalised L1 error, synthetic month")
        .text(
            "Columns: our estimators ([runs averaged]); the largest TV bound of that ε's "
            "conditioning releases (each certified below "
            f"{TV_TARGET}); and the **paper's** Table 2, on the real February 2022 month (not "
            "available here): only the shape (how errors compare across levels, ε and "
            "estimators) is comparable, not the values. The paper's ℳ_MH includes the "
            "inequality constraint x̃ ≥ 0; ours leaves it out (it would make the guarantee "
            "data-dependent, see Privacy). On the synthetic month it would hardly bind: the "
            "smallest zones hold hundreds of trips, against noise of scale 3/ε."
        )
        .table(_error_table(metrics["tables"]["synthetic_month"], diag["synthetic_month"], True))
    )
    if "sample" in metrics["tables"]:
        rep.section("Normalised L1 error, 10,000-trip sample (Feb 2019)")
        if "sample" not in metrics["conditioned_data"]:
            rep.text(
                "Conditioning is not run on the sample by default (its non-negative "
                "variant needs tens of minutes per release there, where many zones hold "
                "zero trips); `--all` adds it."
            )
        rep.table(_error_table(metrics["tables"]["sample"], diag["sample"], with_paper=False))


def _report_certificates(rep: Report, metrics: dict) -> None:
    """The estimates file, the figure and the conditioning certificates."""
    runs, cond_runs = metrics["runs"], metrics["conditioning_runs"]
    diag = metrics["conditioning_diagnostics"]
    (
        rep.figures(
            {
                "error_by_level.png": "error per level per estimator vs ε, with the paper's "
                "numbers as hollow grey markers"
            }
        )
        .text("The first run's released tables of every estimator are in `estimates_run0.csv`.")
        .section("Conditioning: convergence certificates")
        .text(
            "Every MCMC release (conditioning: `condition()`; ℳ_MH: `conditioned_mechanism()`, "
            "the same chains over the noise alone) uses Gibbs moves (level sweeps: a "
            "random perfect matching of a level's nodes within each parent, every matched "
            "pair's line redrawn exactly from the conditional law; single moves of one zone at "
            "the city level). Its burn-in T is the first iteration whose L-lag coupling bound "
            "(200 coupled pairs from the over-dispersed initial law) on the total-variation "
            f"distance from the conditioned law is below {TV_TARGET}; the release is a chain "
            f"state after ≥ T sweeps. Largest bound over every release of the run: "
            f"**{metrics['tv_bound_max']:.4f}**. The lag L comes from the first call's 1-lag "
            "pilot and is reused by the others (it changes how tight the bound is, not whether "
            "it holds). Split-R̂ over 4 over-dispersed chains is reported, not a release "
            "criterion. An MCMC call took "
            f"{metrics['conditioning_seconds_per_call']:.0f} s on average, which is why "
            f"conditioning runs on {cond_runs} run(s) per ε while GLS and TopDown-style run on "
            f"{runs}. ℳ_MH runs on all {runs}: its chains sample the noise alone, so one "
            "certificate per ε serves a release per run, each the state of its own chain past "
            "the burn-in (independent draws)."
        )
        .table(_diag_table(diag), formats=_DIAG_FORMATS)
    )


def _report_consistency_and_privacy(rep: Report, metrics: dict) -> Report:
    """The largest consistency residuals and each estimator's privacy statement."""
    res = metrics["consistency_max_residual"]
    dim = metrics["l1_denominator"]
    return (
        rep.section("Consistency")
        .text(
            "Largest |parent − Σ children| over all released tables (zones → boroughs → city): "
            + "; ".join(
                f"{label}: " + ", ".join(f"{n} {v:.2g}" for n, v in per.items())
                for label, per in res.items()
            )
            + "."
        )
        .section("Privacy")
        .bullets(
            [
                f"GLS, TopDown-style, conditioning: {_privacy(1.0, nodes=dim).text()} (shown "
                "for ε = 1). Each is post-processing of the Laplace measurements; nothing is "
                "held invariant. Conditioning's release is a state of a finite Markov chain: "
                "exact only up to its TV distance from the conditioned law (bounded above; the "
                "bound is a Monte Carlo estimate, not a proof).",
                f"ℳ_MH: {_privacy(1.0, nodes=dim).text()} (ε = 1) for the exact conditioned "
                "law: two neighbouring tables are both consistent, so they differ by a "
                "consistent vector, the conditioned laws live on the same affine set with the "
                "same normaliser, and the density ratio is the Laplace mechanism's. The release "
                "is a chain state within the certified TV distance η of that law, which adds "
                "δ ≤ (1 + e^ε) η (a Monte Carlo estimate). The chains sample the noise alone, "
                "so their burn-in and certificate reveal nothing about the counts. Adding "
                "Alg. 1's x̃ ≥ 0 would make the normaliser depend on x (the bound would double "
                "to 2ε); it is not run.",
                f"conditioning x̃ ≥ 0: {_privacy(1.0, True, dim).text()} In the paper's "
                "conditioned-mechanism view (Alg. 1: the law of x + e given consistency and "
                "x + e ≥ 0) the indicator 𝕀(x + e ≥ 0) involves the confidential counts x and "
                "the normaliser depends on them, so the output is data-dependent and **the "
                "plain DP argument does not cover it**; the release is flagged accordingly (the "
                "sampler itself reads only the noisy measurements and the public noise law).",
            ]
        )
        .text("Seeded runs are for reproduction only, never for a real release.")
    )
