"""An NMF release against a known (synthetic) truth: the Bureau's metric set by size class.

:func:`~censusdp.pipelines.products.nmf_release.release_nmf` writes the unbiased GLS tables of a
Noisy Measurement File. When the file was simulated from a known histogram
(:func:`~censusdp.pipelines.io.nmf_writer.simulate_nmf`), :func:`evaluate_nmf_release`
compares the released total population ``P1_001N`` of every state, county, tract, block
group and block with the truth, per size class of the areas, with the Census Bureau's metric
set of :mod:`censusdp.pipelines.size_class_report` (its
:func:`~censusdp.pipelines.size_class_report.evaluate_size_classes`, where the metrics and
their references are).

**Confidential.** Errors against the truth, together with the release, reveal the truth.
The evaluation is written into its own output folder, never inside the release (which must
stay publishable as it is), labelled ``CONFIDENTIAL.txt`` and in its report and manifest
with :data:`~censusdp.pipelines.report.CONFIDENTIAL_LABEL` — the layout of ``run``'s
``evaluation/`` beside ``release/`` (:func:`censusdp.pipelines.runner.separate_evaluation`).

Areas are matched by GEOID: the truth is given per Census block (15 characters: state 2,
county 3, tract 6, block 4) and summed over the GEOID prefixes of the tabulation levels
(2, 5, 11, 12 — the block group is the block number's first digit — and 15), exactly
(int64). The released areas of each level must be exactly the truth's areas of the
released states, or the evaluation is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from censusdp.atomic import output_dir
from censusdp.errors import DataError, SpecError
from censusdp.hierarchy.core import as_codes
from censusdp.pipelines.report import CONFIDENTIAL_LABEL, markdown_table
from censusdp.pipelines.size_class_report import evaluate_size_classes
from censusdp.spreadsheet import write_csv

__all__ = [
    "EVALUATED_COLUMN",
    "GEOID_PREFIX",
    "WATER_BLOCK_PATCH",
    "geocode16_geoid",
    "regeocode_water_blocks",
    "block_truth_totals",
    "compare_published",
    "integer_bias",
    "read_published",
    "evaluate_nmf_release",
    "nmf_size_class_metrics",
    "released_totals",
]

#: The column evaluated: total population (P1 item 1).
EVALUATED_COLUMN = "P1_001N"
#: Tabulation level → the length of its GEOID, a prefix of the 15-character block GEOID.
GEOID_PREFIX = {"state": 2, "county": 5, "tract": 11, "block_group": 12, "block": 15}
#: The product the NMF release is (real-valued GLS, exact SEs: unbiased).
_PRODUCT = "unbiased"


def block_truth_totals(
    block_geoids: object, persons: np.ndarray
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The truth's persons of every area of every tabulation level, from block entries.

    Parameters
    ----------
    block_geoids : array-like of str
        15-character Census block GEOID of each entry (entries of one block may repeat,
        e.g. the sparse cells of a histogram, and are summed).
    persons : numpy.ndarray
        Integer persons of each entry (≥ 0).

    Returns
    -------
    dict of level → (codes, totals)
        Sorted GEOIDs of the level's areas and their int64 totals.

    Raises
    ------
    DataError
        Not one count per GEOID, a GEOID not of 15 characters, or a negative count (naming
        the entry's position, never a value).
    """
    geo = as_codes(block_geoids)
    n = np.asarray(persons)
    if geo.shape != n.shape or geo.ndim != 1:
        raise DataError(
            f"truth: {geo.shape} block GEOIDs and {n.shape} counts; give one count per GEOID"
        )
    if not np.issubdtype(n.dtype, np.integer):
        raise DataError("truth: persons must be integers (a histogram's counts)")
    bad = np.flatnonzero(np.strings.str_len(geo) != GEOID_PREFIX["block"])
    if bad.size:
        raise DataError(
            f"truth: entry {bad[0]} has a block GEOID of {len(str(geo[bad[0]]))} characters; "
            "give 15-character Census block GEOIDs (state 2, county 3, tract 6, block 4)"
        )
    neg = np.flatnonzero(n < 0)
    if neg.size:
        raise DataError(f"truth: entry {neg[0]} has a negative count; counts are persons ≥ 0")
    out = {}
    for level, width in GEOID_PREFIX.items():
        codes, inv = np.unique(np.strings.slice(geo, 0, width), return_inverse=True)
        totals = np.zeros(codes.size, np.int64)
        np.add.at(totals, inv.reshape(-1), n.astype(np.int64))
        out[level] = (codes, totals)
    return out


