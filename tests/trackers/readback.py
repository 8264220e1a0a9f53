"""Read what the real tracker libraries stored, through their own APIs (tests only).

W&B offline runs are read from the `.wandb` record logs with wandb's own `DataStore` and
protobuf `Record`s (what `wandb sync` uploads); every send of a run in offline mode is a folder
of its own holding the same run id, which `wandb sync` merges into one run, so the folders of one
id are merged here the same way, later sends overriding earlier ones. MLflow runs are read back
through `MlflowClient`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labkit import nightlab, wait_until


def wandb_runs(lab: Path) -> dict[str, dict[str, Any]]:
    """run id -> {project, group, job_type, name, tags, config, summary, files, history, sends}."""
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal import datastore

    runs: dict[str, dict[str, Any]] = {}
    for path in sorted((lab / ".nightlab" / "wandb").glob("offline-run-*/run-*.wandb")):
        store = datastore.DataStore()
        store.open_for_scan(str(path))
        run: dict[str, Any] | None = None
        while (data := store.scan_data()) is not None:
            record = pb.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                r = record.run
                run = runs.setdefault(r.run_id, {"config": {}, "summary": {}, "files": set(), "history": []})
                run.update(project=r.project, group=r.run_group, job_type=r.job_type, name=r.display_name)
                run["tags"] = list(r.tags)
                run["sends"] = run.get("sends", 0) + 1
                run["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
            elif run is None:
                continue
            elif kind == "config":
                run["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
            elif kind == "summary":
                items = record.summary.update
                run["summary"].update(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                )
            elif kind == "files":
                run["files"].update(f.path for f in record.files.files)
            elif kind == "history":
                run["history"].append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                )
            elif kind == "exit":
                run["exit_code"] = record.exit.exit_code
    return runs


def mlflow_runs(uri: str, experiment: str) -> dict[str, Any]:
    """`nightlab.run` tag -> the MLflow run (with `.artifacts`, a list of paths, set on it)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return {}
    out = {}
    for run in client.search_runs([exp.experiment_id], max_results=10000):
        key = run.data.tags["nightlab.run"]
        assert key not in out, f"two MLflow runs carry `nightlab.run = {key}`"
        out[key] = run
    return out


def mlflow_artifacts(uri: str, run_id: str) -> dict[str, str]:
    from mlflow import MlflowClient
    from mlflow.artifacts import download_artifacts

    client = MlflowClient(tracking_uri=uri)
    out = {}
    for info in client.list_artifacts(run_id):
        local = download_artifacts(run_id=run_id, artifact_path=info.path, tracking_uri=uri)
        out[info.path] = Path(local).read_text()
    return out


def mlflow_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow import MlflowClient

    return [(m.step, m.value) for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)]


def trackers_state(lab: Path) -> dict[str, dict]:
    """`nightlab status --json`'s trackers, by name."""
    state = json.loads(nightlab("status", "--json", cwd=lab).stdout)
    return {t["tracker"]: t for t in state["trackers"]}


def wait_sent(lab: Path, name: str, n: int, timeout: float = 180) -> dict:
    """Until tracker `name` has sent `n` runs and has none queued; returns its status."""
    return wait_until(
        lambda: (t := trackers_state(lab)[name])["sent"] >= n and t["queued"] == 0 and t,
        timeout=timeout,
        interval=0.5,
    )
