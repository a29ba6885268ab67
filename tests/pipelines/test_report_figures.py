"""The evaluation's figures as a statistician would publish them (issue 37, item 4).

Linear value axes where the values are close (a log axis only when they span more than a
decade), levels held exactly by an invariant drawn and labelled "exact", errors by size
class one panel per metric, and an SVG beside every PNG.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from censusdp.pipelines.report import (  # noqa: E402
    EXACT_LABEL,
    SIZE_METRICS,
    axis_scale,
    plot_errors_by_level,
    write_figures,
)

SVG = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize(
    "values, scale",
    [
        ([57.0, 60.0], "linear"),  # the bars: 4% apart, drawn several-fold on a log axis
        ([0.0, 0.0, 57.0, 60.0], "linear"),  # exact levels do not stretch the span
        ([1.0, 10.0], "linear"),  # exactly one decade: not more than one
        ([1.0, 10.000001], "log"),
        ([0.0, 0.3, 2.0, 40.0], "log"),
        ([-1.0, 0.5, 100.0], "linear"),  # a signed error never goes on a log axis
        ([np.nan, 3.0, np.inf, 400.0], "log"),  # non-finite values are not drawn
        ([5.0], "linear"),
        ([0.0, 0.0], "linear"),
        ([], "linear"),
    ],
)
def test_axis_scale_is_log_only_beyond_one_decade(values, scale):
    assert axis_scale(values) == scale


def test_axis_scale_equals_the_obvious_rule_on_random_values():
    """Reference: log ⇔ no negative value and max/min of the positive finite values > 10."""
    rng = np.random.default_rng(4)
    for _ in range(500):
        v = rng.choice([0.0, -1.0, 1.0], size=6, p=[0.2, 0.05, 0.75]) * 10 ** rng.uniform(
            -2, 3, size=6
        )
        pos = v[v > 0]
        want = "log" if (v >= 0).all() and pos.size and pos.max() / pos.min() > 10 else "linear"
        assert axis_scale(v) == want, v


def _level_table(values: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame(values, index=["nation", "state", "county", "tract"])


def test_close_errors_get_a_linear_axis_from_zero_and_exact_levels_are_labelled():
    mean = _level_table({"gls": [0.0, 0.0, 57.0, 60.0], "topdown": [0.0, 0.0, 58.0, 59.5]})
    fig, ax = plt.subplots()
    try:
        assert plot_errors_by_level(ax, mean) == "linear"
        assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
        labels = [t.get_text() for t in ax.texts]
        assert labels.count(EXACT_LABEL) == 4  # nation and state, for both estimators
        assert len(ax.patches) == 4  # the measured levels' bars
    finally:
        plt.close(fig)
    spread = _level_table({"gls": [0.0, 0.5, 3.0, 60.0]})
    fig, ax = plt.subplots()
    try:
        assert plot_errors_by_level(ax, spread) == "log" and ax.get_yscale() == "log"
        assert [t.get_text() for t in ax.texts].count(EXACT_LABEL) == 1
    finally:
        plt.close(fig)


def _svg_texts(path) -> list[str]:
    root = ET.parse(path).getroot()  # parses: a well-formed SVG document
    assert root.tag == f"{SVG}svg"
    return ["".join(t.itertext()).strip() for t in root.iter(f"{SVG}text")]


def test_write_figures_writes_svg_beside_png_with_exact_levels_and_size_panels(tmp_path):
    levels = ["nation", "state", "county", "tract"]
    rmse = {"nation": 0.0, "state": 0.0, "county": 57.0, "tract": 60.0}
    metrics = pd.DataFrame(
        [
            {"repetition": r, "estimator": e, "level": lv, "total_rmse": rmse[lv]}
            for r in range(2)
            for e in ("gls", "topdown")
            for lv in levels
        ]
    )
    sizes = pd.DataFrame(
        {
            "estimator": np.repeat(["gls", "topdown"], 3),
            "size_class": ["0", "1–9", "10–99"] * 2,
            "leaves": 5,
            "mae": [1.0, 2.0, 3.0, 1.5, 2.5, 3.5],
            "rmse": [1.2, 2.2, 3.2, 1.7, 2.7, 3.7],
            "mean_error": [0.5, 0.0, -0.5, 0.7, 0.1, -0.9],
            "mape": [np.nan, 40.0, 10.0, np.nan, 45.0, 12.0],
        }
    )
    manifest = {"data": {"levels": levels}}
    empty = pd.DataFrame()
    names = write_figures(tmp_path, metrics, empty, manifest, sizes=sizes)
    assert names == ["errors_by_level.png", "errors_by_size.png"]
    for name in names:
        png, svg = tmp_path / name, tmp_path / name.replace(".png", ".svg")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and svg.is_file()
    texts = _svg_texts(tmp_path / "errors_by_level.svg")
    assert texts.count(EXACT_LABEL) == 4 and "57" in texts and "60" in texts
    size_texts = _svg_texts(tmp_path / "errors_by_size.svg")
    for _, label in SIZE_METRICS:
        assert label in size_texts  # one panel per metric
    assert {"0", "1–9", "10–99"} <= set(size_texts)
