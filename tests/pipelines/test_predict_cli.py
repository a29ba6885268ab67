"""``censusdp predict SPEC``: outputs, output policy and refusals (no counts are read)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from censusdp.app.cli import main
from censusdp.errors import SpecError
from censusdp.hierarchy.storage import save_hierarchy
from censusdp.hierarchy.synthetic import synthetic_state
from censusdp.pipelines.predict import load_predict_spec, predict_spec

SPEC = """
[predict]
schema = "pl94"
invariants = {{ nation = ["total"], state = ["total"] }}
tables = ["total", "hhgq", "votingage * hispanic", "detailed"]

[hierarchy]
{hierarchy}
"""


def _spec(tmp_path, hierarchy='synthetic = "state"\nblocks = 300\nseed = 2', name="spec.toml"):
    p = tmp_path / name
    p.write_text(SPEC.format(hierarchy=hierarchy), encoding="utf-8")
    return p


def test_predict_writes_summary_json_and_figure(tmp_path, capsys):
    spec = _spec(tmp_path)
    out = tmp_path / "pred"
    assert main(["predict", str(spec), "--out", str(out)]) == 0
    assert "no counts were read" in capsys.readouterr().out
    files = sorted(p.name for p in out.iterdir())
    assert files == ["censusdp-output.json", "se_by_level.png", "summary.csv", "summary.json"]
    manifest = json.loads((out / "censusdp-output.json").read_text())
    assert set(manifest["files"]) == {"se_by_level.png", "summary.csv", "summary.json"}
    csv = pd.read_csv(out / "summary.csv")
    pred, summary = predict_spec(load_predict_spec(spec))
    assert len(csv) == len(summary) == 6 * (1 + 8 + 4 + 2016)
    np.testing.assert_allclose(csv.se_max.to_numpy(), summary.se_max.to_numpy(), rtol=1e-12)
    held = csv[(csv.level.isin(["nation", "state"])) & (csv.table == "total")]
    assert (held.se_max == 0).all()
    info = json.loads((out / "summary.json").read_text())
    assert info["rho"] == "293764/114921" and info["nodes"]["block"] == 300
    assert len(info["plan"]) == 65 and "induced subspace" in info["privacy"]
    # the output policy: refused without --overwrite (exit 2), replaced with it
    assert main(["predict", str(spec), "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["predict", str(spec), "--out", str(out), "--overwrite"]) == 0


def test_predict_from_a_saved_public_geography(tmp_path):
    """A saved hierarchy (shape only) gives the same prediction as the synthetic spec."""
    h = synthetic_state(2, blocks=300).hierarchy
    save_hierarchy(h, tmp_path / "geo.npz")
    a = predict_spec(load_predict_spec(_spec(tmp_path)))[1]
    b = predict_spec(load_predict_spec(_spec(tmp_path, 'file = "geo.npz"', "b.toml")))[1]
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize(
    ("hierarchy", "message"),
    [
        ('synthetic = "moon"', "not 'state' or 'us'"),
        ('file = "missing.npz"', "no such file"),
        ('synthetic = "state"\nfile = "x.npz"', "either file"),
        ('synthetic = "state"\nblocks = "many"', "hierarchy.blocks: must be an integer"),
    ],
)
def test_bad_hierarchies_name_the_key(tmp_path, hierarchy, message):
    with pytest.raises(SpecError, match=message):
        load_predict_spec(_spec(tmp_path, hierarchy))


def test_bad_specs_exit_2(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text('[predict]\nschema = "pl94"\ninvariants = { county9 = ["total"] }\n'
                    '[hierarchy]\nsynthetic = "state"\nblocks = 50\n', encoding="utf-8")  # fmt: skip
    assert main(["predict", str(spec), "--out", str(tmp_path / "o")]) == 2
    assert "unknown level 'county9'" in capsys.readouterr().err
    spec.write_text('[predict]\nschema = "sex_age5"\n[hierarchy]\nsynthetic = "state"\n')
    assert main(["predict", str(spec), "--out", str(tmp_path / "o")]) == 2
    assert "no allocation" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
