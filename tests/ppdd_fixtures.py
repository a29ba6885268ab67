"""Small NHGIS files in the PPDD layout (the shipped ``ppdd`` codebook's ``_sf`` columns) and
the ρ of one row computed by hand: shared by the row-geography tests and the hostile suite."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from censusdp.pipelines.io.codebook import Codebook

SHARES = [0.1, 0.1, 0.2, 0.3, 0.2, 0.1]  # the ppdd codebook's default strategy
#: Counties of Illinois and two places in them (9-character GISJOINs), with their PLACEA.
IL_COUNTIES_AND_PLACES = ["G1700310", "G1700430", "G1700890", "G17014000", "G17003012"]
IL_PLACEA = ["", "", "", "14000", "03012"]


def hand_rho(shares: list[float], rho: float) -> float:
    """One row's ρ by hand: each default query partitions every attribute (Δ₂² = 1); σ² =
    1/(2·share·ρ) rounded up onto the sampler's grid, ρ = Σ_q 1/(2σ_q²)."""
    from censusdp.mechanisms.discrete import rational_up

    return math.fsum(1 / (2 * float(rational_up(1 / (2 * s * rho)))) for s in shares)


def ppdd_file(path: Path, cb: Codebook, codes: list[str], **extra: list[str]) -> Path:
    """A PPDD-layout file (``_sf`` columns of random person histograms) with these GISJOINs
    and extra identifier columns."""
    n = len(codes)
    x = np.random.default_rng(5).poisson(0.01, (n, cb.schema.n_cells))
    truth = cb.rows.apply(x.reshape(n, *cb.schema.shape))
    cols: dict[str, object] = {"gisjoin": codes, "name": [f"Area {i}" for i in range(n)], **extra}
    for j, c in enumerate(cb.columns):
        cols[f"{c}_sf"] = truth[:, j]
    pd.DataFrame(cols).to_csv(path, index=False)
    return path
