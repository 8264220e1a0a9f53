"""A package only so that conftest.py's fixtures can be package-scoped: the local Slurm cluster,
the SkyPilot API server and the labs' clusters (~1 GiB, a busy API server) go when this folder's
last test ends, not when the whole session does (the rest of the suite runs after it)."""
