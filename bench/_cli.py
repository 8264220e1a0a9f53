"""What the bench scripts share: running the real `nightlab` CLI as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def nightlab(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float | None = None) -> str:
    """Run `nightlab ARGS` in `cwd`; its stdout, or exit with its error (a bench cannot go on)."""
    proc = subprocess.run(
        [sys.executable, "-m", "nightlab", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        sys.exit(f"nightlab {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout
