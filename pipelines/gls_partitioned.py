"""GLS and unbiased rounding over partitions: upward map → reduce at the root → downward map.

The hierarchy is cut at a level (the units of :func:`~censusdp.pipelines.partition.partition_units`);
every partition is a contiguous run of cut-level nodes with their subtrees.

* :func:`partitioned_gls` maps :func:`~censusdp.estimation.gls.gls_upward` over the
  partitions (each task receives only its partition's measurement and invariant slices and
  the child counts of its levels), reduces the cut-level messages at the top in the calling
  process (:func:`~censusdp.estimation.gls.gls_top`, levels 0 .. cut), then maps
  :func:`~censusdp.estimation.gls.gls_downward` over the partitions.
* :func:`partitioned_round` rounds each partition's subtrees up to the cut with randomness
  keyed by (level, node), then the levels above the cut from the units' leftovers.

Both equal the single-process results (:func:`~censusdp.estimation.gls.tree_gls`,
:func:`~censusdp.estimation.rounding.round_release`) bit for bit, for every backend and
partition count. The GLS maps chain through the executor's handles (:meth:`submit
<censusdp.pipelines.execute.DaskExecutor.submit>`): on Dask, partition ``i``'s measurements
(from ``measure_partitioned(..., keep=True)``) and upward state stay on the worker that
computed them, and only the cut-level messages and the finished per-level arrays pass
through the calling process.

References
----------
Hay, Rastogi, Miklau & Suciu, PVLDB 3(1), 2010 (two-pass consistency); Rauch, Tung &
Striebel, AIAA J. 3(8), 1965 (the smoother); Gandhi, Khuller, Parthasarathy & Srinivasan,
J. ACM 53(3), 2006 (dependent rounding).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls import (
    Forest,
    Geometry,
    GLSPlan,
    UpwardState,
    gls_downward,
    gls_finish,
    gls_plan,
    gls_release,
    gls_top,
    gls_upward,
    restrict,
)
from censusdp.estimation.release import Release
from censusdp.estimation.rounding import (
    TOL,
    RoundPart,
    finish_rounding,
    round_bipartite_part,
    round_part,
    round_release,
    round_top,
)
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.queries import Invariant, Measurement
from censusdp.pipelines.execute import Executor
from censusdp.pipelines.measure import PartitionedMeasurements
from censusdp.pipelines.partition import Partition
from censusdp.rng import KeyedRNG

__all__ = ["partitioned_gls", "partitioned_round"]


# ----------------------------------------------------------------------------- GLS tasks
@dataclass(frozen=True, eq=False)
class _UpTask:
    forest: Forest
    measurements: tuple[Measurement, ...]
    invariants: tuple[Invariant, ...]


def _upward_task(item: _UpTask | tuple, plan: GLSPlan) -> UpwardState:
    """Upward pass of one partition: an :class:`_UpTask`, or ``(forest, measured, entries,
    invariants)`` with ``measured`` the partition's :func:`_measure_task
    <censusdp.pipelines.measure._measure_task>` result and ``entries`` the plan positions,
    levels, queries and laws of the levels at or below the cut."""
    if isinstance(item, _UpTask):
        return gls_upward(plan, item.forest, item.measurements, item.invariants)
    forest, measured, entries, invariants = item
    meas = []
    for i, k, q, law in entries:
        values = measured[i]
        if not np.all(np.isfinite(values)):
            raise DataError(
                f"measurement {q.name!r} at level {plan.names[k]!r} has non-finite values"
            )
        meas.append(Measurement(k, q, values, law))
    return gls_upward(plan, forest, meas, invariants)


def _message_task(state: UpwardState, plan: GLSPlan) -> Any:
    return state.message()


def _downward_task(
    item: tuple[UpwardState, np.ndarray, np.ndarray], plan: GLSPlan, covariance: bool
) -> tuple:
    state, z, P = item
    zhat, Phat = gls_downward(plan, state, z, P)
    # the cut level is finished by the caller
    return gls_finish(plan, zhat[1:], Phat[1:], covariance)


def partitioned_gls(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    measurements: Sequence[Measurement] | PartitionedMeasurements,
    invariants: Sequence[Invariant],
    privacy: PrivacyStatement,
    partitions: Sequence[Partition],
    executor: Executor,
    *,
    covariance: bool = False,
    geometry: Geometry = "weighted",
) -> Release:
    """The GLS estimate computed partition by partition; equals :func:`tree_gls` bit for bit.

    Parameters
    ----------
    hierarchy, cells, measurements, invariants, privacy, covariance, geometry
        As for :func:`~censusdp.estimation.gls.tree_gls`; ``measurements`` may also be the
        :class:`~censusdp.pipelines.measure.PartitionedMeasurements` of
        ``measure_partitioned(..., keep=True)`` (used where they are when its executor and
        partitions are these; gathered otherwise).
    partitions : sequence of Partition
        From :func:`~censusdp.pipelines.partition.partition_units` (one cut level, node order).
    executor : Executor
        Backend of the two maps (sync, threads, Dask); the reduce runs in the caller.

    Returns
    -------
    Release
        Same estimates, variances and covariances as ``tree_gls`` (``np.array_equal``);
        diagnostics add the partition count and per-stage seconds.

    References
    ----------
    Hay et al. (2010); Rauch, Tung & Striebel (1965).
    """
    t0 = time.perf_counter()
    ex = executor
    cut = partitions[0].cut
    pm = measurements if isinstance(measurements, PartitionedMeasurements) else None
    if pm is not None and (pm.executor is not ex or pm.partitions != tuple(partitions)):
        measurements, pm = pm.gather(), None
    if pm is None:
        plan, meas, invs = gls_plan(hierarchy, cells, measurements, invariants, geometry)
        tasks: list = [
            _UpTask(
                Forest.of(hierarchy, cut, p.ranges),
                tuple(restrict(meas, cut, p.ranges)),
                tuple(restrict(invs, cut, p.ranges)),
            )
            for p in partitions
        ]
    else:
        # levels at or below the cut are validated by shape here and for finiteness in
        # their tasks: their values stay with the executor
        stubs = [
            pm.top[i]
            if i in pm.top
            else Measurement(k, q, np.broadcast_to(np.zeros(()), (pm.sizes[k], q.n_rows)), law)
            for i, (k, q, law) in enumerate(pm.plan)
        ]
        plan, meas, invs = gls_plan(hierarchy, cells, stubs, invariants, geometry)
        entries = tuple((i, k, q, law) for i, (k, q, law) in enumerate(pm.plan) if k >= cut)
        tasks = [
            (
                Forest.of(hierarchy, cut, p.ranges),
                h,
                entries,
                tuple(restrict(invs, cut, p.ranges)),
            )
            for p, h in zip(partitions, pm.handles, strict=True)
        ]
    t1 = time.perf_counter()
    states = ex.submit(_upward_task, tasks, plan)
    del tasks
    msg = ex.submit(_message_task, states, plan)
    messages = ex.gather(msg)
    ex.release(msg)
    t2 = time.perf_counter()
    zhat, Phat = gls_top(plan, hierarchy, cut, meas, invs, messages)
    del messages
    t3 = time.perf_counter()
    items = [
        (s, zhat[-1][slice(*p.units)], Phat[-1][slice(*p.units)])
        for s, p in zip(states, partitions, strict=True)
    ]
    down = ex.submit(_downward_task, items, plan, covariance)
    ex.release(states)  # the downward tasks hold them
    del states, items
    parts = ex.gather(down)
    ex.release(down)
    t4 = time.perf_counter()
    est, var, cov = gls_finish(plan, zhat, Phat, covariance)
    for j in range(hierarchy.depth - 1 - cut):
        est.append(np.concatenate([p[0][j] for p in parts]))
        if var is not None:
            var.append(np.concatenate([p[1][j] for p in parts]))
        if cov is not None:
            cov.append(np.concatenate([p[2][j] for p in parts]))
    del parts
    timings = {
        "partitions": len(partitions),
        "cut": hierarchy.names[cut],
        "seconds_setup": t1 - t0,
        "seconds_upward": t2 - t1,
        "seconds_top": t3 - t2,
        "seconds_downward": time.perf_counter() - t3,
        "seconds_downward_map": t4 - t3,
    }
    return gls_release(plan, hierarchy, invs, privacy, est, var, cov, timings)


# ----------------------------------------------------------------------------- rounding tasks
def _round_task(
    item: tuple, n_global: tuple[int, ...], rng: KeyedRNG, mode: str, label: str, tol: float
) -> RoundPart:
    """``item = (forest, lo, leaf_values)`` of one partition."""
    forest, lo, leaves = item
    return round_part(forest, lo, n_global, leaves, rng, mode=mode, label=label, tol=tol)


def _bipartite_task(
    task: tuple[np.ndarray, np.ndarray, int], rng: KeyedRNG, label: str, tol: float
) -> np.ndarray:
    values, child_count, first_parent = task
    return round_bipartite_part(values, child_count, first_parent, rng, label=label, tol=tol)


def partitioned_round(
    release: Release,
    rng: KeyedRNG,
    partitions: Sequence[Partition],
    executor: Executor,
    *,
    method: Literal["cells", "totals", "bipartite"] = "cells",
    label: str | None = None,
    tol: float = TOL,
) -> Release:
    """Unbiased integer rounding partition by partition; equals :func:`round_release`.

    ``"cells"``/``"totals"``: each partition rounds its subtrees up to the cut-level nodes
    (:func:`~censusdp.estimation.rounding.round_part`), the calling process rounds the
    levels above the cut from the at most one fractional part per (cut node, cell) —
    ``"totals"``: per cut node — each subtree leaves
    (:func:`~censusdp.estimation.rounding.round_top`). Randomness is keyed by (level, node)
    (merge ``c`` inside node ``v``'s group uses uniform ``first child of v + c`` of the
    level's stream), so the integers are the same for every partition count and backend,
    and equal to :func:`~censusdp.estimation.rounding.round_release`. ``"bipartite"``: the
    leaves of each parent of the leaf level, with a generator keyed by that parent.

    Guarantees (unchanged by partitioning): every leaf cell is ⌊x⌋ or ⌈x⌉ with
    E[rounded] = x; ``"cells"``: every (node, cell) sum at every level, above and below the
    cut, is the floor or ceiling of its real sum; ``"totals"``: every node total at every
    level and every leaf cell is; in both, sums that are integers (the invariants) are kept
    exactly. ``"bipartite"``: leaf totals and the cell sums and totals of the leaves'
    parents (see :func:`~censusdp.estimation.rounding.round_bipartite`).

    References
    ----------
    Srinivasan (2001); Ageev & Sviridenko (2004); Gandhi et al. (2006).
    """
    h = release.hierarchy
    leaves_real = release.estimates[-1]
    lab = label or f"rounding/{method}"
    cut = partitions[0].cut
    D = h.depth
    ex = executor
    if method == "bipartite":
        if cut > D - 2:  # the leaves' parents are above the cut: one task
            return round_release(release, rng, method=method, label=lab, tol=tol)
        up = h.levels[D - 2]
        tasks = []
        for p in partitions:
            a, b = p.range(D - 2)
            lo, hi = p.range(D - 1)
            tasks.append((leaves_real[lo:hi], up.child_count[a:b], a))
        parts = ex.map(_bipartite_task, tasks, rng, lab, tol)
        return finish_rounding(release, h.aggregate(np.concatenate(parts)), method, tol)
    if method not in ("cells", "totals"):
        raise SpecError(f"method must be 'cells', 'totals' or 'bipartite', got {method!r}")
    n_global = h.sizes[cut:]
    tasks = [
        (
            Forest.of(h, cut, p.ranges),
            tuple(r[0] for r in p.ranges),
            leaves_real[slice(*p.range(D - 1))],
        )
        for p in partitions
    ]
    parts = ex.map(_round_task, tasks, n_global, rng, method, lab, tol)
    del tasks
    K = leaves_real.shape[1]
    leaf, cell, add = round_top(h, cut, parts, K, rng, mode=method, label=lab, tol=tol)
    leaves = np.concatenate([p.leaves for p in parts])
    del parts
    leaves[leaf, cell] += add
    return finish_rounding(release, h.aggregate(leaves), method, tol)
