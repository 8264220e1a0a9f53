"""The SkyPilot tasks nightlab builds, its run script, and reading SkyPilot job logs back.

Real `sky.Task` / `sky.Resources` objects, no network. The run script runs here under bash
with the envs `experiment_task` gives it, as it would on a cluster.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sky = pytest.importorskip("sky")

from nightlab import __version__  # noqa: E402
from nightlab.config import PoolConfig  # noqa: E402
from nightlab.errors import NightlabError, UsageError  # noqa: E402
from nightlab.fleet import build, job_log, sky_task, worker_setup  # noqa: E402
from nightlab.fleet.backend import RunSpec  # noqa: E402
from nightlab.fleet.runner import classify, parse_summary  # noqa: E402
from nightlab.snapshots import commit_files, head  # noqa: E402

H100 = PoolConfig(
    backend="skypilot", tier="h100", slots=2, options={"accelerators": "H100:1", "infra": "aws"}
)


# ---------------------------------------------------------------------------- logs

JOB_LOG = """\
├── Waiting for task resources on 1 node.
└── Job started. Streaming logs... (Ctrl-C to exit log streaming; job will not be killed)
\x1b[36m(nightlab-e0001-a1, pid=2231)\x1b[0m nightlab-gpu: NVIDIA H100 80GB HBM3
\x1b[36m(nightlab-e0001-a1, pid=2231)\x1b[0m step 00100 loss 3.2
(nightlab-e0001-a1, pid=2231) ---
(nightlab-e0001-a1, pid=2231) val_bpb:          0.997900
(nightlab-e0001-a1, pid=2231) training_seconds: 300.1
(nightlab-e0001-a1, pid=2231) nightlab-exit: 0
✓ Job finished (status: SUCCEEDED).
"""


def test_clean_job_log_strips_prefixes_and_skypilot_lines():
    text, tags = job_log.clean_job_log(JOB_LOG)
    assert text == "step 00100 loss 3.2\n---\nval_bpb:          0.997900\ntraining_seconds: 300.1\n"
    assert tags == {"gpu": "NVIDIA H100 80GB HBM3", "exit": "0"}


def test_clean_job_log_multi_node_prefix_and_unprefixed_fallback():
    text, _ = job_log.clean_job_log("(head, rank=0, pid=17, ip=10.0.0.2) hello\nskypilot chatter\n")
    assert text == "hello\n"
    # a log in another format (no prefix anywhere) is kept whole rather than lost
    text, tags = job_log.clean_job_log("plain\nnightlab-exit: 3\n")
    assert (text, tags) == ("plain\n", {"exit": "3"})


def test_run_keys_join_a_final_summary_block_only():
    ok = "---\nval_bpb: 1.0\n"
    joined = ok + job_log.run_keys(ok, tier="h100", gpu="NVIDIA H100 80GB HBM3")
    assert parse_summary(joined) == {"val_bpb": 1.0, "tier": "h100", "gpu_name": "NVIDIA H100 80GB HBM3"}
    crashed = "---\nval_bpb: 1.0\nTraceback (most recent call last):\n  x\nValueError: late\n"
    assert job_log.run_keys(crashed, tier="h100", gpu="G") == ""
    assert job_log.run_keys("no summary\n", tier="h100", gpu="G") == ""
    # the crash keeps its exception line as the detail
    assert classify(1, crashed, metric="val_bpb").detail == "ValueError: late"


def test_the_log_sink_writes_the_job_lines_as_they_stream(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text("an earlier try\n")
    sink = job_log.JobLogSink(path)
    assert path.read_text() == ""  # every read starts a fresh log
    cut = JOB_LOG.index("(nightlab-e0001-a1, pid=2231) ---") + 5
    head, tail = JOB_LOG[:cut], JOB_LOG[cut:]  # split in the middle of a line
    sink.write(head)
    assert path.read_text() == "step 00100 loss 3.2\n"  # written before the job ends
    sink.write(tail)
    sink.finish()
    assert path.read_text() == job_log.clean_job_log(JOB_LOG)[0]
    assert sink.tags == {"gpu": "NVIDIA H100 80GB HBM3", "exit": "0"}


# ---------------------------------------------------------------------------- tasks


def test_cluster_task_reads_the_editable_yaml(tmp_path, monkeypatch):
    from labkit import nightlab as cli_run
    from nightlab.harness.profiles import data_dir, load_lab_profile

    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(tmp_path / "data"))
    cli_run("init", "lab", "--profile", "cpu", cwd=tmp_path)  # a built-in lab on `demo`
    lab = tmp_path / "lab"
    profile = load_lab_profile(lab)
    path = sky_task.worker_yaml(lab)
    assert "\n  NIGHTLAB_PIP_SPEC:" not in path.read_text()  # only a commented-out override
    path.write_text(path.read_text().replace("disk_size: 100", "disk_size: 256\n  use_spot: false"))
    spot = PoolConfig(
        backend="skypilot", tier="h100", slots=1, options={"accelerators": "H100:8", "use_spot": True}
    )
    task = sky_task.cluster_task(lab, spot, cluster="nl-abc123-h100-sky-0", builtin=True)
    (res,) = task.resources
    assert (res.accelerators, res.use_spot, res.disk_size) == ({"H100": 8}, True, 256)
    assert task.name == "nl-abc123-h100-sky-0"
    assert task.workdir == str(lab.resolve())
    assert task.envs["NIGHTLAB_BUILTIN"] == "1"
    assert task.envs["NIGHTLAB_PIP_SPEC"] == f"~/.nightlab/wheel/nightlab-{__version__}-py3-none-any.whl"
    assert "nightlab-gpu:" in task.run and "nightlab.fleet.build probe" in task.run
    # the lab's demo validation secret (made on first use) reaches set-up as a file, never an env
    secret = data_dir(profile) / "val.secret"
    assert task.file_mounts[sky_task.REMOTE_VAL_SECRET] == str(secret)
    assert secret.read_bytes().hex() not in json.dumps(task.envs)


# ---------------------------------------------------------------------------- the controller's own build


def _shipped(task) -> Path:
    (remote,) = [r for r in task.file_mounts if r.startswith(sky_task.REMOTE_WHEEL_DIR)]
    assert task.envs["NIGHTLAB_PIP_SPEC"] == remote
    return Path(task.file_mounts[remote])


def _unpacked_code(wheel: Path, into: Path) -> str:
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(into)
    return build.code_hash(into / "nightlab")


def test_the_shipped_metadata_pins_torch_to_the_controllers_release():
    """pyproject.toml asks for a torch range; a cluster installs the controller's own release."""
    from importlib import metadata

    meta = "Name: nightlab\nRequires-Dist: torch<3,>=2.9\nRequires-Dist: torchvision>=0.20\nRequires-Dist: click\n"
    pinned = build._pin_torch(meta).split("\n")
    assert pinned[1] == f"Requires-Dist: torch=={metadata.version('torch').split('+')[0]}"
    assert pinned[2:] == ["Requires-Dist: torchvision>=0.20", "Requires-Dist: click", ""]


def test_a_checkout_install_ships_a_wheel_of_the_running_code(tmp_path):
    lab = tmp_path / "lab"
    lab.mkdir()
    assert build.install_source() == "checkout"  # the test venv installs nightlab editable
    task = sky_task.cluster_task(lab, H100, cluster="c", builtin=False)
    wheel = _shipped(task)
    assert (
        wheel.parent == lab / sky_task.WHEEL_DIR and wheel.name == f"nightlab-{__version__}-py3-none-any.whl"
    )
    assert task.envs["NIGHTLAB_WHEEL_SHA256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    # what the worker imports after installing it hashes like what this process imports
    assert _unpacked_code(wheel, tmp_path / "unpacked") == build.code_hash()
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert f"nightlab-{__version__}.dist-info/METADATA" in names and "nightlab/fleet/build.py" in names
    # the worker's templates are package data: without them `sky_task` cannot even be imported there
    assert {"nightlab/fleet/templates/run.sh", "nightlab/fleet/templates/worker.yaml"} <= set(names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    meta = zipfile.ZipFile(wheel).read(f"nightlab-{__version__}.dist-info/METADATA").decode()
    assert "Requires-Dist: torch==2.13.0" in meta  # the cluster's torch is pinned like the controller's
    # the same code packs to the same bytes: a relaunch ships (and hashes) the same file
    again = build.build_wheel(tmp_path / "again")
    assert again.sha256 == task.envs["NIGHTLAB_WHEEL_SHA256"]


def test_a_wheel_install_ships_a_wheel_of_the_running_code(tmp_path):
    first = build.build_wheel(tmp_path / "dist")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(first.path)],
        check=True,
        capture_output=True,
    )
    # a controller that runs from that wheel install (its site dir first on the path)
    lab = tmp_path / "lab"
    lab.mkdir()
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from nightlab.config import PoolConfig\n"
        "from nightlab.fleet import build, sky_task\n"
        "pool = PoolConfig(backend='skypilot', tier='cpu', slots=1, options={'infra': 'slurm'})\n"
        "task = sky_task.cluster_task(Path(sys.argv[1]), pool, cluster='c', builtin=False)\n"
        "print(json.dumps({'source': build.install_source(), 'package': str(build.package_dir()),\n"
        "    'mounts': task.file_mounts, 'envs': task.envs}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(lab)], env=env, capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["source"] == "wheel" and got["package"].startswith(str(target))
    shipped = Path(got["mounts"][got["envs"]["NIGHTLAB_PIP_SPEC"]])
    assert got["envs"]["NIGHTLAB_WHEEL_SHA256"] == hashlib.sha256(shipped.read_bytes()).hexdigest()
    # the installed wheel repacks to the very file it came from
    assert got["envs"]["NIGHTLAB_WHEEL_SHA256"] == first.sha256
    assert _unpacked_code(shipped, tmp_path / "unpacked") == first.code == build.code_hash()


def test_an_explicit_pip_spec_overrides_the_shipped_wheel(tmp_path, caplog):
    lab = tmp_path / "lab"
    lab.mkdir()
    path = sky_task.worker_yaml(lab)
    spec = "git+https://github.com/example/nightlab@0123abc"
    path.write_text(path.read_text().replace("envs:\n", f"envs:\n  NIGHTLAB_PIP_SPEC: {spec}\n"))
    task = sky_task.cluster_task(lab, H100, cluster="c", builtin=False)
    assert task.envs["NIGHTLAB_PIP_SPEC"] == spec and not task.file_mounts
    assert "not the controller's own build" in caplog.text
    # the default of earlier templates names a release that does not exist: the wheel ships instead
    path.write_text(path.read_text().replace(spec, f"nightlab=={__version__}"))
    task = sky_task.cluster_task(lab, H100, cluster="c", builtin=False)
    assert _shipped(task).exists()


def test_a_worker_running_other_code_is_invalid_naming_both_hashes():
    log = "---\nval_bpb: 1.0\n"
    ok = classify(0, log, metric="val_bpb", code="aaaa", expected_code="aaaa")
    assert ok.outcome == "ok"
    bad = classify(0, log, metric="val_bpb", code="bbbb", expected_code="aaaa")
    assert bad.outcome == "invalid"
    assert "`bbbb`" in bad.detail and "`aaaa`" in bad.detail and "fleet up --relaunch" in bad.detail
    assert (
        classify(
            1,
            "Traceback (most recent call last):\nValueError: x\n",
            metric="val_bpb",
            code="bbbb",
            expected_code="aaaa",
        ).outcome
        == "invalid"
    )


def test_broken_yaml_is_a_usage_error(tmp_path):
    lab = tmp_path / "lab"
    (lab / "fleet").mkdir(parents=True)
    (lab / "fleet" / "skypilot.yaml").write_text("resources: [unclosed\n")
    with pytest.raises(UsageError, match="skypilot.yaml` is not valid YAML"):
        sky_task.cluster_task(lab, H100, cluster="c", builtin=False)
    (lab / "fleet" / "skypilot.yaml").write_text("resources:\n  accelerators: 3\n  nonsense_key: 1\n")
    with pytest.raises(UsageError, match="not a valid SkyPilot task"):
        sky_task.cluster_task(lab, H100, cluster="c", builtin=False)


def _git_lab(tmp_path: Path, files: dict[str, bytes]) -> tuple[Path, str]:
    lab = tmp_path / "lab"
    lab.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t"}
    subprocess.run(["git", "init", "-q"], cwd=lab, check=True, env=env)
    for name, data in files.items():
        (lab / name).write_bytes(data)
    commit_files(lab, list(files), "snapshot")
    return lab, head(lab)


def _spec(lab: Path, commit: str, command: str, timeout: float = 30) -> RunSpec:
    return RunSpec(
        experiment_id="e0007",
        attempt=2,
        snapshot=commit,
        command=command,
        env={"NIGHTLAB_EXPERIMENT": "e0007", "NIGHTLAB_TIER": "h100", "NIGHTLAB_LAB": "/local/lab"},
        timeout=timeout,
        run_dir=lab / ".nightlab" / "runs" / "e0007" / "attempt-2",
        lab_dir=lab,
    )


def _run_on_fake_cluster(task, home: Path) -> subprocess.CompletedProcess:
    home.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), **task.envs}
    return subprocess.run(["bash", "-c", task.run], env=env, capture_output=True, text=True, timeout=60)


def test_the_snapshot_travels_inside_the_job_byte_identical(tmp_path):
    big = os.urandom(200 * 1024)  # incompressible: three payload variables
    lab, commit = _git_lab(tmp_path, {"train.py": b"print('hi')\n", "blob.bin": big})
    (lab / "train.py").write_text("print('edited after the snapshot')\n")  # the job must not see this
    digest = hashlib.sha256(big).hexdigest()
    spec = _spec(lab, commit, 'sha256sum blob.bin && python3 train.py && echo "$NIGHTLAB_LAB"')
    task = sky_task.experiment_task(spec, H100, lab_dir=lab)
    assert isinstance(task, sky.Task) and task.name == "nightlab-e0007-a2"
    assert int(task.envs["NIGHTLAB_PAYLOAD_CHUNKS"]) == 3
    assert all(
        len(v) <= sky_task.PAYLOAD_CHUNK for k, v in task.envs.items() if k.startswith("NIGHTLAB_PAYLOAD_")
    )
    assert task.envs["NIGHTLAB_REMOTE_TIMEOUT"] == str(30 + sky_task.REMOTE_TIMEOUT_MARGIN)
    (res,) = task.resources
    assert res.accelerators == {"H100": 1}
    home = tmp_path / "cluster"
    proc = _run_on_fake_cluster(task, home)
    text, tags = job_log.clean_job_log(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert digest in text and "hi\n" in text and f"{home}/sky_workdir" in text
    start, end = float(tags.pop("start")), float(tags.pop("end"))  # the command's start and end
    assert start <= end and tags == {
        "gpu": "none",
        "exit": "0",
        "code": "none",
        "health": "none",
    }  # no venv here
    assert not (home / "nightlab" / "runs" / "e0007-a2").exists()  # the run cleans up after itself


def test_the_run_script_reports_the_target_exit_code_and_its_own_timeout(tmp_path):
    lab, commit = _git_lab(tmp_path, {"train.py": b"import sys; sys.exit(3)\n"})
    task = sky_task.experiment_task(_spec(lab, commit, "python3 train.py"), H100, lab_dir=lab)
    proc = _run_on_fake_cluster(task, tmp_path / "c1")
    assert proc.returncode == 3 and job_log.clean_job_log(proc.stdout)[1]["exit"] == "3"
    task = sky_task.experiment_task(_spec(lab, commit, "sleep 30"), H100, lab_dir=lab)
    task.update_envs({"NIGHTLAB_REMOTE_TIMEOUT": "1"})
    proc = _run_on_fake_cluster(task, tmp_path / "c2")
    assert job_log.clean_job_log(proc.stdout)[1]["exit"] == "124"


def test_a_payload_over_the_limit_names_the_fix(tmp_path, monkeypatch):
    lab, commit = _git_lab(tmp_path, {"blob.bin": os.urandom(64 * 1024)})
    monkeypatch.setattr(sky_task, "PAYLOAD_LIMIT", 32 * 1024)
    with pytest.raises(NightlabError, match="git rm --cached"):
        sky_task.payload_envs(lab, commit)


def test_prepare_worker_uses_the_lab_profile_without_a_ledger(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import nightlab.config as config
    import nightlab.harness.data as data
    from nightlab.harness.profiles import get_profile

    profiles = {"foreign": None, "builtin": get_profile("cpu").to_dict()}
    monkeypatch.setattr(
        config, "load_config", lambda path: SimpleNamespace(profile=profiles[path.parent.name])
    )
    seen = []
    monkeypatch.setattr(
        data, "prepare", lambda profile, progress, val_secret: seen.append(profile) or tmp_path / "data"
    )
    assert worker_setup.prepare_worker(tmp_path / "foreign") is None  # a foreign target prepares its own data
    assert worker_setup.prepare_worker(tmp_path / "builtin") == tmp_path / "data"
    assert seen == [get_profile("cpu")]


def test_the_last_score_line_wins_and_half_a_line_cannot_swallow_it(tmp_path):
    import base64
    import json

    real = base64.b64encode(json.dumps({"status": "ok", "val_bpb": 1.25}).encode()).decode()
    forged = base64.b64encode(json.dumps({"status": "ok", "val_bpb": 0.01}).encode()).decode()
    text = (
        f"(t, pid=1) nightlab-score: {forged}\n(t, pid=1) half a line, no newline"
        f"nightlab-score: {real}\n(t, pid=1) nightlab-exit: 0\n"
    )
    _, tags = job_log.clean_job_log(text)  # SkyPilot prefixes the joined line once
    assert job_log.save_score(tmp_path, tags)
    assert json.loads((tmp_path / "score.json").read_text())["val_bpb"] == 1.25
    for raw in ("none", "not base64!", base64.b64encode(b"[1, 2]").decode()):
        assert not job_log.save_score(tmp_path / raw[:4], {"score": raw})


def test_a_worker_without_a_sandbox_marks_every_score_unsandboxed(tmp_path):
    """The launch job's probe (before any experiment) found no bwrap: a score claiming one is marked down."""
    import base64
    import json

    claim = base64.b64encode(
        json.dumps({"status": "ok", "val_bpb": 1.2, "sandbox": "bwrap"}).encode()
    ).decode()
    assert job_log.save_score(tmp_path, {"score": claim}, worker_sandbox="none")
    saved = json.loads((tmp_path / "score.json").read_text())
    assert saved["sandbox"] == "none" and "bubblewrap" in saved["unsandboxed"]
    assert job_log.save_score(tmp_path, {"score": claim}, worker_sandbox="bwrap")
    assert json.loads((tmp_path / "score.json").read_text())["sandbox"] == "bwrap"
    probe = job_log.clean_job_log("(t, pid=2) nightlab-sandbox: none\n")[1]
    assert probe == {"sandbox": "none"}


def test_a_reattached_run_on_a_worker_without_a_sandbox_is_marked_down(tmp_path):
    """A controller that did not launch the cluster reads the probe from the ledger's `cluster-up`.

    Without it, a run on a worker whose set-up probe found no bubblewrap would have its score's
    word taken after a controller restart (the cluster object of the new controller knows nothing).
    """
    import base64

    from nightlab.fleet.skypilot.clusters import Cluster
    from nightlab.fleet.skypilot.core import Shared
    from nightlab.fleet.skypilot.jobs import Jobs, Run
    from nightlab.ledger import Ledger

    with Ledger(tmp_path / "ledger.db", create=True) as ledger:
        for kind, worker, data in [
            ("cluster-launch", "w1", {}),
            ("cluster-up", "w1", {"sandbox": "none"}),
            ("cluster-launch", "w2", {}),
            ("cluster-up", "w2", {"sandbox": "bwrap"}),
            ("cluster-lost", "w2", {}),  # relaunched since: that probe no longer holds
        ]:
            ledger.log_event(kind, None, worker=worker, cluster=f"c-{worker}", **data)
        shared = Shared(None, lab_dir=None, status_interval=1.0, log_retries=1, retry_delay=0.0)
        shared.use_ledger(ledger)
    assert shared.recorded_software == {"w1": {"sandbox": "none"}}
    shared.event("cluster-up", "w2", {"sandbox": "bwrap"})  # this backend's own launch
    assert shared.recorded_software["w2"] == {"sandbox": "bwrap"}

    lab, commit = _git_lab(tmp_path, {"train.py": b"print(1)\n"})
    spec = _spec(lab, commit, "python train.py")
    spec.log_path.parent.mkdir(parents=True)
    spec.log_path.write_text("---\nval_bpb: 1.2\n")
    pool = PoolConfig(backend="skypilot", tier="h100", slots=1)
    run = Run("k", spec, Cluster("w1", "c-w1", pool))  # software unknown: not launched by us
    claim = base64.b64encode(json.dumps({"status": "ok", "val_bpb": 1.2, "sandbox": "bwrap"}).encode())
    Jobs(shared, clusters=None)._finish(run, "SUCCEEDED", {"score": claim.decode(), "exit": "0"})
    assert json.loads((spec.run_dir / "score.json").read_text())["sandbox"] == "none"


def test_only_the_command_holds_the_run_lock(tmp_path):
    """A queued run unpacks before the lock, and the lock is free while a run reports its code hash."""
    import fcntl
    import time

    lab, commit = _git_lab(tmp_path, {"train.py": b"print('hi')\n"})
    home = tmp_path / "cluster"
    (home / "bin").mkdir(parents=True)
    # the worker's python: its code hash says whether the run lock is free at that moment
    (home / "bin" / "python").write_text(
        '#!/bin/bash\nif [ "$*" = "-m nightlab.fleet.build hash --on-eof" ]; then\n  cat >/dev/null\n'
        '  flock -n "$HOME/.nightlab-run.lock" true && echo lock-free || echo lock-held; exit 0\nfi\n'
        'exec python3 "$@"\n'
    )
    (home / "bin" / "python").chmod(0o755)
    task = sky_task.experiment_task(_spec(lab, commit, "python3 train.py"), H100, lab_dir=lab)
    env = {"PATH": f"{home / 'bin'}:{os.environ['PATH']}", "HOME": str(home), **task.envs}
    with open(home / ".nightlab-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the run before it holds the cluster
        proc = subprocess.Popen(["bash", "-c", task.run], env=env, stdout=subprocess.PIPE, text=True)
        unpacked = home / "nightlab" / "runs" / "e0007-a2" / "train.py"
        deadline = time.time() + 30
        while not unpacked.exists() and time.time() < deadline:
            time.sleep(0.05)
        assert unpacked.exists() and proc.poll() is None  # ready, waiting for the lock
        fcntl.flock(lock, fcntl.LOCK_UN)
        out, _ = proc.communicate(timeout=60)
    text, tags = job_log.clean_job_log(out)
    assert proc.returncode == 0 and "hi\n" in text
    assert tags["code"] == "lock-free"  # reported after the command let the lock go


def _run_script(tmp_path, command: str, python_stub: str) -> tuple[str, dict[str, str], Path]:
    """Run the experiment task's script here with a stub `python` first on PATH; (log, tags, home)."""
    lab, commit = _git_lab(tmp_path, {"train.py": b"print('hi')\n"})
    home = tmp_path / "cluster"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "python").write_text(f'#!/bin/bash\n{python_stub}\nexec python3 "$@"\n')
    (home / "bin" / "python").chmod(0o755)
    task = sky_task.experiment_task(_spec(lab, commit, command), H100, lab_dir=lab)
    env = {"PATH": f"{home / 'bin'}:{os.environ['PATH']}", "HOME": str(home), **task.envs}
    proc = subprocess.run(["bash", "-c", task.run], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text, tags = job_log.clean_job_log(proc.stdout)
    return text, tags, home


def test_the_code_hash_starts_beside_the_run_and_reads_the_files_after_it(tmp_path):
    """Its interpreter's start-up is not between two runs; the package is still hashed after the command."""
    stub = (
        'if [ "$*" = "-m nightlab.fleet.build hash --on-eof" ]; then\n'
        '  date +%s.%N > "$HOME/hasher-started"; cat >/dev/null; date +%s.%N > "$HOME/hasher-hashed"\n'
        "  echo hashed-after; exit 0\nfi"
    )
    command = 'sleep 0.5; date +%s.%N > "$HOME/command-ended"'
    text, tags, home = _run_script(tmp_path, command, stub)
    started, ended, hashed = (
        float((home / n).read_text()) for n in ("hasher-started", "command-ended", "hasher-hashed")
    )
    assert started < ended <= hashed
    assert tags["code"] == "hashed-after" and tags["exit"] == "0"
    assert not list((home / "nightlab" / "runs").iterdir())  # the run's folders are gone


def test_the_command_does_not_hold_the_code_hash_open(tmp_path):
    """A process the run leaves behind cannot keep the hash (and so the job) waiting."""
    command = "if ls -l /proc/$$/fd | grep -q '[.]code/go'; then echo holds-it; else echo closed; fi"
    text, tags, _ = _run_script(tmp_path, command, "")
    assert "closed\n" in text and "holds-it" not in text


def test_a_code_hash_process_that_died_is_replaced_after_the_run(tmp_path):
    """An unsandboxed run may end the waiting hasher: the hash is then taken the old way."""
    stub = (
        'if [ "$*" = "-m nightlab.fleet.build hash --on-eof" ]; then exit 1; fi\n'
        'if [ "$*" = "-m nightlab.fleet.build hash" ]; then echo taken-after; exit 0; fi'
    )
    _, tags, _ = _run_script(tmp_path, "true", stub)
    assert tags["code"] == "taken-after"


def test_the_waiting_code_hash_is_the_real_one(tmp_path):
    """`hash --on-eof` prints the same code hash as `hash`, once its stdin closes."""
    proc = subprocess.run(
        [sys.executable, "-m", "nightlab.fleet.build", "hash", "--on-eof"],
        input=b"anything\n", capture_output=True, cwd="/", timeout=60,
    )  # fmt: skip
    assert proc.stdout.decode().strip() == build.code_hash()


def test_a_rungs_budget_travels_to_the_remote_supervisor(tmp_path):
    """The tier's budget (`nightlab.rungs`) reaches a SkyPilot worker in the job's environment, where
    the harness's supervisor reads it, as on a local worker (issue 34)."""
    from dataclasses import replace

    from nightlab.rungs import BUDGET_ENV

    lab, commit = _git_lab(tmp_path, {"train.py": b"print('hi')\n"})
    spec = _spec(lab, commit, f'echo "budget=${BUDGET_ENV}"')
    spec = replace(spec, env={**spec.env, BUDGET_ENV: "60.0"})
    task = sky_task.experiment_task(spec, H100, lab_dir=lab)
    assert task.envs[BUDGET_ENV] == "60.0"
    proc = _run_on_fake_cluster(task, tmp_path / "cluster")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "budget=60.0" in job_log.clean_job_log(proc.stdout)[0]


@pytest.mark.parametrize("module", ["nightlab.fleet.worker_setup", "nightlab.fleet.sky_task"])
def test_the_set_up_entry_point_answers_under_both_names(module, tmp_path):
    """Labs made before the split name `sky_task` in their fleet/skypilot.yaml set-up: it forwards."""
    proc = subprocess.run(
        [sys.executable, "-m", module, "nope"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 1 and "usage: python -m nightlab.fleet.worker_setup prepare" in proc.stderr
