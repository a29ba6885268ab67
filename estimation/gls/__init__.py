"""Projection (GLS) estimation: the public two-pass kernel, its flat (`tree`) and structured
front ends, exact error prediction before any noise, areas as sums of blocks, and budget allocation.
"""
