"""Another package's experiment through the ``censusdp.experiments`` entry point: listed,
described and run like a shipped one (a hand-made distribution on ``sys.path``)."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import pytest

from censusdp.errors import SpecError
from censusdp.experiments.registry import (
    available,
    experiment_info,
    plugin_experiments,
    run_experiment,
)

TOY = """
from censusdp.experiments.registry import ExperimentInfo

INFO = ExperimentInfo(
    reproduces="A toy study of another package: the sum of 1 to n.",
    paper="",
    data=(),
    full_run="0.1 s",
)
OPTIONS = {"n": ("4", "10")}


def run(ctx):
    n = int(ctx.options["n"])
    ctx.write_report(f"# toy\\n\\nsum = {n * (n + 1) // 2}\\n")
    return {"sum": sum(range(1, n + 1))}
"""


def _distribution(site, entry: str) -> None:
    (site / "toy_censusdp_study.py").write_text(textwrap.dedent(TOY))
    info = site / "toy_censusdp_study-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: toy_censusdp_study\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(f"[censusdp.experiments]\n{entry}\n")
    importlib.invalidate_caches()


@pytest.fixture
def site(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    yield site
    importlib.invalidate_caches()
    sys.modules.pop("toy_censusdp_study", None)


def test_an_experiment_of_another_package_is_listed_described_and_run(site, tmp_path):
    assert "toy-sum" not in available()
    _distribution(site, "toy-sum = toy_censusdp_study")
    assert plugin_experiments() == {"toy-sum": "toy_censusdp_study"}
    assert "toy-sum" in available() and "laplace-conditioning" in available()
    assert experiment_info("toy-sum").reproduces.startswith("A toy study")
    out, metrics = run_experiment("toy-sum", tmp_path / "out", seed=1, options={"n": "10"})
    assert metrics["sum"] == 55
    assert json.loads((out / "metrics.json").read_text())["sum"] == 55
    assert "sum = 55" in (out / "report.md").read_text()


def test_a_plug_in_taking_a_shipped_name_is_refused_by_name(site):
    _distribution(site, "laplace-conditioning = toy_censusdp_study")
    with pytest.raises(SpecError, match="'laplace-conditioning'.*toy_censusdp_study 0.1.*rename"):
        available()
