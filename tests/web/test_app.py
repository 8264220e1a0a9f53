"""The dashboard's JSON endpoints and pages against the CLI's `--json` on one ledger.

Run: .venv/bin/python -m pytest -q tests/web/test_app.py
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from nightlab.web.app import create_app

TIME_DEPENDENT = ("elapsed", "remaining")


def _strip_clock(state: dict) -> dict:
    """status --json without the fields that change every second (elapsed / remaining)."""
    state = dict(state)
    state["running"] = [{k: v for k, v in r.items() if k not in TIME_DEPENDENT} for r in state["running"]]
    return state


def test_results_endpoint_is_the_cli_json(night_lab, client):
    assert client.get("/api/results").json() == night_lab.cli_json("results")


def test_status_endpoint_is_the_cli_json(night_lab, client):
    assert _strip_clock(client.get("/api/status").json()) == _strip_clock(night_lab.cli_json("status"))


def test_overview_figures_equal_the_cli(night_lab, client):
    results = night_lab.cli_json("results")
    status = night_lab.cli_json("status")
    overview = client.get("/api/overview").json()
    metric = results["metric"]
    [tier] = overview["tiers"]
    inc = results["incumbent"]["tiers"]["cpu"]
    base = results["baseline"]["tiers"]["cpu"]
    assert tier["incumbent"] == inc and tier["baseline"] == base
    assert tier["improvement"] == pytest.approx(inc["mean"] - base["mean"])
    assert tier["improvement"] < 0  # the adopted LR beats the baseline (lower is better)
    rows = results["experiments"]
    assert overview["counts"] == {
        "done": sum(r["status"] == "finished" for r in rows),
        "ok": sum(r["outcome"] == "ok" for r in rows),
        "crashed": sum(
            r["status"] == "finished" and r["outcome"] not in ("ok", "invalid", "degraded") for r in rows
        ),
        "invalid": sum(r["outcome"] == "invalid" for r in rows),
        "degraded": sum(r["outcome"] == "degraded" for r in rows),
        "running": sum(r["status"] == "running" for r in rows),
        "queued": sum(r["status"] == "queued" for r in rows),
        "cancelled": sum(r["status"] == "cancelled" for r in rows),
    }
    assert overview["counts"]["crashed"] == 1 and overview["counts"]["running"] == 2
    assert overview["leaderboard"] == [r for r in rows if r[metric] is not None][:25]
    assert overview["efficiency"] == status["efficiency"]
    assert overview["incumbent_commit"] == results["incumbent"]["commit"]


def test_fleet_efficiency_is_training_over_held_slot_time(night_lab, client):
    """Recomputed from the events and the metrics, independently of `analysis.fleet_efficiency`."""
    from nightlab.ledger import open_ledger

    with open_ledger(night_lab.path) as ledger:
        events = ledger.events(limit=100_000)
        start = [e for e in events if e.kind == "controller-start"][-1]
        stop = next(e for e in events if e.kind == "controller-stop" and e.id > start.id)
        trained = sum(
            e.metric("training_seconds")
            for e in ledger.experiments()
            if e.ok and start.ts <= e.finished_at <= stop.ts
        )
    eff = client.get("/api/overview").json()["efficiency"]
    assert eff["slots"] == 2
    assert eff["training_seconds"] == pytest.approx(trained)
    assert eff["efficiency"] == pytest.approx(trained / (2 * (stop.ts - start.ts)))


def test_progress_series_has_every_ok_run_and_the_incumbent_line(night_lab, client):
    """The line steps on a kept snapshot's mean over its runs (as progress.png does), not on its best run."""
    results = night_lab.cli_json("results")
    data = client.get("/api/progress").json()
    ok = {r["id"]: r for r in results["experiments"] if r["val_bpb"] is not None}
    assert {p["id"] for p in data["points"]} == set(ok)
    assert [p["t"] for p in data["points"]] == sorted(p["t"] for p in data["points"])
    for p in data["points"]:
        assert p["y"] == ok[p["id"]]["val_bpb"]
        assert p["verdict"] == ok[p["id"]]["verdict"]  # within-noise is drawn apart from discards
    kept = [p for p in data["points"] if p["kept"]]
    assert {p["id"] for p in kept} >= {night_lab.ids["baseline"], night_lab.ids["better"]}
    better = [p["y"] for p in kept if p["id"] in (night_lab.ids["better"], night_lab.ids["repeat"])]
    assert len(better) == 2 and better[0] != better[1]  # two seeds of the adopted snapshot
    assert data["points"][-1]["best"] == pytest.approx(sum(better) / 2)
    entry = next(p for p in data["points"] if p["id"] == night_lab.ids["better"])
    assert entry["best"] == pytest.approx(sum(better) / 2)


