"""The dashboard's experiment page (and `show --json`) link a run to its page in each tracker.

Run: `.venv/bin/python -m pytest tests/trackers/test_links.py -q`
"""

from __future__ import annotations

import json

from labkit import nightlab, wait_json
from nightlab.ledger import open_ledger


def test_the_experiment_page_links_each_tracker_run_that_has_a_page(make_lab):
    from fastapi.testclient import TestClient

    from nightlab.web.app import create_app

    lab = make_lab()
    nightlab("submit", "-m", "baseline", cwd=lab)
    wait_json(lab, "e0001", timeout=120)
    page = "http://mlflow.example:5000/#/experiments/1/runs/abc123"
    with open_ledger(lab) as ledger:
        ledger.tracker_sent(
            "mlflow:http://mlflow.example:5000#n", "e0001", run_id="abc123", url=page, digest="d1"
        )
        ledger.tracker_sent("wandb:/p:offline", "e0001", run_id="x-e0001", url=None, digest="d1")
    shown = json.loads(nightlab("show", "e0001", "--json", cwd=lab).stdout)["trackers"]
    assert [(t["run_id"], t["url"]) for t in shown] == [("abc123", page), ("x-e0001", None)]
    with TestClient(create_app(lab)) as client:
        html = client.get("/experiments/e0001").text
    assert f'<dt>MLflow</dt><dd><a class="tracker" href="{page}"' in html
    assert "W&amp;B" not in html  # an offline run without an entity has no page yet: no link
