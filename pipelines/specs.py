"""Run specs checked against the registries: the names a spec may use.

:mod:`censusdp.pipelines.spec` parses a TOML spec into a :class:`~censusdp.pipelines.spec.RunSpec`
(on core's generic :mod:`censusdp.config` parser) and checks its structure, types and values,
but keeps no list of noise laws, estimators or schedulers: those live in their registries
(noise laws in :mod:`censusdp.mechanisms.registry`, estimators in
:mod:`censusdp.pipelines.estimators`, schedulers in :mod:`censusdp.pipelines.execute`).
:func:`check_spec` asks them, and :func:`load_spec` / :func:`parse_spec`, the only run-spec
loaders, parse and then check. Every problem is a :class:`~censusdp.errors.SpecError` naming
the spec and the dotted key, with the registered names and the closest match.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from censusdp.config import read_spec_toml
from censusdp.errors import SpecError
from censusdp.pipelines.spec import RunSpec, RunSpecParser

__all__ = ["check_spec", "load_spec", "parse_spec"]


def check_spec(spec: RunSpec) -> RunSpec:
    """``spec`` when every name it uses is registered and fits the rest of the spec.

        Checks, naming the spec file and key: the data source is registered (a file source lists
        its cells, a source read by code columns has one per level); the noise law is registered and of the spec's
        accounting; a continuous law is acknowledged (``allow_floating_point``, Mironov 2012)
        and an integer law is not; ``integer = "lattice"`` has an integer law; every estimator
        is registered and accepts the law; the scheduler is registered, and an address is given only
    to the distributed one; a ``tcp://`` address is
        refused off the loopback unless allowed (before any data is read).

        Raises
        ------
        SpecError
    """
    # the registries, here and not at import: a spec that core's parser refuses is refused
    # before numpy, the estimators and Dask are loaded (the command line's start stays fast)
    from censusdp.mechanisms.registry import law_info, noise_names
    from censusdp.pipelines.data import SOURCES
    from censusdp.pipelines.estimators import ESTIMATORS
    from censusdp.pipelines.execute import SCHEDULERS, scheduler_security

    where = spec.source
    source = SOURCES.get(spec.data.source, f"{where}: data.source")
    missing = [lvl for lvl in spec.levels[1:] if lvl not in spec.hierarchy.codes]
    if source.codes and missing:
        raise SpecError(
            f"{where}: hierarchy.codes: no code column for level(s) {missing}; source "
            f"{spec.data.source!r} needs one for every level below the root"
        )
    if source.file and source.schema is None and not spec.data.cells:
        raise SpecError(
            f"{where}: data.cells: missing; source {spec.data.source!r} needs its cell columns"
        )
    mech, privacy = spec.mechanism, spec.privacy
    law = law_info(mech.noise, f"{where}: mechanism.noise")
    if law.accounting != privacy.accounting:
        raise SpecError(
            f"{where}: mechanism.noise: {mech.noise!r} is accounted under {law.accounting!r} "
            f"but privacy.accounting is {privacy.accounting!r}; use a law of "
            f"{privacy.accounting!r} accounting ({list(noise_names(accounting=privacy.accounting))}) "
            f"or set privacy.accounting = {law.accounting!r}"
        )
    if spec.estimators.integer == "lattice" and not law.integer:
        raise SpecError(
            f"{where}: estimators.integer: 'lattice' samples conditioning on the integer "
            "lattice of invariant-preserving noise and needs an integer noise law, but "
            f"mechanism.noise is {mech.noise!r}; set it to one of "
            f"{list(noise_names(integer=True))}, or use integer = 'round'"
        )
    exact = noise_names(integer=True, accounting=law.accounting)
    if not law.integer and not mech.allow_floating_point:
        raise SpecError(
            f"{where}: mechanism.noise: {mech.noise!r} draws floating-point noise, which is not "
            "protected against floating-point attacks (Mironov 2012: the gaps in a float "
            f"sampler's output can reveal the true value); use an exact integer law of the same "
            f"accounting ({list(exact)}) instead, or add allow_floating_point = true to "
            "[mechanism] to release with it anyway (the privacy statement then says so)"
        )
    if law.integer and mech.allow_floating_point:
        raise SpecError(
            f"{where}: mechanism.allow_floating_point: {mech.noise!r} is an exact integer law "
            "with no floating-point sampling to acknowledge; remove the key"
        )
    for i, name in enumerate(spec.estimators.run):
        estimator = ESTIMATORS.get(name, f"{where}: estimators.run[{i}]")
        refused = estimator.accepts(law)
        if refused:
            raise SpecError(f"{where}: estimators.run[{i}]: {name!r} {refused}")
    run = spec.run
    SCHEDULERS.get(run.scheduler, f"{where}: run.scheduler")
    if run.address is not None and run.scheduler != "distributed":
        raise SpecError(
            f"{where}: run.address: only used with scheduler = 'distributed', not {run.scheduler!r}"
        )
    if run.address is not None and run.address.lower().startswith("tcp://"):
        try:
            scheduler_security(run.address, allow_insecure_network=run.allow_insecure_network)
        except SpecError as exc:
            raise SpecError(f"{where}: run.address: {exc}") from None
    return spec


def load_spec(path: str | Path) -> RunSpec:
    """Read a TOML run spec and :func:`parse_spec` it (a relative ``data.path`` is resolved
    against the spec file's directory).

    Raises
    ------
    SpecError
        Missing or unreadable file, TOML syntax error (with line and column), or any
        invalid content (naming the dotted key).
    """
    path = Path(path)
    return parse_spec(read_spec_toml(path), str(path), path.parent)


def parse_spec(
    doc: Mapping[str, Any], source: str = "<spec>", base_dir: str | Path | None = None
) -> RunSpec:
    """Validate a parsed TOML document (:class:`~censusdp.pipelines.spec.RunSpecParser`;
    ``source`` names it in messages, a relative ``data.path`` is resolved against
    ``base_dir``) and :func:`check_spec` it."""
    base = None if base_dir is None else Path(base_dir)
    return check_spec(RunSpecParser(source, base).spec(doc))
