"""Regenerate ``ppdd.toml`` from the NHGIS PPDD codebook text (a development tool, not shipped).

Usage: ``python pipelines/codebooks/generate_ppdd.py ../shared/data/nhgis_ppdd_20200527_codebook.txt``

Each column label (``Not Hispanic or Latino: Two or More Races: Population of two races:
White; Asian``) is read component by component; every component names a row of one element
of the ``ppdd`` schema (hispanic, sex, age, numraces, race7, cenrace, hhinstlevels, hhgq),
the last component on an attribute wins, and the table adds its universe (P10/P11: the
``adult`` slice; P42: group quarters). The result is the (query, row) of the column.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from censusdp.schema import Schema

TABLES = {  # NHGIS code → (table, title, universe)
    "H7V": ("P1", "Total Population", "Total population"),
    "H7X": ("P3", "Race", "Total population"),
    "H7Y": ("P4", "Hispanic or Latino Origin", "Total population"),
    "H7Z": ("P5", "Hispanic or Latino Origin by Race", "Total population"),
    "H72": ("P8", "Race", "Total population"),
    "H73": ("P9", "Hispanic or Latino, and Not Hispanic or Latino by Race", "Total population"),
    "H74": ("P10", "Race for the Population 18 Years and Over", "Population 18 years and over"),
    "H75": (
        "P11",
        "Hispanic or Latino, and Not Hispanic or Latino by Race for the Population 18 Years "
        "and Over",
        "Population 18 years and over",
    ),
    "H76": ("P12", "Sex by Age", "Total population"),
    "H80": (
        "P42",
        "Group Quarters Population by Group Quarters Type",
        "Population in group quarters",
    ),
}
WORDS = {
    "one": "One race",
    "two": "Two races",
    "three": "Three races",
    "four": "Four races",
    "five": "Five races",
    "six": "Six races",
}


def component(schema: Schema, table: str, text: str) -> tuple[str, str]:
    """The (element, row label) one label component names."""
    text = re.sub(r" \([0-9, -]+\)$", "", text)  # GQ type codes "(101-106)"
    m = re.fullmatch(r"Population of (\w+) races?", text)
    if m:
        return "numraces", WORDS[m.group(1)]
    if text == "Two or More Races":
        return "race7", text
    if text in ("Institutionalized population", "Noninstitutionalized population"):
        return "hhinstlevels", text
    for attr in ("hispanic", "sex", "age", "hhgq", "cenrace"):
        if text in schema.attribute(attr).labels:
            if attr == "cenrace" and table in ("P3", "P5"):
                return "race7", text  # the 7-category tables are the race7 recode
            return attr, text
    raise ValueError(f"table {table}: no element has a row {text!r}")


def column(schema: Schema, table: str, label: str) -> tuple[str, list[str]]:
    chosen: dict[int, tuple[str, str]] = {}
    if table in ("P10", "P11"):
        chosen[schema.axis("age")] = ("adult", "18 years and over")
    if table == "P42":
        chosen[schema.axis("hhgq")] = ("gqlevels", "Group quarters")
    if label != "Total":
        for part in label.split(": "):
            name, row = component(schema, table, part)
            chosen[schema.element(name)[0]] = (name, row)
    if not chosen:
        return "total", []
    axes = sorted(chosen)
    return " * ".join(chosen[a][0] for a in axes), [chosen[a][1] for a in axes]


#: The default strategy of ``censusdp privatize --codebook ppdd`` (see the TOML comment).
STRATEGY = [
    "# The default measurement strategy of `censusdp privatize --codebook ppdd`: marginals the",
    "# columns determine, whose span is exactly the columns' (rank 303 = 376 − 73 identities):",
    "# voting age × Hispanic × CENRACE carries P1, P3–P5 and P8–P11 (Hispanic × race is P8 − P9,",
    "# under 18 is all − 18 and over), sex × age is P12, hhgq is P42 (household = total − group",
    "# quarters); the total, voting age × Hispanic and voting age × Hispanic × race 7 are also",
    "# measured on their own (coarse margins, as in the 2020 production strategy), nested so",
    "# that the shared margins form a chain (total ⊂ voting age ⊂ × Hispanic ⊂ × race 7) for",
    "# the rounding. Shares are of the per-person ρ; they are this project's choice (balanced",
    "# table errors on the AIANHH file), not the Census Bureau's.",
    "[strategy]",
    "queries = [",
    '    "total",',
    '    "votingage * hispanic",',
    '    "votingage * hispanic * race7",',
    '    "votingage * hispanic * cenrace",',
    '    "sex * age",',
    '    "hhgq",',
    "]",
    "shares = [0.1, 0.1, 0.2, 0.3, 0.2, 0.1]",
    "",
]


def main(path: str) -> None:
    schema = Schema.load("ppdd")
    out = [
        "# The ten tables of the IPUMS NHGIS Privacy-Protected 2010 Census Demonstration Data",
        "# (v20200527; Van Riper, Kugler and Schroeder 2020) as rows of product queries over the",
        "# `ppdd` schema: every column code → its table, query and row (one label per attribute",
        "# the query keeps, in schema order). Subtotal rows are rows of coarser queries.",
        "# Generated by pipelines/codebooks/generate_ppdd.py from the NHGIS codebook.",
        'schema = "ppdd"',
        "",
    ]
    for code, (table, title, universe) in TABLES.items():
        out += [
            f"[tables.{table}]",
            f'nhgis = "{code}"',
            f"title = {json.dumps(title)}",
            f"universe = {json.dumps(universe)}",
            "",
        ]
    out += STRATEGY
    out.append("[columns]")
    n = 0
    for line in Path(path).read_text(encoding="latin-1").splitlines():
        m = re.fullmatch(r"\s+(H[0-9A-Z]{2})(\d{3}):\s+(.*?)\s*", line)
        if not m or m.group(1) not in TABLES:
            continue
        table = TABLES[m.group(1)][0]
        query, row = column(schema, table, m.group(3))
        out.append(
            f'{m.group(1)}{m.group(2)} = {{ table = "{table}", query = "{query}", '
            f"row = {json.dumps(row)} }}"
        )
        n += 1
    Path(__file__).with_name("ppdd.toml").write_text("\n".join(out) + "\n", encoding="utf-8")
    print(f"{n} columns")


if __name__ == "__main__":
    main(sys.argv[1])
