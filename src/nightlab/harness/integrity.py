"""The harness checks its own files before it scores.

The scoring path is the installed `nightlab` package (the harness, the profile and config
readers, the errors). Its expected SHA-256 digests come from one of two places:

- a regular install: the wheel's `RECORD` (written at install time, one digest per file);
- an editable (development) install, whose RECORD lists no source file: the digests the fleet
  controller took when it started (`snapshot()`), handed to every attempt's supervisor.

`verify(expected)` re-hashes the files and names the first that changed, appeared or vanished; the
supervisor makes such an attempt `invalid`. In the sandbox the package is read-only, so a run
cannot change it at all; unsandboxed, this catches a train.py that patched the harness on disk
(the hash of every file, ~40 of them, takes ~5 ms).

Usage:
    expected = expected_digests()          # in the controller
    problem = verify(expected)             # in the supervisor, before scoring; None when intact
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

__all__ = ["expected_digests", "package_files", "snapshot", "verify"]

_PACKAGE = Path(__file__).resolve().parents[1]  # .../nightlab


def package_files() -> list[Path]:
    """The files the scoring path loads: every .py file of the `nightlab` package but the web UI."""
    return sorted(p for p in _PACKAGE.rglob("*.py") if "web" not in p.relative_to(_PACKAGE).parts[:1])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot() -> dict[str, str]:
    """The current digest of every package file, keyed by its path relative to the package."""
    return {str(p.relative_to(_PACKAGE)): _digest(p) for p in package_files()}


def _record_digests() -> dict[str, str] | None:
    """Install-time digests from the distribution's RECORD, when it lists the package's files."""
    from importlib import metadata

    try:
        files = metadata.files("nightlab") or []
    except metadata.PackageNotFoundError:
        return None
    found = {}
    for f in files:
        parts = Path(str(f)).parts
        if f.hash is None or f.hash.mode != "sha256" or not parts or parts[0] != "nightlab":
            continue
        rel = str(Path(*parts[1:]))
        if rel.endswith(".py") and not rel.startswith("web"):
            raw = base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4))
            found[rel] = raw.hex()
    return found or None


def expected_digests() -> dict[str, str]:
    """What the package's files must hash to: RECORD when installed, else the files as they are now."""
    return _record_digests() or snapshot()


def verify(expected: dict[str, str]) -> str | None:
    """None when every scoring-path file matches `expected`, else a one-line reason naming the file."""
    current = snapshot()
    for rel in sorted(set(expected) | set(current)):
        where = _PACKAGE / rel
        if rel not in current:
            return f"harness file `{where}` is missing; reinstall nightlab (`pip install --force-reinstall nightlab`)"
        if rel not in expected:
            return f"harness file `{where}` was added after nightlab was installed; remove it or reinstall"
        if current[rel] != expected[rel]:
            return f"harness file `{where}` was modified (sha256 {current[rel][:12]}, expected {expected[rel][:12]})"
    return None


def dumps(expected: dict[str, str]) -> str:
    """The digests as JSON, for the supervisor's command line file."""
    return json.dumps(expected, sort_keys=True)
