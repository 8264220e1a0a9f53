"""Exceptions. Everything nightlab raises on purpose derives from `NightlabError`.

Each error carries the process exit code the CLI uses (DESIGN.md): 1 when an operation
failed, 2 for bad usage or bad input. Messages are one line, name the offending value in
backticks and say what to do next.
"""

from __future__ import annotations


class NightlabError(Exception):
    """Root of nightlab's errors: an operation failed (exit code 1)."""

    exit_code = 1


class UsageError(NightlabError):
    """Bad usage or bad input: a flag, a spec, a config value (exit code 2)."""

    exit_code = 2


class NotALabError(UsageError):
    """The directory is not a nightlab lab."""


class ConfigError(UsageError):
    """`nightlab.toml` is missing a key or holds a value of the wrong kind."""


class UnknownExperimentError(UsageError):
    """No experiment with that id in the ledger."""


class DuplicateExperimentError(UsageError):
    """The same snapshot was already measured on that tier with that seed."""


class SnapshotError(NightlabError):
    """A snapshot could not be created or materialised."""


class LedgerError(NightlabError):
    """The ledger database could not be read or written."""


class ControllerError(NightlabError):
    """The fleet controller could not be started, reached or stopped."""
