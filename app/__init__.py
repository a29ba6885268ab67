"""The application layer: the ``censusdp`` command line, above every library layer.

core ← hierarchy ← mechanisms ← estimation ← pipelines ← experiments ← app. Every
sub-command's parser and glue is in :mod:`censusdp.app.commands` (the only argparse code;
the library holds typed functions); :mod:`censusdp.app.cli` owns ``main``. Nothing in the
library imports this package.
"""
