"""The spec reference, generated from the spec parsers themselves.

Every spec family that a command reads has an annotated example here (a TOML text, or several
where keys exclude each other). Generating the page does three things with each:

1. it parses the example with the family's own loader (the one the command uses), so an
   example the parser refuses fails the build;
2. it asks the parser which keys each table accepts: a probe key is put into the table and
   the parser's refusal, which lists the accepted keys, is read back (tables whose keys the
   user names, such as levels or marginals, are refused differently and are marked so);
3. it writes one table per section: every accepted key, with the example's value and the
   comment written beside it in the example.

So the page cannot list a key the parser refuses, nor miss one it accepts
(``tests/app/test_docs.py`` checks both against the parsers). Nothing here is imported by the
library; the site's build runs it through ``docs/gen/pages.py``.
"""

from __future__ import annotations

import ast
import copy
import re
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from censusdp.errors import CensusDPError

#: The key put into a table to make the parser say what it accepts.
PROBE = "zz_probe_key"


@dataclass(frozen=True)
class Family:
    """One spec family: its name, the command that reads it, its loader and its examples.

    Attributes
    ----------
    name : str
        The family (as ``censusdp predict`` names it, plus ``targets``).
    title : str
        The page heading.
    command : str
        The command line that reads it.
    intro : str
        A paragraph of Markdown.
    examples : tuple of str
        TOML texts, each a complete spec the loader accepts; together they use every key.
    files : tuple of (str, str or callable)
        Files the examples name, created beside them before parsing: a text, or a function
        that writes the file at the path it is given.
    """

    name: str
    title: str
    command: str
    intro: str
    examples: tuple[str, ...]
    files: tuple[tuple[str, str | Callable[[Path], Any]], ...] = ()


def _load_run(path: Path) -> Any:
    from censusdp.pipelines.specs import load_spec

    return load_spec(path)


def _load_codebook(path: Path) -> Any:
    from censusdp.pipelines.products.codebook_tables import load_table_spec

    return load_table_spec(path)


def _load_ppmf(path: Path) -> Any:
    from censusdp.pipelines.products.ppmf_persons import load_ppmf_spec

    return load_ppmf_spec(path)


def _load_units(path: Path) -> Any:
    from censusdp.pipelines.products.ppmf_units import load_units_spec

    return load_units_spec(path)


def _load_predict(path: Path) -> Any:
    from censusdp.pipelines.predict import load_predict_spec

    return load_predict_spec(path)


def _load_targets(path: Path) -> Any:
    from censusdp.pipelines.allocate import load_targets
    from censusdp.pipelines.predict import load_predict_spec

    spec = path.parent / "predict.toml"
    spec.write_text(PREDICT_FOR_TARGETS, encoding="utf-8")
    return load_targets(path, load_predict_spec(spec))


def _saved_hierarchy(path: Path) -> None:
    from censusdp.hierarchy.storage import save_hierarchy
    from censusdp.hierarchy.synthetic import synthetic_state

    save_hierarchy(synthetic_state(0, blocks=40).hierarchy, path)


LOADERS: dict[str, Callable[[Path], Any]] = {
    "run": _load_run,
    "codebook": _load_codebook,
    "ppmf": _load_ppmf,
    "ppmf_units": _load_units,
    "predict": _load_predict,
    "targets": _load_targets,
}

PREDICT_FOR_TARGETS = """
[predict]
schema = "pl94"
[hierarchy]
synthetic = "state"
blocks = 40
"""

