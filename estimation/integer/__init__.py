"""Integer releases: laminar and controlled unbiased rounding, dependent rounding, the
non-negative product, capped-simplex projections and the lattice mechanisms' release policy.
"""
