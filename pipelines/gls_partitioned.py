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
partition count. On Dask the upward state stays on the worker that computed it: the
downward task receives it as a future, so only cut-level messages and the finished per-level
arrays pass through the calling process.

References
----------
Hay, Rastogi, Miklau & Suciu, PVLDB 3(1), 2010 (two-pass consistency); Rauch, Tung &
Striebel, AIAA J. 3(8), 1965 (the smoother); Gandhi, Khuller, Parthasarathy & Srinivasan,
J. ACM 53(3), 2006 (dependent rounding).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
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
from censusdp.pipelines.partition import Partition
from censusdp.rng import KeyedRNG

__all__ = ["partitioned_gls", "partitioned_round"]


# ----------------------------------------------------------------------------- remote results
class _Remote:
    """Map keeping results where they were computed (Dask futures), or in process.

    ``map`` returns handles; ``gather`` turns handles into values. Without Dask the handles
    are the values (the executor's ``map``).
    """

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        # Results are gathered after every map, even on Dask: keeping upward states on the
        # workers as futures saved driver memory, but a run whose worker died mid-pass then
        # waited forever for their recomputation (pipelines fault test). Gathered results
        # make every task a pure function of values the driver holds.
        self.client = None
        # scattered shared arguments stay referenced for as long as results that depend on
        # them may need recomputing after a worker is lost
        self._shared: list[Any] = []

    def map(self, fn: Callable[..., Any], items: Sequence[Any], *shared: Any) -> list[Any]:
        """``fn(item, *shared)`` for every item.

        Items travel inside their tasks rather than being scattered: the scheduler can then
        recompute any result lost with a worker (data that was only scattered cannot be
        recomputed). Shared arguments are broadcast to every worker, so one copy survives the
        loss of a worker.
        """
        if self.client is None:
            return self.executor.map(fn, items, *shared)
        c = self.client
        extra = [c.scatter([x], broadcast=True, hash=False)[0] for x in shared]
        self._shared.extend(extra)
        return [c.submit(fn, it, *extra, pure=False, retries=3) for it in items]

    def gather(self, handles: list[Any]) -> list[Any]:
        return handles if self.client is None else self.client.gather(handles)

    def release(self, handles: list[Any]) -> None:
        if self.client is not None:
            for f in handles:
                f.release()


# ----------------------------------------------------------------------------- GLS tasks
@dataclass(frozen=True, eq=False)
class _UpTask:
    forest: Forest
    measurements: tuple[Measurement, ...]
    invariants: tuple[Invariant, ...]


def _upward_task(task: _UpTask, plan: GLSPlan) -> UpwardState:
    return gls_upward(plan, task.forest, task.measurements, task.invariants)


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
    measurements: Sequence[Measurement],
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
        As for :func:`~censusdp.estimation.gls.tree_gls`.
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
    plan, meas, invs = gls_plan(hierarchy, cells, measurements, invariants, geometry)
    cut = partitions[0].cut
    tasks = [
        _UpTask(
            Forest.of(hierarchy, cut, p.ranges),
            tuple(restrict(meas, cut, p.ranges)),
            tuple(restrict(invs, cut, p.ranges)),
        )
        for p in partitions
    ]
    remote = _Remote(executor)
    t1 = time.perf_counter()
    states = remote.map(_upward_task, tasks, plan)
    del tasks
    messages = remote.gather(remote.map(_message_task, states, plan))
    t2 = time.perf_counter()
    zhat, Phat = gls_top(plan, hierarchy, cut, meas, invs, messages)
    del messages
    t3 = time.perf_counter()
    items = [
        (s, zhat[-1][slice(*p.units)], Phat[-1][slice(*p.units)])
        for s, p in zip(states, partitions, strict=True)
    ]
    parts = remote.gather(remote.map(_downward_task, items, plan, covariance))
    remote.release(states)
    del states, items
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
@dataclass(frozen=True, eq=False)
class _RoundTask:
    forest: Forest
    lo: tuple[int, ...]
    leaf_values: np.ndarray


def _round_task(
    task: _RoundTask, n_global: tuple[int, ...], rng: KeyedRNG, mode: str, label: str, tol: float
) -> RoundPart:
    return round_part(
        task.forest, task.lo, n_global, task.leaf_values, rng, mode=mode, label=label, tol=tol
    )


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
    remote = _Remote(executor)
    if method == "bipartite":
        if cut > D - 2:  # the leaves' parents are above the cut: one task
            return round_release(release, rng, method=method, label=lab, tol=tol)
        up = h.levels[D - 2]
        tasks = []
        for p in partitions:
            a, b = p.range(D - 2)
            lo, hi = p.range(D - 1)
            tasks.append((leaves_real[lo:hi], up.child_count[a:b], a))
        parts = remote.gather(remote.map(_bipartite_task, tasks, rng, lab, tol))
        return finish_rounding(release, h.aggregate(np.concatenate(parts)), method, tol)
    if method not in ("cells", "totals"):
        raise SpecError(f"method must be 'cells', 'totals' or 'bipartite', got {method!r}")
    n_global = h.sizes[cut:]
    tasks = [
        _RoundTask(
            Forest.of(h, cut, p.ranges),
            tuple(r[0] for r in p.ranges),
            leaves_real[slice(*p.range(D - 1))],
        )
        for p in partitions
    ]
    parts = remote.gather(remote.map(_round_task, tasks, n_global, rng, method, lab, tol))
    del tasks
    K = leaves_real.shape[1]
    leaf, cell, add = round_top(h, cut, parts, K, rng, mode=method, label=lab, tol=tol)
    leaves = np.concatenate([p.leaves for p in parts])
    del parts
    leaves[leaf, cell] += add
    return finish_rounding(release, h.aggregate(leaves), method, tol)