RUN = """
[data]
source = "csv"                  # where the counts come from: csv, parquet, nhgis, midwest, synthetic
path = "counties.csv"           # the data file, relative to the spec (or --data FILE)
cells = ["M_*", "F_*"]          # the cell columns: names or glob patterns
truth = "sf2010"                # the version (or column) holding the confidential truth
version_column = "version"      # long files: the column naming each row's version
encoding = "utf-8"              # the file's text encoding

[hierarchy]
levels = ["nation", "state", "county"]   # root first; every level below the root has codes
codes = { state = "fips:2", county = "fips" }   # column, or column:prefix length, per level

[privacy]
accounting = "zcdp"             # "zcdp" takes rho; "pure" takes epsilon
rho = 1.0                       # the total budget ρ (zCDP)
delta = 1e-10                   # also state (ε, δ) at this δ (zcdp only)
level_shares = { state = 0.5, county = 0.5 }    # the budget's split over levels (sum 1)
query_shares = { county = { total = 0.5, age = 0.5 } }   # within a level, over its queries

[queries]                       # per level: "total", "detailed" or a marginal's name
state = ["total"]
county = ["total", "age"]

[marginals.age]                 # a marginal (named by you): one row per group of cells
groups = { young = "*_0-4", old = "*_85+" }   # row label = cell pattern or list of cells

[invariants]                    # per level: a query released exactly
nation = "total"
acknowledge_exact_release = true   # allow invariants that fix every measured value

[mechanism]
noise = "discrete_gaussian"     # the noise law (a registered name matching the accounting)
allow_floating_point = false    # required true for the continuous laws (laplace, gaussian)

[estimators]
run = ["gls", "topdown"]        # the estimators run on the same measurements
integer = "round"               # round (unbiased rounding), lattice or none

[estimators.mcmc]               # the conditioning estimator's certified sampler
tv_bound = 0.01                 # release once the coupling bound on TV is below this
max_iterations = 100000         # give up (an error) after this many iterations
chains = 4                      # coupled chains

[run]
repetitions = 1                 # independent releases (at most 1,000)
seed = 12345                    # reproducible mode, for tests only: omit for a secure key
scheduler = "threads"           # sync, threads, distributed or tls://HOST:PORT
partitions = 4                  # partitions of the tree (at most 100,000)

[output]
dir = "out/"                    # the output folder (or --out DIR)
"""

RUN_PURE = """
[data]
source = "midwest"
cells = ["popwhite", "popblack"]
[hierarchy]
levels = ["region", "state", "county"]
[privacy]
accounting = "pure"
epsilon = 1.0                   # the total budget ε (pure DP)
[queries]
county = ["detailed"]
[mechanism]
noise = "discrete_laplace"
[run]
scheduler = "distributed"
address = "tls://scheduler.example:8786"   # join a running Dask scheduler (TLS off the loopback)
tls_ca_file = "ca.pem"          # the scheduler's certificate authority
tls_cert = "client.pem"         # this client's certificate
tls_key = "client.key"          # and its key
allow_insecure_network = false  # true lets a plain tcp:// address leave the loopback
"""

CODEBOOK = """
[data]
source = "nhgis"                # the codebook route reads NHGIS-style files
codebook = "ppdd"               # a shipped codebook's name, or a codebook TOML file
schema = "ppdd"                 # checked against the codebook's schema
encoding = "latin-1"            # the file's text encoding
path = "aianhh.csv"             # the input (or the FILE argument of privatize)
level_column = "SUMLEV"         # the column telling each row's summary level

[privacy]
accounting = "zcdp"             # discrete Gaussian measurements compose in zCDP
rho = 1.0                       # the per-person ρ of the whole file
delta = 1e-10                   # also state (ε, δ) at this δ

[strategy]                      # default: the codebook's own strategy
queries = ["total", "votingage * hispanic * cenrace", "sex * age", "hhgq"]   # product queries
shares = [0.1, 0.5, 0.3, 0.1]   # one share per query

[mechanism]
noise = "discrete_gaussian"     # the only law of this route

[run]
seed = 1                        # reproducible mode, for tests only
"""

CODEBOOK_TREE = """
[data]
source = "nhgis"
codebook = "ppdd"
level = "county"                # every row's summary level, where the file does not tell it

[privacy]
accounting = "zcdp"
rho = 1.0
"""

CODEBOOK_HIERARCHY = """
[data]
source = "nhgis"
codebook = "ppdd"

[privacy]
accounting = "zcdp"
rho = 1.0

[hierarchy]                     # the hierarchy route: an output folder with both products
levels = ["nation", "state", "county"]   # root first, the rows' level last

[invariants]                    # per level above the rows: "total" held exact
state = "total"

[evaluate]                      # the size-class report and its confidential evaluation/
repetitions = 10                # simulated releases (at least 2)
"""

_RELEASE_TAIL = """
[privacy]
accounting = "zcdp"             # discrete Gaussian measurements compose in zCDP
rho = 2.556                     # default: the allocation's own (the 2020 production ρ)
delta = 1e-10                   # also state (ε, δ) at this δ

[mechanism]
noise = "discrete_gaussian"     # the only law of this route

[hierarchy]
blocks = "blocks.csv"           # the public list of every block (or --blocks FILE)
block_column = "GEOID20"        # its block column (default: the first of block, BLOCKID, GEOID20, ...)

[report]
repetitions = 10                # simulated releases for the size-class bias (2 to 1,000)

[run]
seed = 1                        # reproducible mode, for tests only
"""


