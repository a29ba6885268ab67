"""censusdp.pipelines — run a spec over a hierarchy on one machine or over Dask; NHGIS-style I/O."""
