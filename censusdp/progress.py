"""What a long run says while it works: ``logging`` and progress bars, both on stderr.

The command line's global flags set the verbosity for one command (:func:`verbosity`):

- ``-q`` (quiet, level -1): warnings and errors only, no progress bars;
- default (level 0): warnings and errors, and progress bars when stderr is a terminal (a
  script, a pipe or a log file sees only the one-line error of a failure);
- ``-v`` (level 1): progress bars wherever stderr goes, and one ``censusdp: ...`` line per
  stage (``logging.INFO``);
- ``-vv`` (level 2 and above): also ``logging.DEBUG`` lines (e.g. the solvers' banners).

A bar is closed (its last state and a newline written) before a command's error line, so an
error is always the last line on stderr.

Stdout carries only a command's results (tables, ``wrote ...`` lines), so a pipeline can read
it; everything here goes to stderr. Bars are :func:`tqdm_bar`'s (a widget in a Jupyter kernel
that has ``ipywidgets``, text elsewhere: a terminal, a captured stderr, or a kernel without
``ipywidgets``, whose stderr the notebook shows), drawn by the code that runs a stage when
:func:`show_progress` says so (:func:`censusdp.pipelines.runner.execute_spec`; the
``privatize`` routes of PPMF persons, units and codebook files through :func:`progress_bar`,
with their stage lines beside the stage timings, as ``predict``'s). Library
calls outside the command line keep their own defaults: :func:`show_progress` returns the
caller's default unless a command set a verbosity.

Modules log through ``logging.getLogger(__name__)`` (all under the ``censusdp`` logger);
nothing here is imported at the command line's start but :mod:`logging` itself.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

__all__ = [
    "QUIET",
    "VERBOSE",
    "current_verbosity",
    "progress_bar",
    "show_progress",
    "tqdm_bar",
    "tqdm_class",
    "verbosity",
]

#: ``-q``: warnings only, no bars.
QUIET = -1
#: ``-v``: a line per stage; ``-vv`` (2) debug lines too.
VERBOSE = 1

#: The verbosity a running command set; None outside the command line.
_LEVEL: int | None = None


def current_verbosity() -> int | None:
    """The verbosity set by the running command (:func:`verbosity`), None when none is."""
    return _LEVEL


@contextlib.contextmanager
def verbosity(level: int) -> Iterator[logging.Logger]:
    """Route the ``censusdp`` logger to stderr at ``level`` for the duration of a command.

    Parameters
    ----------
    level : int
        :data:`QUIET` (-1), 0 (bars), :data:`VERBOSE` (1: stage lines) or 2+ (debug lines).

    Yields
    ------
    logging.Logger
        The ``censusdp`` logger; its handler and level are restored on exit, so a command run
        in-process (tests, notebooks) leaves logging as it found it.
    """
    global _LEVEL
    log = logging.getLogger("censusdp")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("censusdp: %(message)s"))
    saved_level, saved_log_level, saved_propagate = _LEVEL, log.level, log.propagate
    _LEVEL = level
    log.setLevel(logging.WARNING if level < 1 else logging.INFO if level == 1 else logging.DEBUG)
    log.propagate = False
    log.addHandler(handler)
    try:
        yield log
    finally:
        log.removeHandler(handler)
        _LEVEL, log.propagate = saved_level, saved_propagate
        log.setLevel(saved_log_level)


def show_progress(default: bool) -> bool:
    """Whether to draw progress bars: off under ``-q``, on a terminal by default, always
    with ``-v``; ``default`` (the caller's own choice) outside the command line."""
    if _LEVEL is None:
        return default
    if _LEVEL == 0:
        return sys.stderr.isatty()
    return _LEVEL > 0


def tqdm_class() -> type:
    """The ``tqdm`` class that draws a bar where this process runs.

    ``tqdm.notebook.tqdm`` (a widget) in a Jupyter kernel that can import ``ipywidgets``;
    ``tqdm.std.tqdm`` (text on stderr) everywhere else, a kernel without ``ipywidgets``
    included. This replaces ``tqdm.auto``, which in such a kernel picks the widget class all
    the same and warns (``TqdmWarning: IProgress not found``) on import: the first output of
    a notebook that imported censusdp. Nothing is imported but ``tqdm`` itself (and, in a
    kernel, the check for ``ipywidgets``).

    Returns
    -------
    type
        A ``tqdm`` subclass, called like ``tqdm``.
    """
    if _in_jupyter_kernel():
        import importlib.util

        if importlib.util.find_spec("ipywidgets") is not None:
            from tqdm.notebook import tqdm as notebook_tqdm

            return notebook_tqdm
    from tqdm.std import tqdm as std_tqdm

    return std_tqdm


def _in_jupyter_kernel() -> bool:
    """Whether this process is an IPython kernel (Jupyter, VS Code, nbclient), as tqdm's own
    ``autonotebook`` tells it: an ``IPKernelApp`` in the running shell's configuration."""
    ipython = sys.modules.get("IPython")  # never imported here: a kernel has it loaded
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # an IPython too old or half-initialised: not a kernel we can use
        return False
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def tqdm_bar(*args: Any, **kwargs: Any) -> Any:
    """A bar of :func:`tqdm_class`, with ``tqdm``'s own arguments (``total``, ``desc``,
    ``unit``, ``disable``, ...); what every censusdp module draws its bars with."""
    return tqdm_class()(*args, **kwargs)


def progress_bar(total: int | None, desc: str, unit: str, *, default: bool = False) -> Any:
    """A :func:`tqdm_bar` drawn when :func:`show_progress` says so (``default`` outside the
    command line), for a route's stage loop; use it as a context manager, so that it is
    closed (its last state and a newline written) before an error propagates and the error
    stays the last line on stderr.

    Parameters
    ----------
    total : int or None
        The steps the bar counts (None: a counter without an end).
    desc : str
        Its label, ``censusdp <stage>`` by convention.
    unit : str
        What one step is (``block``, ``release``, ...).
    default : bool
        Whether a library call (no command's verbosity set) draws it.
    """
    # tqdm is imported by the call, not at the command line's start (a light parser)
    return tqdm_bar(total=total, desc=desc, unit=unit, disable=not show_progress(default))
