"""Synthetic Noisy Measurement Files: a known truth written in the layout of the 2020 NMF.

The truth behind the real file is confidential, so accuracy is measured on synthetic NMFs
(docs/design.md § The Noisy Measurement File, Evaluation): a synthetic ``pl94`` histogram (:func:`censusdp.hierarchy.synthetic.
pl94_histogram` on :func:`~censusdp.hierarchy.synthetic.synthetic_state`) is measured with the
2020 production strategy and variances (the ``pl94`` schema's ``[allocation]``: σ²_{ℓ,q} =
Δ₂²/(2ρ_{ℓ,q}), Δ₂ = 1, each rounded *up* onto the exact sampler's rational grid and written
as that σ²), and written in exactly the layout :mod:`.nmf` reads.

The noise is **evaluation noise** (:func:`simulate_nmf`'s ``evaluation_rng``): it makes test
data, it is not a release. It uses the exact discrete Gaussian sampler through its public API
(:meth:`~censusdp.mechanisms.discrete.DiscreteGaussian.sample`) on streams labelled
``nmf-evaluation/<subtree>/<level>/<query>``, apart from the release streams
(``measure/<level>/<query>``) of :mod:`censusdp.mechanisms.product_measure`.

The spine (:mod:`censusdp.hierarchy.nmf_spine`) is made from the tabulation hierarchy:
counties flagged in ``aian_counties`` form the state's AIAN part ``1ss``, the others ``0ss``;
spine county = part + ``000`` + county FIPS (9 characters); tract = county + the tract
code's last 4 digits (13); block group = tract + ``0`` + block-group digit (15); block =
block group + its 16-character tabulation GEOID, the synthetic 3-digit block number
prefixed by its block-group digit as the Census numbers blocks (31).

The stated frame for the hhgq bounds: at every node, for each hhgq type t, the upper bound is
0 where the truth has no one of type t (a structural zero) and otherwise the node's total
population (the frame's capacity: a type can hold at most everyone); the lower bound is 1
where the truth has someone of type t (an occupied unit or facility exists) and 0 otherwise.
Nursing facilities hold no one under 18 (the synthetic histogram's shares put no one there).
A node that is its parent's only child gets no DPQuery rows (the production rule); it keeps
its constraint rows. The US level measures every query but the total.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (strategy, allocation, spine).
Canonne, Kamath & Steinke (2020). The Discrete Gaussian for Differential Privacy.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from censusdp.atomic import output_dir
from censusdp.errors import SpecError
from censusdp.hierarchy.core import STRING_DTYPE, Hierarchy, as_codes
from censusdp.hierarchy.nmf_spine import code_index
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.product_query import apply_queries
from censusdp.pipelines.io.nmf import (
    ALLOCATION_LEVEL,
    LOWER_BOUND,
    NMF_LEVELS,
    PART_NMF_LEVELS,
    QUERY_NAMES,
    UPPER_BOUND,
    US_QUERY_NAMES,
    NMFLevel,
    NMFQuery,
    NMFSubtree,
    nmf_queries,
    subtree_folder,
)
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

__all__ = [
    "TABULATION_LEVELS",
    "NMFGeocodes",
    "nmf_geocodes",
    "production_laws",
    "simulate_nmf",
    "write_nmf",
    "write_state_totals",
]

#: The tabulation hierarchy a synthetic NMF is made from (``synthetic_state``'s levels).
TABULATION_LEVELS = ("nation", "state", "county", "tract", "block_group", "block")
_N_CELLS = 2016


@dataclass(frozen=True, eq=False)
class NMFGeocodes:
    """The spine geocode of every tabulation node (aligned to the hierarchy's node order).

    Attributes
    ----------
    part : numpy.ndarray
        (n_counties,) the state part (``0ss``/``1ss``) of each county.
    levels : dict of str → numpy.ndarray
        NMF level (County … Block) → geocode of each node of the matching tabulation level.
    """

    part: np.ndarray
    levels: dict[str, np.ndarray]


def _tail(codes: np.ndarray, n: int) -> np.ndarray:
    return np.strings.slice(codes, -n, None)


def nmf_geocodes(hierarchy: Hierarchy, aian_counties: np.ndarray | None = None) -> NMFGeocodes:
    """Spine geocodes for a tabulation hierarchy (levels :data:`TABULATION_LEVELS`, codes as
    :func:`~censusdp.hierarchy.synthetic.synthetic_us` writes them: state 2, county 5,
    tract 11, block group 12, block 15 characters).

    Parameters
    ----------
    hierarchy : Hierarchy
    aian_counties : bool array (n_counties,), optional
        Counties in their state's AIAN part (default: none).

    Raises
    ------
    SpecError
        Other levels or code lengths, more than 9,999 tracts in a county.
    """
    if hierarchy.names != TABULATION_LEVELS:
        raise SpecError(f"synthetic NMF: the hierarchy's levels are {list(hierarchy.names)}; "
                        f"give {list(TABULATION_LEVELS)} (synthetic_state)")  # fmt: skip
    for name, width in (
        ("state", 2),
        ("county", 5),
        ("tract", 11),
        ("block_group", 12),
        ("block", 15),
    ):
        if np.any(np.strings.str_len(hierarchy[name].codes) != width):
            raise SpecError(f"synthetic NMF: {name} codes must have {width} characters (the "
                            "Census GEOID layout of synthetic_us)")  # fmt: skip
    n_county = hierarchy["county"].size
    aian = np.zeros(n_county, bool) if aian_counties is None else np.asarray(aian_counties, bool)
    if aian.shape != (n_county,):
        raise SpecError(f"synthetic NMF: aian_counties needs one flag per county ({n_county})")
    state = hierarchy["state"].codes[hierarchy["county"].parent]
    part = np.strings.add(np.where(aian, "1", "0").astype(STRING_DTYPE), state)
    county = np.strings.add(np.strings.add(part, "000"), _tail(hierarchy["county"].codes, 3))
    t = hierarchy["tract"]
    local = np.arange(t.size) - hierarchy["county"].child_start[t.parent]
    if local.size and local.max() >= 10_000:
        raise SpecError("synthetic NMF: a county has more than 9,999 tracts (4-digit spine tracts)")
    tract = np.strings.add(county[t.parent], _tail(t.codes, 4))
    bg = hierarchy["block_group"]
    bgs = np.strings.add(np.strings.add(tract[bg.parent], "0"), _tail(bg.codes, 1))
    b = hierarchy["block"]
    geoid = np.strings.add(np.strings.add(np.strings.slice(b.codes, 0, 12),
                                          np.strings.slice(b.codes, 11, 12)), _tail(b.codes, 3))  # fmt: skip
    block = np.strings.add(bgs[b.parent], geoid)
    return NMFGeocodes(part, {"County": county, "Tract": tract, "Block_Group": bgs, "Block": block})


def production_laws(schema: Schema | None = None) -> dict[tuple[str, str], DiscreteGaussian]:
    """(NMF level, NMF query name) → the production run's discrete Gaussian.

    σ² = Δ₂²/(2ρ_{ℓ,q}) with ρ_{ℓ,q} = ρ · level share · query share of the schema's
    ``[allocation]`` (docs/design.md § Census histograms) and Δ₂ = 1, rounded up onto the sampler's grid (more
    noise, never less); queries with a zero share (the US total) are left out.
    """
    schema = Schema.load("pl94") if schema is None else schema
    if schema.allocation is None or tuple(schema.strategy) != tuple(
        q[: -len("_dpq")] for q in QUERY_NAMES
    ):
        raise SpecError(f"schema {schema.name!r}: a synthetic NMF needs the pl94 strategy and its "
                        "[allocation]")  # fmt: skip
    alloc = schema.allocation
    out = {}
    for level in NMF_LEVELS:
        lvl = ALLOCATION_LEVEL[level]
        for name, share in zip(QUERY_NAMES, alloc.queries[lvl], strict=True):
            if share == 0:
                continue
            rho = alloc.rho * alloc.levels[lvl] * share
            out[(level, name)] = DiscreteGaussian.from_sigma2(Fraction(1) / (2 * rho))
    return out


def _dense(node: np.ndarray, cell: np.ndarray, count: np.ndarray, n: int) -> np.ndarray:
    """(n, 8, 2, 2, 63) int64 counts from sparse (node, cell, count) triples."""
    flat = np.bincount(node * _N_CELLS + cell, weights=count, minlength=n * _N_CELLS)
    return np.rint(flat).astype(np.int64).reshape(n, 8, 2, 2, 63)


def _bounds(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hhgq = counts.reshape(counts.shape[0], 8, -1).sum(axis=2)
    total = hhgq.sum(axis=1, keepdims=True)
    has = hhgq > 0
    return has.astype(np.int64), np.where(has, total, 0)


def _level(
    name: str,
    subtree: str,
    geocodes: np.ndarray,
    parent: np.ndarray,
    counts: np.ndarray,
    measured: np.ndarray,
    laws: Mapping[tuple[str, str], DiscreteGaussian],
    queries: Mapping,
    rng: KeyedRNG,
) -> NMFLevel:
    names = US_QUERY_NAMES if name == "US" else QUERY_NAMES
    truth = apply_queries([queries[nm] for nm in names], counts)
    n = geocodes.size
    qs = {}
    for nm, exact in zip(names, truth.values(), strict=True):
        law = laws[(name, nm)]
        rows = exact.shape[1]
        noise = rng.draw(f"nmf-evaluation/{subtree}/{name}/{nm}", n, 0, n, law.sample, rows,
                         window=law.sample_window)  # fmt: skip
        values = np.where(measured[:, None], exact + noise, 0).astype(np.int64)
        variance = np.where(measured, float(law.sigma2), np.inf)
        qs[nm] = NMFQuery(nm, queries[nm], values, variance)
    lower, upper = _bounds(counts)
    return NMFLevel(name, geocodes, parent, measured.copy(), qs, lower, upper, np.ones(n, bool))


def simulate_nmf(
    hierarchy: Hierarchy,
    block: np.ndarray,
    cell: np.ndarray,
    count: np.ndarray,
    *,
    evaluation_rng: KeyedRNG,
    aian_counties: np.ndarray | None = None,
    with_us: bool = True,
    schema: Schema | None = None,
) -> Iterator[NMFSubtree]:
    """Measure a known ``pl94`` histogram as the 2020 production run did, with evaluation noise.

    Parameters
    ----------
    hierarchy : Hierarchy
        Tabulation levels :data:`TABULATION_LEVELS` (:func:`~censusdp.hierarchy.synthetic.
        synthetic_state`, or ``synthetic_us`` with block groups).
    block, cell, count : numpy.ndarray
        The histogram as sparse (block index, flat ``pl94`` cell, persons) triples
        (:func:`~censusdp.hierarchy.synthetic.pl94_histogram`).
    evaluation_rng : KeyedRNG
        Source of the evaluation noise (streams ``nmf-evaluation/<subtree>/<level>/<query>``);
        not a release sampler.
    aian_counties : bool array (n_counties,), optional
        Counties in their state's AIAN part ``1ss``.
    with_us : bool
        Also simulate the US level (first).
    schema : Schema, optional
        ``pl94`` (loaded when omitted).

    Yields
    ------
    NMFSubtree
        The US level (when ``with_us``), then each state part by state then part: exactly
        what :func:`~censusdp.pipelines.io.nmf.read_nmf` reads back from :func:`write_nmf`'s
        files.
    """
    schema = Schema.load("pl94") if schema is None else schema
    laws = production_laws(schema)
    queries = nmf_queries(schema)
    geo = nmf_geocodes(hierarchy, aian_counties)
    block = np.asarray(block, np.int64)
    cell = np.asarray(cell, np.int64)
    count = np.asarray(count, np.int64)
    if block.size and (block.min() < 0 or block.max() >= hierarchy["block"].size):
        raise SpecError("synthetic NMF: a block index is outside the hierarchy's blocks")
    if cell.size and (cell.min() < 0 or cell.max() >= _N_CELLS):
        raise SpecError(f"synthetic NMF: a cell index is outside 0..{_N_CELLS - 1}")
    if with_us:
        counts = _dense(np.zeros_like(block), cell, count, 1)
        yield NMFSubtree("US", (_level("US", "US", as_codes(["US"]), np.full(1, -1, np.int64), counts,
                                       np.ones(1, bool), laws, queries, evaluation_rng),))  # fmt: skip
    tab = {"County": "county", "Tract": "tract", "Block_Group": "block_group", "Block": "block"}
    county_of = {lvl: hierarchy.ancestor_index(t, "county") for lvl, t in tab.items()}
    block_county = county_of["Block"][block]
    parts = np.unique(np.asarray(geo.part, dtype=object))
    for p in sorted(parts, key=lambda s: (s[1:], s[0])):
        in_part = np.asarray(geo.part, dtype=object) == p
        sel_blocks = in_part[block_county]
        b, c, n = block[sel_blocks], cell[sel_blocks], count[sel_blocks]
        levels: list[NMFLevel] = []
        up_codes = None
        for lvl in PART_NMF_LEVELS:
            if lvl == "State":
                codes = as_codes([p])
                node_of_block = np.zeros(b.size, np.int64)
            else:
                members = np.flatnonzero(in_part[county_of[lvl]])
                raw = geo.levels[lvl][members]
                order = np.argsort(np.asarray(raw, dtype=object), kind="stable")
                members, codes = members[order], raw[order]
                where = np.full(hierarchy[tab[lvl]].size, -1, np.int64)
                where[members] = np.arange(members.size)
                node_of_block = where[hierarchy.ancestor_index("block", tab[lvl])[b]]
            counts = _dense(node_of_block, c, n, codes.size)
            if up_codes is None:
                parent = np.full(codes.size, -1, np.int64)
                measured = np.ones(codes.size, bool)
            else:
                up_len = len(str(up_codes[0]))
                parent = code_index(up_codes, np.strings.slice(codes, 0, up_len))
                measured = np.bincount(parent, minlength=up_codes.size)[parent] > 1
            levels.append(
                _level(lvl, p, codes, parent, counts, measured, laws, queries, evaluation_rng)
            )
            up_codes = codes
        yield NMFSubtree(p, tuple(levels))


def _list_array(values: np.ndarray) -> pa.Array:
    n, width = values.shape
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int64)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values.reshape(-1)))


def _write_level(base: Path, sub: tuple[str, ...], lvl: NMFLevel) -> None:
    dpq_dir = base.joinpath(f"{lvl.name}.parquet", "DPQuery", *sub)
    con_dir = base.joinpath(f"{lvl.name}.parquet", "Constraint", *sub)
    dpq_dir.mkdir(parents=True, exist_ok=True)
    con_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for nm, q in lvl.queries.items():
        keep = np.flatnonzero(q.measured)
        if keep.size == 0:
            continue
        shape = np.tile(np.asarray(q.query.row_shape, np.int64), (keep.size, 1))
        parts.append(pa.table({
            "geocode": pa.array(np.asarray(lvl.geocodes[keep], dtype=object), pa.string()),
            "query_name": pa.array([nm] * keep.size, pa.string()),
            "query_shape": _list_array(shape),
            "value": _list_array(q.values[keep]),
            "variance": pa.array(q.variance[keep], pa.float64()),
        }))  # fmt: skip
    if parts:
        pq.write_table(pa.concat_tables(parts), dpq_dir / "part-00000.parquet")
    has = np.flatnonzero(lvl.has_bounds)
    geos = np.asarray(lvl.geocodes[has], dtype=object)
    con = pa.table({
        "geocode": pa.array(np.concatenate([geos, geos]), pa.string()),
        "query_name": pa.array([LOWER_BOUND] * has.size + [UPPER_BOUND] * has.size, pa.string()),
        "value": _list_array(np.concatenate([lvl.lower[has], lvl.upper[has]])),
        "sign": pa.array(["ge"] * has.size + ["le"] * has.size, pa.string()),
    })  # fmt: skip
    pq.write_table(con, con_dir / "part-00000.parquet")


def write_nmf(root: str | Path, subtrees: Iterable[NMFSubtree], *, overwrite: bool = False) -> Path:
    """Write subtrees (e.g. from :func:`simulate_nmf`) in the NMF layout under ``root``.

    One subtree at a time; the folder appears whole or not at all, and an existing ``root``
    is replaced only when it is an earlier censusdp output and ``overwrite`` (the output
    policy of :func:`censusdp.atomic.output_dir`; its ownership manifest sits at the root,
    where the reader looks only at ``<Level>.parquet`` folders).

    Raises
    ------
    SpecError
        ``root`` exists and is not ours to replace.
    """
    root = Path(root)
    with output_dir(root, overwrite=overwrite, command="simulate_nmf", option="root") as tmp:
        for s in subtrees:
            sub = () if s.subtree == "US" else (subtree_folder(s.subtree),)
            for lvl in s.levels:
                _write_level(tmp, sub, lvl)
        for level in PART_NMF_LEVELS:  # every level folder exists, even with no subtree
            (tmp / f"{level}.parquet").mkdir(exist_ok=True)
    return root


def write_state_totals(path: str | Path, totals: Mapping[str, int]) -> Path:
    """Write state totals (``{ss: total}``) as the CSV :func:`.nmf.read_state_totals` reads
    (columns ``state,total``), atomically, refusing a file censusdp did not write."""
    from censusdp.atomic import output_file

    with output_file(path, formats=[".csv"], command="write_state_totals") as tmp, \
            open(tmp, "w", newline="", encoding="utf-8") as f:  # fmt: skip
        w = csv.writer(f)
        w.writerow(["state", "total"])
        for s in sorted(totals):
            w.writerow([s, int(totals[s])])
    return Path(path)
