"""This release's version (what worker rows and schema versions record)."""

__version__ = "0.2.0"
