"""Fixtures of the red-team suite; the kit itself is `redteam.py` (a unique module name)."""

from redteam import attack, data_root, honest, honest_local, local_labs  # noqa: F401 - pytest finds fixtures by name
