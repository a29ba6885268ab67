"""Table outputs that fit pandas, R and NHGIS habits: margins of error, digits, geography
codes, a data dictionary, Parquet metadata.

Every table route of ``censusdp privatize`` (PPMF persons P1–P5, the PPMF units H1, the
codebook routes, the Noisy Measurement File release) writes its tables through these kernels:

* **Margins of error** (``<column>_moe`` beside every ``<column>_se``, 90% as the American
  Community Survey publishes them). For a **real-valued** estimate the MOE is ``1.645 · SE``
  (U.S. Census Bureau 2020, ch. 8: "MOE = 1.645 × SE"; :func:`real_moe`). For an **integer**
  release (the released value ``r`` and the truth ``t`` are both integers, so the error
  ``r − t`` lies on the integer lattice) the interval ``[r − k, r + k]`` has an integer
  half-width ``k``; ``±1.645 · SE`` with ``SE ≈ 0.5`` contains only the error 0 and covers
  far less than 90%. :func:`lattice_moe` takes the smallest integer ``k ≥ 0`` with

  .. math:: P(|N(0, SE^2)| \\le k + 1/2) \\ge 0.90
            \\iff k \\ge z_{0.95} \\cdot SE - 1/2,

  the normal approximation of the integer error with a continuity correction (the event
  ``|r − t| ≤ k`` of an integer error is the event ``|e| < k + 1/2`` of its continuous
  approximation; Feller 1968, VII.3). The integer MOE is therefore **conservative on the
  lattice**: its nominal coverage is at least 90% and can be well above it (``SE = 0.5``
  gives ``k = 1``, a nominal 99.7%), because no integer half-width lies between ``k − 1``
  (below 90%) and ``k``. A standard error of 0 (an invariant) gives ``k = 0``.
* **Digits**: standard errors and real-valued MOEs are written with :data:`SE_DIGITS`
  significant digits (:func:`significant`), not the 17 of a float64's round trip.
* **Geography**: every row carries its node's code and the codes of its ancestors
  (:func:`parent_codes`: ``state_GEOID``, ``county_GEOID``, ... or ``..._GISJOIN``), from
  the hierarchy's parent arrays, vectorised.
* **Data dictionary**: ``data_dictionary.csv`` beside every table output (column → table →
  label → type → unit; :func:`write_data_dictionary`).
* **Parquet metadata**: the privacy statement and schema name in the file's key-value
  metadata (:func:`write_parquet`).
* **Release texts**: ``manifest.json``, ``privacy.md`` and ``README.md`` of a release folder
  (:func:`write_release_texts`), one layout for every folder route.

References
----------
U.S. Census Bureau (2020). Understanding and Using American Community Survey Data: What All
    Data Users Need to Know, ch. 8 (margins of error at 90%, ``MOE = 1.645 × SE``).
Feller, W. (1968). An Introduction to Probability Theory and Its Applications, Vol. I, 3rd
    ed., VII.3 (the normal approximation of an integer variable, continuity correction).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import norm

from censusdp.budget import PrivacyStatement, Product
from censusdp.hierarchy.core import Hierarchy
from censusdp.spreadsheet import write_csv

__all__ = [
    "ACS_Z",
    "DICTIONARY_COLUMNS",
    "DICTIONARY_FILE",
    "SE_DIGITS",
    "Z90",
    "SIZE_CLASS_FILES",
    "OUTPUT_COLUMNS_NOTE",
    "DictionaryEntry",
    "code_entries",
    "estimate_entries",
    "lattice_moe",
    "long_entries",
    "long_table",
    "margin_of_error",
    "parent_codes",
    "real_moe",
    "significant",
    "wide_table",
    "write_data_dictionary",
    "write_parquet",
    "write_release_texts",
    "written_errors",
]

#: The ACS's published multiplier of a 90% margin of error.
ACS_Z = 1.645
#: The exact two-sided 90% normal quantile, Φ⁻¹(0.95), for the integer (lattice) MOE.
Z90 = float(norm.ppf(0.95))
#: The size-class report's files (manifests list them).
SIZE_CLASS_FILES = ("size_classes.csv", "size_classes.md", "size_classes.png")
#: Significant digits of written standard errors and real-valued margins of error.
SE_DIGITS = 6
#: What the ``_moe`` columns and the dictionary are (manifests and READMEs of the routes).
OUTPUT_COLUMNS_NOTE = (
    "<column>_moe beside every <column>_se: the 90% margin of error; for an integer release "
    "the smallest integer k with P(|N(0, se^2)| <= k + 1/2) >= 0.90 (the interval [r - k, "
    "r + k] on the integer lattice; conservative: at least 90% nominal), for a real-valued "
    "one 1.645 x se (as the ACS publishes); _se written to 6 significant digits; every row "
    "carries its area's code and its ancestors' codes; data_dictionary.csv says what every "
    "column is (table, label, type, unit)"
)
#: The data dictionary's file name and columns.
DICTIONARY_FILE = "data_dictionary.csv"
DICTIONARY_COLUMNS = ("column", "table", "label", "type", "unit")


def significant(x: np.ndarray, digits: int = SE_DIGITS) -> np.ndarray:
    """``x`` rounded to ``digits`` significant digits (float64; 0, inf and nan unchanged):
    the float of its ``%.{digits}g`` decimal, so it prints (CSV, ``repr``) with at most
    ``digits`` digits.

    Vectorised: ``round(x · 10^d) / 10^d`` with ``d = digits − 1 − ⌊log10 |x|⌋``. Where
    ``|d| ≤ 22`` (for six digits, ``|x|`` from about 1e-17 to 1e27) the integer
    ``round(x · 10^d)`` and ``10^d`` are exact floats, so the quotient is the float nearest
    the decimal; the rare values outside are formatted one by one.
    """
    if digits < 1:
        raise ValueError(f"significant: digits must be at least 1, not {digits}")
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    ok = np.isfinite(x) & (x != 0)
    if not ok.any():
        return out
    v = x[ok]
    d = (digits - 1 - np.floor(np.log10(np.abs(v)))).astype(np.int64)
    res = np.empty_like(v)
    up = (d >= 0) & (d <= 22)
    down = (d < 0) & (d >= -22)
    p = 10.0 ** d[up]
    res[up] = np.round(v[up] * p) / p
    q = 10.0 ** (-d[down])
    res[down] = np.round(v[down] / q) * q
    rare = ~(up | down)
    res[rare] = [float(f"{t:.{digits}g}") for t in v[rare]]  # beyond exact powers of ten
    out[ok] = res
    return out


def real_moe(se: np.ndarray) -> np.ndarray:
    """The 90% margin of error of a real-valued estimate, ``1.645 · SE`` (the ACS's), to
    :data:`SE_DIGITS` significant digits."""
    return significant(ACS_Z * np.asarray(se, dtype=np.float64))


def lattice_moe(se: np.ndarray) -> np.ndarray:
    """The 90% margin of error of an integer release, an integer (module docstring).

    The smallest integer ``k ≥ 0`` with ``P(|N(0, se²)| ≤ k + 1/2) ≥ 0.90``:
    ``k = max(0, ⌈z₀.₉₅ · se − 1/2⌉)``. Conservative on the lattice (its nominal coverage
    is at least 90%).

    Parameters
    ----------
    se : numpy.ndarray
        Finite, non-negative standard errors.

    Returns
    -------
    numpy.ndarray
        int64, the shape of ``se``.
    """
    se = np.asarray(se, dtype=np.float64)
    if not (np.isfinite(se) & (se >= 0)).all():
        raise ValueError("lattice_moe: standard errors must be finite and non-negative")
    return np.maximum(np.ceil(Z90 * se - 0.5), 0).astype(np.int64)


def margin_of_error(se: np.ndarray, *, integer: bool) -> np.ndarray:
    """:func:`lattice_moe` for an integer release, else :func:`real_moe`."""
    return lattice_moe(se) if integer else real_moe(se)


def written_errors(se: np.ndarray, *, integer: bool) -> tuple[np.ndarray, np.ndarray]:
    """The written ``_se`` and ``_moe`` of standard errors: ``se`` to :data:`SE_DIGITS`
    significant digits (:func:`significant`) and the 90% margin of error of the unrounded
    ``se`` (:func:`margin_of_error`: integer for an integer release). Where ``se`` is not
    finite (an estimator without standard errors) the MOE is NaN, and the MOEs float64.
    """
    se = np.asarray(se, dtype=np.float64)
    ok = np.isfinite(se)
    if ok.all():
        return significant(se), margin_of_error(se, integer=integer)
    moe = np.full(se.shape, np.nan)
    moe[ok] = margin_of_error(se[ok], integer=integer)
    return significant(se), moe


def wide_table(
    ids: Mapping[str, object],
    columns: Sequence[str],
    values: np.ndarray,
    errors: tuple[np.ndarray, np.ndarray] | None = None,
    *,
    suffix: str = "",
) -> pd.DataFrame:
    """One row per area: the ``ids`` columns (its code, its ancestors'), then for every
    column ``c`` of ``values`` ``(n, len(columns))`` its value ``<c><suffix>`` and, with
    ``errors`` (the written ``se`` and ``moe`` of :func:`written_errors`), ``<c>_se`` and
    ``<c>_moe`` beside it."""
    cols: dict[str, object] = dict(ids)
    for j, c in enumerate(columns):
        cols[f"{c}{suffix}"] = values[:, j]
        if errors is not None:
            cols[f"{c}_se"], cols[f"{c}_moe"] = errors[0][:, j], errors[1][:, j]
    return pd.DataFrame(cols)


def long_table(
    level: str,
    ids: Mapping[str, object],
    values: np.ndarray,
    errors: tuple[np.ndarray, np.ndarray] | None = None,
    *,
    labels: Mapping[str, Sequence[str]],
) -> pd.DataFrame:
    """One row per area and column of ``values`` ``(n, m)``: ``level``, the ``ids`` columns
    repeated per column (None: an empty column, an ancestor the level does not have), the
    ``labels`` columns (``table``, ``column``, ``label``: ``m`` each) repeated per area,
    ``value`` and, with ``errors`` (:func:`written_errors`), ``se`` and ``moe``."""
    n, m = values.shape
    cols: dict[str, object] = {"level": level}
    cols |= {c: None if v is None else np.repeat(v, m) for c, v in ids.items()}
    cols |= {c: np.tile(np.asarray(v, dtype=object), n) for c, v in labels.items()}
    cols["value"] = values.ravel()
    if errors is not None:
        cols["se"], cols["moe"] = errors[0].ravel(), errors[1].ravel()
    return pd.DataFrame(cols)


def parent_codes(
    hierarchy: Hierarchy,
    level: str | int,
    lo: int = 0,
    hi: int | None = None,
    *,
    code_column: str = "GEOID",
) -> dict[str, np.ndarray]:
    """The codes of the ancestors of nodes ``lo:hi`` of ``level``, one column per level
    between the root (excluded: one node) and ``level`` (excluded), root side first:
    ``{"state_GEOID": ..., "county_GEOID": ...}``.

    Vectorised over the nodes: the parent arrays are followed one level at a time for the
    slice only (``O((hi − lo) · depth)``).
    """
    k = hierarchy.level_index(level)
    hi = hierarchy.levels[k].size if hi is None else hi
    idx = np.arange(lo, hi, dtype=np.int64)
    found: list[tuple[str, np.ndarray]] = []
    for j in range(k, 1, -1):  # the parent of level j is level j − 1; stop above the root
        idx = hierarchy.levels[j].parent[idx]
        up = hierarchy.levels[j - 1]
        found.append((f"{up.name}_{code_column}", np.asarray(up.codes, dtype=object)[idx]))
    return dict(reversed(found))


@dataclass(frozen=True)
class DictionaryEntry:
    """One row of ``data_dictionary.csv``.

    Attributes
    ----------
    column : str
        The column's name in the table files.
    table : str
        The published table it belongs to (``P1``), or ``""`` for identifiers.
    label : str
        What it is, in words.
    type : str
        ``integer``, ``float`` or ``text``.
    unit : str
        ``persons``, ``housing units``, ``code``, ...
    """

    column: str
    table: str
    label: str
    type: str
    unit: str


def estimate_entries(
    columns: Sequence[str],
    tables: Sequence[str],
    labels: Sequence[str],
    *,
    unit: str,
    integer: bool,
    suffix: str = "",
    with_se: bool = True,
) -> list[DictionaryEntry]:
    """The dictionary rows of released columns (``<column><suffix>``) and, with ``with_se``,
    of their ``_se`` and ``_moe``: the value's type is ``integer`` for an integer release,
    the MOE's too (:func:`lattice_moe`)."""
    out: list[DictionaryEntry] = []
    kind = "integer" if integer else "float"
    moe_words = (
        "90% margin of error, an integer: the smallest k with P(|N(0, se^2)| <= k + 1/2) >= "
        "0.90 (conservative on the integer lattice)"
        if integer
        else "90% margin of error, 1.645 x standard error (as the ACS publishes)"
    )
    for c, t, lab in zip(columns, tables, labels, strict=True):
        out.append(DictionaryEntry(f"{c}{suffix}", t, lab, kind, unit))
        if with_se:
            out.append(DictionaryEntry(f"{c}_se", t, f"{lab}: standard error", "float", unit))
            out.append(DictionaryEntry(f"{c}_moe", t, f"{lab}: {moe_words}", kind, unit))
    return out


def code_entries(code_column: str, parents: Iterable[str] = ()) -> list[DictionaryEntry]:
    """Dictionary rows of the geography columns: the row's own code and its ancestors'."""
    out = [DictionaryEntry(code_column, "", "the area's code", "text", "code")]
    for p in parents:
        out.append(
            DictionaryEntry(p, "", f"the code of the area's {p.rsplit('_', 1)[0]}", "text", "code")
        )
    return out


def long_entries(
    file: str, unit: str, tables: str, first: str, errors: tuple[str, str] | None
) -> list[DictionaryEntry]:
    """Dictionary rows of a long table's own columns (:func:`long_table`): level, table
    (``tables`` says which, e.g. ``"H1"``), column (``first`` the first one's name), label,
    value in ``unit``; with ``errors`` the ``se`` and ``moe`` columns, described by them."""
    out = [
        DictionaryEntry("level", "", f"{file}: the geographic level", "text", "level"),
        DictionaryEntry("table", "", f"{file}: the table ({tables})", "text", "table"),
        DictionaryEntry("column", "", f"{file}: the column ({first} ...)", "text", "column"),
        DictionaryEntry("label", "", f"{file}: the column's label", "text", "label"),
        DictionaryEntry("value", "", f"{file}: the released count", "integer", unit),
    ]
    if errors is not None:
        out += [
            DictionaryEntry("se", "", f"{file}: {errors[0]}", "float", unit),
            DictionaryEntry("moe", "", f"{file}: {errors[1]}", "integer", unit),
        ]
    return out


def write_data_dictionary(folder: Path, entries: Iterable[DictionaryEntry]) -> Path:
    """Write ``folder/data_dictionary.csv`` (one row per distinct column, first seen kept)."""
    seen: dict[str, DictionaryEntry] = {}
    for e in entries:
        seen.setdefault(e.column, e)
    frame = pd.DataFrame(
        [[getattr(e, f) for f in DICTIONARY_COLUMNS] for e in seen.values()],
        columns=list(DICTIONARY_COLUMNS),
    )
    path = Path(folder) / DICTIONARY_FILE
    write_csv(frame, path, index=False)
    return path


def write_parquet(frame: pd.DataFrame, path: Path, metadata: Mapping[str, object]) -> None:
    """Write ``frame`` as Parquet with ``metadata`` (JSON text per key, ``censusdp.`` keys,
    ``ensure_ascii=False``) in the file's key-value metadata beside pandas' own."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    extra = {
        f"censusdp.{k}".encode(): (
            v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
        ).encode("utf-8")
        for k, v in metadata.items()
    }
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **extra})
    pq.write_table(table, path)


def write_release_texts(
    folder: Path,
    manifest: Mapping[str, object],
    privacy: PrivacyStatement,
    products: Sequence[Product],
    *,
    title: str,
    notes: Iterable[str],
    scope: str = "",
) -> None:
    """Write a release folder's ``manifest.json``, ``privacy.md`` and ``README.md``.

    ``privacy.md``: the derived statement, ``scope`` (what it covers, when it covers more than
    this release) and each product's wording (:meth:`~censusdp.budget.Product.wording`).
    ``README.md``: ``# censusdp release (title)``, the statement, one bullet per line of
    ``notes`` (the files and what they are) and the products' wording again.
    """
    folder = Path(folder)
    (folder / "manifest.json").write_text(
        json.dumps(manifest, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    wording = [f"- {p.wording()}" for p in products]
    lead = f"{scope} " if scope else ""
    (folder / "privacy.md").write_text(
        f"# Privacy\n\n{privacy.text()}\n\n{lead}What each product is:\n\n"
        + "\n".join(wording)
        + "\n",
        encoding="utf-8",
    )
    lines = [f"# censusdp release ({title})", "", f"Privacy: {privacy.text()}", ""]
    lines += [f"- {note}" for note in notes]
    lines += ["", "Privacy of each product (privacy.md says the same):", "", *wording, ""]
    (folder / "README.md").write_text("\n".join(lines), encoding="utf-8")
