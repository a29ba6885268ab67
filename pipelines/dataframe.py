"""``privatize(df, spec) -> DataFrame``: the ``privatize`` command on a pandas frame.

A user with a table already in pandas (one row per area: ``gisjoin``, identifiers, the
confidential ``<cell>_sf`` columns, as an NHGIS extract) gets the release back as a frame,
without choosing file names: :func:`privatize` writes the frame to a Parquet file in a
temporary directory it creates (and alone removes), runs the existing file route
(:func:`censusdp.pipelines.products.registry.privatize`: the product that claims it — the
cells route of a run spec, or the codebook route with ``codebook``), and reads the release back, the same numbers the command
writes for the same input, spec and seed. Parquet both ways keeps the dtypes: integer
releases come back int64, codes as text.

The returned frame carries, beside every ``<cell>_se``, the 90% margin of error
``<cell>_moe`` (the integer lattice MOE of an integer release,
:func:`~censusdp.pipelines.io.outputs.lattice_moe`; ``1.645 · SE`` of a real-valued one),
and in ``frame.attrs`` the derived privacy statement (``"privacy"``) and the whole sidecar
(``"censusdp"``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from censusdp.errors import DataError

__all__ = ["privatize"]


def privatize(
    frame: pd.DataFrame,
    spec: str | Path | None = None,
    *,
    codebook: str | None = None,
    rho: float | None = None,
    delta: float | None = None,
    seed: int | None = None,
) -> pd.DataFrame:
    """Release a table of areas held in a pandas frame (module docstring).

    Parameters
    ----------
    frame : pandas.DataFrame
        One row per area in an NHGIS layout (a ``gisjoin`` column, ``<cell>_sf`` counts).
    spec : path-like, optional
        A run spec (``[data] source = "nhgis"``; its ``[data] path`` is ignored) or a
        codebook spec.
    codebook, rho, delta : optional
        The codebook route without a spec (``codebook="ppdd", rho=0.5``).
    seed : int, optional
        Reproducible mode (tests only).

    Returns
    -------
    pandas.DataFrame
        The release in the input's layout: identifiers, ``<cell>_dp``, ``<cell>_se``,
        ``<cell>_moe``; ``attrs["privacy"]`` the privacy statement.

    Raises
    ------
    DataError
        ``frame`` is not a DataFrame, or its columns are not a release's input.
    SpecError, BudgetError, HierarchyError
        As the ``privatize`` command.
    """
    from censusdp.atomic import read_marker, sidecar_path
    from censusdp.pipelines.io.outputs import margin_of_error
    from censusdp.pipelines.products.registry import PrivatizeOptions
    from censusdp.pipelines.products.registry import privatize as privatize_path

    if not isinstance(frame, pd.DataFrame):
        raise DataError(
            f"privatize: expected a pandas DataFrame, got {type(frame).__name__}; pass the "
            "table of areas (gisjoin, <cell>_sf columns)"
        )
    with tempfile.TemporaryDirectory(prefix="censusdp-privatize-") as tmp:
        src, out = Path(tmp) / "input.parquet", Path(tmp) / "release.parquet"
        frame.to_parquet(src, index=False)
        options = PrivatizeOptions(seed=seed, codebook=codebook, rho=rho, delta=delta)
        privatize_path(src, spec, out, options)
        result = pd.read_parquet(out)
        side = read_marker(sidecar_path(out)) or {}
    cols: dict[str, object] = {}
    for c in result.columns:
        cols[c] = result[c]
        if c.endswith("_se") and f"{c[:-3]}_moe" not in result.columns:
            value = f"{c[:-3]}_dp" if f"{c[:-3]}_dp" in result.columns else c[:-3]
            integer = value in result.columns and result[value].dtype.kind in "iu"
            cols[f"{c[:-3]}_moe"] = margin_of_error(
                np.asarray(result[c], dtype=np.float64), integer=integer
            )
    out_frame = pd.DataFrame(cols)
    out_frame.attrs["privacy"] = side.get("privacy", "")
    out_frame.attrs["censusdp"] = side
    return out_frame