def _allocation(n_queries: int) -> str:
    """An ``[allocation]`` for a strategy of ``n_queries`` queries (equal shares)."""
    shares = "[" + ", ".join([f'"1/{n_queries}"'] * n_queries) + "]"
    return f"""
[allocation]                    # the strategy's shares (censusdp allocate writes them)
rho = "1"                       # ρ of the allocation: an integer or a fraction string "p/q"

[allocation.levels]             # per level, its share of ρ (summing to 1)
nation = "1/6"
state = "1/6"
county = "1/6"
tract = "1/6"
block_group = "1/6"
block = "1/6"

[allocation.queries]            # per level, the shares of the strategy's queries, in its order
nation = {shares}
state = {shares}
county = {shares}
tract = {shares}
block_group = {shares}
block = {shares}
"""


PPMF = (
    """
[data]
source = "ppmf"                 # the Census Bureau's PPMF persons layout
path = "ppmf.csv"               # the input (or the FILE argument of privatize)
"""
    + _RELEASE_TAIL
    + """
[areas]                         # off-spine areas (places) as sums of blocks (or --areas FILE)
file = "places.txt"             # a block → area file
level = "place"                 # the areas' level name in the outputs
block_column = "BLOCKID"        # its block column
area_column = "PLACEFP"         # its area column
skip_blank = true               # blocks in no area have a blank code
gisjoin = false                 # the block codes are GISJOINs
list = "place_list.csv"         # every area (each must contain a block)
share = 0.1                     # measure the areas too, with this share of the total ρ
queries = ["total"]             # what every area answers
"""
)

PPMF_ALLOCATION = """
[data]
source = "ppmf"
[privacy]
accounting = "zcdp"
[hierarchy]
blocks = "blocks.csv"
""" + _allocation(11)

UNITS = (
    """
[data]
source = "ppmf_units"           # the PPMF units layout (RTYPE, HH_STATUS)
"""
    + _RELEASE_TAIL
)

UNITS_ALLOCATION = """
[data]
source = "ppmf_units"
[privacy]
accounting = "zcdp"
[hierarchy]
blocks = "blocks.csv"
""" + _allocation(1)

PREDICT = """
[predict]
schema = "pl94"                 # a shipped schema's name, or a schema TOML file
invariants = { nation = ["total"], state = ["total"] }   # per level, query texts held exact
tables = ["total", "votingage * hispanic * cenrace"]      # the tables predicted (default: the strategy)
quantiles = [0.5, 0.9]          # quantiles of the SE over nodes in summary.csv

[hierarchy]
synthetic = "state"             # a synthetic geography: "state" or "us"
blocks = 2000                   # its blocks (state: 1 to 1,500,000; us: to 22,000,000)
seed = 0                        # its layout seed
"""

PREDICT_FILE = """
[predict]
schema = "pl94"

[hierarchy]
file = "geo.npz"                # or a saved hierarchy of public geography (save_hierarchy)
""" + _allocation(11).replace("(censusdp allocate writes them)", "(default: the schema's)")

TARGETS = """
[objective]
kind = "sum"                    # minimise the sum (or "max") of the targets' relative variances
floor = 0.01                    # every measured query keeps at least this share of its start
tolerance = 0.001               # stop on this certified duality gap (relative)

[population]                    # a typical population per level (the relative variances' size)
tract = 4000

[[target]]                      # one per table whose relative variance counts (at least one)
level = "tract"                 # a level of the spec's hierarchy
table = "total"                 # a product query text of the spec's schema
weight = 1.0                    # its weight in the objective
share = 0.5                     # (max objective) its variance share
"""

