"""The experiments' report builder: header from INFO, tables through markdown_table with
per-column formats, dict / sequence / DataFrame rows, quick-run note, figures and privacy."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from censusdp.budget import statement_for
from censusdp.errors import SpecError
from censusdp.experiments.registry import ExperimentContext, experiment_info
from censusdp.experiments.reporting import Report, pyplot
from censusdp.mechanisms.discrete import DiscreteGaussian

QUICK_NOTE = "*Quick run (`--quick`)"


def _ctx(quick: bool) -> ExperimentContext:
    return ExperimentContext(out=Path("."), quick=quick)


def test_header_title_summary_and_quick_note():
    full = str(Report("blowfish-ranges", _ctx(False)))
    assert full.splitlines()[0] == "# blowfish-ranges"
    assert QUICK_NOTE not in full
    quick = str(Report("blowfish-ranges", _ctx(True), title="Ranges", summary=True))
    lines = quick.splitlines()
    assert lines[0] == "# Ranges"
    assert lines[2] == experiment_info("blowfish-ranges").reproduces
    assert lines[4].startswith(QUICK_NOTE)
    # no context: no note either
    assert QUICK_NOTE not in str(Report("blowfish-ranges"))


def test_unknown_experiment_is_a_spec_error():
    with pytest.raises(SpecError, match="unknown experiment"):
        Report("no-such-experiment")


def test_table_per_column_formats_from_dicts():
    rows = [
        {"name": "a", "n": 12345, "x": 0.123456, "y": -1.5, "ok": True},
        {"name": "b", "n": 7, "x": 2.0, "y": 0.25, "ok": False},
    ]
    text = str(
        Report("wifi-spatiotemporal").table(rows, formats={"n": ",", "x": ".2f", "y": "+.1f"})
    )
    assert "| name | n | x | y | ok |\n|---|---|---|---|---|\n" in text
    assert "| a | 12,345 | 0.12 | -1.5 | True |" in text
    assert "| b | 7 | 2.00 | +0.2 | False |" in text  # format(0.25, "+.1f") rounds half to even


def test_table_from_sequences_with_columns_and_default_format():
    text = str(
        Report("wifi-spatiotemporal").table([["a", 1, 1 / 3], ["b", 2, 12345.678]], ["k", "i", "v"])
    )
    # columns without a format: floats ".3g", integers and strings as str()
    assert "| a | 1 | 0.333 |" in text
    assert "| b | 2 | 1.23e+04 |" in text
    # one format for every float column
    text = str(Report("wifi-spatiotemporal").table([["a", 1, 1 / 3]], ["k", "i", "v"], ".1f"))
    assert "| a | 1 | 0.3 |" in text


def test_table_repeated_column_names_and_column_selection():
    # repeated names (e.g. a "paper" column beside each computed one) share their format
    text = str(
        Report("matrix-masking").table(
            [[1.0, 1.25, 2.0, 2.5]], ["x", "paper", "y", "paper"], {"paper": ""}
        )
    )
    assert "| x | paper | y | paper |" in text
    assert "| 1 | 1.25 | 2 | 2.5 |" in text
    df = pd.DataFrame({"a": [1, 2], "b": [0.5, 0.25], "c": ["u", "v"]})
    text = str(Report("matrix-masking").table(df, ["c", "b"], {"b": ".2f"}))
    assert "| c | b |\n|---|---|\n| u | 0.50 |\n| v | 0.25 |" in text
    rows = [{"a": 1, "b": 2, "c": 3}]
    assert "| c | a |\n|---|---|\n| 3 | 1 |" in str(
        Report("matrix-masking").table(rows, ["c", "a"])
    )


def test_sections_text_bullets_in_order():
    text = str(
        Report("wifi-spatiotemporal")
        .section("One")
        .text("first paragraph", "second paragraph")
        .section("Two", level=3)
        .bullets(["x", "y"])
    )
    assert text == (
        "# wifi-spatiotemporal\n\n## One\n\nfirst paragraph\n\nsecond paragraph\n\n"
        "### Two\n\n* x\n* y\n"
    )


def test_figures_privacy_and_reference_lines():
    st = statement_for("zcdp", DiscreteGaussian(20).privacy(1.0))
    text = str(
        Report("topdown-small-area")
        .figures({"a.png": "what a shows", "b.png": ""})
        .figures({"c.png": ""})
        .privacy(st)
        .privacy("a stated sentence.")
        .reference()
        .reference("Someone (2020).")
    )
    lines = [line for line in text.splitlines() if line]
    assert lines[1] == "Figures: `a.png` (what a shows); `b.png`."
    assert lines[2] == "Figure: `c.png`."
    assert lines[3] == f"Privacy: {st.text()}"
    assert lines[4] == "Privacy: a stated sentence."
    assert lines[5] == f"Reference: {experiment_info('topdown-small-area').paper}"
    assert lines[6] == "Reference: Someone (2020)."


def test_written_through_the_context(tmp_path):
    ctx = ExperimentContext(out=tmp_path, quick=True)
    path = ctx.write_report(Report("wifi-spatiotemporal", ctx).text("body"))
    assert path.read_text(encoding="utf-8") == str(Report("wifi-spatiotemporal", ctx).text("body"))


def test_pyplot_draws_to_files(tmp_path):
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = ExperimentContext(out=tmp_path).savefig(fig, "x.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.get_fignums()  # savefig closed it
