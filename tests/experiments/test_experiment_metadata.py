"""Experiments declare their metadata once; ``--list`` and the docs' table are made from it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from censusdp.app.cli import main
from censusdp.errors import SpecError
from censusdp.experiments.registry import (
    ExperimentInfo,
    available,
    experiment_info,
    readme_table,
)

ROOT = Path(__file__).resolve().parents[2]


def test_every_experiment_declares_its_metadata():
    names = available()
    assert len(names) >= 11
    for name in names:
        info = experiment_info(name)
        assert isinstance(info, ExperimentInfo)
        assert info.reproduces and info.full_run, name


def test_the_docs_table_is_the_one_made_from_the_metadata():
    """The site's experiments page (docs/gen/experiments_page.py, generated at build) holds
    the table made from INFO, one row per experiment."""
    spec = importlib.util.spec_from_file_location(
        "experiments_page", ROOT / "docs" / "gen" / "experiments_page.py"
    )
    page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(page)
    text = page.experiments_markdown()
    assert readme_table() in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert len(rows) == len(available())


def test_list_prints_every_experiment_with_its_run_time(capsys):
    assert main(["experiment", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == available()
    assert experiment_info("nyc-taxi").full_run in next(ln for ln in out if ln.startswith("nyc"))


def test_unknown_experiment_names_are_errors_listing_the_known_ones(capsys):
    with pytest.raises(SpecError, match="available: .*blowfish-ranges"):
        experiment_info("no-such-study")
    assert main(["experiment", "no-such-study"]) == 2
    assert "unknown experiment 'no-such-study'" in capsys.readouterr().err
