"""One way to write an experiment's ``report.md``: a header from the experiment's metadata,
then sections, paragraphs, tables, figures and the privacy statement, in order.

Every experiment's report used to start with its own copy of the title, the reference and
the figure list, and to draw its tables row by row with hand-written ``|`` separators;
:class:`Report` holds those once (tables through
:func:`~censusdp.pipelines.report.markdown_table`). Their figures all began with the same
three lines choosing matplotlib's file backend; :func:`pyplot` is that once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any

import pandas as pd

from censusdp.budget import PrivacyStatement
from censusdp.experiments.registry import ExperimentContext, experiment_info
from censusdp.pipelines.report import markdown_table

__all__ = ["Report", "pyplot"]


class Report:
    """A ``report.md`` under construction; ``str(report)`` is its text.

    Parameters
    ----------
    name : str
        The experiment's registered name (its ``INFO`` gives the one-line summary and the
        paper reproduced).
    ctx : ExperimentContext, optional
        Says whether this is a ``--quick`` run (then the header says the numbers are not
        the full study's).
    title : str, optional
        A heading other than the name.
    summary : bool
        Put the experiment's one-line summary (``INFO.reproduces``) under the title.
    """

    def __init__(
        self,
        name: str,
        ctx: ExperimentContext | None = None,
        *,
        title: str | None = None,
        summary: bool = False,
    ) -> None:
        self.info = experiment_info(name)
        self.lines: list[str] = [f"# {title or name}", ""]
        if summary:
            self.text(self.info.reproduces)
        if ctx is not None and ctx.quick:
            self.text(
                "*Quick run (`--quick`): a small form of the study for checking the code; its "
                "figures are not the study's.*"
            )

    def section(self, title: str, level: int = 2) -> Report:
        """A heading (``##`` by default)."""
        self.lines += ["#" * level + " " + title, ""]
        return self

    def text(self, *paragraphs: str) -> Report:
        """Paragraphs, each followed by a blank line."""
        for p in paragraphs:
            self.lines += [p, ""]
        return self

    def bullets(self, items: Iterable[str]) -> Report:
        """A bulleted list."""
        self.lines += [f"* {item}" for item in items] + [""]
        return self

    def table(
        self,
        rows: pd.DataFrame | Sequence[Mapping[str, Any]] | Sequence[Sequence[Any]],
        columns: Sequence[str] | None = None,
        formats: str | Mapping[str, str] = ".3g",
    ) -> Report:
        """A markdown table from a DataFrame, from dicts (keys are the columns) or from
        sequences with ``columns``; ``formats`` as for
        :func:`~censusdp.pipelines.report.markdown_table` (one format, or one per column)."""
        if isinstance(rows, pd.DataFrame):
            df = rows if columns is None else rows[list(columns)]
        elif columns is not None and rows and not isinstance(rows[0], Mapping):
            df = pd.DataFrame([list(r) for r in rows], columns=list(columns))
        else:
            df = pd.DataFrame(list(rows), columns=None if columns is None else list(columns))
        self.lines += [markdown_table(df, formats), ""]
        return self

    def figures(self, files: Mapping[str, str]) -> Report:
        """The figures written, ``{file name: what it shows}``."""
        listed = "; ".join(f"`{f}` ({what})" if what else f"`{f}`" for f, what in files.items())
        return self.text(("Figures: " if len(files) > 1 else "Figure: ") + listed + ".")

    def privacy(self, statement: PrivacyStatement | str) -> Report:
        """The privacy statement (derived, or a stated sentence for studies without one)."""
        text = statement.text() if isinstance(statement, PrivacyStatement) else statement
        return self.text(f"Privacy: {text}")

    def reference(self, text: str | None = None) -> Report:
        """The paper reproduced (``INFO.paper`` unless ``text`` is given)."""
        ref = text if text is not None else self.info.paper
        return self.text(f"Reference: {ref}") if ref else self

    def __str__(self) -> str:
        return "\n".join(self.lines)


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` drawing to files (the Agg backend, no display needed).

    Imported on first use, so listing or importing an experiment does not load matplotlib;
    save with :meth:`~censusdp.experiments.registry.ExperimentContext.savefig`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
