"""Research identity (nightlab.identity): runs are keyed on what runs, epochs on how it is measured."""

from __future__ import annotations

import json
import sqlite3

from labkit import commit, nightlab, wait_json
from nightlab import identity
from nightlab.lab import Lab


def _incumbent(lab):
    res = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)
    return res, res["incumbent"]["tiers"]["cpu"]


def test_config_only_commit_keeps_the_incumbent_and_a_measurement_change_starts_an_epoch(make_lab):
    lab = make_lab(slots=1)
    ids = [
        e["id"]
        for e in json.loads(nightlab("submit", "-m", "base", "--repeats", "2", "--json", cwd=lab).stdout)
    ]
    wait_json(lab, *ids)
    res, fig = _incumbent(lab)
    assert fig["n"] == 2 and res["epoch"]["number"] == 1
    key = identity.of(lab)

    # paperwork: the config's search settings, program.md, notes: the same research
    toml = lab / "nightlab.toml"
    toml.write_text(toml.read_text().replace("z = 2.0", "z = 2.5"))
    (lab / "program.md").write_text((lab / "program.md").read_text() + "\nTry wider models.\n")
    (lab / "notes").mkdir()
    (lab / "notes" / "ideas.md").write_text("- lr warmup\n")
    commit(lab, "config and notes", "nightlab.toml", "program.md")
    nightlab("fleet", "stop", cwd=lab)
    import subprocess

    subprocess.run(["git", "add", "notes"], cwd=lab, check=True)
    commit(lab, "notes", "notes")
    assert identity.of(lab) == key
    res, fig = _incumbent(lab)
    assert fig["n"] == 2  # the incumbent kept its runs
    assert {e["verdict"] for e in res["experiments"]} == {"baseline"}
    again = nightlab("submit", "-m", "again", cwd=lab, check=False)
    assert again.returncode == 2 and "already measured" in again.stderr  # and it knows it

    # the timeout decides what a run may do: a new comparison epoch
    toml.write_text(toml.read_text().replace("timeout = 600", "timeout = 900"))
    commit(lab, "longer timeout", "nightlab.toml")
    assert identity.of(lab) != key
    res, fig = _incumbent(lab)
    assert fig is None and res["epoch"] == {
        "number": 2,
        "key": identity.epoch_key(Lab(lab).config),
        "total": 2,
        "since": None,
        "changes": ["timeout 600.0 → 900.0"],
    }
    assert all(e["delta"] is None for e in res["experiments"])  # never compared across epochs
    text = nightlab("results", cwd=lab)
    assert (
        "nightlab.toml changed what is measured: comparison epoch 2 of 2 (timeout 600.0 → 900.0)"
        in text.stderr
    )
    [new] = json.loads(
        nightlab("submit", "-m", "base again", "--json", cwd=lab).stdout
    )  # not a duplicate now
    wait_json(lab, new["id"])
    res, fig = _incumbent(lab)
    assert fig["n"] == 1 and res["epoch"]["since"] == new["id"]
    assert len({e["epoch"] for e in res["experiments"]}) == 2


def test_a_ledger_keyed_on_whole_trees_is_rekeyed_once(make_lab):
    lab = make_lab(slots=1)
    [e] = json.loads(nightlab("submit", "-m", "base", "--json", cwd=lab).stdout)
    wait_json(lab, e["id"])
    nightlab("fleet", "stop", cwd=lab)
    db = sqlite3.connect(lab / ".nightlab" / "ledger.db")
    with db:  # what an older nightlab wrote: the git tree of the snapshot, no epoch
        git_tree = subprocess_tree(lab, e["snapshot"])
        db.execute("UPDATE experiments SET identity = ?, epoch = ''", (git_tree,))
        db.execute("DELETE FROM meta WHERE key = ?", (identity.REKEY_META,))
    db.close()
    res, fig = _incumbent(lab)
    assert fig is not None and fig["n"] == 1  # HEAD's runs found again under its identity
    with Lab(lab) as opened:
        [row] = opened.ledger.experiments()
        assert row.identity == identity.of(lab) and row.epoch == identity.epoch_key(opened.config)


def subprocess_tree(lab, commit_hash: str) -> str:
    import subprocess

    return subprocess.run(
        ["git", "rev-parse", f"{commit_hash}^{{tree}}"], cwd=lab, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_changed_source_split_starts_an_epoch_for_its_labs_only():
    """demo's validation split changed (issue 30): its labs' epoch moves, no other lab's key does."""
    from types import SimpleNamespace

    from nightlab.harness.profiles import SOURCE_VERSIONS, get_profile

    def config(profile):
        return SimpleNamespace(
            profile=profile,
            metric=SimpleNamespace(name="val_bpb", direction="lower"),
            target=SimpleNamespace(timeout=600.0),
        )

    demo = identity.measurement(config(get_profile("cpu").to_dict()))
    assert demo["source_version"] == SOURCE_VERSIONS["demo"]
    for profile in (get_profile("cpu", dataset="tinystories").to_dict(), None):
        # the keys measurement() had before: the epoch of every other lab is unchanged
        assert set(identity.measurement(config(profile))) == {"profile", "metric", "direction", "timeout"}


def test_a_builtin_target_lab_is_measured_under_the_harness_clock_version():
    """The supervisor's clock (issue 30: served batches, one-batch warm-up) starts an epoch for built-in labs only."""
    from types import SimpleNamespace

    from nightlab.harness.profiles import get_profile
    from nightlab.harness.serve import CLOCK_VERSION

    def config(builtin):
        return SimpleNamespace(
            profile=get_profile("cpu", dataset="tinystories").to_dict(),
            metric=SimpleNamespace(name="val_bpb", direction="lower"),
            target=SimpleNamespace(timeout=600.0, builtin=builtin),
        )

    assert CLOCK_VERSION >= 2 and identity.measurement(config(True))["clock"] == CLOCK_VERSION
    assert "clock" not in identity.measurement(config(False))  # a foreign target keeps its epoch
    assert identity.epoch_key(config(True)) != identity.epoch_key(config(False))
