"""The topdown-fidelity experiment: the Bureau's counts from the file, exact releases, budget."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from censusdp.errors import DataError
from censusdp.experiments.registry import run_experiment
from censusdp.experiments.topdown_fidelity import (
    ESTIMATORS,
    LABELS,
    ORDERING,
    ORDERING_ONE,
    QUICK_STATES,
    RHO_BUREAU,
    SHARES,
    SIZE_CLASSES,
    _pattern_text,
    bureau_slopes,
    load_county_table,
    size_class_table,
    strategy,
)
from censusdp.mechanisms.product_measure import measure_products, product_privacy
from censusdp.pipelines.metrics import slope_summary
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

SIG = "significant_negative_001"


def test_the_reference_budget_matches_the_bureau_county_total_variance():
    # ε = 4 × 0.16 × 0.3 = 0.192; geometric variance ≈ 2/ε², ρ_total = ε²/4, share 0.3
    assert RHO_BUREAU == Fraction(192, 1000) ** 2 / 4 / Fraction(3, 10) == Fraction(3072, 100000)
    assert sum(SHARES.values()) == 1
    schema = Schema.load("sex_age5")
    plan = strategy(schema, RHO_BUREAU)
    assert [(lv, q.name) for lv, q, _ in plan][:3] == [
        ("nation", "sex"), ("nation", "age5"), ("nation", "detailed")
    ]  # fmt: skip
    total = next(law for lv, q, law in plan if (lv, q.name) == ("county", "total"))
    assert total.sigma2 == Fraction(1) / (2 * Fraction(3, 10) * RHO_BUREAU)
    assert abs(float(total.sigma2) - 2 / 0.192**2) < 1e-9
    # the privacy derived from the measurements: ρ (3 − 0.3), the nation having no total
    counts = [np.zeros((1, *schema.shape), np.int64)] * 3
    meas = measure_products(
        counts,
        plan,
        KeyedRNG.reproducible(0, warn=False),
        level_names=["nation", "state", "county"],
    )
    derived = product_privacy(meas, level_names=["nation", "state", "county"])
    assert derived.rho == pytest.approx(float(RHO_BUREAU * (3 - Fraction(3, 10))), rel=1e-12)


def test_size_classes_against_a_direct_computation():
    rng = np.random.default_rng(3)
    truth = np.array([0, 5, 999, 1000, 4999, 5000, 60_000, 2_000_000])
    err = rng.integers(-20, 20, size=(3, truth.size)).astype(float)
    t = size_class_table(err, truth)
    assert t["counties"].sum() == truth.size
    assert list(t["size_class"]) == ["0–999", "1,000–4,999", "5,000–9,999", "50,000–99,999",
                                     "100,000+"]  # fmt: skip
    for row, (lo, hi) in zip(
        t.itertuples(), [(0, 999), (1000, 4999), (5000, 9999), (50_000, 99_999), (100_000, 1e12)],
        strict=True,
    ):  # fmt: skip
        sel = (truth >= lo) & (truth <= hi)
        e = err[:, sel]
        assert row.mean_error == pytest.approx(e.mean())
        assert row.mae == pytest.approx(np.abs(e).mean())
        assert row.rmse == pytest.approx(np.sqrt((e**2).mean()))
        pos = truth[sel] > 0
        assert row.mape_pct == pytest.approx(
            np.mean(np.abs(100 * e[:, pos] / truth[sel][pos])), nan_ok=True
        )
    assert SIZE_CLASSES[0] == 0


def test_missing_file_and_missing_version_are_data_errors(tmp_path, shared_file):
    with pytest.raises(DataError, match="no such file"):
        run_experiment(
            "topdown-fidelity", out=tmp_path / "x", quick=True, seed=1, data=tmp_path / "no.csv"
        )
    df = pd.read_csv(shared_file("county_sex_age5_2010.csv"), dtype={"fips": str})
    bad = tmp_path / "bad.csv"
    df[df["version"] != "ppdd_20200527"].to_csv(bad, index=False)
    with pytest.raises(DataError, match="ppdd_20200527"):
        load_county_table(bad)


def test_the_bureau_counts_recomputed_from_the_36_cell_file(shared_file):
    data = load_county_table(shared_file("county_sex_age5_2010.csv"))
    regs = bureau_slopes(data)
    assert {k: len(v) for k, v in regs.items()} == {"das_20191029": 48, "das_20200527": 48}
    s19, s20 = (slope_summary(regs[k]) for k in ("das_20191029", "das_20200527"))
    # the counts of the issue and of census-county-bias: the 36 cells sum to the totals file
    assert (s19["negative"], s19[SIG]) == (46, 41)
    assert (s20["negative"], s20[SIG]) == (41, 5)
    totals = pd.read_csv(shared_file("county_totalpop_2010.csv"), dtype={"fips": str})
    totals = totals.set_index("fips").loc[data.hierarchy.leaves.codes.tolist()]
    assert np.array_equal(totals["pop_sf2010"].to_numpy(), data.truth.sum(axis=1))
    assert np.array_equal(
        totals["pop_ppdd_20200527"].to_numpy(), data.bureau["das_20200527"].sum(axis=1)
    )


def test_quick_run_releases_exact_integer_tables(tmp_path, shared_file):
    data_path = shared_file("county_sex_age5_2010.csv")
    out, m = run_experiment(
        "topdown-fidelity", out=tmp_path / "fid", quick=True, seed=7, data=data_path,
        options={"topdown-passes": "both", "histogram": "sex_age"},
    )  # fmt: skip
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["runs"] == 2 and len(on_disk["by_rho"]) == 1
    assert on_disk["estimators"] == list(ESTIMATORS) == [
        "topdown", "topdown_one", "gls", "nonnegative"
    ]  # fmt: skip
    assert on_disk["options"] == {"topdown-passes": "both", "rho": "range", "histogram": "sex_age"}
    assert on_disk["by_rho"][0]["histogram"] == "sex_age"
    data = load_county_table(data_path, QUICK_STATES)
    assert on_disk["counties"] == data.hierarchy.leaves.size
    b = on_disk["by_rho"][0]
    assert b["rho_level"] == pytest.approx(float(RHO_BUREAU))
    for name in ESTIMATORS:
        assert b[name]["checks"] == {
            "integer": True, "non_negative": True, "state_totals_exact": True
        }, name  # fmt: skip
        assert b[name]["states"] == len(QUICK_STATES)
        assert len(b[name]["per_run_negative"]) == 2
        sizes = pd.DataFrame(b[name]["size_classes"])
        assert sizes["counties"].sum() == data.hierarchy.leaves.size
        # noise of ρ* moves a county total by a few persons, never by hundreds
        assert 0 < b[name]["mean_abs_county_error"] < 30
    table = pd.read_csv(out / "state_slopes.csv", dtype={"state": str})
    assert list(table["state"]) == sorted(QUICK_STATES)
    assert on_disk["slopes_table_rows"] == len(QUICK_STATES)
    assert (out / "fidelity.png").stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "topdown-fidelity" in report
    assert all(LABELS[k] in report for k in ESTIMATORS)
    for k in ("topdown", "topdown_one"):
        assert f"{k}_mean_slope" in table.columns


def test_topdown_release_is_consistent_at_every_level(shared_file):
    """Through topdown_schema directly: every level integer, non-negative, children summing
    to parents cell by cell, the state invariants met with ==."""
    from censusdp.estimation.topdown.schema import TopDownOptions, topdown_schema
    from censusdp.experiments.topdown_fidelity import ORDERING, _tensors
    from censusdp.mechanisms.product_measure import product_invariant
    from censusdp.mechanisms.product_query import ProductQuery

    data = load_county_table(shared_file("county_sex_age5_2010.csv"), QUICK_STATES)
    h, schema = data.hierarchy, data.schema
    tensors = _tensors(data)
    total = ProductQuery.parse(schema, "total")
    invs = [product_invariant(tensors, "state", total, level_names=h.names)]
    meas = measure_products(
        tensors, strategy(schema, RHO_BUREAU / 10), KeyedRNG.reproducible(11, warn=False),
        level_names=h.names,
    )  # fmt: skip
    rel = topdown_schema(h, schema, meas, invs, options=TopDownOptions(ordering=ORDERING))
    est = [np.asarray(e).reshape(e.shape[0], -1) for e in rel.estimates]
    for k in range(h.depth):
        assert est[k].dtype == np.int64 and est[k].min() >= 0
    for k in range(1, h.depth):
        assert np.array_equal(h.aggregate_up(k, est[k]), est[k - 1])
    assert np.array_equal(est[1].sum(axis=1), tensors[1].reshape(len(est[1]), -1).sum(axis=1))
    assert est[0].sum() == data.truth.sum()


def test_budgets_of_each_mode(tmp_path):
    from censusdp.experiments.registry import ExperimentContext
    from censusdp.experiments.topdown_fidelity import LOW_FACTORS, RHO_FACTORS, rho_factors

    assert rho_factors(ExperimentContext(out=tmp_path, quick=True)) == (Fraction(1),)
    assert rho_factors(ExperimentContext(out=tmp_path)) == RHO_FACTORS
    every = rho_factors(ExperimentContext(out=tmp_path, all_units=True))
    assert every == (*LOW_FACTORS, *RHO_FACTORS) and min(every) < Fraction(1, 100) < max(every)
    assert Fraction(1) in RHO_FACTORS and min(RHO_FACTORS) < 1 < max(RHO_FACTORS)  # brackets ρ*


def test_options_choose_the_columns_and_budgets(tmp_path):
    from censusdp.errors import SpecError
    from censusdp.experiments.registry import ExperimentContext
    from censusdp.experiments.topdown_fidelity import LOW_FACTORS, estimators, rho_factors

    def ctx(**opts):
        return ExperimentContext(out=tmp_path, options=opts)

    assert estimators(ctx()) == ("topdown", "gls", "nonnegative")
    assert estimators(ctx(**{"topdown-passes": "production"})) == ("topdown", "gls", "nonnegative")
    assert estimators(ctx(**{"topdown-passes": "one"})) == ("topdown_one", "gls", "nonnegative")
    assert estimators(ctx(**{"topdown-passes": "both"}))[:2] == ("topdown", "topdown_one")
    assert rho_factors(ExperimentContext(out=tmp_path, options={"rho": "reference"})) == (
        Fraction(1),
    )
    noisy = rho_factors(ExperimentContext(out=tmp_path, options={"rho": "noisy"}))
    assert noisy == LOW_FACTORS and max(noisy) < Fraction(1, 10)
    # the one-pass variant: every query of a level in a single L2 pass, the same rounder
    for level in ("state", "county"):
        (l2_prod, round_prod), (l2_one, round_one) = ORDERING[level], ORDERING_ONE[level]
        assert len(l2_prod) == 2 and l2_prod[0] == ("total",)
        assert l2_one == (tuple(q for p in l2_prod for q in p),) and round_one == round_prod
    assert ORDERING_ONE["nation"] == ORDERING["nation"]
    # unknown options and values stop before anything runs
    with pytest.raises(SpecError, match="no option 'passes'"):
        run_experiment("topdown-fidelity", out=tmp_path / "a", quick=True, seed=1,
                       options={"passes": "one"})  # fmt: skip
    with pytest.raises(SpecError, match="production, one, both"):
        run_experiment("topdown-fidelity", out=tmp_path / "b", quick=True, seed=1,
                       options={"topdown-passes": "two"})  # fmt: skip
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# ------------------------------------------------------------------ the split histogram


def _synthetic_counties(seed: int = 5, states: int = 2, counties: int = 6):
    """A small CountyData without ../shared: counties of 20 to 20,000 persons."""
    from censusdp.experiments.topdown_fidelity import CountyData
    from censusdp.hierarchy import Table

    schema = Schema.load("sex_age5")
    g = np.random.default_rng(seed)
    n = states * counties
    size = np.exp(g.uniform(np.log(20), np.log(20_000), n))
    cells = g.poisson(size[:, None] * g.dirichlet(np.full(36, 5.0), n))
    st = np.repeat([f"{10 + s:02d}" for s in range(states)], counties)
    fips = [
        f"{s}{c:03d}" for s, c in zip(st, np.tile(np.arange(1, counties + 1), states), strict=True)
    ]
    df = pd.DataFrame(cells, columns=list(schema.cells)).assign(state=st, fips=fips)
    table = Table.from_frame(df, [("state", "state"), ("county", "fips")], list(schema.cells))
    return CountyData(table, schema, {}, np.asarray(st))


def test_the_split_keeps_the_real_cells_as_exact_marginals():
    from censusdp.experiments.topdown_fidelity import (
        NATIONAL_HISPANIC_RACE,
        RACE_GROUPS,
        RACES,
        SPLIT_SHARES,
        national_shares,
        split_histogram,
        split_schema,
    )

    data = _synthetic_counties()
    rng = KeyedRNG.reproducible(3, warn=False)
    hist = split_histogram(data, rng.child("split"))
    schema = split_schema()
    assert schema.shape == (2, 18, 2, len(RACE_GROUPS)) and hist.schema is schema
    assert hist.truth.dtype == np.int64 and hist.truth.min() >= 0
    assert np.array_equal(hist.sex_age(hist.truth), data.truth)  # the real cells, exactly
    assert np.array_equal(hist.truth.sum(axis=1), data.truth.sum(axis=1))
    # seeded and deterministic; another key gives another split of the same cells
    again = split_histogram(data, rng.child("split"))
    assert np.array_equal(again.truth, hist.truth)
    other = split_histogram(data, rng.child("other"))
    assert not np.array_equal(other.truth, hist.truth)
    assert np.array_equal(other.sex_age(other.truth), data.truth)
    # the national 2010 shares (SF1 P5): 308,745,538 persons, 50,477,594 Hispanic
    assert NATIONAL_HISPANIC_RACE.sum() == 308_745_538
    assert NATIONAL_HISPANIC_RACE[1].sum() == 50_477_594
    assert sorted(r for g in RACE_GROUPS.values() for r in g) == sorted(RACES)
    p = national_shares()
    assert p.shape == (2, len(RACE_GROUPS)) and abs(p.sum() - 1) < 1e-12
    assert sum(SPLIT_SHARES.values()) == 1 and SPLIT_SHARES["total"] == SHARES["total"]
    # the strategy's queries exist in the split schema; the nation has no total
    plan = strategy(schema, RHO_BUREAU, SPLIT_SHARES)
    assert [q.name for lv, q, _ in plan if lv == "county"] == list(SPLIT_SHARES)
    assert "total" not in [q.name for lv, q, _ in plan if lv == "nation"]


def test_split_shares_scatter_around_the_national_ones():
    """Pooled over many persons the split's Hispanic × race shares are the national ones:
    each county's shares are a Dirichlet with that mean, so the person-weighted pooled share
    has a computable spread; α = 1e-6 and power against shares 30% off."""
    from scipy import stats

    from censusdp.experiments.topdown_fidelity import (
        SPLIT_CONCENTRATION,
        national_shares,
        split_histogram,
    )

    data = _synthetic_counties(seed=8, states=4, counties=50)
    hist = split_histogram(data, KeyedRNG.reproducible(9, warn=False).child("split"))
    n = data.truth.sum(axis=1).astype(float)
    x = hist.truth.reshape(n.size, 36, -1).sum(axis=1)  # (counties, 2 × races)
    p = national_shares().reshape(-1)
    # per county: Dirichlet-multinomial variance n p (1 - p) (n + κ) / (1 + κ)
    k = SPLIT_CONCENTRATION
    var = (n * (n + k) / (1 + k))[:, None] * p * (1 - p)
    z = (x.sum(axis=0) - n.sum() * p) / np.sqrt(var.sum(axis=0))
    crit = stats.norm.isf(1e-6 / 2 / p.size)
    assert np.all(np.abs(z) < crit), z
    # power: shares of White not Hispanic 30% lower are rejected
    wrong = p.copy()
    wrong[0] *= 0.7
    zw = (x[:, 0].sum() - n.sum() * wrong[0]) / np.sqrt(var[:, 0].sum())
    assert abs(zw) > crit


def test_split_release_through_the_study_loop():
    """One run of every estimator on the split of a small synthetic country: integer
    releases, TopDown-style and the non-negative product non-negative, state totals exact,
    counts of zero cells on the sex × age marginal and on the split's own cells."""
    from censusdp.experiments.topdown_fidelity import _run_rho, _tensors, split_histogram
    from censusdp.mechanisms.product_measure import product_invariant
    from censusdp.mechanisms.product_query import ProductQuery

    data = _synthetic_counties()
    rng = KeyedRNG.reproducible(4, warn=False)
    hist = split_histogram(data, rng.child("split"))
    tensors = _tensors(hist)
    total = ProductQuery.parse(hist.schema, "total")
    invs = [product_invariant(tensors, "state", total, level_names=hist.hierarchy.names)]
    names = ("topdown", "gls", "nonnegative")
    res, errors = _run_rho(hist, tensors, invs, RHO_BUREAU, 1, rng.child("rho"), names)
    for name in names:
        r = res[name]
        assert r["checks"]["integer"] and r["checks"]["state_totals_exact"], name
        assert r["states"] == 2 and errors[name].shape == (1, data.truth.shape[0])
        assert r["true_zero_cells"] == int((data.truth == 0).sum())
        assert r["histogram_cells"]["true_zero_cells"] == int((hist.truth == 0).sum())
        assert r["cpu_seconds_per_run"] > 0
    assert res["topdown"]["checks"]["non_negative"] and res["nonnegative"]["checks"]["non_negative"]
    # the state totals are invariant: errors cancel within each state
    st = hist.hierarchy.ancestor_index("county", "state")
    for name in names:
        assert np.array_equal(np.bincount(st, errors[name][0]), np.zeros(2))


