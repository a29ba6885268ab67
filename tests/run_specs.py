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


#: A small NHGIS file (two states, two counties each; `_dp` and `_sf` columns) and its spec:
#: the input of the hostile and SIGTERM tests' workspaces.
SMALL_NHGIS = (
    "gisjoin,name,state,H78003_dp,H78024_dp,H78003_sf,H78024_sf\n"
    "G0100010,A,Alabama,3,4,3,5\nG0100030,B,Alabama,6,2,7,1\n"
    "G0200010,C,Alaska,1,1,2,0\nG0200020,D,Alaska,8,9,8,9\n"
)
SMALL_NHGIS_SPEC = """
[data]
source = "nhgis"
cells = ["H78003", "H78024"]
[hierarchy]
levels = ["nation", "state", "county"]
[privacy]
accounting = "zcdp"
rho = 0.5
[queries]
county = ["detailed"]
[invariants]
state = "detailed"
[mechanism]
noise = "discrete_gaussian"
[estimators]
run = ["gls"]
"""