def test_fleet_rows_show_progress_and_live_loss(night_lab, client):
    fleet = client.get("/api/fleet").json()
    rows = {w["name"]: w for w in fleet["workers"]}
    first, second = rows["cpu-0"], rows["cpu-1"]
    assert first["experiment"]["id"] == night_lab.ids["running"] and first["state"] == "busy"
    assert first["loss"] == 2.75 and first["progress"] == pytest.approx(0.425)
    assert first["progress_source"] == "log"
    assert second["loss"] == 4.25 and second["progress_source"] == "timeout"
    assert 0 <= second["progress"] <= second["experiment"]["elapsed"] / fleet["budget_seconds"] + 1e-6
    assert [q["id"] for q in fleet["queued"]] == [night_lab.ids["queued"]]


def test_experiment_endpoint_matches_show(night_lab, client):
    for role in ("better", "crash", "running"):
        eid = night_lab.ids[role]
        shown = night_lab.cli_json("show", eid, "--tail", "60")
        page = client.get(f"/api/experiments/{eid}").json()
        assert {k: page[k] for k in shown} == shown, role
    crash = client.get(f"/api/experiments/{night_lab.ids['crash']}").json()
    assert crash["outcome"].startswith("crash") and any(
        "boom at step 3" in line for line in crash["log_tail"]
    )
    running = client.get(f"/api/experiments/{night_lab.ids['running']}").json()
    assert running["live"]["loss"] == 2.75 and running["live"]["percent"] == 42.5


def test_experiment_relatives(night_lab, client):
    ids = night_lab.ids
    better = client.get(f"/api/experiments/{ids['better']}").json()["related"]
    assert better["parent"]["id"] == ids["baseline"]
    assert [x["id"] for x in better["repeats"]] == [ids["repeat"]]
    assert {ids[f"wave{i}"] for i in range(4)} <= {x["id"] for x in better["children"]}
    wave_run = client.get(f"/api/experiments/{ids['wave0']}").json()["related"]
    assert wave_run["parent"]["id"] == ids["better"] and wave_run["parent_on_branch"]
    baseline = client.get(f"/api/experiments/{ids['baseline']}").json()["related"]
    assert {ids["better"], ids["crash"], ids["xss"]} <= {x["id"] for x in baseline["children"]}


def test_experiment_page_renders_diff_log_and_links(night_lab, client):
    ids = night_lab.ids
    html = client.get(f"/experiments/{ids['better']}").text
    assert 'class="hl"' in html  # Pygments highlighted the diff
    assert "LR = 0.02" in html
    assert f'href="/experiments/{ids["baseline"]}"' in html  # parent
    assert f'href="/experiments/{ids["repeat"]}"' in html  # repeat
    crash = client.get(f"/experiments/{ids['crash']}").text
    assert "boom at step 3" in crash


def test_unknown_experiment_and_wave_are_404(client):
    assert client.get("/api/experiments/e9999").status_code == 404
    page = client.get("/experiments/e9999")
    assert page.status_code == 404 and "unknown experiment" in page.text
    assert client.get("/api/waves/w999").status_code == 404


def test_wave_effects_are_the_cli_json(night_lab, client):
    wave = client.get(f"/api/waves/{night_lab.wave}").json()
    assert wave["design"] == "full" and wave["counts"]["done"] == 4
    cli = night_lab.cli_json("effects", night_lab.wave)
    assert wave["effects"] == {**cli, "plot": None}  # the CLI also writes a PNG; the dashboard draws it
    assert cli["factors"] == ["LR", "SLEEP"] and cli["runs"] == 4
    by_lr: dict[str, list[float]] = {}
    for r in wave["experiments"]:
        by_lr.setdefault(r["params"]["LR"], []).append(r["val_bpb"])
    terms = {t["term"]: t for t in cli["terms"]}
    high_minus_low = sum(by_lr["0.04"]) / 2 - sum(by_lr["0.015"]) / 2
    assert terms["LR"]["effect"] == pytest.approx(high_minus_low)
    assert terms["SLEEP"]["effect"] == pytest.approx(0, abs=1e-9)  # SLEEP does not move the metric
    page = client.get(f"/waves/{night_lab.wave}").text
    assert 'id="effects-chart"' in page and "LR x SLEEP" in page
    assert f'href="/waves/{night_lab.wave}"' in client.get("/waves").text