def test_the_histogram_option_chooses_the_histograms(tmp_path):
    from censusdp.experiments.registry import ExperimentContext
    from censusdp.experiments.topdown_fidelity import OPTIONS, SPLIT_ORDERING, histograms

    data = _synthetic_counties()

    def names(**opts):
        ctx = ExperimentContext(
            out=tmp_path, options=opts, rng=KeyedRNG.reproducible(1, warn=False)
        )
        return [h.name for h in histograms(ctx, data)]

    assert OPTIONS["histogram"][0] == "sex_age" and names() == ["sex_age"]
    assert names(histogram="both") == ["sex_age", "split"] and names(histogram="split") == ["split"]
    # the split's production ordering isolates the total below the root, as the 36-cell one
    assert SPLIT_ORDERING["county"][0][0] == ("total",) == ORDERING["county"][0][0]
    assert SPLIT_ORDERING["county"][1] == (("total",), ("sex * age5",), ("detailed",))


def _by_rho(counts: dict[str, tuple[float, float]]) -> dict:
    row = {"histogram": "split", "factor": 1.0}
    for k, (neg, sig) in counts.items():
        row[k] = {"states": 48, "chance_upper_99": 2, "negative_mean": neg,
                  "significant_negative_001_mean": sig}  # fmt: skip
    return {"by_rho": [row], "reference_factor": 1.0, "estimators": list(counts)}


