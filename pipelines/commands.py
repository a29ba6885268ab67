"""Privatize a file from Python (:func:`privatize_file`), the call behind ``censusdp privatize``
(:mod:`censusdp.app.commands.privatize`)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["privatize_file"]


def privatize_file(
    path: str | Path,
    spec_path: str | Path | None,
    out: str | Path,
    *,
    seed: int | None = None,
    overwrite: bool = False,
    codebook: str | None = None,
    rho: float | None = None,
    delta: float | None = None,
) -> Path:
    """Privatize a file with the one registered product that claims it
    (:mod:`censusdp.pipelines.products.registry`) and write it.

    The NHGIS-style products, for example:

    * **codebook** (``codebook`` given, or the spec's ``[data] codebook``): the columns are
      overlapping tables described by a codebook; a strategy of marginals is measured per
      area, one GLS estimate writes every column as integers that keep every identity among
      them (:mod:`censusdp.pipelines.products.codebook_tables`), with ρ derived from the queries.
      ``rho`` (and ``delta``) state the budget when no spec does.
    * **cells** (a run spec without codebook): the spec's first estimator produces the
      release (one repetition); its leaf estimates replace the noisy columns and their
      standard errors fill ``<cell>_se``. Columns that overlap (a shipped codebook's tables,
      or an exact identity among them in the data) are refused: as disjoint cells they would
      understate the privacy loss.

    ``out`` must be a ``.csv`` or ``.parquet`` path that is new, or an earlier censusdp output
    (recognised by its sidecar ``OUT.censusdp.json``) with ``overwrite``; it is checked before
    any work. The sidecar holds the privacy statement.

    Raises
    ------
    SpecError, DataError, HierarchyError, BudgetError
    """
    from censusdp.pipelines.products.registry import PrivatizeOptions, privatize

    options = PrivatizeOptions(
        seed=seed, overwrite=overwrite, codebook=codebook, rho=rho, delta=delta
    )
    return privatize(path, spec_path, out, options).out
