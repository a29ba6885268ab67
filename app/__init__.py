"""The application layer: the ``censusdp`` command line, above every library layer.

core ← hierarchy ← mechanisms ← estimation ← pipelines ← experiments ← app. Each layer
registers the commands of the features it owns; :mod:`censusdp.app.cli` assembles them and
owns ``main``. Nothing in the library imports this package.
"""
