"""A synthetic U.S.-shaped geography with heavy-tailed populations, and a synthetic
redistricting (``pl94``) person histogram on it (for scale tests).

nation → state → county → tract → block with the 2010 Census sizes by default (52 state
areas, 3,221 counties, ~85,000 tracts, 8.2 million blocks) and one cell, ``population``,
totalling about 330 million. Counties are heavy-tailed (lognormal number of tracts),
tracts are similar in size as real tracts are, and blocks are mostly small with about a
third empty. The construction is vectorised and deterministic for a seed.

Codes are FIPS-like: state ``SS``, county ``SSCCC``, tract ``SSCCCTTTTTT``, block
``SSCCCTTTTTTBBBB`` (15 characters, stored inline by numpy's StringDType).

:func:`synthetic_state` is one state of that shape with block groups (nation → state →
county → tract → block group → block), and :func:`pl94_histogram` spreads each block's
persons over the 2,016 cells of the ``pl94`` schema (hhgq × votingage × hispanic × cenrace)
from national shares (:func:`pl94_cell_shares`), sparse and partition by partition.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from censusdp.errors import DataError
from censusdp.hierarchy.core import STRING_DTYPE, Hierarchy, as_codes
from censusdp.hierarchy.table import Table
from censusdp.rng import KeyedRNG
from censusdp.schema import omb_race_combinations

__all__ = [
    "PL94_SHAPE",
    "block_populations",
    "histogram_range",
    "person_offsets",
    "pl94_cell_shares",
    "pl94_histogram",
    "pl94_partitions",
    "random_hierarchy",
    "synthetic_state",
    "synthetic_us",
]

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
    block_groups: int | None = None,
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
    block_groups : int, optional
        Insert a ``block_group`` level between tract and block (at most 9 per tract, 999
        blocks per block group). Codes follow the Census: block group ``SSCCCTTTTTTG`` and
        block ``SSCCCTTTTTTGBBB``, the block's first digit being its block group. ``None``
        (the default) keeps the four-level table, draw for draw.

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
    if block_groups is None:
        n_block = _allocate(g("blocks"), blocks, tracts, 0.6, 9_999, "blocks")
    else:
        n_bg = _allocate(g("block_groups"), block_groups, tracts, 0.5, 9, "block groups")
        n_block = _allocate(g("blocks"), blocks, block_groups, 0.6, 999, "blocks")

    state_codes = np.strings.zfill(np.arange(1, states + 1).astype(STRING_DTYPE), 2)
    county_parent, local = _local_codes(n_county, 3)
    county_codes = np.strings.add(state_codes[county_parent], local)
    tract_parent, local = _local_codes(n_tract, 6)
    tract_codes = np.strings.add(county_codes[tract_parent], local)
    names = ["nation", "state", "county", "tract"]
    codes = [as_codes(["US"]), state_codes, county_codes, tract_codes]
    parents = [None, np.zeros(states, np.int64), county_parent, tract_parent]
    if block_groups is None:
        block_parent, local = _local_codes(n_block, 4)
        block_codes = np.strings.add(tract_codes[block_parent], local)
        block_tract = block_parent
    else:
        bg_parent, local = _local_codes(n_bg, 1)
        bg_codes = np.strings.add(tract_codes[bg_parent], local)
        block_parent, local = _local_codes(n_block, 3)
        block_codes = np.strings.add(bg_codes[block_parent], local)
        block_tract = bg_parent[block_parent]
        names.append("block_group")
        codes.append(bg_codes)
        parents.append(bg_parent)
    del local
    names.append("block")
    codes.append(block_codes)
    parents.append(block_parent)

    # Tract sizes vary mildly; within a tract, occupied blocks get lognormal weights and
    # one block per tract is always occupied.
    tract_size = g("tract_size").lognormal(0.0, 0.35, tracts)
    gb = g("block_weight")
    weight = gb.lognormal(0.0, 1.3, blocks)
    weight[gb.random(blocks) < EMPTY_BLOCK_SHARE] = 0.0
    first_block = np.flatnonzero(np.diff(block_tract, prepend=-1))
    weight[first_block] = np.maximum(weight[first_block], 1.0)
    tract_weight = np.bincount(block_tract, weights=weight, minlength=tracts)
    share = tract_size / tract_size.sum()
    lam = population * share[block_tract] * weight / tract_weight[block_tract]
    pop = g("population").poisson(lam).astype(np.int64)

    h = Hierarchy.from_parents(names, codes, parents)
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


# -- one synthetic state with block groups --------------------------------------------------

#: 2010 Census geography of the 50 states and DC, to size a synthetic state from its number
#: of blocks: 11,078,297 blocks, 3,143 counties, 73,057 tracts, 217,740 block groups and
#: 308,745,538 persons (2010 Census Summary File 1, P1, and its geographic summary).
_US_2010 = dict(blocks=11_078_297, counties=3_143, tracts=73_057, block_groups=217_740)
_US_2010_PERSONS = 308_745_538


def synthetic_state(seed: int = 0, *, blocks: int = 160_000) -> Table:
    """One synthetic state: nation → state → county → tract → block group → block.

    :func:`synthetic_us` with one state and a block-group level, its counties, tracts,
    block groups and persons in the 2010 U.S. proportions to its blocks (about 3,500 blocks
    per county, 150 per tract, 51 per block group and 27.9 persons per block: a state of
    160,000 blocks has 45 counties, 1,055 tracts, 3,145 block groups and about 4.5 million
    persons, the size of Kentucky or Louisiana). Blocks are heavy-tailed with about a third
    empty, as in :func:`synthetic_us`.

    Parameters
    ----------
    seed : int
        Seed of the synthetic data (:class:`~censusdp.rng.KeyedRNG` reproducible mode).
    blocks : int
        Number of blocks (at least 1).

    Returns
    -------
    Table
        One cell, ``population``; canonical order; the same for the same arguments.
    """
    if blocks < 1:
        raise ValueError("a synthetic state needs at least one block")
    per_block = {k: v / _US_2010["blocks"] for k, v in _US_2010.items()}
    counties = max(1, round(blocks * per_block["counties"]))
    tracts = max(counties, round(blocks * per_block["tracts"]))
    block_groups = max(tracts, round(blocks * per_block["block_groups"]))
    return synthetic_us(
        seed,
        states=1,
        counties=counties,
        tracts=tracts,
        block_groups=min(block_groups, blocks),
        blocks=blocks,
        population=round(blocks * _US_2010_PERSONS / _US_2010["blocks"]),
    )


# -- the pl94 person histogram -----------------------------------------------------------

#: hhgq × votingage × hispanic × cenrace, the axis order of ``censusdp/schemas/pl94.toml``.
PL94_SHAPE = (8, 2, 2, 63)

# National counts the shares are made from (persons). Sources:
# - 2020 Census Redistricting Data (P.L. 94-171), U.S.: 331,449,281 persons, 258,343,281
#   aged 18 and over (P3), 62,080,044 Hispanic or Latino (P2), 8,239,016 in group quarters
#   (P5); race alone and Two or More Races by Hispanic origin (P2, rounded to thousands).
# - 2010 Census Summary File 1, U.S., P42: group-quarters population by major type (the
#   split of group quarters among the seven types; 2020 P5 totals are close).
# The rest is a model, not a published table (stated as such): the adult share by Hispanic
# origin (rounded from P4; the non-Hispanic share is solved so that the national adult share
# is exact), the share under 18 in each group-quarters type, and the split of Two or More
# Races over the 57 combinations (by number of races, rounded from P1, then in proportion to
# the product of per-race propensities).
_PERSONS_2020 = 331_449_281
_ADULTS_2020 = 258_343_281
_HISPANIC_2020 = 62_080_044
_GQ_2020 = 8_239_016
_HISPANIC_ADULT_SHARE = 0.69
#: 2010 SF1 P42: correctional (adults), juvenile, nursing, other institutional, college
#: housing, military quarters, other noninstitutional.
_GQ_TYPES_2010 = np.array([2_263_602, 151_493, 1_502_264, 76_300, 2_521_090, 353_056, 1_119_518])
#: Modelled share under 18 in each group-quarters type (juvenile facilities are mostly
#: minors; adult correctional and nursing facilities hold none).
_GQ_UNDER18 = np.array([0.0, 0.85, 0.0, 0.05, 0.02, 0.01, 0.10])
#: 2020 P2, thousands: White, Black, AIAN, Asian, NHPI, Some Other Race alone, Two or More.
_RACE7_BY_HISPANIC = np.array(
    [
        [191_698, 39_941, 2_252, 19_619, 623, 1_690, 13_509],  # not Hispanic or Latino
        [12_579, 1_164, 1_475, 267, 67, 26_226, 20_341],  # Hispanic or Latino
    ],
    dtype=np.float64,
)
#: Two or More Races by number of races (2 … 6), 2020 P1 rounded to thousands.
_NUMRACES_2020 = np.array([31_926, 1_730, 174, 17, 2], dtype=np.float64)
#: Modelled propensity of each race to appear in a combination, by Hispanic origin (makes
#: White–Some Other Race the largest combination among Hispanic persons and White–Black,
#: White–AIAN and White–Asian the largest among the others, as in 2020).
_COMBO_PROPENSITY = np.array(
    [[1.0, 0.35, 0.30, 0.30, 0.05, 0.25], [1.0, 0.10, 0.15, 0.03, 0.01, 1.5]]
)


def pl94_cell_shares() -> np.ndarray:
    """National shares of the 2,016 ``pl94`` cells, a float64 tensor of :data:`PL94_SHAPE`.

    ``P(hhgq, votingage, hispanic, cenrace) = P(hispanic) P(votingage | hispanic)
    P(cenrace | hispanic) P(hhgq | votingage)``: Hispanic 18.7%, adults 77.9% (69% of
    Hispanic and 80% of other persons), group quarters 2.49% split over the seven types as
    in 2010 with a modelled share of minors per type, race as published by Hispanic origin
    with Two or More Races spread over the 57 combinations by a propensity model. The
    sources and which parts are models are listed beside the constants in this module.
    The marginals of the joint are exact: e.g. ``shares.sum((0, 1, 3))[1]`` is
    62,080,044 / 331,449,281.

    Returns
    -------
    numpy.ndarray
        Shape ``(8, 2, 2, 63)``, non-negative, summing to 1 (C order: the flat cell index of
        ``Schema.load("pl94")``).

    References
    ----------
    U.S. Census Bureau (2021). 2020 Census Redistricting Data (Public Law 94-171) Summary
        File, tables P1–P5, United States.
    U.S. Census Bureau (2011). 2010 Census Summary File 1, table P42, United States.
    """
    p_hisp = np.array([1.0 - _HISPANIC_2020 / _PERSONS_2020, _HISPANIC_2020 / _PERSONS_2020])
    p_adult = _ADULTS_2020 / _PERSONS_2020
    adult_nh = (p_adult - p_hisp[1] * _HISPANIC_ADULT_SHARE) / p_hisp[0]
    p_va_h = np.array([[1.0 - adult_nh, adult_nh], [0.31, _HISPANIC_ADULT_SHARE]])  # (hisp, va)
    p_va = np.array([1.0 - p_adult, p_adult])

    gq = _GQ_2020 / _PERSONS_2020 * _GQ_TYPES_2010 / _GQ_TYPES_2010.sum()
    gq_va = gq[:, None] * np.stack([_GQ_UNDER18, 1.0 - _GQ_UNDER18], axis=1)  # (type, va)
    hh_va = p_va - gq_va.sum(axis=0)
    p_hhgq_va = np.vstack([hh_va[None], gq_va]) / p_va  # P(hhgq | va), columns sum to 1

    combos = omb_race_combinations(range(6))
    n_races = np.array([len(c) for c in combos])
    p_race = np.zeros((2, len(combos)))
    for h in range(2):
        race7 = _RACE7_BY_HISPANIC[h] / _RACE7_BY_HISPANIC[h].sum()
        p_race[h, :6] = race7[:6]
        w = np.array([np.prod(_COMBO_PROPENSITY[h, list(c)]) for c in combos])
        for m in range(2, 7):
            sel = n_races == m
            p_race[h, sel] = race7[6] * _NUMRACES_2020[m - 2] / _NUMRACES_2020.sum()
            p_race[h, sel] *= w[sel] / w[sel].sum()
    joint = np.einsum("h,hv,hr,gv->gvhr", p_hisp, p_va_h, p_race, p_hhgq_va)
    return joint / joint.sum()


def _persons_cdf() -> np.ndarray:
    cdf = np.cumsum(pl94_cell_shares().ravel())
    cdf[-1] = 1.0  # the last cell has positive share: no uniform in [0, 1) falls past it
    return cdf


def block_populations(populations: np.ndarray | Table) -> np.ndarray:
    """Persons per block as int64 from a one-cell table or an array of counts.

    Raises
    ------
    DataError
        Not one non-negative integer per block.
    """
    pop = populations.leaf_counts if isinstance(populations, Table) else populations
    pop = np.asarray(pop)
    if pop.ndim == 2 and pop.shape[1] == 1:
        pop = pop[:, 0]
    if pop.ndim != 1 or pop.dtype.kind not in "iu" or (pop.size and int(pop.min()) < 0):
        raise DataError(
            "pl94 histogram: block populations must be one non-negative integer per block "
            f"(got dtype {pop.dtype}, shape {pop.shape}); pass a one-cell Table such as "
            "synthetic_state(...) or its leaf_counts"
        )
    return pop.astype(np.int64, copy=False)


def pl94_histogram(
    populations: np.ndarray | Table,
    seed: int,
    start: int = 0,
    stop: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``pl94`` histogram of blocks ``[start, stop)``, sparse: (block, cell, count).

    Each person of each block falls in one of the 2,016 cells independently with the shares
    of :func:`pl94_cell_shares`, so a block's histogram is multinomial with its population
    as size. Persons are numbered across blocks in order and person ``i``'s cell is draw
    ``i`` of one keyed stream (:meth:`~censusdp.rng.KeyedRNG.draw`, chunks of
    :data:`~censusdp.rng.CHUNK` persons): any block range is a pure function of the seed and
    the range, bit for bit the same however the blocks are split into partitions, and
    drawing it touches only the persons of the range (plus at most two partial chunks).

    Parameters
    ----------
    populations : Table or array of int
        Persons per block (a one-cell table such as :func:`synthetic_state`, or its
        ``leaf_counts``), for every block of the geography.
    seed : int
        Seed of the synthetic data.
    start, stop : int
        The block range (default: every block).

    Returns
    -------
    block, cell, count : numpy.ndarray
        int64, one entry per non-empty (block, cell), sorted by block then cell; ``block``
        indexes the geography's blocks, ``cell`` the flat ``pl94`` cell (C order of
        :data:`PL94_SHAPE`); the counts of a block sum to its population.
    """
    pop = block_populations(populations)
    stop = pop.size if stop is None else stop
    if not 0 <= start <= stop <= pop.size:
        raise ValueError(f"block range [{start}, {stop}) is outside [0, {pop.size})")
    return histogram_range(pop, person_offsets(pop), seed, start, stop)


