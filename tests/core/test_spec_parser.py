"""Core's generic spec parser (:mod:`censusdp.config`): one-line errors naming the file and the
dotted key, never the value; and no vocabulary of the layers above it (issue 34: the run
spec's sections live in :mod:`censusdp.pipelines.spec`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import censusdp.config as config
from censusdp.config import SpecParser, dotted_key, kind_of, read_spec_toml
from censusdp.errors import SpecError

#: Words of the run spec and the layers above core: a section, an option or a scheduler's.
UPPER = ("estimators", "mcmc", "tv_bound", "scheduler", "tls_", "dask", "marginals", "hierarchy")


def _upper_words(source: str) -> list[str]:
    """The ``UPPER`` words in the string constants of ``source`` (docstrings included)."""
    texts = [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant)]
    return sorted({w for t in texts if isinstance(t, str) for w in UPPER if w in t.lower()})


def test_core_parser_names_no_upper_layer_vocabulary():
    assert _upper_words(Path(config.__file__).read_text(encoding="utf-8")) == []
    # power: the check sees a section name where one is written
    assert _upper_words('X = ("run", "tls_ca_file")\nY = "[estimators]"') == ["estimators", "tls_"]


def test_unknown_key_is_named_by_its_dotted_path_with_the_closest_match():
    p = SpecParser("s.toml", None)
    p.keys({"rho": 1}, "privacy", ("rho", "delta"))  # accepted: no error
    with pytest.raises(SpecError) as err:
        p.keys({"rhoo": 1}, "privacy", ("rho", "delta"))
    assert str(err.value) == "s.toml: unknown key 'privacy.rhoo'; did you mean 'privacy.rho'?"
    with pytest.raises(SpecError) as err:
        p.keys({"zzz": 1}, "", ("data", "privacy"))
    assert str(err.value) == "s.toml: unknown key 'zzz'; expected one of ['data', 'privacy']"


def test_a_wrong_type_names_the_type_never_the_value():
    p = SpecParser("s.toml", None)
    assert p.get({"seed": 7}, "run", "seed", int) == 7
    with pytest.raises(SpecError) as err:
        p.get({"seed": "8675309"}, "run", "seed", int)
    assert str(err.value) == "s.toml: run.seed: expected an integer, got a string"
    assert "8675309" not in str(err.value)
    assert kind_of(True) == "a boolean" and kind_of(1.5) == "a float"
    assert dotted_key("", "data") == "data" and dotted_key("privacy", "rho") == "privacy.rho"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "the spec file is empty"),
        (b"[data]\rsource = 1\r", "bare carriage return"),
        (b"\xff\xfe[data]", "not valid UTF-8"),
        (b"[data\n", "TOML syntax error"),
    ],
)
def test_read_spec_toml_refuses_on_one_line_naming_the_file(tmp_path, raw, message):
    path = tmp_path / "s.toml"
    path.write_bytes(raw)
    with pytest.raises(SpecError) as err:
        read_spec_toml(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_read_spec_toml_reads_a_byte_order_mark_and_crlf(tmp_path):
    path = tmp_path / "s.toml"
    path.write_bytes(b'\xef\xbb\xbf[data]\r\nsource = "csv"\r\n')
    assert read_spec_toml(path) == {"data": {"source": "csv"}}