def test_partial_fragment_and_version(client):
    full = client.get("/")
    version = full.headers["X-Nightlab-Version"]
    fragment = client.get("/", params={"partial": 1})
    assert (
        fragment.status_code == 200 and "<html" not in fragment.text and 'id="leaderboard"' in fragment.text
    )
    assert client.get("/", params={"partial": 1, "since": version}).status_code == 204
    assert client.get("/", params={"partial": 1, "since": "0-stale"}).status_code == 200
    assert client.get("/fleet", params={"partial": 1}).status_code == 200


def test_overview_page_shows_the_figures(night_lab, client):
    results = night_lab.cli_json("results")
    html = client.get("/").text
    inc = results["incumbent"]["tiers"]["cpu"]
    assert f"{inc['mean']:.6f}" in html
    assert 'data-count="crashed">1<' in html and 'data-count="running">2<' in html
    first = next(r for r in results["experiments"] if r["val_bpb"] is not None)
    assert f'href="/experiments/{first["id"]}"' in html
    assert 'id="progress-chart"' in html and "/static/uPlot.iife.min.js" in html


def test_the_overview_shows_each_tiers_noise_floor_as_nightlab_noise_does(night_lab, client, make_lab):
    """Issue 32: nothing on the overview said how sure a result is."""
    floors = night_lab.cli_json("noise", "--show")["tiers"]
    [tier] = client.get("/api/overview").json()["tiers"]
    assert floors["cpu"]["sigma"] is not None  # the adopted LR ran twice
    assert (tier["noise"]["sigma"], tier["noise"]["dof"]) == (
        pytest.approx(floors["cpu"]["sigma"]),
        floors["cpu"]["dof"],
    )
    html = client.get("/").text
    assert f'data-figure="noise-cpu">noise floor ± {tier["noise"]["sigma"]:.6f}' in html
    assert f"n={tier['noise']['runs']}, {tier['noise']['dof']} dof" in html
    # a tier without repeats: unmeasured, and the command that measures it
    from fastapi.testclient import TestClient

    from labkit import nightlab, wait_json

    lab = make_lab(slots=1)
    [only] = json.loads(nightlab("submit", "-m", "one run", "--json", cwd=lab).stdout)
    wait_json(lab, only["id"])
    nightlab("fleet", "stop", cwd=lab)
    with TestClient(create_app(lab)) as c:
        html = c.get("/").text
    assert 'noise floor <span class="bad">unmeasured</span>' in html
    assert "<code>nightlab noise --tier cpu</code>" in html


def test_the_experiment_page_says_why_a_verdict_and_what_next(night_lab, client):
    """Issue 32: the run page said `within-noise` with no reason or next step."""
    from markupsafe import escape

    reasons = 0
    for role in ("better", "xss", "wave0", "wave1", "wave2", "wave3"):
        eid = night_lab.ids[role]
        shown = night_lab.cli_json("show", eid)
        page = client.get(f"/api/experiments/{eid}").json()
        assert (page["reason"], page["next_step"]) == (shown["reason"], shown["next_step"])
        html = client.get(f"/experiments/{eid}").text
        for key in ("reason", "next_step"):
            if page[key]:
                assert str(escape(page[key])) in html, (role, key)
        reasons += page["reason"] is not None
    assert reasons >= 1


def test_pages_load_nothing_from_other_hosts(client):
    for path in ("/", "/fleet", "/waves", "/agent"):
        html = client.get(path).text
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), path
    assert client.get("/static/uPlot.iife.min.js").status_code == 200
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(path).status_code == 404


