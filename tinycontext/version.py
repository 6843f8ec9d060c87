"""The package version, at the ground so adapters read it without importing the public API module."""

__version__ = "0.1.0"
