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
        options={"topdown-passes": "both"},
    )  # fmt: skip
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["runs"] == 2 and len(on_disk["by_rho"]) == 1
    assert on_disk["estimators"] == list(ESTIMATORS) == [
        "topdown", "topdown_one", "gls", "nonnegative"
    ]  # fmt: skip
    assert on_disk["options"] == {"topdown-passes": "both", "rho": "range"}
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
    from censusdp.estimation.topdown_schema import topdown_schema
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
    rel = topdown_schema(h, schema, meas, invs, ordering=ORDERING)
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
