"""censusdp.options.with_keywords: settings given one by one applied over an options object."""

from __future__ import annotations

import dataclasses

import pytest

from censusdp.options import with_keywords


@dataclasses.dataclass(frozen=True)
class _Opts:
    a: int = 1
    b: str = "x"


def test_defaults_options_and_keywords_over_options():
    assert with_keywords(_Opts, None, {}, "f") == _Opts()
    given = _Opts(a=5)
    assert with_keywords(_Opts, given, {}, "f") is given
    assert with_keywords(_Opts, given, {"b": "y"}, "f") == _Opts(a=5, b="y")
    assert with_keywords(_Opts, None, {"a": 2, "b": "z"}, "f") == _Opts(a=2, b="z")
    assert given == _Opts(a=5)  # frozen: the caller's object is not changed


def test_unknown_keyword_and_wrong_type_are_refused():
    with pytest.raises(TypeError, match=r"^f\(\) got unexpected keyword argument\(s\) 'c', 'd'; "
                       r"its options are the fields of _Opts: a, b$"):  # fmt: skip
        with_keywords(_Opts, None, {"d": 1, "a": 1, "c": 2}, "f")
    with pytest.raises(TypeError, match=r"options must be a _Opts, not dict"):
        with_keywords(_Opts, {"a": 1}, {}, "f")  # type: ignore[arg-type]
