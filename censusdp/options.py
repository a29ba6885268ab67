"""Typed option groups for functions whose settings outgrew their signature.

A public function takes its data as parameters and its settings as one frozen dataclass
(e.g. :class:`~censusdp.pipelines.structured_stream.StreamOptions`). Callers written before the
dataclass existed passed the settings one by one as keyword arguments; for one release the
function still accepts them and applies them over the dataclass with :func:`with_keywords`,
so an unknown keyword is refused as clearly as the old signature refused it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["with_keywords"]

T = TypeVar("T")


def with_keywords(cls: type[T], options: T | None, keywords: dict[str, Any], function: str) -> T:
    """``options`` (default: ``cls()``) with ``keywords`` (field name → value) applied.

    Parameters
    ----------
    cls : dataclass type
        The options' type.
    options : cls or None
        The options given; None for every default.
    keywords : dict
        Fields of ``cls`` given as keyword arguments to ``function``; they win over
        ``options``.
    function : str
        The function's name, for the error.

    Returns
    -------
    cls
        ``options`` itself when ``keywords`` is empty, else a new instance.

    Raises
    ------
    TypeError
        A keyword that is no field of ``cls`` (named, with the fields to use), or
        ``options`` of another type.
    """
    if options is not None and not isinstance(options, cls):
        raise TypeError(
            f"{function}(): options must be a {cls.__name__}, not {type(options).__name__}"
        )
    base = cls() if options is None else options
    if not keywords:
        return base
    fields = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(keywords) - set(fields))
    if unknown:
        raise TypeError(
            f"{function}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"its options are the fields of {cls.__name__}: {', '.join(fields)}"
        )
    return dataclasses.replace(base, **keywords)  # type: ignore[type-var]
