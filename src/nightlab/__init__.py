"""nightlab: an autonomous ML research lab."""

__version__ = "0.1.0"
