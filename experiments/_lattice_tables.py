"""Shared driver of the small-table lattice experiments (delinquent children, intersecting
constraints): generalized Laplace (ℓ₁ and ℓ₂) on the lattice of an incidence matrix, the
release policy, TV-bound curves for several lags, box plots and one noise table.

References
----------
Dharangutte, Gao, Gong & Yu, "Integer Subspace Differential Privacy", AAAI 2023, §5 and
Appendix E.2–E.3 (Figs. 1, 4–7, Tables 1 and 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from censusdp.budget import PrivacyStatement
from censusdp.estimation.conditioning.diagnostics import meeting_times, tv_upper_bound
from censusdp.estimation.integer.lattice_release import (
    certify,
    lattice_engine,
    release_lattice_noise,
)
from censusdp.experiments.registry import ExperimentContext
from censusdp.experiments.reporting import Report, pyplot
from censusdp.mechanisms.lattice import IntegerLattice, LatticeLaplace

__all__ = ["MOVES", "LatticeTable", "run_table_experiment", "unbiasedness_z"]

#: What each engine mode of :func:`censusdp.estimation.integer.lattice_release.lattice_engine` does
#: on an SNF lattice basis (for the reports).
MOVES = {
    "gibbs": "Gibbs: the step along a uniformly chosen lattice-basis direction is drawn exactly "
    "from the target's conditional on that line (random scan, always accepted)",
    "single": "Metropolis–Hastings: a double-geometric step along a uniformly chosen "
    "lattice-basis direction (random scan; a tuned for acceptance in [0.2, 0.5])",
    "all": "Metropolis–Hastings: double-geometric steps on all lattice-basis directions at "
    "once (e* = e + B u)",
}


def unbiasedness_z(draws: np.ndarray) -> np.ndarray:
    """Per cell, mean / standard error of independent draws (n, d) (0 where constant 0)."""
    n = draws.shape[0]
    mean = draws.mean(axis=0)
    se = draws.std(axis=0, ddof=1) / np.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(se > 0, mean / se, 0.0)


def _with_totals(z: np.ndarray, rows: Sequence[str], cols: Sequence[str]) -> pd.DataFrame:
    """Table ``z`` with its row and column totals, labelled (for the report and the figure)."""
    full = np.zeros((z.shape[0] + 1, z.shape[1] + 1), dtype=np.int64)
    full[:-1, :-1] = z
    full[:-1, -1] = z.sum(1)
    full[-1, :-1] = z.sum(0)
    full[-1, -1] = z.sum()
    return pd.DataFrame(full, index=[*rows, "Total"], columns=[*cols, "Total"])


@dataclass(frozen=True, eq=False)
class LatticeTable:
    """One table experiment: the data, its invariants and how the report shows them.

    Attributes
    ----------
    name : str
        The experiment's registered name (its report's header comes from its ``INFO``).
    title : str
        The report's heading.
    incidence : numpy.ndarray
        A, one row per counting invariant over the cells.
    data : numpy.ndarray
        The confidential cell counts.
    epsilon : float
        ε of the generalized Laplace targets.
    cell_labels : sequence of str
        One label per cell.
    table_shape : (int, int), optional
        Show the example noise as a rows × columns table with totals.
    row_names, col_names : sequence of str
        The table's row and column names.
    invariant_names : sequence of str
        The invariants named in the privacy statement.
    n_draws : int
        Independent released draws per target.
    description : str
        The report's first paragraph.
    """

    name: str
    title: str
    incidence: np.ndarray
    data: np.ndarray
    epsilon: float
    cell_labels: Sequence[str]
    table_shape: tuple[int, int] | None = None
    row_names: Sequence[str] = ()
    col_names: Sequence[str] = ()
    invariant_names: Sequence[str] = ()
    n_draws: int = 1000
    description: str = ""


def run_table_experiment(ctx: ExperimentContext, spec: LatticeTable) -> dict:
    """Run both targets (ℓ₁ and ℓ₂ generalized Laplace) of ``spec``, write figures and
    the report, return the metrics."""
    with ctx.timed("lattice"):
        lattice = IntegerLattice.from_incidence(spec.incidence)
    k = lattice.n_directions
    targets: dict[str, dict] = {}
    draws_by_norm: dict[str, np.ndarray] = {}
    curves: dict[str, dict[int, np.ndarray]] = {}
    all_exact = True
    privacy = None
    for norm in ("l1", "l2"):
        with ctx.timed(norm):
            target, curves[norm], rel = _run_target(ctx, lattice, spec, norm)
        targets[norm] = target | {"seconds": ctx.timings[f"{norm}_seconds"]}
        all_exact &= target["margins_exact"]
        draws_by_norm[norm] = rel.noise
        if norm == "l1":
            privacy = rel.privacy

    example = draws_by_norm["l1"][0]
    table = (
        None
        if spec.table_shape is None
        else _with_totals(example.reshape(spec.table_shape), spec.row_names, spec.col_names)
    )
    _figures(ctx, curves, targets, draws_by_norm, spec.cell_labels, k, spec.n_draws, table)

    metrics = {
        "epsilon": spec.epsilon,
        "lattice_rank": k,
        "incidence_rank": lattice.rank,
        "n_draws": spec.n_draws,
        "margins_exact": all_exact,
        "all_integer": all(np.issubdtype(d.dtype, np.integer) for d in draws_by_norm.values()),
        "tv_bound_final": max(t["tv_bound_final"] for t in targets.values()),
        "iterations": max(t["iterations"] for t in targets.values()),
        "iteration_tv_below_0.01": max(t["iteration_tv_below_0.01"] for t in targets.values()),
        "max_abs_mean_z": max(t["max_abs_mean_z"] for t in targets.values()),
        "rhat_max": max(t["rhat_max"] for t in targets.values()),
        "moves": {norm: t["mode"] for norm, t in targets.items()},
        "targets": targets,
    }
    ctx.write_report(_report(ctx, spec, lattice, targets, all_exact, example, table, privacy))
    return metrics


def _run_target(
    ctx: ExperimentContext, lattice: IntegerLattice, spec: LatticeTable, norm: str
) -> tuple[dict, dict, Any]:
    """One target: its certificate and release (keyed stream ``norm``), whether every draw
    keeps the margins exactly, the unbiasedness z-scores, and TV curves for several lags
    (the default lag's is the certificate's); its metrics (without seconds), curves and
    release."""
    k = lattice.n_directions
    law = LatticeLaplace(spec.epsilon, norm)
    rng = ctx.rng.child(f"{norm}")
    report = certify(lattice, law, rng)
    rel = release_lattice_noise(
        lattice,
        law,
        rng,
        data=spec.data,
        n_draws=spec.n_draws,
        invariants=spec.invariant_names,
        report=report,
    )
    released = rel.released
    exact = bool(
        np.issubdtype(released.dtype, np.integer)
        and np.all(released @ spec.incidence.T == spec.incidence @ spec.data)
    )
    z = unbiasedness_z(rel.noise)
    eng = lattice_engine(lattice, law, report.a, mode=report.mode)
    t_max = int(1.5 * report.iterations) + 1
    ts = np.linspace(0, t_max, 200).astype(np.int64)
    curves: dict = {report.lag: report.tv_curve(ts)}
    g = rng.generator("experiment/extra-lags")
    zeros = np.zeros((report.n_coupled, lattice.dim), dtype=np.int64)
    for ls in (1, 25) if ctx.quick else (1, 10, 25, 50):
        lag = ls * k
        if lag == report.lag:
            continue
        res = meeting_times(eng, zeros, zeros, lag, g, max_iterations=20 * t_max + lag)
        curves[lag] = tv_upper_bound(res.meeting_times, lag, ts)
    curves["t"] = ts
    target = {
        **report.to_dict(),
        "moves": MOVES[report.mode],
        "tv_bound_final": report.tv_bound,
        "iteration_tv_below_0.01": report.iterations,
        "margins_exact": exact,
        "max_abs_mean_z": float(np.max(np.abs(z))),
        "mean_abs_noise": float(np.abs(rel.noise).mean()),
        "noise_sd_per_cell": rel.noise.std(axis=0).tolist(),
        "privacy": rel.privacy.to_dict(),
    }
    return target, curves, rel


def _figures(
    ctx: ExperimentContext,
    curves: dict,
    targets: dict,
    draws_by_norm: dict[str, np.ndarray],
    cell_labels: Sequence[str],
    k: int,
    n_draws: int,
    table: pd.DataFrame | None,
) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, norm in zip(axes, ("l1", "l2"), strict=True):
        ts = curves[norm]["t"]
        cert = targets[norm]
        for lag in sorted(lg for lg in curves[norm] if lg != "t"):
            mark = " (certificate)" if lag == cert["lag"] else ""
            ax.plot(
                ts / k,
                np.minimum(curves[norm][lag], 1.5),
                label=f"L = {lag} ({lag // k} sweeps){mark}",
            )
        ax.axhline(0.01, color="k", ls=":", lw=1)
        ax.axvline(cert["iterations"] / k, color="k", lw=0.6)
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_ylim(0, 2)
        ax.set_xlabel(f"iteration (sweeps of {k} steps)")
        moves = "Gibbs" if cert["mode"] == "gibbs" else "Metropolis"
        ax.set_title(f"{norm} target, {moves} moves: TV upper bound ({cert['n_coupled']} pairs)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("d_TV(π_t, π) upper bound")
    ctx.savefig(fig, "tv_bound.png")

    fig, axes = plt.subplots(1, 2, figsize=(max(10, 0.7 * len(cell_labels) * 2), 4), sharey=True)
    for ax, norm in zip(axes, ("l1", "l2"), strict=True):
        ax.boxplot(draws_by_norm[norm], whis=1.5)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(np.arange(1, len(cell_labels) + 1), cell_labels, rotation=90, fontsize=7)
        ax.set_title(f"{norm} target: {n_draws} independent draws per cell")
    axes[0].set_ylabel("integer noise")
    ctx.savefig(fig, "noise_boxplots.png")

    if table is not None:
        fig, ax = plt.subplots(figsize=(6, 2.2))
        ax.axis("off")
        ax.table(
            cellText=table.to_numpy().astype(str).tolist(),
            rowLabels=list(table.index),
            colLabels=list(table.columns),
            loc="center",
        )
        ax.set_title("one released noise table (ℓ₁ target): margins are zero")
        ctx.savefig(fig, "noise_table.png")


def _report(
    ctx: ExperimentContext,
    spec: LatticeTable,
    lattice: IntegerLattice,
    targets: dict,
    all_exact: bool,
    example: np.ndarray,
    table: pd.DataFrame | None,
    privacy: PrivacyStatement,
) -> Report:
    """The report: the mechanism and its moves, A, the certificates per target, one
    released noise vector (as a table with totals, or with its invariant sums), the figures
    and the privacy statement."""
    incidence, n_draws, epsilon = spec.incidence, spec.n_draws, spec.epsilon
    k = lattice.n_directions
    rows = [
        {
            "target": norm,
            "moves": t["mode"],
            "a": "—" if t["mode"] == "gibbs" else f"{t['proposal_a']:.3f}",
            "lag L (steps)": t["lag"],
            "T (steps)": t["iterations"],
            "T (sweeps)": t["sweeps"],
            "TV bound at T": t["tv_bound_final"],
            "R̂ max": t["rhat_max"],
            "max abs mean/SE": t["max_abs_mean_z"],
            "mean abs noise": t["mean_abs_noise"],
        }
        for norm, t in targets.items()
    ]
    fmt = {"T (sweeps)": ".0f", "TV bound at T": ".3g", "R̂ max": ".4f",
           "max abs mean/SE": ".2f", "mean abs noise": ".2f"}  # fmt: skip
    incidence_text = "\n".join(" ".join(str(int(v)) for v in row) for row in incidence)
    rep = (
        Report(spec.name, ctx, title=spec.title)
        .text(
            spec.description,
            f"Generalized Laplace mechanism on the lattice ker(A) ∩ Z^{lattice.dim} "
            f"(rank {k}; A has rank {lattice.rank}), ε = {epsilon:g}, ℓ₁ and ℓ₂ targets, "
            "sampled with the shared MCMC engine along the lattice basis (LLL-reduced from the "
            "Smith normal form), released through the certified path (`certify`, "
            "`release_lattice_noise`). Moves:",
        )
        .bullets(
            f"{norm} target (mode `{t['mode']}`): {t['moves']}." for norm, t in targets.items()
        )
        .text(
            "The ℓ₁ target is a product of per-cell factors, so its conditional along a line is "
            "known exactly (Gibbs moves, the default for it); the ℓ₂ norm is not separable and "
            "stays on Metropolis moves.",
            "Incidence matrix A (rows = counting invariants):",
            f"```\n{incidence_text}\n```",
        )
        .table(rows, formats=fmt)
        .text(
            "T is the first iteration at which the L-lag TV bound fell below 0.01: "
            + "; ".join(
                f"{norm}: iteration {t['iteration_tv_below_0.01']} ({t['sweeps']:.0f} sweeps)"
                for norm, t in targets.items()
            )
            + ". The bound is a Monte Carlo estimate from the coupled pairs.",
            f"Every released draw is integer and keeps every invariant exactly: **{all_exact}**.\n"
            f"Each of the {n_draws} draws per target is the final state of its own chain "
            "(independent draws), so the standard error of a cell mean is the draws' standard "
            "deviation / √n.",
            "One released noise vector (ℓ₁ target):",
        )
    )
    if table is not None:
        rep.table(table.reset_index(names=""))
    else:
        rep.table([example.tolist()], list(spec.cell_labels))
        rep.text(f"Invariant sums of this noise vector (A z): {(incidence @ example).tolist()}")
    figures = {
        "tv_bound.png": "L-lag TV upper bound against iteration for several L",
        "noise_boxplots.png": "per-cell box plots",
    }
    if table is not None:
        figures["noise_table.png"] = ""
    rep.figures(figures)
    return rep.privacy(privacy).text(
        "Iterations are engine steps (one move per chain along one basis direction); a sweep "
        f"is {k} steps, the unit of the paper's Gibbs sweep (Algorithm 1). The engine uses a "
        "random scan over basis directions where the paper sweeps them in order."
    )
