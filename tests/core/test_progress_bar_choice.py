"""Which tqdm class draws censusdp's bars (:func:`censusdp.progress.tqdm_class`), issue 37.

``tqdm.auto`` in a Jupyter kernel without ``ipywidgets`` picks the widget class all the same
and warns ``TqdmWarning: IProgress not found`` when imported: that was the first output of a
notebook importing the prelude. The choice is checked here with a stand-in kernel (an
``IPython`` module whose shell has an ``IPKernelApp`` configuration) and a stand-in for the
presence of ``ipywidgets``; tests/test_notebooks.py checks it in a real kernel (no warning in
any committed or executed output).
"""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings

import pytest
from tqdm.notebook import tqdm as notebook_tqdm
from tqdm.std import tqdm as std_tqdm

import censusdp.progress as progress


def _fake_ipython(config: dict) -> types.ModuleType:
    shell = types.SimpleNamespace(config=config)
    module = types.ModuleType("IPython")
    module.get_ipython = lambda: shell  # type: ignore[attr-defined]
    return module


@pytest.fixture
def widgets(monkeypatch):
    """Set whether ``ipywidgets`` is importable (by :func:`importlib.util.find_spec`)."""
    real = importlib.util.find_spec

    def set_present(present: bool) -> None:
        def find_spec(name, *args, **kwargs):
            if name == "ipywidgets":
                return object() if present else None
            return real(name, *args, **kwargs)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    return set_present


@pytest.mark.parametrize(
    ("kernel", "has_widgets", "expected"),
    [
        (None, True, std_tqdm),  # a script or terminal: text, whatever is installed
        ({}, True, std_tqdm),  # a terminal IPython (no kernel): text
        ({"IPKernelApp": {}}, False, std_tqdm),  # a kernel without ipywidgets: text, no warning
        ({"IPKernelApp": {}}, True, notebook_tqdm),  # a kernel with ipywidgets: the widget
    ],
)
def test_the_bar_class_follows_the_kernel_and_ipywidgets(
    kernel, has_widgets, expected, widgets, monkeypatch
):
    if kernel is None:
        monkeypatch.delitem(sys.modules, "IPython", raising=False)
    else:
        monkeypatch.setitem(sys.modules, "IPython", _fake_ipython(kernel))
    widgets(has_widgets)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a TqdmWarning would fail here
        assert progress.tqdm_class() is expected


def test_a_kernel_without_widgets_draws_a_text_bar_without_warning(widgets, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "IPython", _fake_ipython({"IPKernelApp": {}}))
    widgets(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with progress.progress_bar(3, "censusdp test", "step", default=True) as bar:
            bar.update(3)
    err = capsys.readouterr().err
    assert "censusdp test: 100%" in err and "3/3" in err and "Warning" not in err


def test_a_broken_ipython_is_not_taken_for_a_kernel(widgets, monkeypatch):
    module = types.ModuleType("IPython")

    def broken():
        raise RuntimeError("half-initialised")

    module.get_ipython = broken  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", module)
    widgets(True)
    assert progress.tqdm_class() is std_tqdm