def test_read_only(night_lab, client):
    from nightlab.errors import NightlabError
    from nightlab.web._readonly import ReadOnlyLab

    def stored() -> str:
        """The ledger's bytes: the database and its write-ahead log, where WAL-mode writes land first."""
        h = hashlib.sha256()
        for name in ("ledger.db", "ledger.db-wal"):
            f = night_lab.path / ".nightlab" / name
            h.update(f.read_bytes() if f.exists() else b"")
        return h.hexdigest()

    before = stored()
    from fastapi.routing import APIRoute

    routes = [r for r in client.app.routes if isinstance(r, APIRoute)]
    assert all(r.methods <= {"GET", "HEAD"} for r in routes)
    paths = [r.path for r in routes if "{" not in r.path] + ["/static/dashboard.js"]
    paths += [f"/experiments/{night_lab.ids['better']}", f"/waves/{night_lab.wave}", "/api/experiments/e0001"]
    for path in paths:
        assert client.get(path).status_code < 400, path
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            assert client.request(method, path).status_code in (404, 405), (method, path)
    assert stored() == before
    with ReadOnlyLab(night_lab.path) as lab:
        # no writer is reachable through a method: the read-only connection has none of them
        assert not hasattr(lab.ledger, "set_verdict") and not hasattr(lab.ledger, "transaction")
        with pytest.raises(NightlabError, match="readonly"):
            lab.ledger._query("DELETE FROM events")  # past every method: SQLite refuses
        adopted = lab.ledger.get(night_lab.ids["better"])  # reads still work
        assert (
            adopted.adopted_at is not None
            and adopted.verdict == night_lab.cli_json("show", adopted.id)["verdict"]
        )


def test_token_is_required_on_every_request(night_lab):
    from fastapi.testclient import TestClient

    with TestClient(create_app(night_lab.path, token="s3cret-token")) as c:
        for path in ("/", "/api/overview", "/static/dashboard.js", f"/experiments/{night_lab.ids['better']}"):
            assert c.get(path).status_code == 401, path
        assert c.get("/api/overview", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/overview", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
        opened = c.get("/", params={"token": "s3cret-token"})
        assert opened.status_code == 200 and "HttpOnly" in opened.headers["set-cookie"]
        assert c.get("/api/fleet").status_code == 200  # the cookie carries the token from now on
        c.cookies.clear()
        assert c.get("/api/fleet").status_code == 401


def test_foreign_host_header_is_rejected(night_lab):
    from fastapi.testclient import TestClient

    app = create_app(night_lab.path, allowed_hosts=["127.0.0.1", "localhost"])
    with TestClient(app, base_url="http://127.0.0.1:8350") as c:
        assert c.get("/api/overview").status_code == 200
        assert c.get("/api/overview", headers={"Host": "attacker.example"}).status_code == 400


def test_not_a_lab_fails_at_start(tmp_path):
    from nightlab.errors import NightlabError

    with pytest.raises(NightlabError):
        create_app(tmp_path)


def test_cached_pages_follow_the_ledger(make_lab):
    """Pages are cached per lab version; any recorded change (here a submit) shows on the next request."""
    import json

    from fastapi.testclient import TestClient

    from labkit import nightlab

    lab = make_lab(slots=1)
    with TestClient(create_app(lab)) as c:
        first = c.get("/")
        assert c.get("/api/overview").json()["counts"]["queued"] == 0
        version = first.headers["X-Nightlab-Version"]
        nightlab("submit", "-m", "queued while watching", "--no-start", cwd=lab)
        assert c.get("/", params={"partial": 1, "since": version}).status_code == 200
        assert c.get("/api/overview").json()["counts"]["queued"] == 1
        assert c.get("/api/results").json() == json.loads(nightlab("results", "--json", cwd=lab).stdout)


def test_figures_read_as_the_cli_prints_them(night_lab, client):
    # the metrics table: integers as integers, the metric with six decimals (display.number)
    html = client.get(f"/experiments/{night_lab.ids['better']}").text
    assert '<th>env_seed</th><td class="num">0</td>' in html
    assert '<th>training_seconds</th><td class="num">0.2</td>' in html
    assert re.search(r"<th>val_bpb</th><td class=\"num\">\d\.\d{6}</td>", html)
    # a wave's spec reads as key=value, never a Python repr
    wave = client.get(f"/waves/{night_lab.wave}").text
    facts = wave.split('<dl class="facts">')[1].split("</dl>")[0]
    assert "{'" not in facts and "None" not in facts and "&#39;" not in facts
