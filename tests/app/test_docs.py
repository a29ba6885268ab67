"""The documentation site's generated and reference pages agree with the code (no mkdocs
needed: the generators are plain functions, ``make docs-check`` builds the site itself).

- The spec reference lists every key each spec parser accepts, section by section: compared
  with the ``allowed`` sets the parsers pass to :meth:`censusdp.config.SpecParser.keys` while
  they read the page's examples (recorded, not read from the page's generator), and every
  key has an example and a meaning; a page missing a key is caught (power).
- Every public name of ``censusdp.prelude`` has an entry in the API reference, and no entry
  names something the prelude does not export; a page missing a name is caught (power).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
from pathlib import Path

import pytest

import censusdp.prelude as prelude
from censusdp.config import SpecParser

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "reference" / "api.md"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "gen" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


specref = _module("specref")


@pytest.fixture(scope="module")
def generated() -> dict[str, tuple[dict, str]]:
    """Per family: the probed sections and the family's page text."""
    return {
        f.name: (specref.family_sections(f), specref.family_markdown(f)) for f in specref.FAMILIES
    }


def _recorded(family, monkeypatch) -> dict[str, set[str]]:
    """``path -> allowed`` as the parser passes them to ``SpecParser.keys`` on the examples."""
    seen: dict[str, set[str]] = {}
    original = SpecParser.keys

    def record(self, table, path, allowed):
        seen.setdefault(path, set()).update(allowed)
        return original(self, table, path, allowed)

    monkeypatch.setattr(SpecParser, "keys", record)
    with tempfile.TemporaryDirectory() as tmp:
        for i, example in enumerate(family.examples):
            specref._parse(family, example, Path(tmp), f"example{i}.toml")
    monkeypatch.setattr(SpecParser, "keys", original)
    return seen


def _page_keys(page: str) -> dict[str, set[str]]:
    """``section path -> keys`` listed in the tables of a family's page."""
    out: dict[str, set[str]] = {}
    section = None
    for line in page.splitlines():
        head = re.match(r"^### (?:`\[(.+)\]`|Top level)$", line)
        if head:
            section = head.group(1) or ""
            out[section] = set()
            continue
        row = re.match(r"^\| `([^`]+)` \|", line)
        if row and section is not None:
            out[section].add(row.group(1))
    return out


def _missing(page: str, accepted: dict[str, set[str]]) -> dict[str, set[str]]:
    """What ``page`` fails to list of the ``accepted`` keys, per section."""
    listed = _page_keys(page)
    gaps = {path: keys - listed.get(path, set()) for path, keys in accepted.items()}
    return {path: keys for path, keys in gaps.items() if keys}


def test_every_family_of_spec_is_on_the_page():
    from censusdp.pipelines.predict import SPEC_FAMILIES

    assert set(SPEC_FAMILIES) <= {f.name for f in specref.FAMILIES}


@pytest.mark.parametrize("family", ["run", "codebook", "ppmf", "ppmf_units", "predict"])
def test_the_spec_reference_lists_every_key_the_parser_accepts(family, generated, monkeypatch):
    fam = next(f for f in specref.FAMILIES if f.name == family)
    recorded = _recorded(fam, monkeypatch)
    assert recorded, "the parser checked no table: the recorder saw nothing"
    sections, page = generated[family]
    assert _missing(page, recorded) == {}
    for path, allowed in recorded.items():  # and nothing the parser does not accept
        assert set(sections[path].accepted) == allowed, path
        assert _page_keys(page)[path] == allowed, path


def test_every_listed_key_has_an_example_and_a_meaning(generated):
    for family, (sections, page) in generated.items():
        for line in page.splitlines():
            if re.match(r"^\| `[^`]+` \|", line):
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
                assert cells[1] and cells[2], f"{family}: {line}"
        fixed = sum(s.accepted is not None for s in sections.values())
        assert fixed >= 2, family


def test_predict_and_targets_pages_list_what_their_parsers_refuse_without(generated):
    """Each listed key, dropped from the examples' union, is what the parser names when it
    refuses the probe (so the list is the parser's)."""
    for family in ("predict", "targets"):
        sections, page = generated[family]
        for path, s in sections.items():
            if s.accepted is not None:
                assert _page_keys(page)[path] == set(s.accepted)
                assert all(k in s.refusal for k in s.accepted), s.refusal
    assert "'quantiles'" in generated["predict"][0]["predict"].refusal


def test_a_page_missing_a_key_is_caught(generated):
    _, page = generated["run"]
    doctored = page.replace("| `tv_bound` |", "| `tv_bond` |")
    assert _missing(doctored, {"estimators.mcmc": {"tv_bound", "chains"}}) == {
        "estimators.mcmc": {"tv_bound"}
    }


def test_an_example_the_parser_refuses_fails_the_generation():
    fam = specref.FAMILIES[0]
    bad = specref.Family(
        fam.name, fam.title, fam.command, fam.intro, (fam.examples[0] + "\n[extra]\n",), fam.files
    )
    from censusdp.errors import SpecError

    with pytest.raises(SpecError, match="unknown key 'extra'"):
        specref.family_sections(bad)


# ------------------------------------------------------------------------------------- API
def _api_names(text: str) -> list[str]:
    return re.findall(r"^::: censusdp\.prelude\.(\w+)$", text, re.M)


def _undocumented(text: str) -> set[str]:
    return set(prelude.__all__) - set(_api_names(text))


def test_every_public_name_of_the_prelude_is_in_the_api_reference():
    text = API.read_text(encoding="utf-8")
    assert _undocumented(text) == set()
    names = _api_names(text)
    assert len(names) == len(set(names)) and set(names) <= set(prelude.__all__)


def test_an_api_page_missing_a_name_is_caught():
    text = API.read_text(encoding="utf-8").replace("::: censusdp.prelude.tree_gls\n", "")
    assert _undocumented(text) == {"tree_gls"}


# ------------------------------------------------------------------------- design citations
def _cited_sections(paths) -> set[str]:
    found = set()
    for path in paths:
        text = path.read_text(encoding="utf-8")
        found |= set(re.findall(r"docs/design\.md\s+§ ([A-Z][\w ]*?)(?=[):,.;'\n]| \()", text))
    return found


def _headings() -> set[str]:
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    return set(re.findall(r"^## (.+)$", text, re.M))


def test_every_design_citation_names_a_section_of_the_design_page():
    folders = ("censusdp", "hierarchy", "mechanisms", "estimation", "pipelines", "experiments")
    sources = [p for f in folders for p in (ROOT / f).rglob("*.py")]
    cited = _cited_sections(sources)
    assert len(cited) >= 4  # the scan finds the citations
    assert cited <= _headings(), cited - _headings()
    assert not [p for p in sources if "DESIGN §" in p.read_text(encoding="utf-8")]


def test_a_citation_of_a_missing_section_is_caught(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text('"""See docs/design.md § Layoutz (the folders)."""\n', encoding="utf-8")
    assert _cited_sections([bad]) - _headings() == {"Layoutz"}
