"""Run the estimators a spec names on one set of measurements.

Every estimator takes the same inputs (hierarchy, cells, measurements, invariants, privacy
statement) and returns a :class:`~censusdp.estimation.release.Release`. The pipeline adds the
integer step (``[estimators] integer``) and maps the parallel parts over an executor: the
per-parent TopDown-style problems, and the GLS and rounding passes per partition.
"""

from __future__ import annotations

from collections.abc import Sequence

from censusdp.budget import PrivacyStatement
from censusdp.config import EstimatorSpec
from censusdp.errors import SpecError
from censusdp.estimation.gls import tree_gls
from censusdp.estimation.release import Release
from censusdp.estimation.rounding import round_release
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.queries import Invariant, Measurement
from censusdp.pipelines.execute import Executor
from censusdp.pipelines.gls_partitioned import partitioned_gls, partitioned_round
from censusdp.pipelines.partition import Partition
from censusdp.rng import KeyedRNG

__all__ = ["ESTIMATORS", "run_estimator", "rounding_mode"]

ESTIMATORS = ("gls", "conditioning", "topdown")


def rounding_mode(invariants: Sequence[Invariant]) -> str:
    """``"totals"`` when node totals are held invariant (keeps them exact), else ``"cells"``."""
    return "totals" if any(iv.query.name == "total" for iv in invariants) else "cells"


def _round(release: Release, invariants, rng: KeyedRNG, executor, partitions) -> Release:
    mode = rounding_mode(invariants)
    if partitions is None or executor is None:
        return round_release(release, rng, method=mode)
    return partitioned_round(release, rng, partitions, executor, method=mode)


def _partitioned_gls(
    hierarchy, cells, measurements, invariants, privacy, rng, options, executor, partitions
) -> Release:
    """GLS and its rounding where the partitions are; only the finished release is gathered."""
    kept = partitioned_gls(
        hierarchy, cells, measurements, invariants, privacy, partitions, executor, keep=True
    )
    try:
        if options.integer == "none":
            return kept.gather()
        mode = rounding_mode(invariants)
        rounded = partitioned_round(kept, rng.child("round/gls"), partitions, executor, method=mode)
        if isinstance(rounded, Release):  # cut at the leaves: rounded in this process
            return rounded
        try:
            return rounded.gather()
        finally:
            rounded.drop()
    finally:
        kept.drop()


def run_estimator(
    name: str,
    hierarchy: Hierarchy,
    cells: Sequence[str],
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
    privacy: PrivacyStatement,
    rng: KeyedRNG,
    options: EstimatorSpec,
    *,
    executor: Executor | None = None,
    partitions: Sequence[Partition] | None = None,
) -> Release:
    """One estimator's release, with the spec's integer step applied.

    Parameters
    ----------
    name : {"gls", "conditioning", "topdown"}
    rng : KeyedRNG
        Randomness of the estimator itself (rounding, MCMC); never the measurement noise.
    options : EstimatorSpec
        ``integer`` ("round", "lattice", "none"; see
        :class:`~censusdp.config.EstimatorSpec`) and the MCMC options.
    executor, partitions
        Where the parallel parts run; None runs everything in this process.
    """
    if name == "gls":
        if partitions is not None and executor is not None:
            return _partitioned_gls(
                hierarchy,
                cells,
                measurements,
                invariants,
                privacy,
                rng,
                options,
                executor,
                partitions,
            )
        release = tree_gls(hierarchy, cells, measurements, invariants, privacy)
    elif name == "topdown":
        from censusdp.estimation.topdown import topdown

        mapper = None if executor is None or executor.name == "sync" else executor.map
        chunks = 1 if mapper is None else 4 * max(1, executor.workers)
        return topdown(
            hierarchy, cells, measurements, invariants, privacy, mapper=mapper, chunks=chunks
        )
    elif name == "conditioning":
        from censusdp.estimation.conditioning import condition

        mc = options.mcmc
        kwargs = {"tv_bound": mc.tv_bound, "n_rhat_chains": max(4, mc.chains)}
        if mc.max_iterations is not None:
            kwargs["max_iterations"] = mc.max_iterations
        release = condition(
            hierarchy, cells, measurements, invariants, privacy, rng.child("conditioning"), **kwargs
        )
    else:
        raise SpecError(f"unknown estimator {name!r}; choose from {list(ESTIMATORS)}")
    if options.integer != "none" and not release.integer:  # "lattice": GLS is rounded
        release = _round(release, invariants, rng.child(f"round/{name}"), executor, partitions)
    return release
