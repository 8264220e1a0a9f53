"""The scorer, the clock and the harness-owned keys, in-process on tiny models (a few seconds).

The scorer's val_bpb must equal `evaluate.py`'s for the same model (one metric, two call paths);
its hidden probe must pass causal models and catch leaky ones; `check_archive` must accept what
torch.export writes and refuse what loading would turn into code; `apply_score` against the
module's table. The clock's rules are tested in test_serve.py.
Run: .venv/bin/python -m pytest -q tests/harness/test_scorer.py
"""

from __future__ import annotations

import json
import socket
import threading
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from nightlab.harness import serve
from nightlab.harness.cache import val_set_digest
from nightlab.harness.clock import TrainingClock
from nightlab.harness.data import prepare
from nightlab.harness.evaluate import evaluate
from nightlab.harness.handoff import hand_in
from nightlab.harness.names import HANDOFF_META, MODEL_FILE
from nightlab.harness.owned import apply_score, trust
from nightlab.harness.profiles import Profile, fingerprint
from nightlab.harness.profiles import data_dir as profile_data_dir
from nightlab.harness.scorer import UnscorableModelError, check_archive, score

torch = pytest.importorskip("torch")

PROFILE = Profile("scorer", "demo", vocab_size=512, seq_len=32, budget_seconds=2.0, eval_tokens=2048)


class Bigram(torch.nn.Module):
    """A causal model: logits at t from token t only; `leak` adds token t + 1 (the future)."""

    def __init__(self, vocab: int, leak: bool = False):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, vocab)
        self.leak = leak

    def forward(self, idx):
        logits = self.emb(idx)
        if self.leak:
            logits = logits + 5 * torch.nn.functional.one_hot(idx.roll(-1, dims=1), logits.size(-1))
        return logits


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scorer")
    data = root / "data"
    prepare(PROFILE, data_dir=data / fingerprint(PROFILE), progress=False)
    rows = [f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v!r}" for k, v in PROFILE.to_dict().items()]
    (root / "nightlab.toml").write_text(
        "[profile]\n" + "\n".join(r for r in rows if "train_defaults" not in r)
    )
    return root


@pytest.fixture(autouse=True)
def _data_root(lab, monkeypatch):
    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(lab / "data"))


def clock(batch_size: int = 4) -> TrainingClock:
    """A training clock on a server that never served a batch (all `hand_in` needs from it)."""
    mine, theirs = socket.socketpair()
    config = serve.ServerConfig(Path("."), PROFILE.seq_len, 2.0)
    rows = SimpleNamespace(row_len=PROFILE.seq_len + 1, dtype=np.dtype("<u2"))
    server = serve.BatchServer(mine, config, rows=lambda seed: rows)
    threading.Thread(target=server.serve, daemon=True).start()
    return TrainingClock(theirs, device="cpu", batch_size=batch_size)


def handed(model, folder: Path) -> Path:
    hand_in(model, clock(), folder=folder)
    return folder


def test_the_scorer_measures_what_evaluate_measures(lab, tmp_path):
    torch.manual_seed(0)
    model = Bigram(PROFILE.vocab_size)
    result = score(handed(model, tmp_path / "h"), lab)
    reference = evaluate(model, PROFILE, batch_size=4, device="cpu")
    assert result["status"] == "ok" and "invalid_reason" not in result
    assert result["val_bpb"] == pytest.approx(reference.val_bpb, abs=1e-6)
    assert result["eval_tokens"] == reference.tokens and result["probe_rows"] == 8
    assert result["data_fingerprint"] == fingerprint(PROFILE)
    # which demo validation set: the digest of the data folder's secret (never the secret)
    secret = (profile_data_dir(PROFILE) / "val.secret").read_bytes()
    assert result["val_set"] == val_set_digest(secret) and secret.hex() not in json.dumps(result)


def test_a_model_that_sees_the_next_token_is_caught_by_the_hidden_probe(lab, tmp_path):
    torch.manual_seed(0)
    result = score(handed(Bigram(PROFILE.vocab_size, leak=True), tmp_path / "h"), lab)
    assert result["status"] == "invalid" and result["invalid_reason"].startswith("model is not causal")
    honest = evaluate(Bigram(PROFILE.vocab_size), PROFILE, batch_size=4, device="cpu").val_bpb
    assert result["val_bpb"] < honest  # still scored: the number shows what the leak was worth


def _rewrite(archive: Path, change) -> None:
    items = {n: zipfile.ZipFile(archive).read(n) for n in zipfile.ZipFile(archive).namelist()}
    change(items)
    with zipfile.ZipFile(archive, "w") as z:
        for name, data in items.items():
            z.writestr(name, data)


def test_check_archive_accepts_an_export_and_refuses_code(tmp_path):
    folder = handed(Bigram(PROFILE.vocab_size), tmp_path / "h")
    archive = folder / MODEL_FILE
    check_archive(archive)

    def pickled(items):
        name = next(n for n in items if n.endswith("model_weights_config.json"))
        cfg = json.loads(items[name])
        next(iter(cfg["config"].values()))["use_pickle"] = True
        items[name] = json.dumps(cfg).encode()

    def guarded(items):
        name = next(n for n in items if n.endswith("models/model.json"))
        program = json.loads(items[name])
        program["guards_code"] = ["__import__('os').system('true')"]
        items[name] = json.dumps(program).encode()

    def foreign_file(items):
        items[next(iter(items)).split("/")[0] + "/data/constants/opaque_obj_0"] = b"x"

    for change, words in ((pickled, "pickled"), (guarded, "guard code"), (foreign_file, "does not load")):
        copy = tmp_path / f"{change.__name__}.pt2"
        copy.write_bytes(archive.read_bytes())
        _rewrite(copy, change)
        with pytest.raises(UnscorableModelError, match=words):
            check_archive(copy)


