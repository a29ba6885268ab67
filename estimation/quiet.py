"""Solvers that keep stdout for the command's results.

cvxpy's ``verbose=False`` silences a solver's iteration log, but HiGHS (highspy ≥ 1.7, the
TopDown-style L1 and rounding LPs) prints a two-line ``Running HiGHS ...`` banner on the C
library's stdout the first time a process constructs a ``highspy.Highs`` — before any option
can be set — and cvxpy constructs one in every HiGHS solve. :func:`quiet_options` returns the
options for a silent solve and, for HiGHS, first takes that once-per-process banner off
stdout (:func:`swallow_highs_banner`): it is logged at DEBUG instead (``censusdp -v``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import tempfile
import threading

__all__ = ["quiet_options", "swallow_highs_banner"]

log = logging.getLogger(__name__)

_BANNER_LOCK = threading.Lock()
_BANNER_DONE = False


def swallow_highs_banner() -> str:
    """Construct this process's first ``highspy.Highs`` with file descriptor 1 redirected, so
    HiGHS's one-time banner does not reach stdout; returns the banner's text ("" when it was
    already printed or swallowed, or highspy is absent). Later calls do nothing.

    The C library's buffers are flushed before descriptor 1 is restored (a banner still in
    them would otherwise land on stdout later).
    """
    global _BANNER_DONE
    with _BANNER_LOCK:
        if _BANNER_DONE:
            return ""
        _BANNER_DONE = True
        try:
            import highspy
        except ImportError:  # pragma: no cover - highspy is a dependency
            return ""
        libc = ctypes.CDLL(None)
        sys.stdout.flush()
        libc.fflush(None)
        saved = os.dup(1)
        with tempfile.TemporaryFile() as sink:
            try:
                os.dup2(sink.fileno(), 1)
                highspy.Highs()
                libc.fflush(None)
            finally:
                os.dup2(saved, 1)
                os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", "replace").strip()
    if text:
        log.debug("HiGHS: %s", text.replace("\n", " / "))
    return text


def quiet_options(solver: str) -> dict:
    """cvxpy ``Problem.solve`` options for a silent ``solver``: ``verbose=False``, and for
    HiGHS ``output_flag=False`` after :func:`swallow_highs_banner`."""
    opts: dict = {"verbose": False}
    if solver.upper() == "HIGHS":
        swallow_highs_banner()
        opts["output_flag"] = False
    return opts
