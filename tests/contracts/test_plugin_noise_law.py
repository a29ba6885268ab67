"""A noise law from a second package, through its entry point (issue 37's acceptance).

A toy distribution is written in a temporary folder — a ``pyproject.toml`` declaring
``[project.entry-points."censusdp.noise_laws"]`` and one module with two laws — and installed
with the environment's own installer (``uv pip install --no-deps --no-build-isolation
--target``, or ``pip`` where uv is absent: offline, setuptools from the environment) into a
throwaway folder that the child processes put on ``PYTHONPATH``. Then, as a user would:

* ``censusdp run`` measures a small table with ``noise = "toy_laplace"``; the release's
  statement names the law and its ε is the one derived from the toy law's own
  ``privacy(sensitivity)`` (ε = Δ₁/b), i.e. the spec's budget;
* the power check: ``toy_leaky`` (calibrated to spend twice what it is given, on purpose) is
  refused — the statement is derived from the laws, never taken from the package;
* the same package's estimator (``censusdp.estimators``: ``toy_gls``) runs the estimate;
* building the command line's parser loads no plug-in (``--help`` stays light).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import run_specs

TOY_PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "toy-censusdp-laws"
version = "0.1"

[project.entry-points."censusdp.noise_laws"]
toy_laplace = "toy_censusdp_laws:ToyLaplace"
toy_leaky = "toy_censusdp_laws:ToyLeaky"

[project.entry-points."censusdp.estimators"]
toy_gls = "toy_censusdp_estimators:ToyGLS"

[tool.setuptools]
py-modules = ["toy_censusdp_laws", "toy_censusdp_estimators"]
"""

TOY_ESTIMATORS = '''
"""A toy estimator of another package: the GLS under another name."""
from censusdp.pipelines.estimators import GLS


class ToyGLS(GLS):
    name = "toy_gls"
'''


TOY_MODULE = '''
"""Two toy noise laws of another package."""
import math

import numpy as np

from censusdp.mechanisms.laws import NoiseLaw


class ToyLaplace(NoiseLaw):
    """Laplace(0, b) drawn as a difference of two exponentials; ε = Δ₁ / b."""

    name = "toy_laplace"
    is_integer = False
    accounting = "pure"  # a third-party law may declare the string

    def __init__(self, scale):
        self.scale = float(scale)

    @classmethod
    def from_epsilon(cls, epsilon, sensitivity=1.0):
        return cls(sensitivity / epsilon)

    def sample(self, stream, size):
        return stream.exponential(self.scale, size) - stream.exponential(self.scale, size)

    def log_density(self, x):
        return -np.abs(x) / self.scale - math.log(2.0 * self.scale)

    @property
    def variance(self):
        return 2.0 * self.scale**2

    def privacy(self, sensitivity):
        return float(sensitivity) / self.scale


class ToyLeaky(ToyLaplace):
    """Miscalibrated on purpose: half the scale its ε needs, so it spends 2ε."""

    name = "toy_leaky"

    @classmethod
    def from_epsilon(cls, epsilon, sensitivity=1.0):
        return cls(sensitivity / (2.0 * epsilon))
'''


def _install(package: Path, target: Path) -> None:
    """Install ``package`` into ``target`` offline with the environment's installer."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    common = ["--no-deps", "--no-build-isolation", "--target", str(target), str(package)]
    if uv:
        cmd = [uv, "pip", "install", "--quiet", "--python", sys.executable, "--offline", *common]
    else:
        probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip("neither uv nor pip in this environment to install the toy package")
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", *common]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    dist = list(target.glob("toy_censusdp_laws-0.1.dist-info"))
    assert dist and "censusdp.noise_laws" in (dist[0] / "entry_points.txt").read_text()


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory) -> Path:
    """The toy package, installed into a folder of its own (not into the test environment)."""
    root = tmp_path_factory.mktemp("toy")
    package, site = root / "toy-censusdp-laws", root / "site"
    package.mkdir()
    (package / "pyproject.toml").write_text(TOY_PYPROJECT)
    (package / "toy_censusdp_laws.py").write_text(TOY_MODULE)
    (package / "toy_censusdp_estimators.py").write_text(TOY_ESTIMATORS)
    pytest.importorskip("setuptools", reason="the toy package is built with setuptools, offline")
    _install(package, site)
    return site


def _censusdp(site: Path, cwd: Path, *args: str, code: str | None = None):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    )
    argv = ["-c", code] if code else ["-m", "censusdp.app", *args]
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_noise_law_from_another_package_measures_a_table_with_derived_privacy(toy_site, tmp_path):
    (tmp_path / "data.csv").write_text(run_specs.SMALL_DATA)
    # a continuous law: released only when acknowledged, and the statement then says so
    spec = run_specs.SMALL_SPEC.replace(
        'noise = "discrete_laplace"', 'noise = "toy_laplace"\nallow_floating_point = true'
    ).replace('run = ["gls"]', 'run = ["toy_gls"]')  # and the other package's estimator
    assert 'noise = "toy_laplace"' in spec and 'run = ["toy_gls"]' in spec
    (tmp_path / "toy.toml").write_text(spec)
    (tmp_path / "leaky.toml").write_text(spec.replace("toy_laplace", "toy_leaky"))

    # the parser (and so --help) loads no plug-in; a lookup loads it
    probe = _censusdp(
        toy_site,
        tmp_path,
        code=textwrap.dedent(
            """
            import json, sys
            from censusdp.app.cli import build_parser
            build_parser()
            before = "toy_censusdp_laws" in sys.modules
            from censusdp.mechanisms.registry import NOISE_LAWS, law_info
            info = law_info("toy_laplace")
            print(json.dumps({"before": before, "plugins": NOISE_LAWS.plugins,
                              "accounting": str(info.accounting.value), "integer": info.integer}))
            """
        ),
    )
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert seen["before"] is False
    assert seen["plugins"]["toy_laplace"] == "toy-censusdp-laws 0.1"
    assert seen["accounting"] == "pure" and seen["integer"] is False

    res = _censusdp(toy_site, tmp_path, "run", "toy.toml", "--out", "out", "--seed", "5")
    assert res.returncode == 0, res.stderr
    manifest = json.loads((tmp_path / "out" / "release" / "manifest.json").read_text())
    text = json.dumps(manifest, ensure_ascii=False)
    assert "toy_laplace" in text and "toy_gls" in text
    privacy = (tmp_path / "out" / "release" / "privacy.md").read_text()
    assert "toy_laplace" in privacy and "ε = 1" in privacy
    assert "floating-point" in privacy  # derived from the registry: the law is not integer

    # power: a law that spends twice its share is caught by the derived statement
    leaky = _censusdp(toy_site, tmp_path, "run", "leaky.toml", "--out", "leak", "--seed", "5")
    assert leaky.returncode == 2, leaky.stdout + leaky.stderr
    assert "the measurements (toy_leaky) spend ε = 2" in leaky.stderr
    assert not (tmp_path / "leak").exists()
