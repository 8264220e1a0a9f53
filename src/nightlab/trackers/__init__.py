"""Experiment trackers: every finished run of a lab in Weights & Biases and MLflow, live.

Configured in `[trackers.wandb]` / `[trackers.mlflow]` of nightlab.toml (docs/trackers.md). The
controller keeps one worker process beside itself (`python -m nightlab.trackers LAB`, started
through the hook `fleet.daemon` hands it, so the fleet imports nothing of this package); the worker
reads the ledger's outbox and sends each experiment that ends, is re-judged or is adopted
(`_outbox.follow`), one thread per tracker. A tracker that is down, slow or misconfigured only
delays its own thread: runs are dispatched and recorded exactly as without it, and what it
missed is sent when it works again. `nightlab export wandb|mlflow` sends a whole lab through the
same `Sender`, so live logging and an export agree.

Modules: `_record` (what is sent: `RunRecord`, the incumbent's line), `_base` (`BaseTracker`, the
contract), `_wandb`, `_mlflow` (one per tracker; each imports its library only when built),
`_outbox` (`Sender`, `follow`), `_export` (`export`, `tracker_status`), `__main__` (the worker).
"""

from __future__ import annotations

from nightlab.trackers._base import TRACKERS, BaseTracker, make_tracker
from nightlab.trackers._export import export, tracker_status
from nightlab.trackers._outbox import Sender, follow
from nightlab.trackers._record import LabView, RunRecord, WaveRecord

__all__ = [
    "TRACKERS",
    "BaseTracker",
    "LabView",
    "RunRecord",
    "Sender",
    "WaveRecord",
    "export",
    "follow",
    "make_tracker",
    "tracker_status",
]
