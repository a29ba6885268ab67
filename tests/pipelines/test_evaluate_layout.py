"""``--evaluate`` keeps the confidential comparison apart from the release, as ``run`` does:
``OUT/release/`` (what may be published) beside ``OUT/evaluation/`` (never inside it).

The PPMF persons route is checked in ``test_privatize_ppmf.py`` (its module fixture runs
with ``--evaluate``); here the units route end to end and the layout helper itself."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest

from censusdp.app.cli import main
from censusdp.errors import SpecError
from censusdp.pipelines.runner import EVALUATION_DIR, RELEASE_DIR, separate_evaluation

_spec = importlib.util.spec_from_file_location(
    "_units_tests", Path(__file__).with_name("test_units_h1.py")
)
_u = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_u)  # units_frame, write


def test_separate_evaluation_moves_everything_else_into_release(tmp_path):
    out = tmp_path / "tmp"
    (out / "unbiased").mkdir(parents=True)
    (out / "unbiased" / "t.csv").write_text("a\n")
    (out / "manifest.json").write_text("{}")
    (out / EVALUATION_DIR).mkdir()
    (out / EVALUATION_DIR / "size_classes.md").write_text("x")
    release = separate_evaluation(out)
    assert release == out / RELEASE_DIR
    assert sorted(p.name for p in out.iterdir()) == [EVALUATION_DIR, RELEASE_DIR]
    assert sorted(p.name for p in release.iterdir()) == ["manifest.json", "unbiased"]
    assert (release / "unbiased" / "t.csv").read_text() == "a\n"
    assert sorted(p.name for p in (out / EVALUATION_DIR).iterdir()) == [
        "CONFIDENTIAL.txt",
        "size_classes.md",
    ]
    with pytest.raises(SpecError, match="release/ already"):
        separate_evaluation(out)


def test_units_route_with_evaluate_keeps_the_evaluation_beside_the_release(tmp_path):
    units = _u.write(_u.units_frame(np.random.default_rng(16), 300, 5), tmp_path / "units.csv")
    out = tmp_path / "h1"
    argv = ["privatize", str(units), "-o", str(out), "--blocks-from-data", "--seed", "2"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([*argv, "--repetitions", "2", "--evaluate"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "censusdp-output.json",
        EVALUATION_DIR,
        RELEASE_DIR,
    ]
    release = out / RELEASE_DIR
    assert (release / "h1_block.csv").is_file() and (release / "size_classes.md").is_file()
    assert not (release / EVALUATION_DIR).exists()
    assert "CONFIDENTIAL" not in (release / "size_classes.md").read_text()
    assert "CONFIDENTIAL" in (out / EVALUATION_DIR / "size_classes.md").read_text()
    manifest = json.loads((release / "manifest.json").read_text())
    assert "../evaluation/" in json.dumps(manifest)
    text = printed.getvalue()
    assert f"wrote {out}/release/" in text and f"wrote {out}/evaluation/ (CONFIDENTIAL" in text
    # without --evaluate the output is the release itself, as before
    plain = tmp_path / "plain"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*argv[:3], str(plain), *argv[4:], "--repetitions", "2"]) == 0
    assert (plain / "h1_block.csv").is_file() and not (plain / RELEASE_DIR).exists()
