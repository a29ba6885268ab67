"""An experiment that needs a public file says where it comes from (issue 37, item 2).

A user who installed the wheel has no checkout beside it: a missing input is one exit-2 line
naming the file, its public source (IPUMS NHGIS, the Census Bureau, NYC TLC) and ``--data``,
never a folder beside the repository.
"""

from __future__ import annotations

import pytest

import censusdp.experiments.registry as registry
from censusdp.app.cli import main
from censusdp.experiments.registry import PUBLIC_SOURCES, available, experiment_info


def test_every_public_input_has_its_source():
    needed = {name for exp in available() for name in experiment_info(exp).data}
    assert needed and needed <= set(PUBLIC_SOURCES), needed - set(PUBLIC_SOURCES)


@pytest.mark.parametrize(
    "experiment, source",
    [("census-county-integer", "IPUMS NHGIS"), ("nyc-taxi", "Taxi & Limousine Commission")],
)
def test_a_missing_input_names_its_source_not_a_sibling_folder(
    experiment, source, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(registry, "shared_data_file", lambda name: None)  # a wheel install
    monkeypatch.chdir(tmp_path)
    assert main(["experiment", experiment, "--quick", "--out", "o"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and source in lines[0] and "--data PATH" in lines[0], lines
    assert "shared" not in lines[0] and "beside the repository" not in lines[0]
    assert not (tmp_path / "o").exists()
