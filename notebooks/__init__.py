"""The walkthrough notebooks, shipped in the wheel as ``censusdp.notebooks`` (package data).

Nothing to import here: ``censusdp notebooks list`` names them and ``censusdp notebooks copy
DIR`` copies them into a new folder (:mod:`censusdp.app.commands.notebooks`). In a clone they are the
``notebooks/`` folder of the repository; each is committed with its outputs.
"""
