"""Live logging: the controller's tracker worker sends every finished run to the real W&B (offline)
and MLflow (SQLite) libraries, and `nightlab export` afterwards agrees with it.

Read back through each library's own API (`readback.py`): run count, config / params, metrics,
tags, files / artifacts, groups / parent runs, the incumbent's series. Crashes and timeouts are
logged with their class. Run: `.venv/bin/python -m pytest tests/trackers/test_live_logging.py -q`
"""

from __future__ import annotations

import json

from readback import mlflow_artifacts, mlflow_history, mlflow_runs, wait_sent, wandb_runs

from labkit import nightlab, wait_json

TRACKERS = """
[trackers.wandb]
project = "nightlab-test"
entity = "team"
mode = "offline"

[trackers.mlflow]
tracking_uri = "sqlite:///tracking/mlflow.db"
experiment = "night"
ui_url = "http://127.0.0.1:5000"
"""


def _ids(proc) -> list[str]:
    return [line for line in proc.stdout.split() if line.startswith("e")]


def test_every_run_reaches_both_trackers_live_and_an_export_agrees(tracked_lab):
    lab = tracked_lab(TRACKERS, slots=2, timeout=8)
    nightlab("submit", "-m", "baseline", "--repeats", "2", cwd=lab)
    nightlab("sweep", "LR=0.02,0.05", "-m", "lr grid", cwd=lab)
    nightlab("submit", "-m", "it crashes", "--set", 'MODE="crash"', cwd=lab)
    nightlab("submit", "-m", "it hangs", "--set", 'MODE="hang"', cwd=lab)
    wait_json(lab, "--all", timeout=120)
    done = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)["experiments"]
    by_id = {d["id"]: d for d in done}
    assert len(by_id) == 6
    wait_sent(lab, "wandb", 6)
    wait_sent(lab, "mlflow", 6)
    held = json.loads(nightlab("show", "e0001", "--json", cwd=lab).stdout)["trackers"]
    lab_id = next(t["run_id"] for t in held if t["tracker"].startswith("wandb:")).split("-")[0]

    # ---- MLflow: one run per experiment, a parent run per wave, one incumbent run; nothing twice
    uri = f"sqlite:///{lab}/tracking/mlflow.db"
    runs = mlflow_runs(uri, "night")
    expected = {f"{lab_id}-e000{i}" for i in range(1, 7)} | {f"{lab_id}-w001", f"{lab_id}-incumbent-cpu"}
    assert set(runs) == expected
    base = runs[f"{lab_id}-e0001"]
    assert base.info.run_name == "e0001" and base.info.status == "FINISHED"
    assert base.data.params["tier"] == "cpu" and base.data.params["seed"] == str(by_id["e0001"]["seed"])
    assert base.data.params["LR"] == "0.01" and base.data.params["snapshot"]  # the knobs as set
    assert base.data.metrics["val_bpb"] == by_id["e0001"]["val_bpb"]
    assert {"training_seconds", "peak_vram_mb"} <= set(base.data.metrics)
    assert base.data.tags["verdict"] == "baseline" and base.data.tags["outcome"] == "ok"
    assert base.data.tags["trust"] == "self-reported" and base.data.tags["proposer"] == "cli"
    assert base.data.tags["mlflow.note.content"] == "baseline"
    swept = runs[f"{lab_id}-e0003"]
    assert swept.data.params["LR"] == "0.02" and swept.data.tags["wave"] == "w001"
    assert swept.data.tags["mlflow.parentRunId"] == runs[f"{lab_id}-w001"].info.run_id
    assert swept.data.tags["proposer"] == "sweep:full"
    crash = runs[f"{lab_id}-e0005"]
    assert crash.info.status == "FAILED" and crash.data.tags["outcome"] == "crash:exception"
    assert crash.data.tags["class"] == "crash" and crash.data.tags["verdict"] == "crash"
    assert "boom at step 3" in crash.data.tags["detail"]
    hung = runs[f"{lab_id}-e0006"]
    assert hung.info.status == "FAILED" and hung.data.tags["outcome"] == "timeout"
    files = mlflow_artifacts(uri, swept.info.run_id)
    assert set(files) == {"diff.patch", "log_tail.txt"}
    assert "+LR = 0.02" in files["diff.patch"] and "val_bpb:" in files["log_tail.txt"]
    assert "ValueError: boom at step 3" in mlflow_artifacts(uri, crash.info.run_id)["log_tail.txt"]
    incumbent = runs[f"{lab_id}-incumbent-cpu"]
    assert mlflow_history(uri, incumbent.info.run_id, "val_bpb") == [(1, by_id["e0001"]["val_bpb"])]

    # ---- W&B (offline): the same runs under the same ids, the wave as the group
    wb = wandb_runs(lab)
    assert set(wb) == expected - {f"{lab_id}-w001"}  # a wave is a group in W&B, not a run
    w3 = wb[f"{lab_id}-e0003"]
    assert w3["project"] == "nightlab-test" and w3["group"] == "w001" and w3["job_type"] == "experiment"
    assert w3["config"]["LR"] == 0.02 and w3["config"]["tier"] == "cpu" and w3["config"]["wave"] == "w001"
    assert w3["summary"]["val_bpb"] == by_id["e0003"]["val_bpb"] and w3["summary"]["proposer"] == "sweep:full"
    assert {"diff.patch", "log_tail.txt"} <= w3["files"]
    assert wb[f"{lab_id}-e0005"]["exit_code"] == 1 and wb[f"{lab_id}-e0005"]["summary"]["class"] == "crash"
    assert wb[f"{lab_id}-e0006"]["summary"]["outcome"] == "timeout"
    assert wb[f"{lab_id}-incumbent-cpu"]["history"][0]["incumbent/val_bpb"] == by_id["e0001"]["val_bpb"]

    # ---- the dashboard's and `show`'s links: MLflow's page (ui_url), W&B's page once synced
    links = {
        t["tracker"].split(":")[0]: t["url"]
        for t in json.loads(nightlab("show", "e0003", "--json", cwd=lab).stdout)["trackers"]
    }
    assert (
        links["mlflow"]
        == f"http://127.0.0.1:5000/#/experiments/{swept.info.experiment_id}/runs/{swept.info.run_id}"
    )
    assert links["wandb"] == f"https://wandb.ai/team/nightlab-test/runs/{lab_id}-e0003"

    # ---- an export after live logging finds everything up to date: it agrees, nothing is duplicated
    for name in ("mlflow", "wandb"):
        again = json.loads(nightlab("export", name, "--json", cwd=lab).stdout)
        assert (again["sent"], again["unchanged"], again["incumbent_points"]) == (0, 6, 0)
    sends = {k: v["sends"] for k, v in wandb_runs(lab).items()}

    # ---- a later change (an adoption) is sent live as an update of the same runs
    nightlab("adopt", "e0003", "--force", cwd=lab)
    wait_sent(lab, "mlflow", 6)
    after = mlflow_runs(uri, "night")
    assert set(after) == expected
    assert after[f"{lab_id}-e0003"].data.tags["adopted"] == "yes"
    assert after[f"{lab_id}-e0003"].info.run_id == swept.info.run_id
    assert [v for _, v in mlflow_history(uri, incumbent.info.run_id, "val_bpb")][-1] == by_id["e0003"][
        "val_bpb"
    ]
    wait_sent(lab, "wandb", 6)
    wb = wandb_runs(lab)
    assert set(wb) == expected - {f"{lab_id}-w001"}
    assert wb[f"{lab_id}-e0003"]["summary"]["adopted"] == "yes"
    assert wb[f"{lab_id}-e0003"]["sends"] == sends[f"{lab_id}-e0003"] + 1
    assert wb[f"{lab_id}-e0001"]["sends"] == sends[f"{lab_id}-e0001"]  # unchanged: not sent again
