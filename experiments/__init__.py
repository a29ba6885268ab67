"""censusdp.experiments — one module per reproduced study.

An experiment named ``foo-bar`` is the module ``censusdp.experiments.foo_bar`` with a function
``run(ctx: ExperimentContext) -> dict`` returning its metrics; see
:mod:`censusdp.experiments.registry`.
"""
