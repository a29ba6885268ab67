"""Issue 37 outputs: integer releases have an integer ``value``; the ``run`` route's
``estimates.parquet`` carries ``moe`` beside ``se`` (the integer lattice margin for an
integer release, ``1.645 · se`` for a real-valued one, empty without an SE) and ``se`` to six
significant digits (:func:`~censusdp.pipelines.runner.release_frame`)."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import pytest

from censusdp.budget import PrivacyStatement
from censusdp.estimation.release import Release
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.synthetic import synthetic_us
from censusdp.pipelines.io.outputs import lattice_moe, real_moe, significant
from censusdp.pipelines.runner import release_frame, run_spec
from censusdp.pipelines.specs import load_spec


def _release(integer: bool, variances: bool = True, estimator: str = "gls") -> Release:
    h = Hierarchy.from_parents(
        ["root", "leaf"], [np.array(["r"]), np.array(["a", "b", "c"])],
        [np.zeros(1, np.int64), np.zeros(3, np.int64)],
    )  # fmt: skip
    leaf = np.array([[3.0, 1.0], [0.0, 7.0], [2.0, 5.0]])
    est = [leaf.sum(axis=0, keepdims=True), leaf]
    if not integer:
        est = [e + 0.25 for e in est]
    var = [np.full(e.shape, 0.123456789) for e in est]
    var[0][0, 0] = 0.0  # a held figure
    return Release(
        estimator, h, ("x", "y"),
        [e.astype(np.int64) if integer else e for e in est],
        var if variances else None, PrivacyStatement("zcdp", rho=0.5), integer=integer,
    )  # fmt: skip


@pytest.mark.parametrize("integer", [True, False])
def test_to_frame_value_dtype_follows_the_release(integer: bool) -> None:
    f = _release(integer).to_frame()
    assert f["value"].dtype == (np.int64 if integer else np.float64)
    want = np.array([5, 13, 3, 1, 0, 7, 2, 5]) + (0 if integer else 0.25)
    assert np.array_equal(f["value"].to_numpy(), want)
    assert f["se"].dtype == np.float64 and np.isfinite(f["se"]).all()


def test_release_frame_adds_moe_and_six_digit_se() -> None:
    rels = {"gls": _release(True), "topdown": _release(True, variances=False, estimator="topdown")}
    f = release_frame(rels)
    assert f["value"].dtype == np.int64  # every release integer
    assert list(f.columns) == ["level", "code", "cell", "estimator", "value", "se", "moe"]
    g = f[f.estimator == "gls"]
    full = rels["gls"].to_frame()["se"].to_numpy()
    assert np.array_equal(g["se"].to_numpy(), significant(full))
    assert g["se"].iloc[1] == 0.351364 and repr(float(g["se"].iloc[1])) == "0.351364"
    assert np.array_equal(g["moe"].to_numpy(), lattice_moe(full))  # integers on the lattice
    assert g["moe"].iloc[0] == 0 and g["se"].iloc[0] == 0  # a zero SE: a zero margin
    t = f[f.estimator == "topdown"]
    assert t["se"].isna().all() and t["moe"].isna().all()  # no SE, no margin
    mixed = release_frame({"int": _release(True), "real": _release(False, estimator="real")})
    assert mixed["value"].dtype == np.float64  # one column, one dtype
    r = mixed[mixed.estimator == "real"]
    assert np.array_equal(r["moe"].to_numpy(), real_moe(_release(False).to_frame()["se"]))
    i = mixed[mixed.estimator == "int"]
    assert np.array_equal(i["value"].to_numpy(), np.round(i["value"].to_numpy()))


SPEC = """
[data]
source = "csv"
path = "{path}"
cells = ["population"]
[hierarchy]
levels = ["nation", "state", "county", "block"]
codes = {{ state = "block:2", county = "block:5", block = "block" }}
[privacy]
accounting = "zcdp"
rho = 0.5
level_shares = {{ county = 0.5, block = 0.5 }}
[queries]
county = ["detailed"]
block = ["detailed"]
[invariants]
state = "total"
[mechanism]
noise = "discrete_gaussian"
[estimators]
run = ["gls"]
integer = "round"
[run]
repetitions = 1
seed = 3
"""


def test_the_run_route_writes_integer_values_moe_and_six_digit_se(tmp_path) -> None:
    table = synthetic_us(2, states=2, counties=4, tracts=8, blocks=24, population=2_000)
    csv = tmp_path / "blocks.csv"
    pd.DataFrame(
        {
            "block": table.hierarchy.leaves.codes.astype(object),
            "population": table.leaf_counts[:, 0],
        }
    ).to_csv(csv, index=False)
    spec = tmp_path / "spec.toml"
    spec.write_text(textwrap.dedent(SPEC.format(path=csv)))
    res = run_spec(load_spec(spec), out=tmp_path / "out", progress=False)
    est = pd.read_parquet(tmp_path / "out" / "release" / "estimates.parquet")
    assert est["value"].dtype == np.int64 and est["moe"].dtype == np.float64
    full = res.releases["gls"].to_frame()
    assert np.array_equal(est["value"].to_numpy(), full["value"].to_numpy())
    assert np.array_equal(est["se"].to_numpy(), significant(full["se"].to_numpy()))
    assert np.array_equal(est["moe"].to_numpy(), lattice_moe(full["se"].to_numpy()))
    assert all(float(f"{x:.6g}") == x for x in est["se"])  # six significant digits
    assert "moe" in (tmp_path / "out" / "release" / "privacy.md").read_text()