def test_an_unexportable_model_fails_with_one_line_naming_the_fix(tmp_path):
    from nightlab.harness.handoff import ModelNotExportableError

    class Branchy(Bigram):
        def forward(self, idx):
            if idx.sum() > 0:  # Python control flow on a tensor value
                return self.emb(idx)
            return self.emb(idx) * 2

    with pytest.raises(ModelNotExportableError) as info:
        hand_in(Branchy(PROFILE.vocab_size), clock(), folder=tmp_path / "h")
    message = str(info.value)
    assert "\n" not in message
    assert "Python branches on tensor values" in message and 'ATTENTION = "sdpa"' in message


def test_the_hand_in_records_the_clock(tmp_path):
    folder = handed(Bigram(PROFILE.vocab_size), tmp_path / "h")
    meta = json.loads((folder / HANDOFF_META).read_text())
    assert meta["batch_size"] == 4 and meta["seq_len"] == PROFILE.seq_len and meta["seed"] == 0
    assert set(meta["clock"]) >= {"training_seconds", "warmup_seconds", "budget_seconds", "steps"}


def test_apply_score_takes_the_owned_keys_from_the_harness_only():
    printed = {"val_bpb": 0.01, "training_seconds": 1.0, "num_steps": 9.0}
    score_ok = {"status": "ok", "val_bpb": 1.2, "training_seconds": 30.1, "sandbox": "bwrap"}
    outcome, detail, metrics = apply_score("ok", None, printed, score_ok, metric="val_bpb")
    assert outcome == "ok" and metrics["val_bpb"] == 1.2 and metrics["num_steps"] == 9.0
    assert (
        "train.py printed val_bpb = 0.01" in metrics["harness_warning"]
        and detail == metrics["harness_warning"]
    )
    assert trust(metrics, builtin=True) == "harness"
    assert trust({**metrics, "sandbox": "none"}, builtin=True) == "unsandboxed"
    assert trust(metrics, builtin=False) == "self-reported"
    # no score at all: the run's own figures are never taken
    assert apply_score("ok", None, printed, None, metric="val_bpb")[0] == "invalid"
    # the training process crashed: the log's class stands
    crashed = apply_score("crash:oom", "CUDA out of memory", {}, {"status": "not-scored"}, metric="val_bpb")
    assert crashed[:2] == ("crash:oom", "CUDA out of memory")
    refused = apply_score("ok", None, printed, {"status": "invalid", "invalid_reason": "x"}, metric="val_bpb")
    assert refused[0] == "invalid" and refused[1] == "x" and "val_bpb" not in refused[2]


def test_a_score_from_another_validation_set_is_invalid():
    """Two workers whose demo data was drawn from different secrets measure different things: the
    controller refuses a score whose `val_set` is not its lab's (or that has none), never pools it."""
    score_ok = {"status": "ok", "val_bpb": 1.2, "val_set": "aaaa"}
    assert apply_score("ok", None, {}, score_ok, metric="val_bpb", expected_val_set="aaaa")[0] == "ok"
    outcome, detail, metrics = apply_score(
        "ok", None, {}, score_ok, metric="val_bpb", expected_val_set="bbbb"
    )
    assert outcome == "invalid" and "`aaaa`" in detail and "`bbbb`" in detail and metrics["val_set"] == "aaaa"
    unlabelled = {"status": "ok", "val_bpb": 1.2}
    assert apply_score("ok", None, {}, unlabelled, metric="val_bpb", expected_val_set="bbbb")[0] == "invalid"
    assert apply_score("ok", None, {}, unlabelled, metric="val_bpb")[0] == "ok"  # a source without one


def test_a_seed_that_changes_nothing_is_flagged():
    from nightlab.harness.owned import seed_ignored

    assert seed_ignored(1, 1.2345671, [(0, 1.2345668)]) is not None  # the same to 6 decimals
    assert "ignores NIGHTLAB_SEED" in seed_ignored(1, 1.5, [(0, 1.5)])
    assert seed_ignored(1, 1.5, [(0, 1.4999), (1, 1.5)]) is None  # a repeat of the same seed may agree


def test_the_supervisor_preloads_the_deserializer_and_exits_without_teardown():
    """`_preload` imports what `torch.export.load` needs (1.3-1.6 s a run otherwise, after the run);
    `exit_now` keeps the exit code and the output that is still buffered."""
    import subprocess
    import sys

    code = (
        "import sys; from nightlab.harness.attempt import _preload; from nightlab.harness.names import exit_now; _preload(); "
        "print('torch._export.serde.serialize' in sys.modules, end=''); exit_now(3)"
    )
    proc = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and proc.stdout == "True", proc.stderr


def test_a_run_that_never_finished_keeps_its_class_whatever_score_it_left():
    """A remote job's last score line is train.py's when the job was killed or lost before the run
    script printed its own; so a timed-out, lost or cancelled run is never `ok` from a score."""
    forged = {"status": "ok", "val_bpb": 0.01, "scored_by": "harness", "sandbox": "bwrap"}
    for outcome in ("timeout", "infra", "cancelled"):
        got, _, metrics = apply_score(outcome, "why", {"val_bpb": 0.01}, forged, metric="val_bpb")
        assert got == outcome and "val_bpb" not in metrics and "scored_by" not in metrics
