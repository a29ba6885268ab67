"""censusdp — census-style hierarchical disclosure avoidance.

Subpackages: :mod:`censusdp.hierarchy` (geography), :mod:`censusdp.mechanisms` (noise laws
and mechanisms), :mod:`censusdp.estimation` (GLS, conditioning, TopDown-style, rounding),
:mod:`censusdp.pipelines` (specs, Dask, NHGIS I/O), :mod:`censusdp.experiments`, and the
application layer :mod:`censusdp.app` (the command line). Core modules here:
:mod:`~censusdp.rng`, :mod:`~censusdp.budget`, :mod:`~censusdp.errors`,
:mod:`~censusdp.config` (the generic spec parser).
"""

__version__ = "0.1.0"
