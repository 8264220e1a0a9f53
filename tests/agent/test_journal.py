"""The journal: diff summaries, ideas, themes, dead ends and seed changes, from a real lab."""

from __future__ import annotations

import json
import math

import pytest

from labkit import SYNTHETIC_TRAIN, nightlab, wait_json
from nightlab.agent.changes import Change, file_change, summarize_change
from nightlab.agent.journal import Idea, Theme, TierResult, build_journal, theme_name
from nightlab.lab import Lab

MODEL = """\
import torch

LR = 0.01  # learning rate
SEED = 0
DEPTH = 8


class GPT:
    def __init__(self):
        self.depth = DEPTH

    def forward(self, x):
        return x * 2


def train():
    torch.manual_seed(SEED)
    return GPT().forward(LR)
"""


def synthetic_metric(lr: float) -> float:
    """What the synthetic target prints for `LR` (tests/conftest.py)."""
    return 1.0 + 10 * (math.log10(lr) - math.log10(0.02)) ** 2


# ---------------------------------------------------------------------------- summarize_change


def test_a_knob_change_is_named_with_both_values():
    change = summarize_change(MODEL, MODEL.replace("LR = 0.01", "LR = 0.02"))
    assert change.knobs == (("LR", "0.01", "0.02"),)
    assert change.scopes == ()
    assert change.touched == ("LR",)
    assert change.describe() == "LR 0.01->0.02"
    assert not change.seed_only


def test_code_edits_are_attributed_to_their_function_with_line_counts():
    new = MODEL.replace("        return x * 2\n", "        x = x + 1\n        return x * 3\n")
    change = summarize_change(MODEL, new)
    assert change.knobs == ()
    assert change.scopes == (("GPT.forward", 2, 1),)
    assert change.describe() == "GPT.forward +2/-1"


def test_several_places_and_a_new_knob():
    new = MODEL.replace("DEPTH = 8\n", "DEPTH = 8\nWIDTH = 64\n").replace(
        "    return GPT().forward(LR)", "    return GPT().forward(LR * WIDTH)"
    )
    change = summarize_change(MODEL, new, file="train.py")
    assert change.knobs == (("train.py:WIDTH", None, "64"),)
    assert change.scopes == (("train.py:train", 1, 1),)
    assert change.touched == ("train.py:WIDTH", "train.py:train")
    assert change.describe() == "train.py:WIDTH (new)->64, train.py:train +1/-1"


@pytest.mark.parametrize(
    "new",
    [
        MODEL.replace("SEED = 0", "SEED = 1"),  # the seed knob
        MODEL.replace("torch.manual_seed(SEED)", "torch.manual_seed(SEED + 1)"),  # a line about the seed
    ],
)
def test_seed_only_changes_are_recognised(new):
    assert summarize_change(MODEL, new).seed_only


def test_a_seed_change_with_anything_else_is_an_idea():
    new = MODEL.replace("SEED = 0", "SEED = 1").replace("LR = 0.01", "LR = 0.02")
    assert not summarize_change(MODEL, new).seed_only
    assert not summarize_change(MODEL, MODEL).seed_only  # no change at all is not a seed change
    assert summarize_change(MODEL, MODEL).empty


def test_a_file_that_no_longer_parses_is_summarised_by_lines():
    new = MODEL.replace("        return x * 2\n", "        return x * (2\n")
    change = summarize_change(MODEL, new)
    assert change.knobs == ()
    assert change.scopes == (("GPT.forward", 1, 1),)


def test_a_deleted_or_added_file_is_one_change_named_for_the_file():
    gone = file_change("train.py", MODEL, None, prefix=False)
    assert gone.knobs == () and gone.scopes == ()  # not "LR (removed), SEED (removed), ..."
    assert gone.touched == ("train.py (deleted)",)
    assert gone.describe() == "train.py deleted (-18 lines)"
    assert theme_name(gone.touched) == "train.py (deleted)"
    added = file_change("extra.py", None, MODEL, prefix=True)
    assert added.describe() == "extra.py added (+18 lines)" and not added.seed_only
    assert file_change("x.py", None, None, prefix=False).empty
    assert file_change("x.py", MODEL, MODEL.replace("0.01", "0.02"), prefix=True).touched == ("x.py:LR",)