def person_offsets(pop: np.ndarray) -> np.ndarray:
    """Number of the first person of each block, and the total last: ``[0, cumsum(pop)]``.

    Computed once for a whole geography, it is what :func:`histogram_range` needs to draw
    any block range alone (the person numbering of :func:`pl94_histogram`).
    """
    return np.concatenate(([0], np.cumsum(pop)))


def histogram_range(
    pop: np.ndarray, offset: np.ndarray, seed: int, start: int, stop: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`pl94_histogram` of blocks ``[start, stop)`` from :func:`block_populations`
    ``pop`` and :func:`person_offsets` ``offset`` (unchecked: reads ``pop[start:stop]``,
    ``offset[start]``, ``offset[stop]`` and the total ``offset[-1]``)."""
    cdf = _persons_cdf()
    rng = KeyedRNG.reproducible(seed, warn=False).child("synthetic_pl94")
    cells = rng.draw(
        "persons",
        int(offset[-1]),
        int(offset[start]),
        int(offset[stop]),
        lambda gen, size: np.searchsorted(cdf, gen.random(size), side="right"),
    )[:, 0]
    n_cells = int(np.prod(PL94_SHAPE))
    block = np.repeat(np.arange(start, stop, dtype=np.int64), pop[start:stop])
    key, count = np.unique(block * n_cells + cells, return_counts=True)
    return key // n_cells, key % n_cells, count.astype(np.int64)


def pl94_partitions(
    populations: np.ndarray | Table, seed: int, bounds: Sequence[int]
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """The ``pl94`` histogram one partition at a time: partition ``i`` is blocks
    ``[bounds[i], bounds[i+1])``.

    Yields ``(i, block, cell, count)`` as :func:`pl94_histogram` for that range, which is
    what regenerates partition ``i`` alone; only one partition is held at a time. Any
    increasing ``bounds`` (per county: ``Hierarchy.descendant_range``; or fixed-size runs of
    blocks) give the same histogram.
    """
    pop = block_populations(populations)
    b = np.asarray(bounds, dtype=np.int64)
    if b.ndim != 1 or b.size < 2 or b[0] < 0 or b[-1] > pop.size or np.any(np.diff(b) < 0):
        raise ValueError(
            f"partition bounds must increase from ≥ 0 to ≤ {pop.size} (the number of blocks)"
        )
    offset = person_offsets(pop)  # once: a partition costs its own blocks only
    for i in range(b.size - 1):
        yield (i, *histogram_range(pop, offset, seed, int(b[i]), int(b[i + 1])))
