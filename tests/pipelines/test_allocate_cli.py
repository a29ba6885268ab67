"""``censusdp allocate SPEC --target T -o NEW``: the new spec, the report, the refusals."""

from __future__ import annotations

import re

import pytest

from censusdp.app.cli import main
from censusdp.estimation.gls.allocate import evaluate_allocation
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.allocate import load_targets
from censusdp.pipelines.predict import load_predict_spec

SPEC = """
[predict]
schema = "pl94"
invariants = { nation = ["total"], state = ["total"] }

[hierarchy]
synthetic = "state"
blocks = 300
seed = 2
"""

TARGETS = """
[objective]
kind = "sum"
tolerance = 0.01

[population]
tract = 4000
block_group = 1500

[[target]]
level = "block_group"
table = "hispanic * cenrace"

[[target]]
level = "tract"
table = "adult"
share = 0.78
weight = 2
"""


@pytest.fixture
def files(tmp_path):
    spec, targets = tmp_path / "spec.toml", tmp_path / "targets.toml"
    spec.write_text(SPEC, encoding="utf-8")
    targets.write_text(TARGETS, encoding="utf-8")
    return tmp_path, spec, targets


def test_allocate_writes_a_spec_that_predicts_the_reported_objective(files, capsys):
    tmp, spec, targets = files
    out = tmp / "new.toml"
    assert main(["allocate", str(spec), "--target", str(targets), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "production" in text and "certified" in text and "block_group: hispanic" in text
    new = load_predict_spec(out)
    old = load_predict_spec(spec)
    assert new.allocation.rho == old.allocation.rho  # the same ρ, exactly
    assert new.allocation != old.allocation and new.invariants == old.invariants
    objective = load_targets(targets, old).objective
    inv = [(lvl, ProductQuery.parse(old.schema, t)) for lvl, t in old.invariants]
    before = evaluate_allocation(old.hierarchy, old.schema, old.allocation, objective, inv)[0]
    after = evaluate_allocation(new.hierarchy, new.schema, new.allocation, objective, inv)[0]
    assert after < 0.85 * before
    assert f"{after:.6g}" in text and f"{before:.6g}" in text
    assert (tmp / "new.toml.censusdp.json").is_file()  # ownership sidecar
    # the output policy: never the input, no silent replacement
    assert main(["allocate", str(spec), "--target", str(targets), "-o", str(spec)]) == 2
    assert main(["allocate", str(spec), "--target", str(targets), "-o", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("[objective]", "[objective]\nspeed = 3"), r"unknown key 'objective.speed'"),
        (
            ('kind = "sum"', 'kind = "mean"'),
            r"objective.kind: 'mean' is not one of \['sum', 'max'\]",
        ),
        (
            ("[population]", "[populations]"),
            r"unknown key 'populations'; did you mean 'population'\?",
        ),
        (("tract = 4000", "tracts = 4000"), "population.tracts: unknown level"),
        (('level = "tract"', 'level = "place"'), r"target\[1\].level: unknown level 'place'"),
        (('table = "adult"', 'table = "adults"'), r"target\[1\].table: .*strategy tables are"),
        (("share = 0.78", "share = 0.78\ncolour = 1"), r"unknown key 'target\[1\].colour'"),
        (("weight = 2", "weight = -2"), r"target\[1\].weight: must be positive"),
        (("tract = 4000\n", ""), r"target\[1\]: no \[population\] entry for level 'tract'"),
        (("tolerance = 0.01", "tolerance = 2"), r"objective.tolerance: must be in \(0, 1\)"),
    ],
)
def test_targets_file_errors_exit_2_naming_the_key(files, capsys, edit, message):
    tmp, spec, targets = files
    targets.write_text(TARGETS.replace(*edit), encoding="utf-8")
    out = tmp / "new.toml"
    assert main(["allocate", str(spec), "--target", str(targets), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("censusdp: error:") and str(targets) in err
    assert re.search(message, err), err
    assert not out.exists()