# ---------------------------------------------------------------------------- themes


def idea(status: str, seq: int, delta: float | None = None) -> Idea:
    result = TierResult("cpu", status, None if delta is None else 1.0 + delta, delta, 1, None)
    return Idea("t", (f"e{seq:04d}",), "d", "idea", Change(), (result,), False, seq)


def test_a_theme_is_a_dead_end_only_with_two_decided_failures_and_nothing_pending():
    assert not Theme("LR", (idea("discard", 1, 0.1),)).dead_end  # one failure says little
    assert Theme("LR", (idea("discard", 1, 0.1), idea("crash", 2))).dead_end
    assert not Theme("LR", (idea("discard", 1, 0.1), idea("crash", 2), idea("pending", 3))).dead_end
    assert not Theme("LR", (idea("discard", 1, 0.1), idea("within-noise", 2, -0.01))).dead_end
    assert not Theme("LR", (idea("discard", 1, 0.1), idea("keep", 2, -0.2))).dead_end


def test_theme_names_are_the_touched_names():
    assert theme_name(()) == "other"
    assert theme_name(("A", "B")) == "A, B"
    assert theme_name(("A", "B", "C", "D", "E")) == "A, B, C +2"


# ---------------------------------------------------------------------------- a real lab


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A lab with a measured baseline, knob ideas, crashes, a seed change and a code change."""
    root = tmp_path_factory.mktemp("journal")
    target = root / "target"
    target.mkdir()
    (target / "train.py").write_text(SYNTHETIC_TRAIN)
    nightlab("init", "lab", "--target", str(target), "--cpu-slots", "2", cwd=root)
    lab = root / "lab"
    nightlab("submit", "-m", "baseline", "--repeats", "2", cwd=lab)
    for lr in ("0.02", "0.04"):
        nightlab("submit", "-m", f"lr {lr}", "--set", f"LR={lr}", cwd=lab)
    nightlab("submit", "-m", "crash it", "--set", "MODE='crash'", cwd=lab)
    nightlab("submit", "-m", "nan it", "--set", "MODE='nan'", cwd=lab)
    source = (lab / "train.py").read_text()
    seed_line = 'seed = int(os.environ.get("NIGHTLAB_SEED", "0"))'
    (lab / "train.py").write_text(source.replace(seed_line, seed_line + " + 7"))
    nightlab("submit", "-m", "another seed", cwd=lab)
    (lab / "train.py").write_text(source.replace("time.sleep(SLEEP)\n", "time.sleep(SLEEP / 2)\n"))
    nightlab("submit", "-m", "sleep less", cwd=lab)
    (lab / "train.py").write_text(source)
    wait_json(lab, "--all")
    nightlab("submit", "-m", "repeat lr 0.02", "--from", "e0003", "--seed", "1", cwd=lab)
    wait_json(lab, "--all")
    yield lab
    nightlab("fleet", "stop", cwd=lab, check=False)


def test_ideas_are_grouped_by_theme_with_verdicts_and_deltas(history):
    with Lab.open(history) as lab:
        journal = build_journal(lab)
    themes = {t.name: t for t in journal.themes}
    assert set(themes) == {"LR", "MODE", "module"}
    lr = {i.description: i for i in themes["LR"].ideas}
    base = synthetic_metric(0.01)
    best = lr["lr 0.02"]
    assert best.ids == ("e0003", "e0009")  # the repeat of the same files is the same idea
    assert best.status == "keep"
    [result] = best.results
    assert result.n == 2 and result.delta == pytest.approx(synthetic_metric(0.02) - base)
    assert lr["lr 0.04"].status == "discard"
    assert lr["lr 0.04"].change.describe() == "LR 0.01->0.04"
    assert not themes["LR"].dead_end
    assert themes["MODE"].dead_end
    assert {r.outcome for i in themes["MODE"].ideas for r in i.results} == {"crash:exception", "crash:nan"}
    [sleep] = themes["module"].ideas
    assert sleep.change.describe() == "module +1/-1"
    assert [i.description for i in journal.seed_changes] == ["another seed"]
    assert [i.ids for i in journal.repeats] == [("e0001", "e0002")]
    assert all(i.kind == "idea" for i in journal.ideas)


def test_the_text_marks_dead_ends_and_fits_a_budget(history):
    with Lab.open(history) as lab:
        journal = build_journal(lab)
    text = journal.to_text()
    assert "## MODE [dead end]: 2 ideas" in text
    assert '- e0003+1 keep: cpu 1.000000 -0.906191 (n=2) | "lr 0.02" | LR 0.01->0.02' in text
    assert "## seed changes (not ideas" in text and '"another seed"' in text
    assert "re-measurements of unchanged snapshots: 2 runs of 1 snapshot" in text
    short = journal.to_text(max_chars=len(text) - 100)
    assert len(short) <= len(text) - 100
    assert "also tried" in short  # condensed, but still says what was tried
    tiny = journal.to_text(max_chars=300)
    assert len(tiny) <= 300 and tiny.endswith("prints all of it)\n")


def test_journal_command_text_and_json(history):
    text = nightlab("journal", cwd=history).stdout
    assert text.startswith("# Journal: 9 experiments, 5 ideas in 3 themes, 1 seed change;")
    data = json.loads(nightlab("journal", "--json", cwd=history).stdout)
    assert data["metric"] == "val_bpb" and data["direction"] == "lower"
    assert {t["name"]: t["dead_end"] for t in data["themes"]} == {"LR": False, "MODE": True, "module": False}
    assert data["seed_changes"][0]["kind"] == "seed-change"
    assert data["in_flight"] == []
    # an idea's research identity, under its name since ledger schema v6 and its old one (issue 33)
    idea = data["themes"][0]["ideas"][0]
    assert len(idea["identity"]) == 64 and idea["tree"] == idea["identity"]


def test_a_deleted_editable_file_is_one_theme_and_the_run_file_cannot_be_deleted(tmp_path):
    """A lab whose second editable file (8 knobs) was deleted: one theme named for the file.
    Deleting the file the command runs is refused at submit (one line, exit 2)."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "train.py").write_text(SYNTHETIC_TRAIN)
    (target / "extra.py").write_text("".join(f"K{i} = {i}  # knob {i}\n" for i in range(8)))
    init = ("init", "lab", "--target", str(target), "--editable", "train.py", "--editable", "extra.py")
    nightlab(*init, cwd=tmp_path)
    lab = tmp_path / "lab"
    nightlab("submit", "-m", "baseline", "--no-start", cwd=lab)
    (lab / "extra.py").unlink()
    nightlab("submit", "-m", "drop extra", "--no-start", cwd=lab)
    data = json.loads(nightlab("journal", "--json", cwd=lab).stdout)
    [theme] = data["themes"]
    assert theme["name"] == "extra.py (deleted)"
    assert theme["ideas"][0]["change"] == "extra.py deleted (-8 lines)"
    (lab / "train.py").unlink()
    proc = nightlab("submit", "-m", "no train.py", "--no-start", cwd=lab, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "`train.py` is missing" in lines[0] and "git checkout -- train.py" in lines[0]
    assert "e0003" not in nightlab("results", "--all", cwd=lab).stdout


def test_journal_of_a_new_lab(make_lab):
    lab = make_lab(slots=1)
    text = nightlab("journal", cwd=lab).stdout
    assert text.startswith("# Journal: 0 experiments, 0 ideas in 0 themes, 0 seed changes;")
    assert "cpu: not measured" in text


def test_a_degraded_run_is_shown_with_its_figure_and_reason_never_as_a_result():
    from nightlab.agent.journal import _tier_results
    from nightlab.ledger import Experiment, ExperimentStatus

    e = Experiment(
        id="e0001", seq=1, snapshot="c" * 40, identity="t", parent=None, description="x", tier="cpu", seed=0,
        wave=None, priority=0, params={}, source="cli", status=ExperimentStatus.FINISHED,
        outcome="degraded", detail="starved: got 31% of the CPU it asked for", verdict="degraded",
        attempts=1, cancel_requested=False, submitted_at=0.0, started_at=0.0, finished_at=1.0,
        adopted_at=None, metrics={"val_bpb": 0.9},
    )  # fmt: skip
    [result] = _tier_results([e], {}, "val_bpb")
    assert result.verdict == "degraded" and result.mean is None and result.delta is None
    assert result.describe() == "cpu degraded (0.900000 not judged: starved: got 31% of the CPU it asked for)"
