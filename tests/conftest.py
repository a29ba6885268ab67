"""Shared fixtures: optional shared data (skip when absent) and a reproducible RNG."""

from __future__ import annotations

from pathlib import Path

import pytest

from censusdp.paths import shared_data_file
from censusdp.rng import KeyedRNG


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
