"""The package version, in a module of its own so `--version` needs no torch."""

__version__ = "0.1.0"
