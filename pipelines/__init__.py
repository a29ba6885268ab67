"""censusdp.pipelines — run a spec over a hierarchy on one machine or over Dask.

Layout: the run spec and its registries (``spec``, ``specs``, ``plan``, ``estimators``), measurement and
execution (``measure``, ``execute``, ``partition``, ``partition_driver``: one driver for every
partitioned step), ``io/`` (NHGIS, PPMF and NMF readers and writers, output columns, the one
checksummed release store), ``products/`` (the registry of file products — cells table, NHGIS
codebook tables, PPMF persons and units, the PL94 stream, the Noisy Measurement File — each
with ``claims``, a typed spec and ``run``), and reports (``report``, ``metrics``,
``size_class_report``)."""
