"""Shared fixtures: optional shared data (skip when absent), a reproducible RNG and one Dask
local cluster per test process; hypothesis profiles.

Hypothesis runs derandomized by default (the ``repeatable`` profile: the same cases on every
run, so the suite that CI runs cannot fail by the draw of a new case); ``pytest
--hypothesis-profile=explore`` draws fresh cases to look for new failures, and a case found
that way is pinned with ``@example`` beside the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from censusdp.paths import shared_data_file
from censusdp.rng import KeyedRNG

settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("repeatable")


@pytest.fixture
def shared_file():
    """``shared_file("county_totalpop_2010.csv")`` → Path, or skip the test when absent."""

    def get(name: str) -> Path:
        p = shared_data_file(name)
        if p is None:
            pytest.skip(f"../shared/data/{name} is not available")
        return p

    return get


@pytest.fixture
def rng() -> KeyedRNG:
    return KeyedRNG.reproducible(20261121, warn=False)


@pytest.fixture(scope="session")
def dask_executor():
    """A ``distributed`` executor on a two-worker local cluster, started once per test process
    (each pytest-xdist worker) and shared by every module's cluster tests: starting the
    cluster costs more CPU than most of those tests. Tests release what they submit."""
    pytest.importorskip("dask.distributed")
    from censusdp.pipelines.execute import open_executor

    with open_executor("distributed", workers=2) as ex:
        yield ex