def released_totals(release_dir: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``P1_001N`` of every area of every tabulation level of a ``censusdp nmf`` release
    (``pl94_<level>.csv``, column ``GEOID``), sorted by GEOID.

    Raises
    ------
    DataError
        A table missing, without the columns, or with a GEOID repeated.
    """
    root = Path(release_dir)
    out = {}
    for level, width in GEOID_PREFIX.items():
        path = root / f"pl94_{level}.csv"
        if not path.is_file():
            raise DataError(f"{path}: not found; give the folder written by `censusdp nmf`")
        try:
            f = pd.read_csv(path, usecols=["GEOID", EVALUATED_COLUMN], dtype={"GEOID": str})
        except ValueError as e:
            raise DataError(
                f"{path}: needs the columns GEOID and {EVALUATED_COLUMN} (a `censusdp nmf` table)"
            ) from e
        geo = as_codes(f["GEOID"].to_numpy(dtype=str))
        bad = np.flatnonzero(np.strings.str_len(geo) != width)
        if bad.size:
            raise DataError(
                f"{path}: row {bad[0] + 2}, column GEOID: not {width} characters (a {level} "
                "GEOID); give the folder written by `censusdp nmf`"
            )
        order = np.argsort(geo, kind="stable")
        geo, val = geo[order], f[EVALUATED_COLUMN].to_numpy(np.float64)[order]
        rep = np.flatnonzero(geo[1:] == geo[:-1])
        if rep.size:
            raise DataError(f"{path}: GEOID {geo[rep[0]]} appears twice; one row per {level}")
        out[level] = (geo, val)
    return out


def nmf_size_class_metrics(
    released: dict[str, tuple[np.ndarray, np.ndarray]],
    truth: dict[str, tuple[np.ndarray, np.ndarray]],
) -> pd.DataFrame:
    """The metric set by level and size class of released against true totals (CONFIDENTIAL).

    Both arguments map a level to (sorted GEOIDs, totals) (:func:`released_totals`,
    :func:`block_truth_totals`). The truth is restricted to the released states; then
    every level's GEOIDs must agree exactly. Areas are classed by their true size.

    Returns
    -------
    pandas.DataFrame
        ``product, level, size_class, n, mae, rmse, mean_error, mape, over_10pct``
        (:func:`~censusdp.pipelines.size_class_report.evaluate_size_classes`).

    Raises
    ------
    DataError
        A level missing, or areas released but not in the truth (or the reverse), naming
        the level and the first such GEOID.
    """
    states = released["state"][0]
    est, tru = {}, {}
    for level in GEOID_PREFIX:
        if level not in released or level not in truth:
            raise DataError(f"NMF evaluation: no {level} totals in the release or the truth")
        rg, rv = released[level]
        tg, tv = truth[level]
        keep = np.isin(np.strings.slice(tg, 0, GEOID_PREFIX["state"]), states)
        tg, tv = tg[keep], tv[keep]
        if not np.array_equal(rg, tg):
            only_r = np.setdiff1d(rg, tg)
            only_t = np.setdiff1d(tg, rg)
            which = (
                f"{level} {only_r[0]} is released but not in the truth"
                if only_r.size
                else f"{level} {only_t[0]} is in the truth but not released"
            )
            raise DataError(
                f"NMF evaluation: {which}; the truth must be the histogram the NMF was "
                "simulated from, with every block (0 persons included)"
            )
        est[level], tru[level] = rv, tv
    return evaluate_size_classes(tru, {_PRODUCT: est})


def evaluate_nmf_release(
    release_dir: str | Path,
    block_geoids: object,
    persons: np.ndarray,
    out: str | Path,
    *,
    overwrite: bool = False,
) -> pd.DataFrame:
    """Evaluate a ``censusdp nmf`` release against the truth it was simulated from.

    Writes the confidential folder ``out`` (whole or not at all; never inside the release,
    nor holding it): ``CONFIDENTIAL.txt``, ``size_classes.csv``, ``size_classes.md`` and
    ``manifest.json`` (``"confidential": true``), each labelled
    :data:`~censusdp.pipelines.report.CONFIDENTIAL_LABEL`.

    Parameters
    ----------
    release_dir : path
        The folder :func:`~censusdp.pipelines.products.nmf_release.release_nmf` wrote.
    block_geoids, persons
        The truth: 15-character block GEOIDs and persons (:func:`block_truth_totals`),
        covering every block of the released states.
    out : path
        The evaluation folder.
    overwrite : bool
        Replace ``out`` when it is an earlier censusdp output.

    Returns
    -------
    pandas.DataFrame
        The metrics (:func:`nmf_size_class_metrics`), as written to ``size_classes.csv``.

    Raises
    ------
    SpecError
        ``out`` inside the release or holding it; an output the policy refuses.
    DataError
        As :func:`released_totals`, :func:`block_truth_totals`, :func:`nmf_size_class_metrics`.
    """
    release = Path(release_dir).resolve()
    target = Path(out).resolve()
    if target == release or release in target.parents or target in release.parents:
        raise SpecError(
            f"{out}: the evaluation is confidential and must be kept apart from the release "
            f"{release_dir}; give a folder neither inside it nor holding it"
        )
    released = released_totals(release)
    metrics = nmf_size_class_metrics(released, block_truth_totals(block_geoids, persons))
    cols = ["product", "level", "size_class", "n", "mae", "rmse", "mean_error", "mape",
            "over_10pct"]  # fmt: skip
    text = [
        f"# Errors of {EVALUATED_COLUMN} by size class against the confidential truth",
        "",
        f"**{CONFIDENTIAL_LABEL}**",
        "",
        f"Release: `{release_dir}` (unbiased GLS of the NMF). Areas classed by their true "
        "total population; MAPE and `over_10pct` (areas off by more than 10%) leave out "
        "areas of size 0. Size classes without areas are left out (they are in "
        "`size_classes.csv`).",
        "",
        markdown_table(metrics.loc[metrics["n"] > 0, cols]),
        "",
    ]
    manifest = {
        "confidential": True,
        "label": CONFIDENTIAL_LABEL,
        "evaluation_of": str(release / "manifest.json"),
        "column": EVALUATED_COLUMN,
        "levels": list(GEOID_PREFIX),
        "states": released["state"][0].tolist(),
    }
    with output_dir(target, overwrite=overwrite, inputs=[release], command="nmf-evaluate") as tmp:
        (tmp / "CONFIDENTIAL.txt").write_text(CONFIDENTIAL_LABEL + "\n", encoding="utf-8")
        write_csv(metrics, tmp / "size_classes.csv", index=False)
        (tmp / "size_classes.md").write_text("\n".join(text), encoding="utf-8")
        (tmp / "manifest.json").write_text(
            json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    return metrics


def integer_bias(
    hierarchy,
    block: np.ndarray,
    cell: np.ndarray,
    count: np.ndarray,
    seeds,
    *,
    aian_counties: np.ndarray | None = None,
    rounding_seed: int = 0,
) -> pd.DataFrame:
    """The bias of the non-negative integer product by block size class, by simulation on
    a synthetic NMF (issue 35, build 4), beside the unbiased GLS's as a control.

    Per seed, a synthetic file of one state is written in memory from the known histogram
    (:func:`~censusdp.pipelines.io.nmf_writer.simulate_nmf`, *evaluation* noise keyed by the
    seed), estimated (:func:`~censusdp.pipelines.products.nmf_release.estimate_state`) and made
    integer (:func:`~censusdp.pipelines.products.nmf_integers.nmf_integers`); the blocks' released
    ``P1_001N`` minus the truth is averaged per size class of the truth (the Bureau's
    classes, :data:`~censusdp.pipelines.metrics.SIZE_CLASSES`). The standard error of a
    class's bias is that of the per-release means over the releases (the blocks of one
    release share noise).

    Parameters
    ----------
    hierarchy, block, cell, count
        One state's tabulation hierarchy and sparse ``pl94`` histogram (as
        :func:`~censusdp.hierarchy.synthetic.pl94_histogram` gives them).
    seeds : sequence of int
        Evaluation seeds, one simulated release each (at least 2).
    aian_counties : numpy.ndarray, optional
        Counties of the AIAN part ``1ss``.
    rounding_seed : int
        Seed of the integer product's rounding.

    Returns
    -------
    pandas.DataFrame
        One row per size class with blocks: ``size_class``, ``blocks``, ``gls_bias``,
        ``gls_bias_se``, ``integer_bias``, ``integer_bias_se`` (persons per block).
        CONFIDENTIAL when the histogram is real: errors against it reveal it.
    """
    from censusdp.pipelines.io.nmf import collect_nmf
    from censusdp.pipelines.io.nmf_writer import simulate_nmf
    from censusdp.pipelines.metrics import SIZE_CLASSES
    from censusdp.pipelines.products.nmf_integers import nmf_integers
    from censusdp.pipelines.products.nmf_release import estimate_state
    from censusdp.rng import KeyedRNG

    seeds = [int(x) for x in seeds]
    if len(seeds) < 2:
        raise SpecError("integer_bias: give at least 2 seeds (the SE needs replicates)")
    total = int(np.asarray(count).sum())
    state = str(hierarchy["state"].codes[0])
    truth_by_code = dict(
        zip(
            hierarchy["block"].codes.tolist(),
            np.bincount(block, weights=count, minlength=hierarchy["block"].size).astype(np.int64),
            strict=True,
        )
    )
    gls_err, int_err, truth = [], [], None
    for seed in seeds:
        subs = simulate_nmf(hierarchy, block, cell, count, aian_counties=aian_counties,
                            with_us=False,
                            evaluation_rng=KeyedRNG.reproducible(seed, warn=False))  # fmt: skip
        r = estimate_state(collect_nmf(subs, {state: total}))
        ints = nmf_integers(r, KeyedRNG.reproducible(rounding_seed + seed, warn=False))
        if truth is None:
            from censusdp.pipelines.products.nmf_release import census_block_geoids

            ids = census_block_geoids(r.tabulation_geoids).tolist()
            truth = np.array([truth_by_code[g] for g in ids], np.int64)
        gls = r.release.query_estimates("block", "total")[:, 0]
        k = r.hierarchy.level_index("block")
        integer = ints.counts[k].reshape(ints.counts[k].shape[0], -1).sum(axis=1)
        gls_err.append(gls - truth)
        int_err.append(integer - truth)
    g, i = np.stack(gls_err), np.stack(int_err)
    rows = []
    for label, lo, hi in SIZE_CLASSES:
        sel = (truth >= lo) & (truth <= hi)
        if not sel.any():
            continue
        gm, im = g[:, sel].mean(axis=1), i[:, sel].mean(axis=1)
        n = len(seeds)
        rows.append(
            {
                "size_class": label,
                "blocks": int(sel.sum()),
                "gls_bias": float(gm.mean()),
                "gls_bias_se": float(gm.std(ddof=1) / np.sqrt(n)),
                "integer_bias": float(im.mean()),
                "integer_bias_se": float(im.std(ddof=1) / np.sqrt(n)),
            }
        )
    return pd.DataFrame(rows)


#: The water-block patch of the 2020 Census: blocks whose persons the published tabulation
#: (and the PPMF) puts in a land block while the NMF spine keeps them in a water block of a
#: water tract (99xxxx) of the same county. Published 16-character geocode (state 2, county
#: 3, tract 6, block group 1, block 4) → the NMF's, as the Census Bureau's DHC NMF README
#: (paragraph 27, "water block patch") documents it and census-bluedown's
#: ``ground_truth.handle_water_block_patch`` applies it to the PPMF.
WATER_BLOCK_PATCH = {
    "4502997080033004": "4502999010000001",
    "4505395030244009": "4505399010000002",
    "5306104010044007": "5306199000200017",
    "4816772390033135": "4816799010000039",
    "0607501790311031": "0607599020000001",
}


def geocode16_geoid(geocode16: object) -> np.ndarray:
    """15-character Census block GEOIDs of 16-character geocodes (state 2, county 3, tract 6,
    block group 1, block 4): the block-group digit dropped (it is the block number's first
    digit, which the GEOID keeps). The last 16 characters of an NMF block geocode are one."""
    g = as_codes(geocode16)
    bad = np.flatnonzero(np.strings.str_len(g) != 16)
    if bad.size:
        raise DataError(f"geocode {g[bad[0]]!r} is not 16 characters (state, county, tract, "
                        "block group, block)")  # fmt: skip
    return np.strings.add(np.strings.slice(g, 0, 11), np.strings.slice(g, 12, 16))


def regeocode_water_blocks(
    released: dict[str, tuple[np.ndarray, np.ndarray]],
    patch: dict[str, str] | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A release's totals re-geocoded as the published tabulation has them (the water-block
    patch, :data:`WATER_BLOCK_PATCH`).

    For every patched block the release has (its NMF GEOID in ``released["block"]``), its
    released total moves, at every level, from the area of its NMF GEOID to the area of its
    published GEOID (a GEOID prefix; the area is added when the release lacks it, as the
    published land block, absent from the NMF, is): the NMF block keeps exactly 0, its
    water tract and block group lose it, the land ones gain it. Counties and states are
    unchanged (the patch stays within a county). Exact for the integer product (int64);
    the real-valued GLS totals move in float64.

    Parameters
    ----------
    released : dict of level → (GEOIDs sorted, totals)
        :func:`released_totals`.
    patch : dict of str → str, optional
        Published → NMF 16-character geocodes (default :data:`WATER_BLOCK_PATCH`).

    Returns
    -------
    dict of level → (GEOIDs sorted, totals)
    """
    patch = WATER_BLOCK_PATCH if patch is None else patch
    if not patch or "block" not in released:
        return released
    pub = geocode16_geoid(np.array(list(patch), dtype=object))
    nmf = geocode16_geoid(np.array(list(patch.values()), dtype=object))
    bg, bv = as_codes(released["block"][0]), released["block"][1]
    pos = np.searchsorted(bg, nmf)
    has = (pos < bg.size) & (bg[np.minimum(pos, max(bg.size - 1, 0))] == nmf)
    if not has.any():
        return released
    moved = bv[pos[has]]
    out = dict(released)
    for level, (geo, val) in released.items():
        w = GEOID_PREFIX[level]
        keys = np.concatenate([as_codes(geo), np.strings.slice(nmf[has], 0, w),
                               np.strings.slice(pub[has], 0, w)])  # fmt: skip
        vals = np.concatenate([val, -moved, moved]).astype(val.dtype, copy=False)
        codes, inv = np.unique(as_codes(keys), return_inverse=True)
        tot = np.zeros(codes.size, val.dtype)
        np.add.at(tot, inv.reshape(-1), vals)
        if level == "block":  # the NMF block keeps exactly 0 (no float residue)
            tot[np.isin(codes, nmf[has])] = 0
        out[level] = (codes, tot)
    return out


