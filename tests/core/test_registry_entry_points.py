"""Registries list other packages' plug-ins from entry points, loaded on the first lookup.

A distribution is made by hand on ``sys.path`` (a module and its ``*.dist-info`` with
``entry_points.txt``: what an installer writes), so ``importlib.metadata`` finds it as it
finds an installed package; the registries under test are throwaway ones with their own
group, so the real registries are untouched.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from censusdp.errors import SpecError
from censusdp.registry import Registry


def _distribution(site: Path, name: str, module: str, source: str, entry_points: str) -> None:
    """``module.py`` and ``name-0.1.dist-info`` (METADATA, entry_points.txt) in ``site``."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    importlib.invalidate_caches()
    for mod in [m for m in sys.modules if m.startswith("toy_things")]:
        del sys.modules[mod]


def test_plug_ins_are_loaded_on_the_first_lookup_and_only_then(site):
    _distribution(
        site,
        "toy_things",
        "toy_things_a",
        """
        LOADED = True
        def square(x):
            return x * x
        """,
        "[censusdp.test_things]\nsquare = toy_things_a:square\n",
    )
    importlib.invalidate_caches()
    things: Registry = Registry("thing", entry_points="censusdp.test_things")
    things.add("identity", lambda x: x)  # adding looks nothing up
    assert "toy_things_a" not in sys.modules
    assert things.get("square")(3) == 9  # the first lookup loads the group
    assert "toy_things_a" in sys.modules
    assert things.names() == ("identity", "square")
    assert things.plugins == {"square": "toy_things 0.1"}
    plain: Registry = Registry("thing")  # no group: never reads entry points
    assert "square" not in plain and plain.names() == ()


def test_a_registering_callback_sees_what_the_entry_point_names(site):
    _distribution(
        site,
        "toy_things",
        "toy_things_b",
        "class Cube:\n    name = 'cube'\n",
        "[censusdp.test_things_b]\ncube = toy_things_b:Cube\n",
    )
    importlib.invalidate_caches()
    seen = []
    things: Registry = Registry(
        "thing",
        entry_points="censusdp.test_things_b",
        register=lambda name, obj: (seen.append((name, obj.__name__)), things.add(obj.name, obj)),
    )
    assert "cube" in things and seen == [("cube", "Cube")]


@pytest.mark.parametrize(
    "entry, source, words",
    [
        ("bad = toy_things_missing:f", "", ["failed to load (ModuleNotFoundError", "toy_things"]),
        ("bad = toy_things_c:nothing", "x = 1\n", ["failed to load (AttributeError"]),
        (
            "bad = toy_things_c:boom",
            "def boom(): pass\nraise RuntimeError('no')\n",
            ["failed to load (RuntimeError: no)"],
        ),  # fmt: skip
    ],
)
def test_a_broken_plug_in_is_one_line_naming_it_and_its_package(site, entry, source, words):
    _distribution(site, "toy_things", "toy_things_c", source, f"[censusdp.test_bad]\n{entry}\n")
    importlib.invalidate_caches()
    things: Registry = Registry("thing", entry_points="censusdp.test_bad")
    with pytest.raises(SpecError) as err:
        things.get("anything")
    message = str(err.value)
    assert "\n" not in message
    assert "thing plug-in 'bad'" in message and "toy_things 0.1" in message
    assert "fix or uninstall that package" in message
    for word in words:
        assert word in message


def test_a_plug_in_registering_under_another_name_is_refused(site):
    _distribution(
        site,
        "toy_things",
        "toy_things_d",
        "class Other:\n    name = 'other'\n",
        "[censusdp.test_names]\nmine = toy_things_d:Other\n",
    )
    importlib.invalidate_caches()
    things: Registry = Registry(
        "thing",
        entry_points="censusdp.test_names",
        register=lambda name, obj: things.add(obj.name, obj),
    )
    with pytest.raises(SpecError, match="registered no thing named 'mine'"):
        things.names()


def test_a_plug_in_taking_a_built_in_name_is_refused(site):
    _distribution(
        site,
        "toy_things",
        "toy_things_e",
        "def f():\n    pass\n",
        "[censusdp.test_clash]\nidentity = toy_things_e:f\n",
    )
    importlib.invalidate_caches()
    things: Registry = Registry("thing", entry_points="censusdp.test_clash")
    builtin = things.add("identity", lambda x: x)
    with pytest.raises(SpecError, match="'identity'.*takes the name of a thing registered already"):
        things.get("identity")
    assert "toy_things_e" not in sys.modules
    with pytest.raises(SpecError, match="takes the name"):  # every later lookup, the same line
        things.names()
    assert builtin(2) == 2
