"""The exact reproduction of issue 21: a second local pool on a machine whose first pool uses every core.

`fleet start` refuses the pools with one line; with the documented override both runs
compete, end `degraded` (figures and reason recorded, never judged, in no figure), and
each is re-run once, alone, on a slot that fits the machine. The target spins one
process per slot thread for a fixed time and reports its step count, like a trainer
under a wall-clock budget: a starved run does fewer steps and "scores" worse.
"""

from __future__ import annotations

import json
import os

import pytest

from labkit import commit, nightlab, wait_json

SPIN_TRAIN = '''\
"""A trainer stand-in: one busy process per slot thread for SECONDS, steps counted."""
import os
import time

SECONDS = 8.0
threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
r, w = os.pipe()
child = False
for _ in range(threads - 1):
    if os.fork() == 0:
        child = True
        break
end = time.time() + SECONDS
steps = 0
while time.time() < end:
    steps += 1
if child:
    os.write(w, f"{steps}\\n".encode())
    os._exit(0)
os.close(w)
for _ in range(threads - 1):
    os.wait()
total = steps + sum(int(x) for x in os.read(r, 1 << 16).split())
print("---")
print(f"val_bpb:          {1e6 / total:.6f}")
print(f"num_steps:        {total}")
'''

DEFAULT_THRESHOLD = {"NIGHTLAB_MIN_CPU_SHARE": ""}  # the lab's own min_cpu_share (0.7), not the suite's

POOLS = """[[fleet.pool]]
backend = "local"
tier = "cpu"
slots = 1
threads = {t}

[[fleet.pool]]
backend = "local"
tier = "cpu2"
slots = 1
threads = {t}
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="needs Linux schedstat")
def test_second_pool_on_a_full_machine_is_refused_then_degraded_and_rerun(tmp_path):
    cores = len(os.sched_getaffinity(0))
    target = tmp_path / "target"
    target.mkdir()
    (target / "train.py").write_text(SPIN_TRAIN)
    lab = tmp_path / "lab"
    nightlab("init", str(lab), "--target", str(target), "--timeout", "120", cwd=tmp_path)
    toml = lab / "nightlab.toml"
    text = toml.read_text()
    start = text.index("[[fleet.pool]]")
    text = text[:start] + POOLS.format(t=cores) + "\n" + text[text.index("[search]") :]
    toml.write_text(text.replace("idle_shutdown = 900", "idle_shutdown = 30"))
    commit(lab, "second pool")
    try:
        refused = nightlab("fleet", "start", cwd=lab, check=False)
        assert refused.returncode == 2, refused.stderr
        line = refused.stderr.strip()
        assert "\n" not in line and f"ask for {2 * cores} threads" in line and "oversubscribe = true" in line
        refused = nightlab("submit", "-m", "base", "--no-start", cwd=lab, check=False)
        assert refused.returncode == 0  # queuing without starting the fleet is not refused
        nightlab("cancel", refused.stdout.strip(), cwd=lab)
        refused = nightlab("submit", "-m", "base", "--seed", "5", cwd=lab, check=False)
        assert refused.returncode == 2 and "oversubscribe = true" in refused.stderr

        toml.write_text(toml.read_text().replace("[fleet]\n", "[fleet]\noversubscribe = true\n"))
        commit(lab, "accept oversubscription")
        # both queued before the fleet starts, so they run side by side from the first turn
        a = nightlab("submit", "-m", "base", "--no-start", cwd=lab).stdout.strip()
        b = nightlab("submit", "-m", "base", "--tier", "cpu2", "--no-start", cwd=lab).stdout.strip()
        nightlab("fleet", "start", cwd=lab, env=DEFAULT_THRESHOLD)
        wait_json(lab, a, b, timeout=120)
        res = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)
        by_id = {e["id"]: e for e in res["experiments"]}
        for first in (a, b):
            e = by_id[first]
            # both slots ran their 2 x cores busy processes on `cores` cores: each got at most half
            assert e["outcome"] == "degraded" and e["verdict"] == "degraded", e
            assert e["val_bpb"] is None and e["metrics"]["val_bpb"] > 0  # recorded, not compared
            assert e["degraded"].startswith("starved: it got")
        reruns = [e for e in res["experiments"] if e["description"].startswith("re-run of")]
        assert sorted(e["description"].split()[2] for e in reruns) == sorted([a, b])
        wait_json(lab, *(e["id"] for e in reruns), timeout=120)
        with_attempts = {
            e["id"]: json.loads(nightlab("show", e["id"], "--json", cwd=lab).stdout) for e in reruns
        }
        # the re-runs ran one at a time: each had the machine's cores to itself (the next starts as
        # soon as the first's process is gone, just before its end is written: allow for that)
        spans = sorted(
            (x["attempts"][-1]["started_at"], x["attempts"][-1]["ended_at"]) for x in with_attempts.values()
        )
        assert spans[0][1] - 1.0 <= spans[1][0], spans
        res = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)
        by_id = {e["id"]: e for e in res["experiments"]}
        assert len(res["experiments"]) == 5  # no re-run of a re-run (one of the 5 is the cancelled one)
        for r in reruns:
            e = by_id[r["id"]]
            first = by_id[r["description"].split()[2]]
            assert e["outcome"] in ("ok", "degraded"), e
            if e["outcome"] == "ok":
                # the healthy re-run did clearly more steps than its starved first run
                assert e["metrics"]["num_steps"] > 1.3 * first["metrics"]["num_steps"]
                fig = res["incumbent"]["tiers"][e["tier"]]
                assert fig["n"] == 1 and fig["mean"] == pytest.approx(e["val_bpb"])
            else:  # the machine is loaded from outside as well: no figure at all, never a wrong one
                assert res["incumbent"]["tiers"][e["tier"]] is None
        text = nightlab("results", cwd=lab)
        assert f"{a} starved: it got" in text.stderr and "not judged" in text.stderr
        shown = nightlab("show", a, "--no-diff", cwd=lab).stdout
        assert "health degraded (got" in shown
        # each names the other: the degraded run its re-run, the re-run what it re-runs
        [again] = [r["id"] for r in reruns if r["description"].split()[2] == a]
        assert f"re-run as {again} (" in shown
        assert f"re-run of {a}, which ended degraded" in nightlab("show", again, "--no-diff", cwd=lab).stdout
        assert (with_attempts[again]["rerun_of"], with_attempts[again]["rerun"]) == (a, None)
        # the report and the dashboard say it too; the journal gives its figure and reason
        nightlab("report", "--no-plot", cwd=lab)
        # results.tsv holds the default tier, results-cpu2.tsv the second pool's
        tsvs = (lab / "results.tsv", lab / "results-cpu2.tsv")
        rows = [r.split("\t") for tsv in tsvs for r in tsv.read_text().splitlines()[1:]]
        marked = [r for r in rows if "[degraded: starved" in r[4]]
        assert len(marked) >= 2 and {r[3] for r in marked} == {"discard"}
        from nightlab.web._readonly import ReadOnlyLab
        from nightlab.web._views import overview

        view = ReadOnlyLab(lab)
        try:
            counts = overview(view)["counts"]
        finally:
            view.close()
        assert counts["degraded"] >= 2 and counts["crashed"] == 0
    finally:
        nightlab("fleet", "stop", cwd=lab, check=False)
