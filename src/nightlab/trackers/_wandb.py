"""Weights & Biases: one W&B run per experiment, its wave as the run's group.

A run's id is `<lab id>-<experiment id>` (W&B lets the caller choose it), so a re-send resumes
the same run (`resume="allow"`) instead of making a new one. Config = `RunRecord.config`,
summary = its metrics and tags, files = diff.patch and log_tail.txt, the W&B tags = verdict,
outcome and tier; a run that did not end `ok` is marked failed (exit code 1). The incumbent's line
is a run of its own per tier (`<lab id>-incumbent-<tier>`, job type `incumbent`) whose history has
one step per kept change (step = the experiment's number).

In `mode = "offline"` runs are written under `.nightlab/wandb/` for `wandb sync`; W&B then has no
resume, so each send is a new offline folder holding the same run id (`wandb sync` merges them
into one run). Every `wandb.init` is silent and collects no system metrics, git or code: the
worker process logs dozens of runs and none of its own machine's state is the experiment's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nightlab.config import WandbConfig
from nightlab.trackers._base import BaseTracker, require, safe_name
from nightlab.trackers._record import RunRecord, WaveRecord

APP_URL = "https://wandb.ai"  # where an offline run's page will be once it is synced


class WandbTracker(BaseTracker):
    name = "wandb"

    def __init__(self, config: WandbConfig, lab_dir: Path) -> None:
        self.config, self.key = config, config.key
        self.dir = Path(lab_dir) / ".nightlab"  # wandb writes its run folders into `wandb/` here
        self.wandb = require("wandb", "wandb")

    def _init(self, run_id: str, **kwargs: Any) -> Any:
        w, offline = self.wandb, self.config.mode == "offline"
        settings = w.Settings(
            silent=True,
            console="off",
            x_disable_stats=True,
            x_disable_meta=True,
            disable_git=True,
            save_code=False,
            disable_job_creation=True,
            x_save_requirements=False,
        )
        return w.init(
            project=self.config.project,
            entity=self.config.entity,
            id=run_id,
            mode=self.config.mode,
            dir=str(self.dir),
            resume=None if offline else "allow",  # offline has no resume: wandb sync merges by id
            reinit="create_new",
            settings=settings,
            **kwargs,
        )

    def _url(self, run: Any, run_id: str) -> str | None:
        if run.url:
            return run.url
        if self.config.entity:  # offline: the page it will have once synced
            return f"{APP_URL}/{self.config.entity}/{self.config.project}/runs/{run_id}"
        return None

    def log_run(self, record: RunRecord, wave: WaveRecord | None) -> tuple[str, str | None]:
        tags = [t[:64] for t in (record.tags["verdict"], record.tags["outcome"], record.tags["tier"]) if t]
        run = self._init(
            record.run_id,
            name=record.name,
            notes=record.description,
            group=wave.id if wave else None,
            job_type="experiment",
            tags=tags,
        )
        try:
            run.config.update(record.config, allow_val_change=True)
            run.summary.update({**record.metrics, **record.tags})
            for name, text in record.files.items():
                path = os.path.join(run.dir, name)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                run.save(path, base_path=run.dir, policy="now")
            url = self._url(run, record.run_id)
        finally:
            run.finish(exit_code=1 if record.failed else 0)
        return record.run_id, url

    def log_incumbent(
        self, tier: str, metric: str, points: list[tuple[int, str, float]], lab_id: str
    ) -> None:
        run = self._init(
            f"{lab_id}-incumbent-{safe_name(tier)}",
            name=f"incumbent {tier}",
            job_type="incumbent",
            tags=["incumbent", tier[:64]],
        )
        try:
            run.config.update({"tier": tier, "metric": metric}, allow_val_change=True)
            for seq, _, value in points:
                run.log({f"incumbent/{metric}": value, "experiment": seq}, step=seq)
            run.summary.update({"incumbent": points[-1][1], f"incumbent/{metric}": points[-1][2]})
        finally:
            run.finish()
