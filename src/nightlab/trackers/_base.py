"""`BaseTracker`: the contract every experiment tracker (W&B, MLflow) implements.

Implementer's contract:
- `log_run` creates the run of a record, or updates it when the destination already has a run
  of the same `record.run_id` (a re-send must never make a second run), and returns
  (the tracker's id of the run, its web page or None);
- `log_incumbent` appends points to the incumbent's own run of a tier (only points newer than
  the ones it was given before: the caller keeps track, in the ledger);
- any failure raises; the caller records it, retries later and never loses the experiment;
- the library is imported in `__init__`, never at module import, so nightlab works without it.
"""

from __future__ import annotations

import importlib
import re
from abc import ABC, abstractmethod
from pathlib import Path
from types import ModuleType

from nightlab.config import LabConfig
from nightlab.errors import UsageError
from nightlab.trackers._record import RunRecord, WaveRecord

TRACKERS = ("wandb", "mlflow")


class BaseTracker(ABC):
    """One configured destination (see the module docstring for the contract)."""

    name: str  # `wandb` | `mlflow`: the `[trackers.<name>]` table and the `nightlab[<name>]` extra
    key: str  # the destination (`WandbConfig.key`, `MlflowConfig.key`): its cursor in the ledger

    @abstractmethod
    def log_run(self, record: RunRecord, wave: WaveRecord | None) -> tuple[str, str | None]:
        """Create or update the run of `record` (grouped under `wave`); returns (run id, page url)."""

    @abstractmethod
    def log_incumbent(
        self, tier: str, metric: str, points: list[tuple[int, str, float]], lab_id: str
    ) -> None:
        """Append (experiment seq, experiment id, incumbent figure) points to the tier's incumbent run."""

    def close(self) -> None:
        """Release the library's resources (default: nothing to release)."""


def require(module: str, extra: str) -> ModuleType:
    """Import a tracker's library, or fail with the one line that installs it.

    Raises:
        UsageError: the library is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UsageError(
            f"`[trackers.{extra}]` is configured but {module} is not installed ({e}); "
            f"Please run: pip install 'nightlab[{extra}]'"
        ) from e


def safe_name(text: str) -> str:
    """A tier or wave name as a run id segment (W&B ids take letters, digits, `_` and `-`)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)


def make_tracker(name: str, config: LabConfig, lab_dir: Path) -> BaseTracker:
    """The configured tracker `name` (`wandb` | `mlflow`), its library imported now.

    Raises:
        UsageError: `[trackers.<name>]` is not configured, or its library is not installed.
    """
    section = getattr(config.trackers, name, None)
    if section is None:
        raise UsageError(
            f"nightlab.toml has no `[trackers.{name}]`; add it (docs/trackers.md) and "
            "`git commit nightlab.toml`"
        )
    if name == "wandb":
        from nightlab.trackers._wandb import WandbTracker

        return WandbTracker(section, lab_dir)
    from nightlab.trackers._mlflow import MlflowTracker

    return MlflowTracker(section, lab_dir)