def test_the_pattern_verdicts_follow_the_counts() -> None:
    """The report's verdict against the Bureau's pattern comes from the measured counts:
    two thirds of the areas negative and significant ones above chance's 99% point."""
    text = _pattern_text(_by_rho({"topdown": (25.0, 0.3), "topdown_one": (35.8, 2.2),
                                  "gls": (22.7, 0.2)}))  # fmt: skip
    assert "TopDown-style 25.0 / 0.3: no clear majority" in text
    assert "one L2 pass 35.8 / 2.2: the Bureau's pattern" in text
    assert "Why production-pass TopDown-style differs" in text
    assert "reproduces the pattern here" in text
    text = _pattern_text(_by_rho({"topdown": (33.0, 2.5), "gls": (24.0, 2.0)}))
    assert "TopDown-style 33.0 / 2.5: the Bureau's pattern" in text
    assert "GLS + unbiased rounding 24.0 / 2.0: no clear majority" in text
    assert "Why" not in text
    text = _pattern_text(_by_rho({"topdown": (40.0, 1.0), "topdown_one": (31.0, 9.0)}))
    assert "40.0 / 1.0: a negative majority, significant ones within chance" in text
    assert "31.0 / 9.0: significant negatives above chance without" in text
    assert "does not reproduce it either" in text
