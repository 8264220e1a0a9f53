"""The red-team kit (fixtures in conftest.py): run a hostile train.py exactly as the fleet does, and record it as the controller does.

`attack(source)` lays out an attempt the way the local backend does (`LAB/.nightlab/runs/e0001/
attempt-1/work/` holding the snapshot), starts the real supervisor
(`python -P -m nightlab.harness.attempt ... -- python train.py`, sandboxed when bwrap works here),
and then makes of its exit code, log and `score.json` what the controller's `_record` makes
(`runner.classify`, then `owned.apply_score`). A tiny profile (demo data, 64-token rows, an 8 s
budget it never reaches in its 4 steps) keeps each attack to one short run. Every process a test starts is killed by its
process-group id when the test ends, pass or fail.

`local_labs` adds two labs on `local:` datasets (a file; a folder named through a symlink, holding a
symlink to a file elsewhere), each corpus kept inside its lab, which the sandbox shows the run:
without the hiding of `SandboxPlan.hidden` every byte of it would be readable there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from nightlab.fleet.runner import classify, read_tail
from nightlab.harness.data import prepare
from nightlab.harness.demo import demo_documents
from nightlab.harness.names import ISOLATED
from nightlab.harness.owned import apply_score, read_score
from nightlab.harness.profiles import Profile, fingerprint
from nightlab.harness.sandbox import available
from nightlab.search.knobs import set_knobs

# 4 steps (`NIGHTLAB_MAX_STEPS`) end every step-limited run long before its 8 s budget even at load 12
# (with 2 s, a loaded box cut the honest run short and an attack that did nothing "beat" it). The runs
# about time train on a 2 s rung instead (`TIMED`: the supervisor's `NIGHTLAB_TIER_BUDGET`).
PROFILE = Profile("redteam", "demo", vocab_size=512, seq_len=64, budget_seconds=8.0, eval_tokens=4096)
BUDGET = 2.0
# Time-budgeted: no step limit, a 2 s rung. The hand-in grace is 12 s (`NIGHTLAB_HANDIN_GRACE`, read
# by the supervisor only): the tiny model hands in ~2.5 s after its last batch on a quiet box and was
# seen at 5.6 s at load 12, so attacks that train past the budget train 20 s to be caught.
TIMED = {"NIGHTLAB_MAX_STEPS": "", "NIGHTLAB_TIER_BUDGET": str(BUDGET), "NIGHTLAB_HANDIN_GRACE": "12"}
OVERTIME = 20
TINY = {"DEPTH": "1", "HEAD_DIM": "64", "DEVICE_BATCH_SIZE": "4", "TOTAL_BATCH_SIZE": "256"}
SANDBOXED = available() is None
needs_sandbox = pytest.mark.sandbox  # skipped, and said before the first test, without bwrap (needs.py)


def template() -> str:
    source = resources.files("nightlab.targets.gpt").joinpath("train.py").read_text()
    return set_knobs(source, TINY)


def edit(source: str, anchor: str, replacement: str) -> str:
    """Replace one anchor of the template; fails loudly when the template moved on."""
    assert source.count(anchor) == 1, f"anchor not found once in the template: {anchor!r}"
    return source.replace(anchor, replacement)


@dataclass
class Recorded:
    outcome: str
    detail: str | None
    metrics: dict[str, Any]
    log: str
    work: Path
    run_dir: Path

    @property
    def val_bpb(self) -> float | None:
        value = self.metrics.get("val_bpb")
        return float(value) if isinstance(value, (int, float)) else None


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("redteam-data")
    prepare(PROFILE, data_dir=root / fingerprint(PROFILE), progress=False)
    (root / "downloads").mkdir(exist_ok=True)
    (root / "downloads" / "raw-val.txt").write_text("raw validation text a run must not read\n")
    (root / "downloads" / "tinystories").mkdir()
    (root / "downloads" / "tinystories" / "TinyStoriesV2-GPT4-valid.txt").write_text("Once upon a time.\n")
    return root


def _lab(folder: Path, profile: Profile = PROFILE) -> Path:
    toml = "\n".join(
        f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"'
        for k, v in profile.to_dict().items()
        if k != "train_defaults"
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nightlab.toml").write_text("[profile]\n" + toml + "\n")
    return folder


@dataclass(frozen=True)
class LocalLab:
    """A lab on a `local:` dataset whose files lie inside the lab (prepared into `data_root`)."""

    lab: Path
    profile: Profile


@pytest.fixture(scope="session")
def local_labs(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> dict[str, LocalLab]:
    """`file`: `local:LAB/corpus.txt`; `folder`: `local:LAB/data-link`, a symlink to `LAB/data/`, whose
    `part2.jsonl` is a symlink to `LAB/extra/part2.jsonl`."""
    docs = demo_documents()[:2000]
    base = tmp_path_factory.mktemp("local-labs")
    file_lab, folder_lab = base / "file-lab", base / "folder-lab"
    (file_lab).mkdir()
    (file_lab / "corpus.txt").write_text("<|endoftext|>".join(docs))
    for sub in ("data", "extra"):
        (folder_lab / sub).mkdir(parents=True)
    (folder_lab / "data" / "part1.txt").write_text("<|endoftext|>".join(docs[:1200]))
    (folder_lab / "extra" / "part2.jsonl").write_text(
        "".join(json.dumps({"text": d}) + "\n" for d in docs[1200:])
    )
    (folder_lab / "data" / "part2.jsonl").symlink_to(folder_lab / "extra" / "part2.jsonl")
    (folder_lab / "data-link").symlink_to(folder_lab / "data")
    labs = {
        "file": LocalLab(file_lab, replace(PROFILE, dataset=f"local:{file_lab / 'corpus.txt'}")),
        "folder": LocalLab(folder_lab, replace(PROFILE, dataset=f"local:{folder_lab / 'data-link'}")),
    }
    for lab in labs.values():
        prepare(lab.profile, data_dir=data_root / fingerprint(lab.profile), progress=False)
        _lab(lab.lab, lab.profile)
    return labs


def run_attempt(
    base: Path,
    data_root: Path,
    source: str,
    started: list[int],
    *,
    env: dict[str, str] | None = None,
    sandbox: bool = True,
    timeout: float = 240,
    local: LocalLab | None = None,
) -> Recorded:
    """Lay out one attempt under `base` (or in the `local` lab), supervise it, and record it as the controller would."""
    profile = local.profile if local else PROFILE
    lab = local.lab if local else _lab(base / f"lab{len(started)}")
    runs = lab / ".nightlab" / "runs"  # a local lab is shared by its tests: a new experiment folder each
    run_dir = runs / f"e{len(list(runs.glob('e*'))) + 1:04d}" / "attempt-1"
    work = run_dir / "work"
    work.mkdir(parents=True)
    (work / "train.py").write_text(source)
    (work / "nightlab.toml").write_text((lab / "nightlab.toml").read_text())
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTLAB_")}
    full_env.update(
        NIGHTLAB_DATA_DIR=str(data_root),
        NIGHTLAB_SEED="0",
        NIGHTLAB_LAB=str(lab),
        NIGHTLAB_MAX_STEPS="4",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    if not sandbox or not SANDBOXED:  # NIGHTLAB_NO_SANDBOX=1 on the suite runs every attack unsandboxed
        full_env["NIGHTLAB_NO_SANDBOX"] = "1"
    full_env.update(env or {})
    full_env = {k: v for k, v in full_env.items() if v != ""}  # "" removes a variable
    command = [sys.executable, *ISOLATED, "-m", "nightlab.harness.attempt", "--run-dir", str(run_dir),
               "--lab", str(lab), "--", f"{sys.executable} train.py"]  # fmt: skip
    log_path = run_dir / "log.txt"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, cwd=work, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        started.append(proc.pid)
        try:
            code = proc.wait(timeout=timeout)
        finally:
            kill_group(proc.pid)
    tail = read_tail(log_path)
    result = classify(code, tail, metric="val_bpb", expected_fingerprint=fingerprint(profile))
    outcome, detail, metrics = apply_score(
        result.outcome, result.detail, result.metrics, read_score(run_dir), metric="val_bpb"
    )
    return Recorded(outcome, detail, metrics, tail, work, run_dir)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.fixture
def attack(tmp_path: Path, data_root: Path):
    """Factory: `attack(source, env=..., sandbox=True)` -> Recorded (see the module docstring)."""
    started: list[int] = []

    def run(source: str, **kwargs: Any) -> Recorded:
        return run_attempt(tmp_path, data_root, source, started, **kwargs)

    yield run
    for pid in started:
        kill_group(pid)


@pytest.fixture(scope="session")
def honest(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Recorded:
    """The unmodified template's recorded result: what every attack must not beat."""
    started: list[int] = []
    try:
        result = run_attempt(tmp_path_factory.mktemp("honest"), data_root, template(), started)
    finally:
        for pid in started:
            kill_group(pid)
    assert result.outcome == "ok", result.log[-3000:]
    return result


@pytest.fixture(scope="session")
def honest_local(tmp_path_factory: pytest.TempPathFactory, data_root: Path, local_labs: dict[str, LocalLab]):
    """Factory: `honest_local(name)` -> the template's recorded result in that local lab (run once)."""
    done: dict[str, Recorded] = {}

    def get(name: str) -> Recorded:
        if name not in done:
            started: list[int] = []
            try:
                done[name] = run_attempt(
                    tmp_path_factory.mktemp("honest"), data_root, template(), started, local=local_labs[name]
                )
            finally:
                for pid in started:
                    kill_group(pid)
            assert done[name].outcome == "ok", done[name].log[-3000:]
        return done[name]

    return get