FAMILIES: tuple[Family, ...] = (
    Family(
        "run",
        "Run specs",
        "censusdp run SPEC; censusdp privatize FILE --spec SPEC (cell tables); censusdp predict",
        "A table of cells on a hierarchy read from code columns: what `censusdp run` executes "
        "and what `privatize` uses for an NHGIS cells file. The shipped `midwest_demo` and "
        "`nhgis_under1` specs (`censusdp spec show NAME`) are of this family.",
        (RUN, RUN_PURE),
        (("counties.csv", "fips,version\n"),),
    ),
    Family(
        "codebook",
        "Codebook specs (NHGIS tables)",
        "censusdp privatize FILE --spec SPEC (with [data] codebook)",
        "NHGIS-style files whose columns are overlapping tables of one histogram, released "
        "through a codebook.",
        (CODEBOOK, CODEBOOK_TREE, CODEBOOK_HIERARCHY),
    ),
    Family(
        "ppmf",
        "PPMF persons specs",
        "censusdp privatize PPMF.csv --spec SPEC -o OUTDIR",
        "The Census Bureau's Privacy-Protected Microdata File (persons), released with the "
        "2020 production `pl94` strategy.",
        (PPMF, PPMF_ALLOCATION),
        (("blocks.csv", "GEOID20\n"), ("places.txt", ""), ("place_list.csv", "")),
    ),
    Family(
        "ppmf_units",
        "PPMF units specs",
        "censusdp privatize UNITS.csv --spec SPEC -o OUTDIR",
        "The PPMF units file (housing units and group quarters), released as H1.",
        (UNITS, UNITS_ALLOCATION),
        (("blocks.csv", "GEOID20\n"),),
    ),
    Family(
        "predict",
        "Predict specs",
        "censusdp predict SPEC",
        "The exact standard errors of a schema release before any noise is drawn; "
        "`censusdp predict` also reads every family above.",
        (PREDICT, PREDICT_FILE),
        (("geo.npz", _saved_hierarchy),),
    ),
    Family(
        "targets",
        "Allocation targets",
        "censusdp allocate SPEC --target TARGETS.toml -o NEW_SPEC",
        "What `censusdp allocate` optimises: tables at levels and how they are weighed.",
        (TARGETS,),
    ),
)


# ----------------------------------------------------------------------------------- probing
@dataclass(frozen=True)
class Section:
    """One table of a family's specs as the parser checks it.

    Attributes
    ----------
    path : str
        Dotted path (``""`` for the top level; ``target[]`` for an array of tables).
    accepted : tuple of str or None
        The keys the parser accepts there, in its order; None where the keys are named by
        the user (levels, marginals) and the parser checks them against those.
    refusal : str
        The parser's message for the probe key, the spec's file name left out.
    """

    path: str
    accepted: tuple[str, ...] | None
    refusal: str


def _accepted_from(message: str) -> tuple[str, ...] | None:
    """The key list in a refusal: ``expected one of [...]`` or ``use [...]`` / ``use a, b``."""
    m = re.search(r"(?:expected one of|; use) (\[[^\]]*\])", message)
    if m:
        return tuple(ast.literal_eval(m.group(1)))
    m = re.search(r"; use ([\w]+(?:, [\w]+)+)$", message)
    if m:
        return tuple(m.group(1).split(", "))
    return None


def _tables(doc: Any, path: str = "") -> list[tuple[str, tuple]]:
    """(dotted path, address in the document) of every table, arrays of tables by element 0."""
    out: list[tuple[str, tuple]] = []

    def walk(node: Any, dotted: str, address: tuple) -> None:
        out.append((dotted, address))
        for key, value in node.items():
            sub = f"{dotted}.{key}" if dotted else key
            if isinstance(value, Mapping):
                walk(value, sub, (*address, key))
            elif isinstance(value, list) and value and isinstance(value[0], Mapping):
                walk(value[0], f"{sub}[]", (*address, key, 0))

    walk(doc, path, ())
    return out


def _parse(family: Family, text: str, folder: Path, name: str = "spec.toml") -> None:
    for file, content in family.files:
        if not (folder / file).exists():
            if callable(content):
                content(folder / file)
            else:
                (folder / file).write_text(content, encoding="utf-8")
    path = folder / name
    path.write_text(text, encoding="utf-8")
    LOADERS[family.name](path)


