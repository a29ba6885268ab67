"""``privatize(df, spec) -> DataFrame`` (issue 37, build point 5): the command's numbers for
the same input, spec and seed, dtypes kept, the integer MOE beside every SE, the statement in
``attrs``; nothing left behind; a non-frame refused in one line."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from run_specs import SMALL_NHGIS, SMALL_NHGIS_SPEC

from censusdp.errors import DataError
from censusdp.pipelines.io.outputs import lattice_moe
from censusdp.pipelines.products.registry import PrivatizeOptions
from censusdp.pipelines.products.registry import privatize as privatize_path
from censusdp.prelude import privatize


def _frame() -> pd.DataFrame:
    return pd.read_csv(io.StringIO(SMALL_NHGIS), dtype={"gisjoin": str})


def test_a_frame_in_the_release_out(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(SMALL_NHGIS_SPEC)
    before = set(Path(tempfile.gettempdir()).glob("censusdp-privatize-*"))
    got = privatize(_frame(), spec, seed=3)
    assert set(Path(tempfile.gettempdir()).glob("censusdp-privatize-*")) == before
    # the command on the same file, spec and seed writes the same numbers
    _frame().to_csv(tmp_path / "in.csv", index=False)
    privatize_path(tmp_path / "in.csv", spec, tmp_path / "out.csv", PrivatizeOptions(seed=3))
    cli = pd.read_csv(tmp_path / "out.csv", dtype={"gisjoin": str})
    assert list(got.columns) == [
        "gisjoin", "name", "state", "H78003_dp", "H78003_se", "H78003_moe", "H78024_dp",
        "H78024_se", "H78024_moe",
    ]  # fmt: skip
    for c in ("gisjoin", "H78003_dp", "H78024_dp"):
        assert got[c].tolist() == cli[c].tolist()
    assert np.allclose(got["H78003_se"], cli["H78003_se"], rtol=1e-12, atol=0)
    assert got["H78003_dp"].dtype == np.int64 and got["H78003_moe"].dtype == np.int64
    assert np.array_equal(got["H78024_moe"], lattice_moe(got["H78024_se"].to_numpy()))
    assert "induced subspace differential privacy" in got.attrs["privacy"]
    assert got.attrs["censusdp"]["command"] == "privatize"


def test_not_a_frame_is_refused() -> None:
    with pytest.raises(DataError, match="expected a pandas DataFrame, got list"):
        privatize([1, 2], "spec.toml")
