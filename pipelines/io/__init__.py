"""Readers and writers of external file formats (the 2020 Noisy Measurement File: :mod:`.nmf`)."""
