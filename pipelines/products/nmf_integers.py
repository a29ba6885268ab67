"""The NMF route's non-negative integer product: consistent, non-negative integer P1–P5
tables from the same GLS estimate as the unbiased release, with the file's structural zeros
held, the state total exact and children summing to their parents (issue 35, build 4).

:func:`nmf_integers` runs :func:`~censusdp.estimation.integer.nonnegative.nonnegative_structured`
(top down, per parent: the children's totals by a simplex projection, then their cells by a
transportation projection, each rounded with its margins exact; no commercial solver) on a
state's :class:`~censusdp.pipelines.products.nmf_release.NMFStateRelease`, with the state total
invariant and every structural zero of the file (hhgq upper bounds of 0, nursing facilities
holding no one under 18) as a cell fixed at 0 (``held``: closed upward, a cell held at
every child is held at the parent). What it checks and reports:

* non-negative int64 at every spine node, every node the sum of its children (by
  construction; :func:`check_integers` verifies it), the state total ``==`` the published
  one across the state's two parts, every held cell ``== 0``;
* the hhgq *bounds* of the file: the upper bounds of 0 are held; the other bounds
  (``lower ≤ hhgq total ≤ upper``) are not imposed by the projections, and the number of
  (node, type) pairs outside them is reported (:attr:`NMFIntegers.bound_violations`).

The product is **biased** (:data:`~censusdp.estimation.integer.nonnegative.BIASED_NOTE`: small counts
up, large ones down, as TopDown's) and has no standard errors; its bias by size class is
measured by simulation on a synthetic NMF (:func:`censusdp.pipelines.products.nmf_evaluate.integer_bias`).
Privacy: post-processing of the same published measurements, under the release's statement.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (non-negative least squares per parent,
    structural zeros and hhgq bounds as constraints).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from censusdp.errors import DataError
from censusdp.estimation.integer.nonnegative import nonnegative_structured
from censusdp.pipelines.io.nmf import SPINE_LEVEL
from censusdp.pipelines.products.pl94_tables import pl94_codebook
from censusdp.rng import KeyedRNG
from censusdp.spreadsheet import write_csv

__all__ = [
    "INTEGER_FOLDER",
    "NMFIntegers",
    "check_integers",
    "held_cells",
    "nmf_integers",
    "write_integers",
]

#: The product's folder inside the release folder.
INTEGER_FOLDER = "nonnegative"
_LABEL = "nmf/nonnegative"


@dataclass(frozen=True, eq=False)
class NMFIntegers:
    """One state's non-negative integer histograms.

    Attributes
    ----------
    state : str
    counts : tuple of numpy.ndarray
        Per spine level (nation … block), int64 ``(n_nodes, 8, 2, 2, 63)``.
    bound_violations : dict of str → dict
        Per NMF level, ``{"below_lower": n, "above_upper": n}``: (node, hhgq type) pairs of
        the integers outside the file's bounds (not imposed; upper bounds of 0 are held).
    """

    state: str
    counts: tuple[np.ndarray, ...]
    bound_violations: dict


def held_cells(state) -> list[np.ndarray]:
    """Per spine level, ``(n_nodes, 2016)`` bool: the structural zeros of the level's nodes
    (:meth:`~censusdp.pipelines.io.nmf.NMFMeasurements.zeros`), closed upward (a cell held
    at every child is held at the parent; the GLS estimate is then exactly 0 there too)."""
    h = state.hierarchy
    zeros = state.measurements.zeros()
    out: list[np.ndarray] = [np.zeros(0)] * h.depth
    for k in range(h.depth - 1, -1, -1):
        n = h.levels[k].size
        own = zeros.get(h.names[k])
        cells = (
            np.zeros((n, 2016), bool)
            if own is None
            else np.broadcast_to(own[..., None], (n, 8, 2, 2, 63)).reshape(n, 2016)
        )
        if k < h.depth - 1:
            par = h.levels[k + 1].parent
            every = np.ones((n, 2016), bool)
            np.logical_and.at(every, par, out[k + 1])
            cells = cells | every
        out[k] = cells
    return out


def nmf_integers(state, rng: KeyedRNG) -> NMFIntegers:
    """The non-negative integer product of one state's GLS release (see the module doc).

    Parameters
    ----------
    state : NMFStateRelease
        From :func:`~censusdp.pipelines.products.nmf_release.estimate_state`.
    rng : KeyedRNG
        The rounding's uniforms (streams ``nmf/nonnegative/...``).

    Raises
    ------
    DataError
        Structural zeros that cannot be held with the state total and the parents' integers.
    """
    rel = state.release
    held = held_cells(state)
    invs = state.measurements.invariants()
    nn = nonnegative_structured(rel, rng, invariants=invs, label=_LABEL, held=held)
    counts = tuple(np.asarray(c).reshape(-1, 8, 2, 2, 63) for c in nn.counts)
    check_integers(state, counts, held)
    return NMFIntegers(state.state, counts, _bound_violations(state, counts))


def check_integers(state, counts, held=None) -> None:
    """Refuse integers that break what the product promises: non-negative, children sum to
    parents cell by cell, the state total, held cells 0 (AssertionError-free: DataError)."""
    h = state.hierarchy
    held = held_cells(state) if held is None else held
    for k, c in enumerate(counts):
        if c.dtype.kind not in "iu" or (c.size and int(c.min()) < 0):
            raise DataError(f"non-negative product, level {h.names[k]!r}: a negative count")
        if np.any(c.reshape(c.shape[0], -1)[held[k]] != 0):
            raise DataError(f"non-negative product, level {h.names[k]!r}: a held cell is not 0")
        if k + 1 < len(counts):
            sums = np.zeros_like(c)
            np.add.at(sums, h.levels[k + 1].parent, counts[k + 1])
            if not np.array_equal(sums, c):
                raise DataError(
                    f"non-negative product, level {h.names[k]!r}: children do not sum to parents"
                )
    k = h.level_index("state")
    for i, s in enumerate(h["state"].codes):
        if int(counts[k][i].sum()) != state.measurements.state_totals[str(s)]:
            raise DataError(f"non-negative product, state {s}: the total is not the published one")


def _bound_violations(state, counts) -> dict:
    h = state.hierarchy
    out = {}
    for name, lvl in state.measurements.levels.items():
        c = counts[h.level_index(SPINE_LEVEL[name])]
        hhgq = c.reshape(c.shape[0], 8, -1).sum(axis=2)
        has = lvl.has_bounds[:, None]
        out[name] = {
            "below_lower": int((has & (hhgq < lvl.lower)).sum()),
            "above_upper": int((has & (hhgq > lvl.upper)).sum()),
        }
    return out


def write_integers(folder: Path, state, product: NMFIntegers, started: set[str]) -> list[str]:
    """Append the state's integer P1–P5 tables to ``folder`` (``nonnegative/`` of a release):
    ``pl94_state.csv``, ``pl94_spine_<level>.csv`` and ``pl94_block.csv`` (GEOID and spine
    geocode), and the tabulation county / tract / block group as sums of the blocks'
    integers. No ``_se`` columns: the product is biased and has none. Returns the names
    written (``started``: the names already begun, appended to)."""
    from censusdp.pipelines.products.nmf_release import (
        SPINE_OUTPUT_LEVELS,
        TABULATION_PREFIX,
        census_block_geoids,
    )

    book = pl94_codebook()
    cols = list(book.columns)
    h = state.hierarchy
    counts = product.counts

    def table(codes: dict, c: np.ndarray) -> pd.DataFrame:
        vals = book.rows.apply(c)
        frame = pd.DataFrame({k: np.asarray(v, dtype=object) for k, v in codes.items()})
        return pd.concat([frame, pd.DataFrame(vals.astype(np.int64), columns=cols)], axis=1)

    frames = {"pl94_state.csv": table({"GEOID": h["state"].codes}, counts[h.level_index("state")])}
    for level in SPINE_OUTPUT_LEVELS:
        frames[f"pl94_spine_{level}.csv"] = table(
            {"geocode": h[level].codes}, counts[h.level_index(level)]
        )
    blocks = counts[h.level_index("block")]
    geo = state.tabulation_geoids
    for level, width in TABULATION_PREFIX.items():
        keys, inv = np.unique(np.strings.slice(geo, 0, width), return_inverse=True)
        sums = np.zeros((keys.size, *blocks.shape[1:]), np.int64)
        np.add.at(sums, inv.reshape(-1), blocks)
        frames[f"pl94_{level}.csv"] = table({"GEOID": keys}, sums)
    frames["pl94_block.csv"] = table(
        {"GEOID": census_block_geoids(geo), "geocode": h["block"].codes}, blocks
    )
    folder.mkdir(exist_ok=True)
    for name, frame in frames.items():
        first = name not in started
        write_csv(frame, folder / name, index=False, header=first, mode="w" if first else "a")
        started.add(name)
    return sorted(frames)
