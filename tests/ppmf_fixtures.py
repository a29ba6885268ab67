"""Synthetic PPMF persons for the reader and table tests (2020 layout columns)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def ppmf_persons(
    gen: np.random.Generator,
    n: int,
    blocks: list[tuple[str, str, str, str, str]],
    household_share: float,
) -> pd.DataFrame:
    """``n`` persons spread over ``blocks`` (state, county, tract, block group, block codes),
    a ``household_share`` of them in households and the rest in group quarters of a random
    type, every other attribute drawn uniformly over its codes."""
    b = gen.integers(0, len(blocks), n)
    gq = np.where(gen.random(n) < household_share, 0, gen.integers(1, 8, n))
    return pd.DataFrame(
        {
            "TABBLKST": [blocks[i][0] for i in b],
            "TABBLKCOU": [blocks[i][1] for i in b],
            "TABTRACT": [blocks[i][2] for i in b],
            "TABBLKGRP": [blocks[i][3] for i in b],
            "TABBLK": [blocks[i][4] for i in b],
            "RTYPE": np.where(gq == 0, "3", "5"),
            "GQTYPE_PL": gq.astype(str),
            "VOTING_AGE": gen.integers(1, 3, n).astype(str),
            "CENHISP": gen.integers(1, 3, n).astype(str),
            "CENRACE": [f"{v:02d}" for v in gen.integers(1, 64, n)],
        }
    )
