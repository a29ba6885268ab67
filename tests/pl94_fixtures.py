"""Shared by the streamed pl94 engine's tests: the schema, the production plan, the basis
queries of its store, and a small synthetic U.S. with its histogram source."""

from __future__ import annotations

from censusdp.estimation.gls.predict import allocation_plan
from censusdp.hierarchy.synthetic import synthetic_us
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.products.pl94_stream import SyntheticHistogram
from censusdp.schema import Schema

SCHEMA = Schema.load("pl94")
PLAN = allocation_plan(SCHEMA)
TOTAL = ProductQuery.parse(SCHEMA, "total")
QUERIES = [q for _, q, _ in PLAN] + [TOTAL, TOTAL]


def small_us(counties: int, tracts: int, block_groups: int, blocks: int, population: int):
    """(hierarchy, source) of a two-state synthetic U.S. (seed 4): six levels, every one
    branching."""
    table = synthetic_us(4, states=2, counties=counties, tracts=tracts,
                         block_groups=block_groups, blocks=blocks, population=population)  # fmt: skip
    return table.hierarchy, SyntheticHistogram(table.leaf_counts[:, 0], 4)