def _dump(doc: Mapping[str, Any]) -> str:
    """A TOML text of ``doc`` (strings, numbers, booleans, lists and tables: what specs use)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, Mapping):
            return "{ " + ", ".join(f'"{k}" = {value(x)}' for k, x in v.items()) + " }"
        raise TypeError(type(v))

    return "".join(f'"{k}" = {value(v)}\n' for k, v in doc.items())


def probe(family: Family, example: str) -> list[Section]:
    """Every table of ``example`` with the keys the family's parser accepts there.

    Raises
    ------
    CensusDPError
        The example itself is refused (the page would document a spec that does not parse).
    RuntimeError
        A table takes the probe key silently, or refuses it for another reason than the key.
    """
    doc = tomllib.loads(example)
    sections = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _parse(family, example, folder)  # the example as written must parse
        for dotted, address in _tables(doc):
            probed = copy.deepcopy(doc)
            table = probed
            for step in address:
                table = table[step]
            table[PROBE] = 1
            try:
                _parse(family, _dump(probed), folder, "probe.toml")
            except CensusDPError as exc:
                message = str(exc).replace(str(folder / "probe.toml"), "SPEC")
            else:
                raise RuntimeError(f"{family.name}: [{dotted}] takes any key: the parser skips it")
            accepted = _accepted_from(message) if PROBE in message else None
            if accepted is None and not dotted:
                raise RuntimeError(f"{family.name}: the top level refused the probe key without "
                                   f"listing its sections: {message}")  # fmt: skip
            sections.append(Section(dotted, accepted, message))
    return sections


def family_sections(family: Family) -> dict[str, Section]:
    """The union over a family's examples: per table path, the keys its parser accepts."""
    out: dict[str, Section] = {}
    for example in family.examples:
        for s in probe(family, example):
            if s.path in out and out[s.path].accepted != s.accepted:
                raise RuntimeError(f"{family.name}: [{s.path}] accepts different keys in two "
                                   "examples")  # fmt: skip
            out.setdefault(s.path, s)
    return out


# ------------------------------------------------------------------------------------ writing
def _comments(examples: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """``dotted key -> (example value, comment)`` from the examples' lines."""
    out: dict[str, tuple[str, str]] = {}
    section = ""
    for text in examples:
        section = ""
        for line in text.splitlines():
            head = re.match(r"^\[\[?([^\]]+)\]\]?\s*(?:#\s*(.*))?$", line)
            if head:
                section = head.group(1).strip() + ("[]" if line.startswith("[[") else "")
                if head.group(2):
                    out.setdefault(f"[{section}]", ("", head.group(2).strip()))
                continue
            m = re.match(r"^([A-Za-z_][\w]*)\s*=\s*(.*?)\s*(?:#\s*(.*))?$", line)
            if m:
                key = f"{section}.{m.group(1)}" if section else m.group(1)
                if key not in out or not out[key][1]:
                    out[key] = (m.group(2), (m.group(3) or "").strip())
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def family_markdown(family: Family) -> str:
    """The page section of one family: command, example(s) and a table per section."""
    sections = family_sections(family)
    notes = _comments(family.examples)
    lines = [f"## {family.title}", "", f"Read by `{family.command}`. {family.intro}", ""]
    for i, example in enumerate(family.examples):
        label = "A complete example" if i == 0 else "Also accepted (keys that exclude the above)"
        lines += [f"{label}:", "", "```toml", example.strip(), "```", ""]
    for path, s in sections.items():
        name = f"[{path}]" if path else "top level"
        head = notes.get(f"[{path}]", ("", ""))[1]
        lines += [f"### `{name}`" if path else "### Top level", ""]
        if head:
            lines += [head[0].upper() + head[1:] + ".", ""]
        if s.accepted is None:
            lines += [
                "Keys named by you; the parser checks each against what it must name. "
                f"A wrong one is refused: `{_cell(s.refusal)}`",
                "",
            ]
            continue
        lines += ["| key | example | meaning |", "|---|---|---|"]
        for key in s.accepted:
            dotted = f"{path}.{key}" if path else key
            value, note = notes.get(dotted, ("", ""))
            for table in (dotted, f"{dotted}[]"):
                if table in sections:  # a table: its own section below says what it holds
                    note = notes.get(f"[{table}]", ("", ""))[1] or note or "a table: see below"
                    value = "(an array of tables)" if table.endswith("[]") else "(a table)"
            lines.append(f"| `{key}` | `{_cell(value)}` | {_cell(note)} |" if value else
                         f"| `{key}` | | {_cell(note)} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def spec_reference_markdown() -> str:
    """The whole spec reference page."""
    parts = [
        "# Spec reference",
        "",
        "Generated when the site is built, from the spec parsers themselves "
        "(`docs/gen/specref.py`): every example below is parsed by the loader its command "
        "uses, and each section's keys are the ones that parser accepts, read from its "
        "refusal of a probe key. An unknown key is always an error (exit status 2) naming the "
        "file and the dotted key, with the accepted keys or the closest one.",
        "",
        "Budgets and shares are kept as exact rationals (denominators up to 10¹²); every "
        "relative path is relative to the spec file.",
        "",
    ]
    parts += [family_markdown(f) for f in FAMILIES]
    return "\n".join(parts)
