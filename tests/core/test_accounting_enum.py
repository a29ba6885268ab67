"""The typed accounting (:class:`censusdp.budget.Accounting`, issue 34 "One engine").

- The member is its wire string: JSON, ``str``, ``format`` and ``repr`` give what the old
  strings gave, so a manifest written from a member is byte-identical to one written from the
  string, and it reads back (``from_dict``) to the same member.
- Strings are read once at the edge (:meth:`Accounting.parse`, :class:`PrivacyStatement`,
  :func:`register_law`, :func:`build_plan`): past it the library holds members.
- No library module outside the spec parsers and the budget module holds a ``"pure"`` or
  ``"zcdp"`` literal: the rule of ``../shared/tools/structure.py``
  (``zcdp_pure_literals_outside_parser``), mirrored here, with a check that the scan flags a
  planted literal (so the test can fail).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from censusdp.budget import (
    ACCOUNTINGS,
    ZCDP,
    Accounting,
    PrivacyStatement,
    PureAccountant,
    PureDP,
    ZCDPAccountant,
    accountant_for,
    loss,
    statement_for,
)
from censusdp.errors import BudgetError
from censusdp.mechanisms.registry import NOISE_LAWS, SENSITIVITY_NORM, law_info

ROOT = Path(__file__).resolve().parents[2]

#: The library packages structure.py scans, and the path words that mark a parser or the
#: budget module (where the strings belong).
LIB = ("censusdp", "hierarchy", "mechanisms", "estimation", "pipelines", "experiments", "app")
PARSER_WORDS = ("spec", "budget", "config")

#: Files allowed a literal while another change lands (none now): a literal anywhere fails.
PENDING: dict[str, int] = {}


def _literals(source: str) -> list[int]:
    """Line of every ``"pure"``/``"zcdp"`` constant in ``source`` (structure.py's rule)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and node.value in ("zcdp", "pure")
    ]


def _library_literals() -> dict[str, list[int]]:
    out = {}
    for pkg in LIB:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT).as_posix()
            if any(word in rel for word in PARSER_WORDS):
                continue
            lines = _literals(path.read_text(encoding="utf-8"))
            if lines:
                out[rel] = lines
    return out


def test_no_accounting_literal_outside_parsers_and_budget():
    found = _library_literals()
    over = {rel: lines for rel, lines in found.items() if len(lines) > PENDING.get(rel, 0)}
    assert over == {}, f"accounting literals outside the parsers/budget: {over}"


def test_the_scan_finds_a_planted_literal():
    # Power: the rule flags both literals, in any syntactic position, and nothing else.
    src = 'x = "zcdp"\nif y == \'pure\':\n    z = "pure accounting"\n'
    assert _literals(src) == [1, 2]
    assert _literals("a = Accounting.ZCDP\nb = 'zcdp_cks'\n") == []
    assert (ROOT / "censusdp" / "budget.py").is_file()  # the scan reads the real tree


@pytest.mark.parametrize("member, text", [(Accounting.PURE, "pure"), (Accounting.ZCDP, "zcdp")])
def test_member_is_its_wire_string(member, text):
    assert member == text and text == member
    assert str(member) == text and f"{member}" == text and repr(member) == repr(text)
    assert json.dumps(member) == json.dumps(text) == f'"{text}"'
    assert json.dumps({"accounting": member}) == json.dumps({"accounting": text})
    assert Accounting(json.loads(json.dumps(member))) is member
    assert hash(member) == hash(text) and ACCOUNTINGS[member] == ACCOUNTINGS[text]
    assert member.unit == ACCOUNTINGS[text]
    assert Accounting.parse(text) is member and Accounting.parse(member) is member


@pytest.mark.parametrize("bad", ["Pure", "zCDP", "", "epsilon", None, 1, b"zcdp"])
def test_parse_refuses_other_values_in_one_line(bad):
    with pytest.raises(BudgetError) as err:
        Accounting.parse(bad, "privacy.accounting")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("privacy.accounting must be 'pure' or 'zcdp', got ")
    assert msg.endswith(repr(bad))


@pytest.mark.parametrize(
    "text, kwargs",
    [
        ("pure", {"epsilon": 0.5}),
        ("zcdp", {"rho": 0.25, "delta": 1e-10}),
    ],
)
def test_statement_manifest_byte_identical_and_round_trips(text, kwargs):
    common = {"invariants": ("state: total",), "mechanism": "m", "notes": ("n",)}
    from_string = PrivacyStatement(text, **kwargs, **common)
    from_member = PrivacyStatement(Accounting(text), **kwargs, **common)
    assert from_string == from_member
    assert from_string.accounting is Accounting(text)
    d = from_string.to_dict()
    assert type(d["accounting"]) is str and d["accounting"] == text
    written = json.dumps(d, sort_keys=True, ensure_ascii=False)
    assert written == json.dumps(from_member.to_dict(), sort_keys=True, ensure_ascii=False)
    assert f'"accounting": "{text}"' in written
    back = PrivacyStatement.from_dict(json.loads(written))
    assert back == from_string and back.accounting is Accounting(text)
    assert json.dumps(back.to_dict(), sort_keys=True, ensure_ascii=False) == written


def test_statement_for_and_typed_losses_carry_members():
    assert statement_for("pure", 1.0).accounting is Accounting.PURE
    assert statement_for(Accounting.ZCDP, 0.1, 1e-9).accounting is Accounting.ZCDP
    assert statement_for(ZCDP(0.1)).accounting is Accounting.ZCDP
    assert PureDP(1.0).accounting is Accounting.PURE and ZCDP(1.0).accounting is Accounting.ZCDP
    assert isinstance(loss(Accounting.PURE, 1.0), PureDP)
    assert isinstance(loss("zcdp", 1.0), ZCDP)
    assert PureAccountant.accounting is Accounting.PURE
    assert ZCDPAccountant.accounting is Accounting.ZCDP
    assert isinstance(accountant_for(Accounting.ZCDP, 1.0), ZCDPAccountant)
    with pytest.raises(ValueError, match="accounting must be"):
        PrivacyStatement("renyi", epsilon=1.0)


def test_every_registered_law_holds_a_member():
    assert set(SENSITIVITY_NORM) == set(Accounting)
    for name in NOISE_LAWS.names():
        info = law_info(name)
        assert type(info.accounting) is Accounting, name
        assert type(info.law.accounting) is Accounting, name
        assert info.norm == {Accounting.PURE: 1, Accounting.ZCDP: 2}[info.accounting]


def test_a_law_declaring_the_string_is_read_once_at_registration():
    from censusdp.mechanisms.laws import Gaussian
    from censusdp.mechanisms.registry import register_law

    class Declared(Gaussian):  # a third-party law written against the old strings
        name, accounting = "test_declared_gaussian", "zcdp"

    assert type(Declared.accounting) is str
    register_law(Declared)
    try:
        info = law_info("test_declared_gaussian")
        assert info.accounting is Accounting.ZCDP and Declared.accounting is Accounting.ZCDP
        assert info.norm == 2 and info.unit == "rho"
        assert info.calibrate(0.5, 1.0).privacy(1.0) == pytest.approx(0.5, rel=1e-12)
    finally:
        NOISE_LAWS.remove("test_declared_gaussian")
