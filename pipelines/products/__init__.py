"""File products in a registry: each claims a path and spec, reads its file, runs and writes
its release (cells table, NHGIS codebook tables, PPMF persons and units, the PL94 stream, the NMF).
"""
