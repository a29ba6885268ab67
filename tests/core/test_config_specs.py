"""Run specs: the two example specs parse; malformed specs raise SpecError naming the key."""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from censusdp.errors import SpecError
from censusdp.mechanisms.registry import law_info
from censusdp.pipelines.spec import REDACTED, CodeSpec, RunSpec
from censusdp.pipelines.specs import load_spec, parse_spec

SPECS = Path(__file__).parent / "specs"


def _county_doc() -> dict:
    return tomllib.loads((SPECS / "county.toml").read_text())


def _midwest_doc() -> dict:
    return tomllib.loads((SPECS / "midwest.toml").read_text())


def test_county_spec_parses():
    spec = load_spec(SPECS / "county.toml")
    assert isinstance(spec, RunSpec)
    assert spec.source.endswith("county.toml")
    assert spec.levels == ("nation", "state", "county")
    assert spec.hierarchy.codes == {"state": CodeSpec("fips", 2), "county": CodeSpec("fips")}
    assert spec.data.path == SPECS / "county_sex_age5_2010.csv"  # resolved against the spec
    assert spec.data.cells == ("M_*", "F_*")
    assert spec.queries["county"] == ("total", "sex", "detailed")
    assert spec.queries["nation"] == ("detailed",)
    assert spec.invariants == {"nation": ("total",), "state": ("total",)}
    assert spec.marginals["broad_age"].groups["under5"] == ("M_0-4", "F_0-4")
    assert spec.privacy.accounting == "zcdp" and spec.privacy.total == 2.5
    assert spec.privacy.query_shares["nation"] == {"detailed": 1.0}  # single query: share 1
    assert law_info(spec.mechanism.noise).integer
    assert spec.estimators.mcmc.max_iterations == 50000
    assert spec.run.seed == 20261121 and spec.run.reproducible
    assert spec.output.dir == Path("out/county")
    alloc = spec.allocation()
    assert alloc[("county", "detailed")] == pytest.approx(2.5 * 0.6 * 0.5)
    assert sum(alloc.values()) == pytest.approx(2.5)
    statement = spec.statement()
    assert statement.guarantee == "induced subspace differential privacy"
    assert statement.invariants == ("nation: total", "state: total")


def test_midwest_spec_parses_with_defaults():
    spec = load_spec(SPECS / "midwest.toml")
    assert spec.data.source == "midwest" and spec.data.path is None
    assert spec.hierarchy.codes == {}
    assert spec.privacy.accounting == "pure" and spec.privacy.delta is None
    assert spec.run.seed is None and spec.run.scheduler == "sync" and spec.run.repetitions == 2
    assert spec.estimators.mcmc.tv_bound == 0.01 and spec.estimators.mcmc.chains == 4
    assert spec.output.dir is None
    single = _midwest_doc()
    single["queries"] = {"county": "detailed"}
    del single["privacy"]["level_shares"], single["privacy"]["query_shares"]
    assert parse_spec(single).allocation() == {("county", "detailed"): 1.0}


def test_seed_is_never_shown_or_serialised():
    spec = load_spec(SPECS / "county.toml")
    assert "20261121" not in repr(spec) and "20261121" not in str(spec.run)
    d = spec.to_dict()
    assert d["run"]["seed"] == REDACTED
    assert "20261121" not in repr(d)
    assert "seed" not in load_spec(SPECS / "midwest.toml").to_dict()["run"]


@pytest.mark.parametrize("name", ["county.toml", "midwest.toml"])
def test_to_dict_round_trips(name):
    spec = load_spec(SPECS / name)
    assert parse_spec(spec.to_dict(redact_seed=False), source=spec.source) == spec


def _set(path: str, value: object) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return mutate


def _delete(path: str) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[key]
        del node[last]

    return mutate


