"""Exceptions. Everything nightlab raises on purpose derives from `NightlabError`.

Each error carries the process exit code the CLI uses (README, "Commands"): 1 when an operation
failed, 2 for bad usage or bad input. Messages are one line, name the offending value in
backticks and say what to do next.
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Sequence

MAX_MESSAGE = 2000  # characters of an error line; a 10,000-character id is shown cut
_UNPRINTABLE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}  # controls, formats (bidi), separators, unassigned


def one_line(message: str) -> str:
    """An error message safe to print as one terminal line.

    Messages quote the user's value, and a value can hold a newline, `\\r`, NUL, an ANSI
    escape or a right-to-left override (found by tests/reliability): those are shown
    escaped (`\\n`, `\\x00`, `\\u202e`), never interpreted by the terminal.
    """
    out = "".join(
        ch.encode("unicode_escape").decode() if unicodedata.category(ch) in _UNPRINTABLE else ch
        for ch in message
    )
    return out if len(out) <= MAX_MESSAGE else out[: MAX_MESSAGE - 1] + "…"


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

    def __init__(self, message: str) -> None:
        # the message quotes values from the file, and a TOML string can hold a newline
        super().__init__(one_line(message))


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


class WaitTimeoutError(NightlabError):
    """`wait` gave up before the experiments ended; `experiments` holds their state at that moment."""

    def __init__(self, message: str, experiments: Sequence[object] = ()) -> None:
        super().__init__(message)
        self.experiments = list(experiments)


def closest_first(name: str, known: Sequence[str]) -> list[str]:
    """`known` with the close matches to `name` first, best first, then the rest in their order.

    The one suggestion rule of every "unknown NAME" message (knobs, tiers): case is ignored and
    difflib's ratio decides (cutoff 0.5, the default 0.6 misses `LR` for `MATRIX_LR`-style typos).
    """
    by_upper = {k.upper(): k for k in known}
    close = difflib.get_close_matches(name.upper(), list(by_upper), n=max(1, len(by_upper)), cutoff=0.5)
    ordered = [by_upper[c] for c in close]
    return ordered + [k for k in known if k not in ordered]


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """`did you mean `X`? ` for the closest match of `name` in `known`, or `` when none is close."""
    by_upper = {k.upper(): k for k in known}
    close = difflib.get_close_matches(name.upper(), list(by_upper), n=1, cutoff=0.5)
    return f"did you mean `{by_upper[close[0]]}`? " if close else ""
