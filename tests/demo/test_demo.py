"""`nightlab demo` end to end, deterministically: every stage runs for real (the cpu profile's
data, the local fleet, the noise floor, the wave, the verdict, the adoption, the report, the story),
but the lab's train.py is a synthetic target whose TOTAL_BATCH_SIZE has a known effect, so the
find cannot depend on how busy the machine is. Whether the real GPT target finds the batch regime
on this machine is a measurement with a rate: bench/demo_runs.py (bench/RESULTS.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from matplotlib.axes import Axes

from labkit import SYNTHETIC_TRAIN, commit, nightlab
from nightlab import lab as lab_module
from nightlab.cli import main
from nightlab.config import load_config
from nightlab.ledger import open_ledger
from nightlab.report import progress_png

# The synthetic target with the demo's knob: val_bpb = 1.50 + 0.2 per doubling of the total batch
# above 2**11, plus a seeded noise of sd ~0.01 (SYNTHETIC_TRAIN's NOISE), so 2**11 beats the
# carried-over 2**13 by 0.40 = about 40 noise sd's on any machine, loaded or not.
EFFECT = 0.2
DEMO_TRAIN = SYNTHETIC_TRAIN.replace(
    "NOISE = 0.0  # standard deviation of the seeded noise",
    "NOISE = 0.006  # standard deviation of the seeded noise\n"
    "TOTAL_BATCH_SIZE = 2**11  # tokens per optimizer step",
).replace(
    "metric = 1.0 + 10 * (math.log10(LR) - math.log10(0.02)) ** 2 + noise",
    f"metric = 1.5 + {EFFECT} * math.log2(TOTAL_BATCH_SIZE / 2**11) + noise",
)


@pytest.fixture
def synthetic_demo(monkeypatch, tmp_path):
    """The demo's lab with the synthetic train.py in place of the GPT (self-reported results)."""
    real_init = lab_module.init_lab

    def init_lab(directory: Path, options):
        path = real_init(directory, options)
        (path / "train.py").write_text(DEMO_TRAIN)
        toml = path / "nightlab.toml"
        toml.write_text(toml.read_text().replace("builtin = true", "builtin = false"))
        commit(path, "synthetic target")
        return path

    assert "TOTAL_BATCH_SIZE = 2**11" in DEMO_TRAIN and f"{EFFECT} * math.log2" in DEMO_TRAIN
    monkeypatch.setattr(lab_module, "init_lab", init_lab)
    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)


def demo(capsys, *args: str) -> tuple[int, str, str]:
    """`nightlab demo ARGS` in this process (so the synthetic lab applies): exit code, stdout, stderr."""
    code = 0
    try:
        main(["demo", *args])
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_demo_finds_the_known_effect_and_tells_the_story(synthetic_demo, tmp_path, capsys, monkeypatch):
    from nightlab.harness.sandbox import available

    monkeypatch.setenv("NIGHTLAB_NO_SANDBOX", "1")  # the start and the story say runs are unsandboxed
    available.cache_clear()  # an earlier test of this process may have cached "sandboxed"
    try:
        code, stdout, stderr = demo(capsys, "--dir", "demo-lab", "--json")
    finally:
        available.cache_clear()  # nor may this test's answer leak into later ones
    assert code == 0, stderr
    out = json.loads(stdout)
    lab = tmp_path / "demo-lab"
    assert out["lab"] == str(lab)
    for stage in ("[1/6]", "[2/6]", "[3/6]", "[4/6]", "[5/6]", "[6/6]"):
        assert stage in stderr
    # said before the first run, with the fix, and again in the story
    warning = "runs will be unsandboxed: NIGHTLAB_NO_SANDBOX=1 is set; unset it to sandbox runs"
    assert warning in stderr.split("[3/6]")[0]
    assert out["unsandboxed"] == "NIGHTLAB_NO_SANDBOX=1 is set; unset it to sandbox runs"
    # the find: the smallest total batch wins by the known effect and is adopted
    assert out["verdict"] == "keep" and out["adopted"], out["story"]
    assert out["baseline"] == pytest.approx(1.5 + 2 * EFFECT, abs=0.05)
    assert out["best"] == pytest.approx(1.5, abs=0.05)
    assert out["z"] > out["z_needed"] and out["margin_sd"] > out["z_needed"]
    assert "-TOTAL_BATCH_SIZE = 2**13" in out["diff"]
    assert re.search(r"^\+TOTAL_BATCH_SIZE = 2\*\*11\b", out["diff"], re.M)
    assert "TOTAL_BATCH_SIZE = 2**11" in (lab / "train.py").read_text()
    # the story: each variant's mean ± sd, the winner's margin, the diff, where to look next
    story = "\n".join(out["story"])
    assert story in stderr  # printed for people too
    assert {v["knobs"]["TOTAL_BATCH_SIZE"] for v in out["variants"]} == {"2**11", "2**12"}
    assert f"what won: {out['best_id']} by " in story and "noise sd" in story and ": `keep`" in story
    assert "+TOTAL_BATCH_SIZE = 2**11" in story and "http://127.0.0.1:8350/" in story
    assert "runs were unsandboxed (NIGHTLAB_NO_SANDBOX=1 is set; unset it to sandbox runs)" in story
    assert "progress.png" in story and (lab / "progress.png").stat().st_size > 0
    rows = (lab / "results.tsv").read_text().splitlines()
    assert rows[0].startswith("commit\tval_bpb")
    assert sum(1 for r in rows[1:] if r.split("\t")[3] == "keep") >= 3  # the baseline's runs and the winner
    res = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)
    assert {e["outcome"] for e in res["experiments"]} <= {"ok", "degraded"}
    assert not [e["id"] for e in res["experiments"] if e["status"] in ("queued", "running")]
    # what the demo printed is what the ledger holds: the best variant's figure
    best = next(e for e in res["experiments"] if e["id"] == out["best_id"])
    with open_ledger(lab) as ledger:
        ident = ledger.get(best["id"]).identity
        same = [e.metric("val_bpb") for e in ledger.experiments(identity=ident, tier=best["tier"])]
    assert out["best_runs"] == len(same) and out["best"] == pytest.approx(sum(same) / len(same))
    # progress.png labels the baseline and the kept change, not a variant that was not adopted
    labels = []
    monkeypatch.setattr(Axes, "annotate", lambda self, text, *a, **k: labels.append(text))
    with open_ledger(lab) as ledger:
        progress_png(ledger, load_config(lab / "nightlab.toml"), tmp_path / "progress.png")
    assert labels == ["baseline", f"kept {out['best_id']}: {best['description']}"]
    status = json.loads(nightlab("status", "--json", cwd=lab).stdout)
    assert not status["controller"]["running"]  # the demo leaves no fleet behind
    # a second demo replaces the lab it made; a directory it did not make is refused
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    code, _, stderr = demo(capsys, "--dir", "mine")
    assert code == 2 and "was not made by `nightlab demo`" in stderr
    assert (tmp_path / "mine" / "notes.txt").exists()
