"""``censusdp privatize`` on a PPMF with measured places (``[areas] share``): the places are
measured with their share of ρ and every level's GLS estimate is updated with them; the
statement is derived over both; places stay sums of blocks, invariants exact; the places'
standard errors shrink against the run that only sums blocks."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from censusdp.app.cli import main
from censusdp.pipelines.products.pl94_tables import pl94_codebook

pytestmark = pytest.mark.slow  # two privatize runs (about 9 CPU s each)

_spec = importlib.util.spec_from_file_location(
    "_ppmf_tests", Path(__file__).with_name("test_privatize_ppmf.py")
)
_t = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_t)  # the small PPMF, its public blocks and places

MEASURED = _t.SPEC.replace(
    "skip_blank = true\n", 'skip_blank = true\nshare = 0.1\nqueries = ["total"]\n'
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same PPMF and seed privatized with the places only summed, and measured."""
    tmp = tmp_path_factory.mktemp("ppmf_areas")
    data, spec = _t._ppmf(tmp)
    measured = tmp / "measured.toml"
    measured.write_text(MEASURED)
    out = {}
    for name, sp in (("summed", spec), ("measured", measured)):
        out[name] = tmp / name
        argv = ["privatize", str(data), "--spec", str(sp), "-o", str(out[name]), "--seed", "4"]
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(argv) == 0
    return data, out


def _table(out: Path, product: str, level: str) -> pd.DataFrame:
    return pd.read_csv(out / product / f"pl94_{level}.csv", dtype={"GEOID": str})


def test_measured_places_are_in_the_derived_statement(runs):
    """The statement is derived from the measurements: the places' spend is listed (0.1 of
    the spec's ρ = 2), the tree's allocation gets the rest (its discrete Gaussian σ² are
    rounded up onto a rational grid, so it spends slightly less than its 1.8), and the
    total is within the spec's ρ."""
    _, out = runs
    man = json.loads((out["measured"] / "manifest.json").read_text())
    notes = " ".join(man["privacy"]["notes"])
    assert "place/total discrete_gaussian ρ = 0.2 (Δ₂ = 1)" in notes
    summed = json.loads((out["summed"] / "manifest.json").read_text())
    assert 2.0 * (1 - 1e-3) <= man["privacy"]["rho"] <= 2.0
    assert man["privacy"]["rho"] == pytest.approx(0.9 * summed["privacy"]["rho"] + 0.2, rel=1e-3)
    assert man["spec"]["areas"]["share"] == "1/10"
    assert "measured" in (out["measured"] / "README.md").read_text()
    assert "place/total" not in " ".join(summed["privacy"]["notes"])


def test_measured_places_stay_sums_of_blocks_and_shrink_their_ses(runs):
    """Both products' places are sums of their blocks; the state totals are the input's
    (invariants ==); the places' total SEs shrink against the summed run. The written ``_se``
    adds to the exact GLS variance the replicate estimate of the rounding's (32 replicates,
    each run its own), so a place may move up by that estimate's noise: each within 5%, and the
    mean variance strictly down (the exact GLS shrink, place by place, is
    tests/estimation/test_area_measurements.py's)."""
    data, out = runs
    columns = list(pl94_codebook().columns)
    for product in ("unbiased", "nonnegative"):
        blocks = _table(out["measured"], product, "block")
        blocks = blocks.copy().assign(place=[_t._place(g) for g in blocks.GEOID])
        want = blocks[blocks.place != ""].groupby("place")[columns].sum()
        have = _table(out["measured"], product, "place").set_index("GEOID")[columns]
        assert np.array_equal(have.to_numpy(), want.loc[have.index].to_numpy())
        states = _table(out["measured"], product, "state").set_index("GEOID")["P1_001N"]
        truth = pd.read_csv(data, dtype=str).groupby("TABBLKST").size()
        assert states.to_dict() == truth.to_dict()
    se = {
        k: _table(v, "unbiased", "place").set_index("GEOID")["P1_001N_se"] for k, v in out.items()
    }
    assert np.all(se["measured"] <= 1.05 * se["summed"]), se
    assert (se["measured"] ** 2).mean() < (se["summed"] ** 2).mean(), se
    print("place P1_001N_se summed:", se["summed"].to_dict(), "measured:", se["measured"].to_dict())
