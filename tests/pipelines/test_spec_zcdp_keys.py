"""The discrete-Gaussian routes (PPMF persons, PPMF units, codebook tables) read ``[privacy]``,
``[mechanism]`` and ``[run]`` through one rule (:func:`censusdp.pipelines.spec.zcdp_keys`):
the same spec sections are accepted by all three and the same mistakes refused by all three,
each on one line naming the file and the dotted key."""

from __future__ import annotations

import pytest

from censusdp.errors import SpecError
from censusdp.pipelines.products.codebook_tables import load_table_spec
from censusdp.pipelines.products.ppmf_persons import load_ppmf_spec
from censusdp.pipelines.products.ppmf_units import load_units_spec

DATA = {
    "ppmf": ('[data]\nsource = "ppmf"\n', load_ppmf_spec),
    "units": ('[data]\nsource = "ppmf_units"\n', load_units_spec),
    "codebook": ('[data]\nsource = "nhgis"\ncodebook = "ppdd"\n', load_table_spec),
}
GOOD = (
    '[privacy]\naccounting = "zcdp"\nrho = 2.0\ndelta = 1e-10\n'
    '[mechanism]\nnoise = "discrete_gaussian"\n[run]\nseed = 7\n'
)
BAD = {
    "privacy.accounting": ('accounting = "zcdp"', 'accounting = "pure"'),
    "privacy.delta": ("delta = 1e-10", "delta = 1.0"),
    "privacy.epsilon": ("rho = 2.0", "rho = 2.0\nepsilon = 1.0"),
    "mechanism.noise": ('noise = "discrete_gaussian"', 'noise = "laplace"'),
    "run.seed": ("seed = 7", "seed = -1"),
}


@pytest.mark.parametrize("route", sorted(DATA))
def test_a_valid_spec_is_read_the_same_by_every_route(route, tmp_path):
    head, load = DATA[route]
    path = tmp_path / "spec.toml"
    path.write_text(head + GOOD, encoding="utf-8")
    spec = load(path)
    assert float(spec.rho) == 2.0 and spec.delta == 1e-10 and spec.seed == 7


@pytest.mark.parametrize("route", sorted(DATA))
@pytest.mark.parametrize("key", sorted(BAD))
def test_every_route_refuses_the_same_mistake_naming_file_and_key(route, key, tmp_path):
    head, load = DATA[route]
    path = tmp_path / "spec.toml"
    path.write_text(head + GOOD.replace(*BAD[key]), encoding="utf-8")
    with pytest.raises(SpecError) as err:
        load(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and key in message and "\n" not in message
