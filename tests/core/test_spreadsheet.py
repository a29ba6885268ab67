"""Spreadsheet-safe CSV (:mod:`censusdp.spreadsheet`): formula-like text cells are written
with a leading apostrophe and quoted; numbers stay numbers; nothing else changes."""

from __future__ import annotations

import csv
import io

import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from censusdp.spreadsheet import (
    FORMULA_START,
    escape_cell,
    spreadsheet_safe,
    unescape_cell,
    write_csv,
)


def _slow_escape(text: str) -> str:
    """The rule spelled out: a formula start that is not a plain decimal number."""
    if not text or text[0] not in "=+-@\t\r":
        return text
    body = text[1:] if text[0] in "+-" else None
    if body is not None:
        mantissa, _, exp = body.partition("e") if "e" in body else body.partition("E")
        digits = mantissa.replace(".", "", 1)
        ok_m = digits.isascii() and digits.isdigit() and mantissa.count(".") <= 1
        ok_e = (not _) or (exp.lstrip("+-").isascii() and exp.lstrip("+-").isdigit()
                           and len(exp) - len(exp.lstrip("+-")) <= 1)  # fmt: skip
        if ok_m and ok_e:
            return text
    return "'" + text


def test_formula_cells_are_escaped_and_quoted_numbers_stay():
    frame = pd.DataFrame(
        {
            "code": ["=1+1", "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\tx", "01001", "-5"],
            "count": [-5, 3, 0, 1, 2, 7, 9],
        }
    )
    buf = io.StringIO()
    assert write_csv(frame, buf) == 5
    rows = list(csv.reader(io.StringIO(buf.getvalue()), quoting=csv.QUOTE_NONNUMERIC))
    assert rows[0] == ["code", "count"]
    assert [r[0] for r in rows[1:]] == [
        "'=1+1", "'+cmd|' /C calc'!A0", "'-2+3", "'@SUM(A1)", "'\tx", "01001", "-5"
    ]  # fmt: skip
    assert [r[1] for r in rows[1:]] == [-5.0, 3.0, 0.0, 1.0, 2.0, 7.0, 9.0]  # numbers, unquoted
    back = pd.read_csv(io.StringIO(buf.getvalue()), dtype={"code": str})
    assert (
        back["code"].iloc[0].startswith("'=") and back["count"].tolist() == frame["count"].tolist()
    )
    assert frame["code"].iloc[0] == "=1+1"  # the caller's frame is untouched


def test_nothing_to_escape_writes_what_pandas_writes():
    frame = pd.DataFrame({"GEOID": ["01001", "01003"], "name": ["A", None], "n": [1.5, -2.0]})
    ours, theirs = io.StringIO(), io.StringIO()
    assert write_csv(frame, ours) == 0
    frame.to_csv(theirs, index=False)
    assert ours.getvalue() == theirs.getvalue()


def test_column_names_are_escaped_too():
    safe, n = spreadsheet_safe(pd.DataFrame({"=HYPERLINK(1)": ["a"], "ok": ["b"]}))
    assert n == 1 and list(safe.columns) == ["'=HYPERLINK(1)", "ok"]


@given(st.lists(st.one_of(st.none(), st.text(max_size=8),
                          st.sampled_from(["-5", "+3.2e4", "-.5", "-", "=", "@", "-1-1", "1e5"])),
                min_size=1, max_size=20))  # fmt: skip
def test_vectorised_escape_matches_the_cell_rule(cells):
    frame = pd.DataFrame({"c": pd.Series(cells, dtype=object)})
    safe, n = spreadsheet_safe(frame)
    want = [None if c is None else _slow_escape(c) for c in cells]
    got = [None if pd.isna(c) else c for c in safe["c"]]
    assert got == want
    assert n == sum(w != c for w, c in zip(want, cells, strict=True))
    assert [None if c is None else escape_cell(c) for c in cells] == want
    assert all(unescape_cell(w) == c for w, c in zip(want, cells, strict=True) if w != c)
    assert set(FORMULA_START) == set("=+-@\t\r")
