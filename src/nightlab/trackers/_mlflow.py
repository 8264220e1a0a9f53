"""MLflow: one MLflow run per experiment, a parent run per wave, through `MlflowClient`.

MLflow chooses run ids itself, so a run is found again by its tag `nightlab.run`
(`<lab id>-<experiment id>`): a re-send updates that run (tags, missing params and metrics, the
files) and never makes a second one. Params = `RunRecord.config` (MLflow params are write-once:
one already logged is left as it is), metrics = its metrics at step 0, tags = its tags plus the
description as the run's note, artifacts = diff.patch and log_tail.txt; a run that did not end
`ok` is `FAILED`. A wave is a parent run (`mlflow.parentRunId`) tagged `nightlab.run` =
`<lab id>-<wave id>`; the incumbent's line is a run per tier whose metric history has one step
per kept change (step = the experiment's number).

A `sqlite:///PATH` tracking URI with a relative PATH is the lab's (`sqlite:///mlflow.db` is
`<lab>/mlflow.db`), and an experiment this creates in such a store keeps its artifacts beside
the database (`mlartifacts/`), not in the worker's working directory. MLflow 3 no longer writes
to `file:` stores, hence none here.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from nightlab.config import MlflowConfig
from nightlab.trackers._base import BaseTracker, require, safe_name
from nightlab.trackers._record import RunRecord, WaveRecord

# the MLflow client retries a refused connection 7 times with doubling waits (over 4 minutes);
# the worker retries on its own schedule and an export is run again, so one try takes seconds.
# Set in the process's environment only when unset: a user's own choice wins.
CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
BATCH = 100  # MLflow's limit on params (and tags) per `log_batch`


def resolve_uri(uri: str, lab_dir: Path) -> str:
    """The tracking URI with a relative `sqlite:///PATH` made the lab's."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str((Path(lab_dir) / uri[len(prefix) :]).resolve())
    return uri


def _ms(t: float | None) -> int:
    return int((t if t is not None else time.time()) * 1000)


class MlflowTracker(BaseTracker):
    name = "mlflow"

    def __init__(self, config: MlflowConfig, lab_dir: Path) -> None:
        self.config, self.key = config, config.key
        for name, value in CLIENT_DEFAULTS.items():
            os.environ.setdefault(name, value)
        self.mlflow = require("mlflow", "mlflow")
        self.uri = resolve_uri(config.tracking_uri, lab_dir)
        self.client = self.mlflow.MlflowClient(tracking_uri=self.uri)
        self._experiment: str | None = None
        self._parents: dict[str, str] = {}  # wave run key -> MLflow run id

    # ------------------------------------------------------------------ lookups

    def experiment_id(self) -> str:
        if self._experiment is None:
            found = self.client.get_experiment_by_name(self.config.experiment)
            if found is not None:
                self._experiment = found.experiment_id
            else:
                location = None
                if self.uri.startswith("sqlite:///"):
                    location = (Path(self.uri[len("sqlite:///") :]).parent / "mlartifacts").as_uri()
                self._experiment = self.client.create_experiment(
                    self.config.experiment, artifact_location=location
                )
        return self._experiment

    def find(self, run_key: str) -> Any:
        """The run tagged `nightlab.run = run_key`, or None."""
        runs = self.client.search_runs(
            [self.experiment_id()], filter_string=f"tags.`nightlab.run` = '{run_key}'", max_results=1
        )
        return runs[0] if runs else None

    def _run(self, run_key: str, name: str, start: float | None, tags: dict[str, str]) -> Any:
        run = self.find(run_key)
        if run is None:
            run = self.client.create_run(
                self.experiment_id(),
                start_time=_ms(start),
                tags={"nightlab.run": run_key, **tags},
                run_name=name,
            )
        return run

    def page(self, run_id: str) -> str | None:
        base = self.config.ui_url or (self.uri if self.uri.startswith(("http://", "https://")) else None)
        if base is None:
            return None
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id()}/runs/{run_id}"

    # ------------------------------------------------------------------ runs

    def _wave_run(self, wave: WaveRecord) -> str:
        if wave.run_id not in self._parents:
            run = self._run(wave.run_id, wave.id, wave.created_at, {"nightlab.wave": wave.id})
            params = {"design": wave.design, "tier": wave.tier, "base_snapshot": wave.base_snapshot}
            self._log(run, params=params, tags={"mlflow.note.content": wave.description})
            if run.info.status != "FINISHED":
                self.client.set_terminated(run.info.run_id, "FINISHED")
            self._parents[wave.run_id] = run.info.run_id
        return self._parents[wave.run_id]

    def _log(
        self,
        run: Any,
        *,
        params: dict[str, Any],
        metrics: dict[str, float] | None = None,
        tags: dict[str, str] | None = None,
        at: float | None = None,
    ) -> None:
        """Tags always; params and metrics that the run does not hold yet (both are write-once)."""
        m = self.mlflow.entities
        have_params, have_metrics = run.data.params, run.data.metrics
        new_params = [
            m.Param(k, (v if isinstance(v, str) else json.dumps(v, default=str))[:MAX_PARAM_CHARS])
            for k, v in params.items()
            if v is not None and k not in have_params
        ]
        new_metrics = [
            m.Metric(k, v, _ms(at), 0) for k, v in (metrics or {}).items() if k not in have_metrics
        ]
        new_tags = [m.RunTag(k, v) for k, v in (tags or {}).items()]
        run_id = run.info.run_id
        for start in range(0, max(len(new_params), len(new_tags), 1), BATCH):
            self.client.log_batch(
                run_id,
                metrics=new_metrics if start == 0 else [],
                params=new_params[start : start + BATCH],
                tags=new_tags[start : start + BATCH],
            )

    def log_run(self, record: RunRecord, wave: WaveRecord | None) -> tuple[str, str | None]:
        parent = self._wave_run(wave) if wave is not None else None
        run = self._run(record.run_id, record.name, record.started_at, {})
        tags = {**record.tags, "mlflow.note.content": record.description}
        if parent is not None:
            tags["mlflow.parentRunId"] = parent
        self._log(run, params=record.config, metrics=record.metrics, tags=tags, at=record.finished_at)
        run_id = run.info.run_id
        for name, text in record.files.items():
            self.client.log_text(run_id, text, name)
        self.client.set_terminated(
            run_id, "FAILED" if record.failed else "FINISHED", end_time=_ms(record.finished_at)
        )
        return run_id, self.page(run_id)

    def log_incumbent(
        self, tier: str, metric: str, points: list[tuple[int, str, float]], lab_id: str
    ) -> None:
        run = self._run(f"{lab_id}-incumbent-{safe_name(tier)}", f"incumbent {tier}", None, {})
        m = self.mlflow.entities
        now = _ms(None)
        self.client.log_batch(
            run.info.run_id,
            metrics=[m.Metric(metric, value, now, seq) for seq, _, value in points],
            tags=[m.RunTag("incumbent", points[-1][1]), m.RunTag("tier", tier)],
        )
        if run.info.status != "FINISHED":
            self.client.set_terminated(run.info.run_id, "FINISHED")
