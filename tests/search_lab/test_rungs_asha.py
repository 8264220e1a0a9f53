"""Asynchronous successive halving (issue 34): `nightlab submit --screen` runs an idea on the
screening rung, and the controller promotes it as soon as it ranks in the rung's top 1/eta."""

from __future__ import annotations

import json

import pytest

from labkit import commit, nightlab, wait_json, wait_until

CPU2 = '[[fleet.pool]]\nbackend = "local"\ntier = "cpu2"\nslots = 1\n'


def test_submit_screen_promotes_the_top_third_as_runs_finish(quick_lab):
    lab = quick_lab(slots=1, extra_pools=CPU2, sleep=0.05, noise=0.0)
    toml = lab / "nightlab.toml"
    text = toml.read_text()
    assert '\ntier = "cpu"\n' in text
    toml.write_text(text.replace('\ntier = "cpu"\n', '\ntier = "cpu"\npromote_to = "cpu2"\n', 1))
    commit(lab, "cpu screens for cpu2")
    ids = {}
    # runs end in this order on the one cpu slot: 0.005, the incumbent (0.01), 0.07, 0.03, 0.015, 0.02
    for lr in ("0.005", "0.07", "0.03", "0.015", "0.02"):
        out = json.loads(
            nightlab(
                "submit",
                "--screen",
                "--tier",
                "cpu2",
                "-m",
                f"lr {lr}",
                "--set",
                f"LR={lr}",
                "--no-start",
                "--json",
                cwd=lab,
            ).stdout
        )
        assert out[0]["tier"] == "cpu"
        ids[lr] = out[0]["id"]
    nightlab("submit", "-m", "start", "--set", "LR=0.0101", cwd=lab)  # starts the controller
    assert "rungs: cpu -> cpu2, cpu2" in nightlab("status", cwd=lab).stdout  # a foreign target: no budgets
    wait_json(lab, *ids.values())

    def shown(lr):
        return json.loads(nightlab("show", ids[lr], "--no-diff", "--json", cwd=lab).stdout)["rung"]

    wait_until(lambda: all(shown(lr)["promotion"] for lr in ids), timeout=60)
    # asynchronous: 0.03 was in the top third of the 4 snapshots seen when it ended, before the
    # better ones came; 0.005 and 0.07 never were
    promoted = {lr for lr in ids if shown(lr)["promotion"]["promoted"]}
    assert promoted == {"0.03", "0.015", "0.02"}
    losers = shown("0.005")
    assert losers["promotion"]["cutoff"] >= 1 and losers["reached"] == "cpu"
    assert losers["why"].startswith("not promoted: rank ") and "(1/3)" in losers["why"]
    best = shown("0.02")
    assert best["promotion"]["rank"] == 1 and best["why"].startswith("promoted to cpu2")
    # the last rung judges with the sound rule: two runs a side on cpu2
    cpu2 = wait_until(
        lambda: (
            (
                [
                    e
                    for e in json.loads(nightlab("results", "--tier", "cpu2", "--json", cwd=lab).stdout)[
                        "experiments"
                    ]
                    if e["status"] == "finished"
                ]
            )
            if len(
                json.loads(nightlab("results", "--tier", "cpu2", "--all", "--json", cwd=lab).stdout)[
                    "experiments"
                ]
            )
            >= 8
            else None
        ),
        timeout=60,
    )
    assert {e["tier"] for e in cpu2} == {"cpu2"}
    text = nightlab("show", ids["0.02"], "--no-diff", cwd=lab).stdout
    assert "rung reached cpu2; promoted to cpu2" in text
    # rank transfer between the rungs, on the lab's own promoted runs: 3 is too few to say anything
    wait_until(
        lambda: all(
            e["status"] == "finished"
            for e in json.loads(nightlab("results", "--tier", "cpu2", "--all", "--json", cwd=lab).stdout)[
                "experiments"
            ]
        ),
        timeout=60,
    )
    [row] = json.loads(nightlab("rungs", "--json", cwd=lab).stdout)
    assert (row["rung"], row["next"], row["n"]) == ("cpu", "cpu2", 3)
    assert row["rho"] == pytest.approx(1.0) and row["interval"] is None and "unmeasured" in row["warning"]
    # the dashboard says the same: the experiment page and the leaderboard's tier cell
    from fastapi.testclient import TestClient

    from nightlab.web.app import create_app

    with TestClient(create_app(lab)) as client:
        page = client.get(f"/experiments/{ids['0.005']}").text
        assert 'data-figure="rung"' in page and "not promoted: rank " in page
        assert client.get(f"/api/experiments/{ids['0.02']}").json()["rung"]["reached"] == "cpu2"
        assert "→ cpu2" in client.get("/").text
    text = nightlab("rungs", cwd=lab)
    assert "cpu -> cpu2: rank correlation +1.00, n=3" in text.stdout and "warning:" in text.stderr


def test_submit_screen_without_a_rung_names_the_config_to_add(quick_lab):
    lab = quick_lab(slots=1)
    proc = nightlab("submit", "--screen", "-m", "x", "--set", "LR=0.03", cwd=lab, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert 'promote_to = "cpu"' in proc.stderr and "budget_seconds" in proc.stderr
    assert json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)["total"] == 0  # nothing queued


def test_a_refused_screened_idea_leaves_no_wave(quick_lab):
    lab = quick_lab(slots=1, extra_pools=CPU2)
    toml = lab / "nightlab.toml"
    toml.write_text(toml.read_text().replace('\ntier = "cpu"\n', '\ntier = "cpu"\npromote_to = "cpu2"\n', 1))
    commit(lab, "cpu screens for cpu2")
    proc = nightlab(
        "submit", "--screen", "--tier", "cpu2", "-m", "x", "--set", "NOPE=1", cwd=lab, check=False
    )
    assert proc.returncode == 2 and "NOPE" in proc.stderr
    assert json.loads(nightlab("waves", "--json", cwd=lab).stdout) == []