#: GEOID length → tabulation level, for a published table.
_LEVEL_OF_WIDTH = {w: lv for lv, w in GEOID_PREFIX.items()}


def read_published(path: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A published table of total population (e.g. a state's 2020 P1 from the Census
    Bureau's API or data.census.gov, saved as CSV): columns ``GEOID`` and ``P1_001N``, one
    row per area of any tabulation level, the level told by the GEOID's length (2 state,
    5 county, 11 tract, 12 block group, 15 block; a ``1000000US``-style prefix up to ``US``
    is dropped). Returns level → (sorted GEOIDs, totals) for the levels present.

    Raises
    ------
    DataError
        A missing column, a GEOID of another length, a repeated GEOID, or a total that is
        not a non-negative integer (naming file, row and column; never a value).
    """
    from censusdp.tabular import read_csv_text

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise DataError(f"{path}: cannot read the published table ({type(e).__name__})") from e
    df = read_csv_text(text, path)
    for col in ("GEOID", EVALUATED_COLUMN):
        if col not in df.columns:
            raise DataError(
                f"{path.name}: no column {col!r}; give a CSV with columns GEOID and "
                f"{EVALUATED_COLUMN} (the published P1 total population)"
            )
    geo = df["GEOID"].fillna("").astype(str).str.replace(r"^.*US", "", regex=True).to_numpy()
    raw = df[EVALUATED_COLUMN].fillna("").astype(str).str.strip()
    ok = raw.str.fullmatch(r"\d+").to_numpy()
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise DataError(
            f"{path.name}: row {i + 1}, column {EVALUATED_COLUMN!r}: not a non-negative "
            "integer; give the published counts"
        )
    val = raw.to_numpy().astype(np.int64)
    width = np.array([len(g) for g in geo])
    bad = np.flatnonzero(~np.isin(width, list(_LEVEL_OF_WIDTH)))
    if bad.size:
        raise DataError(
            f"{path.name}: row {bad[0] + 1}, column 'GEOID': {width[bad[0]]} characters is "
            "no tabulation level (2 state, 5 county, 11 tract, 12 block group, 15 block)"
        )
    out = {}
    for w, level in _LEVEL_OF_WIDTH.items():
        sel = np.flatnonzero(width == w)
        if not sel.size:
            continue
        g = as_codes(geo[sel].astype(str))
        order = np.argsort(g, kind="stable")
        g, v = g[order], val[sel][order]
        rep = np.flatnonzero(g[1:] == g[:-1])
        if rep.size:
            raise DataError(
                f"{path.name}: row {int(sel[order][rep[0] + 1]) + 1}, column 'GEOID': the "
                f"{level} appears twice; one row per area"
            )
        out[level] = (g, v)
    return out


def compare_published(release_dir: str | Path, published: str | Path) -> pd.DataFrame:
    """The Census Bureau's metric set by size class of a release's ``P1_001N`` against a
    published table (:func:`read_published`) — the *difference* from the published numbers
    (themselves TopDown's noisy, post-processed estimates), not an error against the truth.

    Every product found in ``release_dir`` is compared: the unbiased GLS tables
    (``pl94_<level>.csv``) and, when written, the non-negative integer product
    (``nonnegative/``). The release's areas are first re-geocoded as the published
    tabulation has them (:func:`regeocode_water_blocks`: the documented water-block patch),
    so published and released rows match by GEOID. Areas are classed by their published
    size; each published area must be released. Both sides are public: nothing here is
    confidential.

    Returns
    -------
    pandas.DataFrame
        ``product, level, size_class, n, mae, rmse, mean_error, mape, over_10pct`` for the
        levels of the published table.

    Raises
    ------
    DataError
        As :func:`read_published` and :func:`released_totals`; a published area that is not
        released (naming its level and GEOID).
    """
    pub = read_published(published)
    if not pub:
        raise DataError(f"{Path(published).name}: no rows; give the published P1 totals")
    products = {"unbiased": Path(release_dir)}
    if (Path(release_dir) / "nonnegative" / "pl94_state.csv").is_file():
        products["nonnegative"] = Path(release_dir) / "nonnegative"
    released: dict[str, dict[str, np.ndarray]] = {}
    for product, folder in products.items():
        rel = regeocode_water_blocks(released_totals(folder))
        released[product] = {}
        for level, (pg, _) in pub.items():
            rg, rv = rel[level]
            pos = np.searchsorted(rg, pg)
            found = (pos < rg.size) & (rg[np.minimum(pos, rg.size - 1)] == pg)
            if not found.all():
                raise DataError(
                    f"{Path(published).name}: {level} {pg[np.flatnonzero(~found)[0]]} is "
                    "published but not released; give the table of the released state(s)"
                )
            released[product][level] = rv[pos]
    reference = {level: v.astype(np.float64) for level, (_, v) in pub.items()}
    return evaluate_size_classes(reference, released)
