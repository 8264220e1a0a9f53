"""The state prompt: instructions first, then what a restarted agent needs to carry on."""

from __future__ import annotations

from pathlib import Path

from labkit import nightlab, wait_json
from nightlab.agent.prompt import Budget, build_prompt
from nightlab.lab import Lab
from nightlab.ledger import _base as ledger_base


def test_the_prompt_carries_the_labs_state(make_lab, monkeypatch):
    lab = make_lab(slots=2)
    nightlab("submit", "-m", "baseline", "--repeats", "2", cwd=lab)
    # two runs: a keep needs each side's own spread (search/decide.py MIN_RUNS_TO_KEEP)
    nightlab("submit", "-m", "lr 0.02", "--set", "LR=0.02", "--repeats", "2", cwd=lab)
    nightlab("submit", "-m", "blow up", "--set", "MODE='oom'", cwd=lab)
    wait_json(lab, "--all")
    nightlab("fleet", "stop", cwd=lab)
    nightlab("submit", "-m", "lr 0.03 queued", "--set", "LR=0.03", "--no-start", cwd=lab)
    (lab / "train.py").write_text((lab / "train.py").read_text().replace("SLEEP = 0.2", "SLEEP = 0.1"))
    (lab / "prepare.py").write_text("# tampered\n")
    decoded: list[str] = []
    real = ledger_base._to_experiment
    monkeypatch.setattr(
        ledger_base, "_to_experiment", lambda row, m=None: decoded.append(row["id"]) or real(row, m)
    )
    with Lab.open(lab) as opened:
        text = build_prompt(
            opened, session=4, reason="stall", budget=Budget(hours_left=2.5, experiments_left=7)
        )
    # the journal reads every experiment once; the state section ranks from keys and decodes
    # only the crashes it lists (at 20,000 experiments a second full read cost ~1 s)
    assert decoded.count("e0006") == 1

    assert text.startswith("# nightlab research session 4 (")
    assert "The previous session ended (stall)" in text
    assert f"in the lab at `{lab}`" in text
    order = [text.index(h) for h in ("# Instructions", "# The lab now", "# Research journal", "# Now")]
    assert order == sorted(order)
    assert "# nightlab: how to do research in this lab" in text  # program.md, in full
    assert "- fleet: tier `cpu` 2 slots (default tier `cpu`)" in text
    assert "  - cpu: 1.906191 ± 0.000000 (n=2); noise floor σ 0.000000 (2 dof)" in text
    assert "- this run's budget: 2.5 h left, 7 more experiments" in text
    assert "- e0006 queued on cpu: lr 0.03 queued" in text
    assert "- e0003 cpu 1.000000 (-0.906191 vs incumbent) keep: lr 0.02" in text
    assert "## Kept but not adopted" in text and "- e0004 cpu: lr 0.02" in text
    assert "- e0005 crash:oom: MemoryError: cannot allocate 1 TiB | blow up" in text
    assert "uncommitted edits in train.py" in text
    assert "files outside the editable set were changed: prepare.py" in text
    assert "## LR: 2 ideas" in text  # the journal, with the queued idea pending
    assert "- e0006 pending" in text


def test_a_first_session_on_a_new_lab(make_lab):
    lab = make_lab(slots=1)
    with Lab.open(lab) as opened:
        text = build_prompt(opened, session=1)
    assert "You are starting a research run in this lab." in text
    assert "- cpu: not measured; submit it (`nightlab submit -m baseline`)" in text
    assert "- nothing: every slot is free, submit a wave now" in text
    assert "## Best results per tier\n- none yet" in text
    assert "this run's budget" not in text and "## The working tree" not in text


def test_the_targets_own_program_follows_nightlabs(tmp_path: Path):
    target = tmp_path / "t"
    target.mkdir()
    (target / "train.py").write_text("LR = 0.1\n")
    (target / "program.md").write_text("# autoresearch notes\nTry wider models.\n")
    nightlab("init", "lab", "--target", str(target), cwd=tmp_path)
    with Lab.open(tmp_path / "lab") as opened:
        text = build_prompt(opened, session=1)
    ours = text.index("# nightlab: how to do research in this lab")
    theirs = text.index("# The target's own notes (program.md)")
    assert ours < theirs < text.index("Try wider models.")


def test_the_prompt_stays_under_its_token_budget(make_lab):
    from nightlab.agent.prompt import CHARS_PER_TOKEN, PROMPT_TOKEN_BUDGET

    lab = make_lab(slots=2)
    nightlab("submit", "-m", "baseline", cwd=lab)
    for i, lr in enumerate(("0.02", "0.03", "0.005", "0.04", "0.015", "0.001")):
        nightlab("submit", "-m", f"idea {i}: a long description " + "x" * 300, "--set", f"LR={lr}", cwd=lab)
    wait_json(lab, "--all")
    with Lab.open(lab) as opened:
        full = build_prompt(opened, session=1)
        small = len(full) // CHARS_PER_TOKEN - 400  # tokens: 1,600 chars short of the whole journal
        cut = build_prompt(opened, session=1, token_budget=small)
    assert len(full) <= PROMPT_TOKEN_BUDGET * CHARS_PER_TOKEN
    assert len(cut) <= small * CHARS_PER_TOKEN

    # only the journal gave way: instructions and state are whole, the journal says it was condensed
    def head(text: str) -> str:  # all before the journal, without the first line's clock
        return text.split("# Research journal")[0].split("\n", 1)[1]

    assert head(cut) == head(full)
    assert "also tried" in cut or "journal cut" in cut
