"""A small run spec and its data shared by the CLI tests (a state → county CSV, one cell).

Tests that need a variant append sections (``SMALL_SPEC + "[run]\\n..."``) or replace a line.
"""

SMALL_DATA = "fips,pop\n01001,10\n01003,20\n02001,5\n02002,7\n"

SMALL_SPEC = """
[data]
source = "csv"
path = "data.csv"
cells = ["pop"]
[hierarchy]
levels = ["nation", "state", "county"]
codes = { state = "fips:2", county = "fips" }
[privacy]
accounting = "pure"
epsilon = 1.0
level_shares = { state = 0.5, county = 0.5 }
[queries]
state = ["detailed"]
county = ["detailed"]
[mechanism]
noise = "discrete_laplace"
[estimators]
run = ["gls"]
"""
