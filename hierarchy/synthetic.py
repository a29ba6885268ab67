"""A synthetic U.S.-shaped geography with heavy-tailed populations (for scale tests).

nation → state → county → tract → block with the 2010 Census sizes by default (52 state
areas, 3,221 counties, ~85,000 tracts, 8.2 million blocks) and one cell, ``population``,
totalling about 330 million. Counties are heavy-tailed (lognormal number of tracts),
tracts are similar in size as real tracts are, and blocks are mostly small with about a
third empty. The construction is vectorised and deterministic for a seed.

Codes are FIPS-like: state ``SS``, county ``SSCCC``, tract ``SSCCCTTTTTT``, block
``SSCCCTTTTTTBBBB`` (15 characters, stored inline by numpy's StringDType).
"""

from __future__ import annotations

import numpy as np

from censusdp.hierarchy.core import STRING_DTYPE, Hierarchy, as_codes
from censusdp.hierarchy.table import Table
from censusdp.rng import KeyedRNG

__all__ = ["random_hierarchy", "synthetic_us"]

#: Probability that a block is structurally empty (water, parks, industry), before the
#: Poisson zeros of sparsely populated blocks.
EMPTY_BLOCK_SHARE = 0.3


def _allocate(
    gen: np.random.Generator, n_items: int, n_groups: int, sigma: float, cap: int, what: str
) -> np.ndarray:
    """Split ``n_items`` among ``n_groups`` (each ≥ 1) with lognormal(0, sigma) weights."""
    if n_items < n_groups:
        raise ValueError(f"need at least one {what} per parent: {n_items} < {n_groups}")
    if n_items > n_groups * cap:
        raise ValueError(f"too many {what}: at most {cap} per parent fit the code width")
    w = gen.lognormal(0.0, sigma, n_groups)
    counts = 1 + gen.multinomial(n_items - n_groups, w / w.sum())
    while (over := counts > cap).any():  # rare: give the overflow to the smallest groups
        excess = int((counts[over] - cap).sum())
        counts[over] = cap
        room = np.flatnonzero(counts < cap)
        take = room[np.argsort(counts[room], kind="stable")][:excess]
        counts[take] += 1
    return counts.astype(np.int64)


def _local_codes(counts: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Parent index of each child and its 1-based zero-padded code within the parent."""
    parent = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    local = np.arange(parent.size, dtype=np.int64) - start[parent] + 1
    return parent, np.strings.zfill(local.astype(STRING_DTYPE), width)


def synthetic_us(
    seed: int = 0,
    *,
    states: int = 52,
    counties: int = 3221,
    tracts: int = 85_000,
    blocks: int = 8_200_000,
    population: int = 330_000_000,
) -> Table:
    """A synthetic nation → state → county → tract → block table, one cell ``population``.

    Parameters
    ----------
    seed : int
        Seed of the reproducible :class:`~censusdp.rng.KeyedRNG` (synthetic data only).
    states, counties, tracts, blocks : int
        Number of nodes per level (each parent gets at least one child; at most 99 states,
        999 counties per state, 999,999 tracts per county and 9,999 blocks per tract).
    population : int
        Expected total population (the realised total is Poisson around it).

    Returns
    -------
    Table
        Canonical order; the same for the same arguments.
    """
    if not 1 <= states <= 99:
        raise ValueError("states must be between 1 and 99 (2-digit codes)")
    rng = KeyedRNG.reproducible(seed, warn=False).child("synthetic_us")
    g = rng.generator

    n_county = _allocate(g("counties"), counties, states, 0.8, 999, "counties")
    n_tract = _allocate(g("tracts"), tracts, counties, 1.4, 999_999, "tracts")
    n_block = _allocate(g("blocks"), blocks, tracts, 0.6, 9_999, "blocks")

    state_codes = np.strings.zfill(np.arange(1, states + 1).astype(STRING_DTYPE), 2)
    county_parent, local = _local_codes(n_county, 3)
    county_codes = np.strings.add(state_codes[county_parent], local)
    tract_parent, local = _local_codes(n_tract, 6)
    tract_codes = np.strings.add(county_codes[tract_parent], local)
    block_parent, local = _local_codes(n_block, 4)
    block_codes = np.strings.add(tract_codes[block_parent], local)
    del local

    # Tract sizes vary mildly; within a tract, occupied blocks get lognormal weights and
    # one block per tract is always occupied.
    tract_size = g("tract_size").lognormal(0.0, 0.35, tracts)
    gb = g("block_weight")
    weight = gb.lognormal(0.0, 1.3, blocks)
    weight[gb.random(blocks) < EMPTY_BLOCK_SHARE] = 0.0
    first_block = np.concatenate(([0], np.cumsum(n_block)[:-1]))
    weight[first_block] = np.maximum(weight[first_block], 1.0)
    tract_weight = np.bincount(block_parent, weights=weight, minlength=tracts)
    share = tract_size / tract_size.sum()
    lam = population * share[block_parent] * weight / tract_weight[block_parent]
    pop = g("population").poisson(lam).astype(np.int64)

    h = Hierarchy.from_parents(
        ["nation", "state", "county", "tract", "block"],
        [as_codes(["US"]), state_codes, county_codes, tract_codes, block_codes],
        [None, np.zeros(states, np.int64), county_parent, tract_parent, block_parent],
    )
    return Table(h, ("population",), pop[:, None])


def random_hierarchy(gen: np.random.Generator, fanouts: list[tuple[int, int]]) -> Hierarchy:
    """A random tree for tests and examples: each node of level ``d - 1`` gets between
    ``fanouts[d-1][0]`` and ``fanouts[d-1][1]`` children (inclusive); levels ``L0, L1, ...``.
    """
    names = [f"L{d}" for d in range(len(fanouts) + 1)]
    codes: list = [["root"]]
    parents: list = [None]
    n = 1
    for d, (lo, hi) in enumerate(fanouts, start=1):
        par = np.repeat(np.arange(n), gen.integers(lo, hi + 1, size=n))
        codes.append([f"{d}-{i:04d}" for i in range(par.size)])
        parents.append(par)
        n = par.size
    return Hierarchy.from_parents(names, codes, parents)