# (mutation of the county spec, substrings the message must contain)
MALFORMED = {
    "unknown key": (
        _set("privacy.level_share", {"county": 1.0}),
        ["unknown key 'privacy.level_share'", "did you mean 'privacy.level_shares'?"],
    ),
    "unknown section": (_set("invarients", {}), ["unknown key 'invarients'", "'invariants'"]),
    "nested unknown key": (
        _set("estimators.mcmc.chain", 3),
        ["unknown key 'estimators.mcmc.chain'", "'estimators.mcmc.chains'"],
    ),
    "wrong type": (_set("hierarchy.levels", "county"), ["hierarchy.levels", "expected an array"]),
    "wrong type number": (_set("privacy.rho", "1.0"), ["privacy.rho", "expected a number"]),
    "shares do not sum to 1": (
        _set("privacy.level_shares.county", 0.5),
        ["privacy.level_shares", "sum to 0.9"],
    ),
    "query shares do not sum to 1": (
        _set("privacy.query_shares.county.sex", 0.3),
        ["privacy.query_shares.county", "sum to 1.1"],
    ),
    "negative share": (
        _set("privacy.query_shares.state", {"total": 1.5, "detailed": -0.5}),
        ["privacy.query_shares.state.detailed", "must be positive"],
    ),
    "non-positive rho": (_set("privacy.rho", 0.0), ["privacy.rho", "must be positive"]),
    "negative epsilon": (
        lambda d: (
            d["privacy"].update(accounting="pure", epsilon=-1.0)
            or d["privacy"].pop("rho")
            or d["privacy"].pop("delta")
            or d["mechanism"].update(noise="laplace")
        ),
        ["privacy.epsilon", "must be positive"],
    ),
    "unknown noise": (
        _set("mechanism.noise", "discrete_gausian"),
        ["mechanism.noise", "'discrete_gausian'", "did you mean 'discrete_gaussian'?"],
    ),
    "accounting/noise mismatch": (
        _set("mechanism.noise", "discrete_laplace"),
        ["mechanism.noise", "accounted under 'pure'", "privacy.accounting is 'zcdp'"],
    ),
    "epsilon given for zcdp": (
        _set("privacy.epsilon", 1.0),
        ["privacy.epsilon", "takes a total 'rho'"],
    ),
    "delta for pure": (
        lambda d: (
            d["privacy"].update(accounting="pure", epsilon=1.0)
            or d["privacy"].pop("rho")
            or d["mechanism"].update(noise="laplace")
        ),
        ["privacy.delta", "pure accounting has no delta"],
    ),
    "invariant level not in levels": (
        _set("invariants.tract", "total"),
        ["unknown level 'invariants.tract'", "hierarchy.levels is"],
    ),
    "query at unknown level": (
        _set("queries.countee", ["total"]),
        ["unknown level 'queries.countee'", "did you mean 'queries.county'?"],
    ),
    "unknown query": (
        _set("queries.county", ["total", "age"]),
        ["queries.county[1]", "unknown query 'age'"],
    ),
    "unknown invariant query": (_set("invariants.state", "sexx"), ["invariants.state[0]", "'sex'"]),
    "query shares for unknown query": (
        _set("privacy.query_shares.state", {"total": 0.4, "detailed": 0.3, "sex": 0.3}),
        ["unknown query 'privacy.query_shares.state.sex'"],
    ),
    "query shares for unmeasured level": (
        _set("privacy.query_shares.nation", {"detailed": 0.5, "total": 0.5}),
        ["unknown query 'privacy.query_shares.nation.total'"],
    ),
    "level share for unmeasured level": (
        lambda d: d["queries"].pop("nation"),
        ["unknown measured level 'privacy.level_shares.nation'"],
    ),
    "missing query shares": (
        _delete("privacy.query_shares"),
        ["privacy.query_shares.state", "missing"],
    ),
    "bad scheduler": (
        _set("run.scheduler", "dask"),
        ["run.scheduler", "'dask' is not one of ['sync', 'threads', 'distributed']"],
    ),
    "address without distributed": (_set("run.scheduler", "threads"), ["run.address"]),
    "seed not an int": (_set("run.seed", "hunter2"), ["run.seed", "expected an integer"]),
    "seed is a float": (_set("run.seed", 1.5), ["run.seed", "expected an integer"]),
    "negative seed": (_set("run.seed", -3), ["run.seed", "non-negative"]),
    "bool repetitions": (_set("run.repetitions", True), ["run.repetitions", "got a boolean"]),
    "zero partitions": (_set("run.partitions", 0), ["run.partitions", "at least 1"]),
    "bad code spec": (_set("hierarchy.codes.state", "fips:x"), ["hierarchy.codes.state"]),
    "missing code": (_delete("hierarchy.codes.state"), ["hierarchy.codes", "['state']"]),
    "empty path": (_set("data.path", ""), ["data.path", "must not be empty"]),
    "bad source": (_set("data.source", "xlsx"), ["data.source", "'xlsx'"]),
    "bad encoding": (_set("data.encoding", "utf-42"), ["data.encoding"]),
    "marginal shadows builtin": (
        _set("marginals.total", {"groups": {"a": "M_*"}}),
        ["marginals.total"],
    ),
    "bad estimator": (_set("estimators.run", ["gls", "mcmc"]), ["estimators.run[1]", "'mcmc'"]),
    "tv bound out of range": (_set("estimators.mcmc.tv_bound", 1.5), ["estimators.mcmc.tv_bound"]),
    "duplicate level": (
        _set("hierarchy.levels", ["nation", "state", "state"]),
        ["hierarchy.levels", "'state' is listed twice"],
    ),
    "missing section": (_delete("mechanism"), ["missing section [mechanism]"]),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_specs(case):
    mutate, expected = MALFORMED[case]
    doc = copy.deepcopy(_county_doc())
    mutate(doc)
    with pytest.raises(SpecError) as err:
        parse_spec(doc, source="bad.toml")
    msg = str(err.value)
    assert msg.startswith("bad.toml: ")
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"
    assert "hunter2" not in msg  # values that may be secret are never echoed


def test_toml_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "broken.toml"
    bad.write_text('[data]\nsource = "csv"\npath = \n')
    with pytest.raises(SpecError, match=r"broken\.toml: TOML syntax error: .*line 3"):
        load_spec(bad)


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(SpecError, match="nothere.toml: cannot read"):
        load_spec(tmp_path / "nothere.toml")
    latin = tmp_path / "latin.toml"
    latin.write_bytes('[data]\nsource = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(SpecError, match="latin.toml: the spec is not valid UTF-8"):
        load_spec(latin)
