"""The SkyPilot tasks a remote worker runs, and reading their logs back.

Two tasks per worker cluster:

- the *cluster task* (`sky.launch`, once per cluster): the lab's `fleet/skypilot.yaml`, an
  ordinary SkyPilot YAML that users may edit (image, disk, setup, envs), with the pool's
  `accelerators` / `infra` / `use_spot` from `nightlab.toml` filled in. Its setup installs
  nightlab and the target's dependencies and prepares the data with the lab's profile; its
  run is a probe that prints the exact GPU name.
- the *experiment task* (`sky.exec`, once per attempt): `RUN_SCRIPT` with the snapshot
  inside the job itself, as a base64 tar.gz split over environment variables. The cluster
  workdir is shared and rsynced without delete, so shipping code through it could let two
  experiments see each other's files; an env payload cannot. Each variable stays under
  Linux's 128 KiB limit for one environment string (`MAX_ARG_STRLEN`); a new built-in lab
  (train.py, program.md, nightlab.toml, agent skills) is 14.5 KB as a tar.gz.

Logs come back through `sky.tail_logs` with SkyPilot's `(task, pid=1234) ` prefix on every
line of the job's output and its own progress lines in between; `JobLogSink` keeps the
job's lines, strips the prefixes and takes out the two lines the run script adds
(`nightlab-gpu:` and `nightlab-exit:`), writing as the log streams in.

Usage: `cluster_task(lab_dir, pool, cluster="nl-1a2b3c-h100-k8s-0", builtin=True)`,
`experiment_task(spec, pool, lab_dir=lab_dir)`; both return real `sky.Task` objects.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from nightlab import __version__
from nightlab.atomic import atomic_write_text
from nightlab.config import PoolConfig
from nightlab.errors import NightlabError, UsageError
from nightlab.fleet.backend import RunSpec
from nightlab.fleet.build import Wheel, build_wheel
from nightlab.snapshots import git

if TYPE_CHECKING:
    import sky

log = logging.getLogger("nightlab.skypilot")

WORKER_YAML_PATH = Path("fleet") / "skypilot.yaml"
WHEEL_DIR = Path(".nightlab") / "fleet" / "wheel"  # the controller's own build, in the lab
# where each cluster receives that wheel (`~` is the cluster's home; set-up expands it)
REMOTE_WHEEL_DIR = "~/.nightlab/wheel"
# where set-up finds the lab's `demo` validation secret (a file mount of the controller's
# `val.secret`); `prepare_worker` moves it into the data folder, which the sandbox hides. Not an
# env: SkyPilot writes a task's envs into its job scripts under ~/.sky, which a run can read.
REMOTE_VAL_SECRET = "~/.nightlab/val.secret"
PAYLOAD_CHUNK = 96 * 1024  # bytes of base64 per variable, under MAX_ARG_STRLEN (128 KiB)
PAYLOAD_LIMIT = 1024 * 1024  # all chunks together stay well under ARG_MAX (2 MiB on Linux)
# The remote `timeout` is a backstop for a dead controller: the controller's own deadline,
# which starts when the job reports `nightlab-start:`, always fires first and cancels the
# job (outcome `timeout`).
REMOTE_TIMEOUT_MARGIN = 60
_LOCAL_PATHS = {
    "NIGHTLAB_LAB",
    "NIGHTLAB_DATA_DIR",
}  # paths on the controller's machine: meaningless remotely
# a deeper queue commits experiments to a worker earlier for no gain: two hide an exec slower than a run
MAX_QUEUE_DEPTH = 8
POOL_OPTIONS = {
    "accelerators",
    "infra",
    "use_spot",
    "autostop",
    "autodown",
    "hourly_price",
    "pipeline",
    "runner",
    "slots_per_cluster",
}

WORKER_YAML = """\
# The SkyPilot task of every nightlab worker cluster (one cluster per worker).
# Reference: https://docs.skypilot.co/en/latest/reference/yaml-spec.html
#
# nightlab fills in, per [[fleet.pool]] of nightlab.toml: resources.accelerators,
# resources.infra and resources.use_spot; `nightlab fleet up` launches one cluster per worker
# with this file. Edit anything else (image, disk, setup, envs). `run` is replaced: per
# experiment nightlab ships the snapshot and runs the target with `sky exec`.
name: nightlab-worker

resources:
  disk_size: 100
  # image_id: docker:nvcr.io/nvidia/pytorch:25.01-py3

# The lab itself: synced to ~/sky_workdir at launch (SkyPilot honours .gitignore), so
# setup can install the target's requirements and prepare its data.
workdir: .

envs:
  NIGHTLAB_VENV: ~/nightlab-venv
  # nightlab itself: by default `fleet up` ships a wheel of the controller's own nightlab
  # (file_mounts) and points NIGHTLAB_PIP_SPEC at it. Set it here only to install something
  # else on purpose (a git URL, a wheel path, a released version). WARNING: whatever it
  # installs runs next to your cloud credentials, and a result from code whose hash differs
  # from the controller's is `invalid`; never name a package you have not checked.
  # NIGHTLAB_PIP_SPEC: git+https://github.com/you/nightlab@<commit>

setup: |
  set -e
  # a relaunched cluster keeps its home, or what a lost allocation's clean-up left of it (Slurm):
  # a working venv is reused, a broken one made again
  "${NIGHTLAB_VENV/#\\~/$HOME}/bin/python" -c 'import sys, pip; assert sys.prefix != sys.base_prefix and pip.__file__.startswith(sys.prefix)' 2>/dev/null ||
    python3 -m venv --clear "${NIGHTLAB_VENV/#\\~/$HOME}"
  . "${NIGHTLAB_VENV/#\\~/$HOME}/bin/activate"
  pip install -q --upgrade pip
  # nightlab with its dependencies (torch pinned to the controller's), then this exact
  # build again: a cluster set up before may hold other code under the same version
  spec="${NIGHTLAB_PIP_SPEC/#\\~/$HOME}"
  pip install -q "$spec"
  pip install -q --no-deps --force-reinstall "$spec"
  if [ -f requirements.txt ]; then pip install -q -r requirements.txt; fi
  # The training sandbox (bubblewrap): without it, built-in-target runs on this worker still
  # run and are scored by the harness, but are marked `unsandboxed` (docs/integrity.md).
  if ! command -v bwrap >/dev/null 2>&1; then
    { sudo -n apt-get install -y -q bubblewrap || apt-get install -y -q bubblewrap; } >/dev/null 2>&1 ||
      echo "nightlab: bubblewrap could not be installed here: runs on this worker are unsandboxed"
  fi
  # The data, tokenizer and validation shard the lab measures with, built from the lab's
  # profile; every result's data fingerprint is checked against the lab's.
  # (the synced lab has no ledger, so this reads nightlab.toml alone)
  if [ "$NIGHTLAB_BUILTIN" = 1 ]; then python -m nightlab.fleet.sky_task prepare;
  elif [ -f prepare.py ]; then python prepare.py; fi

run: |
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | sed 's/^/nightlab-gpu: /'
  "${NIGHTLAB_VENV/#\\~/$HOME}/bin/python" -m nightlab.fleet.build probe
"""

# The per-experiment run. It never touches the shared workdir: the snapshot comes out of
# the job's own environment into a directory named for the attempt. With NIGHTLAB_SUPERVISE=1
# (the built-in target) the command runs under the harness's supervisor, as on a local slot
# (`harness/attempt.py`: sandbox, clock and wall checks, digests, the scorer), and its
# `score.json` comes back on the job's last lines, after every process of the run has ended
# (see `save_score` for why a line train.py printed cannot stand in for it). `-I`: the
# snapshot (the cwd) must not shadow the installed harness, and PYTHONPATH does not count.
RUN_SCRIPT = r"""set -u
venv="${NIGHTLAB_VENV:-$HOME/nightlab-venv}"; venv="${venv/#\~/$HOME}"
if [ -f "$venv/bin/activate" ]; then . "$venv/bin/activate"; fi
export NIGHTLAB_LAB="$HOME/sky_workdir" PYTHONUNBUFFERED=1
run_dir="$HOME/nightlab/runs/$NIGHTLAB_RUN"
supervise="${NIGHTLAB_SUPERVISE:-0}"; unset NIGHTLAB_SUPERVISE
work="$run_dir"; if [ "$supervise" = 1 ]; then work="$run_dir/work"; fi
hashing="$run_dir.code"  # the code hash's channel (below); beside the run, not in its directory
rm -rf "$run_dir" "$hashing" && mkdir -p "$work" "$hashing"
i=0
while [ "$i" -lt "$NIGHTLAB_PAYLOAD_CHUNKS" ]; do
  eval "printf '%s' \"\$NIGHTLAB_PAYLOAD_$i\""
  i=$((i + 1))
done | base64 -d | tar -xzf - -C "$work"
if [ $? -ne 0 ]; then echo "nightlab: the snapshot payload could not be unpacked"; echo "nightlab-exit: 97"; exit 97; fi
unset $(env | sed -n 's/^\(NIGHTLAB_PAYLOAD_[0-9]*\)=.*/\1/p')
# The code hash of the nightlab this run imports is taken after the run (so a run that changed
# the installed nightlab is caught), but its interpreter starts now, so its start-up and imports
# are not between two runs (the script's time after the command: 0.093 -> 0.027 s at load 2,
# bench/RESULTS.md; more under load). It reads
# the package's files only at EOF on the FIFO, which comes when the script closes its end after
# the command (no process of the run holds that end: it is closed for the command; a sandboxed
# run's processes all end with it). From /, so no folder shadows it; PYTHONPATH counts, as it
# does for the run. Without a FIFO the hash is taken after the command, as below.
hasher=""
if mkfifo "$hashing/go" 2>/dev/null; then
  (cd / && exec python -m nightlab.fleet.build hash --on-eof <"$hashing/go" >"$hashing/code" 2>/dev/null) &
  hasher=$!
  exec {go}>"$hashing/go"
else
  exec {go}>/dev/null
fi
# A lane of an N-slot cluster (NIGHTLAB_GPU, NIGHTLAB_SLOTS; docs/skypilot.md "Several slots per
# cluster") runs on its own GPU(s) with 1/N of the node's CPUs (the cgroup's quota where one is
# set: a container's share, not the host's cores), and has a run lock of its own. Slurm gives each
# lane's job a whole GPU of its own and may confine the step to that device (ConstrainDevices), so
# there its choice stands; Ray may pack two fractional jobs onto one GPU, so there the lane pins.
# A one-slot cluster sees what the job was given, as before.
lock="$HOME/.nightlab-run.lock"
if [ -n "${NIGHTLAB_GPU:-}" ]; then
  if [ -z "${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}" ] || [ -z "${CUDA_VISIBLE_DEVICES:-}" ]; then
    export CUDA_VISIBLE_DEVICES="$NIGHTLAB_GPU"
  fi
  lock="$HOME/.nightlab-run-g${NIGHTLAB_GPU%%,*}.lock"
  cpus=$(nproc --all 2>/dev/null || echo 1)
  if [ -r /sys/fs/cgroup/cpu.max ] && read -r quota period </sys/fs/cgroup/cpu.max && [ "$quota" != max ]; then
    cpus=$(( (quota + period - 1) / period ))
  fi
  threads=$(( cpus / ${NIGHTLAB_SLOTS:-1} )); if [ "$threads" -lt 1 ]; then threads=1; fi
  export NIGHTLAB_THREADS="$threads" OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}"
  export MKL_NUM_THREADS="${MKL_NUM_THREADS:-$threads}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-$threads}"
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "nightlab-gpu: ${gpu:-none}"
# One experiment at a time per cluster (per lane), whatever SkyPilot's scheduler would let run beside it
# (on Ray-based infra a fractional request could share a GPU; on Slurm each job is an exclusive
# step that asks for the GPU and every CPU of the cluster, so Slurm already serialises them):
# a next one that starts early waits here with its snapshot unpacked. Its budget starts at
# `nightlab-start:`, not at `sky exec`. The run inherits the lock: a process it leaves behind
# keeps the next one waiting.
exec 9>"$lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi
echo "nightlab-start: $(date +%s.%N)"
# The run's machine health, sampled beside it by the mark its processes inherit (the resident
# runner sets one; `sky exec` does not), judged by the controller (`fleet/worker_health.py`). The
# sampler holds neither the lock nor the hasher's FIFO: the next run and the hash never wait on it.
export NIGHTLAB_ATTEMPT="${NIGHTLAB_ATTEMPT:-sky/$NIGHTLAB_RUN/$$}"
(cd / && exec python -m nightlab.fleet.worker_health --mark "$NIGHTLAB_ATTEMPT" --threads "${NIGHTLAB_THREADS:-0}" \
  --exclude $$ $hasher --out "$hashing/health.json" >/dev/null 2>&1 9>&- {go}>&-) &
sampler=$!
cd "$work"
# stderr joins stdout here: SkyPilot on Slurm carries the two apart and reordered a traceback
# before the lines printed ahead of it (the conformance suite's crash scenario, real SDK)
if [ "$supervise" = 1 ]; then
  timeout -k 10 "$NIGHTLAB_REMOTE_TIMEOUT" python -I -m nightlab.harness.attempt \
    --run-dir "$run_dir" --lab "$NIGHTLAB_LAB" -- "$NIGHTLAB_COMMAND" 2>&1 {go}>&-
else
  timeout -k 10 "$NIGHTLAB_REMOTE_TIMEOUT" bash -c "$NIGHTLAB_COMMAND" 2>&1 {go}>&-
fi
code=$?
echo "nightlab-end: $(date +%s.%N)"
kill -TERM "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
# the experiment is over: a next job waiting at the lock may start while this one reports; on
# Slurm the next job's step waits for this whole job to exit instead (docs/skypilot.md, "Pipelining")
exec 9>&-
cd "$HOME"
# now the hasher reads the package's files (above): a result from other code is `invalid`; the
# hash is taken the old way if that process is gone (an unsandboxed run may have ended it)
exec {go}>&-
if [ -n "$hasher" ]; then wait "$hasher"; fi
nightlab_code=$(cat "$hashing/code" 2>/dev/null)
if [ -z "$nightlab_code" ]; then nightlab_code=$(cd / && python -m nightlab.fleet.build hash 2>/dev/null || echo none); fi
echo "nightlab-code: $nightlab_code"
if [ "$supervise" = 1 ]; then
  echo "nightlab-score: $(base64 -w0 "$run_dir/score.json" 2>/dev/null || echo none)"
fi
echo "nightlab-health: $(base64 -w0 "$hashing/health.json" 2>/dev/null || echo none)"
echo "nightlab-exit: $code"
rm -rf "$run_dir" "$hashing"
exit $code
"""


SKYPILOT_SERIES = "0.14."  # the SDK signatures this module is written against


def _sky():
    """The `sky` module, refused clearly when missing or of another release series."""
    try:
        import sky
    except ImportError as e:
        raise UsageError(
            'a [[fleet.pool]] uses `backend = "skypilot"` but SkyPilot is not installed; '
            "run `pip install 'nightlab[skypilot]'`"
        ) from e
    version = getattr(sky, "__version__", "?")
    if not version.startswith(SKYPILOT_SERIES):
        raise UsageError(
            f"nightlab's SkyPilot backend is written for skypilot {SKYPILOT_SERIES}x, found `{version}`; "
            "run `pip install 'nightlab[skypilot]'` (skypilot>=0.14,<0.15)"
        )
    return sky


def check_pool(pool: PoolConfig) -> None:
    """Refuse unknown keys of a skypilot pool (config.py passes them through as `options`)."""
    unknown = sorted(set(pool.options) - POOL_OPTIONS)
    if unknown:
        raise UsageError(
            f"unknown key `{unknown[0]}` in the skypilot pool of tier `{pool.tier}`; "
            f"known keys: backend, tier, workers, {', '.join(sorted(POOL_OPTIONS))}"
        )
    runner = pool.options.get("runner", True)
    if not isinstance(runner, bool):
        raise UsageError(
            f"`runner = {runner!r}` in the skypilot pool of tier `{pool.tier}`: use true (a resident "
            "runner per Slurm cluster, the default) or false (one `sky exec` per experiment)"
        )
    if (
        runner is True
        and "runner" in pool.options
        and not str(pool.options.get("infra", "")).startswith("slurm/")
    ):
        raise UsageError(
            f'`runner = true` in the skypilot pool of tier `{pool.tier}` needs `infra = "slurm/<cluster>"` '
            "(the runner is reached through that cluster's entry in ~/.slurm/config); remove `runner`"
        )
    depth = pool.options.get("pipeline", True)
    if not isinstance(depth, int) or (not isinstance(depth, bool) and not 0 <= depth <= MAX_QUEUE_DEPTH):
        raise UsageError(
            f"`pipeline = {depth!r}` in the skypilot pool of tier `{pool.tier}`: use true, false, "
            f"or the number of experiments queued behind the running one (0-{MAX_QUEUE_DEPTH})"
        )


def worker_yaml(lab_dir: Path) -> Path:
    """The lab's `fleet/skypilot.yaml`, written from the template when missing."""
    path = lab_dir / WORKER_YAML_PATH
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # launches run on several threads: the file must appear whole or not at all
        atomic_write_text(path, WORKER_YAML, unique=True)
    return path


def load_worker_config(lab_dir: Path) -> dict[str, Any]:
    """The parsed worker YAML (a SkyPilot task config)."""
    import yaml  # a SkyPilot dependency

    path = worker_yaml(lab_dir)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise UsageError(f"`{path}` is not valid YAML: {str(e).splitlines()[0]}; fix it or delete it") from e
    if not isinstance(doc, dict):
        raise UsageError(f"`{path}` must be a SkyPilot task (a YAML mapping); fix it or delete it")
    return doc


def _resources(doc: dict[str, Any], pool: PoolConfig) -> dict[str, Any]:
    res = dict(doc.get("resources") or {})
    for key in ("accelerators", "infra", "use_spot"):
        if key in pool.options:
            res[key] = pool.options[key]
    return res


def pip_override(doc: dict[str, Any]) -> str | None:
    """The worker YAML's explicit `NIGHTLAB_PIP_SPEC`, or None when the controller ships its wheel.

    `nightlab==<this version>` is what earlier templates wrote by default: no such release
    exists, so it is no choice of the user's and the wheel is shipped instead.
    """
    spec = str((doc.get("envs") or {}).get("NIGHTLAB_PIP_SPEC") or "").strip()
    if not spec or spec == f"nightlab=={__version__}":
        return None
    return spec


def cluster_task(
    lab_dir: Path, pool: PoolConfig, *, cluster: str, builtin: bool, wheel: Wheel | None = None
) -> sky.Task:
    """The task `sky.launch` runs once per worker cluster: set-up plus a GPU and version probe.

    Args:
        wheel: the controller's own nightlab (`build.build_wheel`), shipped as a file mount
            to `REMOTE_WHEEL_DIR` and installed by set-up; built here when None, unless
            the worker YAML sets `NIGHTLAB_PIP_SPEC` on purpose.
    """
    sky = _sky()
    doc = load_worker_config(lab_dir)
    doc["name"] = cluster
    doc["resources"] = _resources(doc, pool)
    workdir = doc.get("workdir", ".")
    if isinstance(workdir, str):
        doc["workdir"] = str((lab_dir / workdir).resolve())  # relative to the lab
    envs = {str(k): str(v) for k, v in (doc.get("envs") or {}).items()}
    envs.update({"NIGHTLAB_TIER": pool.tier, "NIGHTLAB_BUILTIN": "1" if builtin else "0"})
    override = pip_override(doc)
    if override is None:
        wheel = wheel or build_wheel(lab_dir / WHEEL_DIR)
        remote = f"{REMOTE_WHEEL_DIR}/{wheel.path.name}"
        doc["file_mounts"] = {**(doc.get("file_mounts") or {}), remote: str(wheel.path)}
        envs.update({"NIGHTLAB_PIP_SPEC": remote, "NIGHTLAB_WHEEL_SHA256": wheel.sha256})
    else:
        log.warning(
            "fleet/skypilot.yaml installs nightlab from `%s` (NIGHTLAB_PIP_SPEC), not the controller's "
            "own build: results from other code are `invalid`",
            override,
        )
    secret = lab_val_secret_file(lab_dir) if builtin else None
    if secret is not None:  # every worker scores on the lab's validation set, not one of its own
        doc["file_mounts"] = {**(doc.get("file_mounts") or {}), REMOTE_VAL_SECRET: str(secret)}
    doc["envs"] = envs
    try:
        return sky.Task.from_yaml_config(doc)
    except (ValueError, TypeError) as e:  # SkyPilot's schema errors
        raise UsageError(f"`{lab_dir / WORKER_YAML_PATH}` is not a valid SkyPilot task: {e}") from e


def lab_val_secret_file(lab_dir: Path) -> Path | None:
    """The controller's file of the lab's validation secret (`demo` only, made on first use), else None.

    It lies in the controller's data folder for the lab's profile: local runs score on it, and the
    controller refuses a score from another set (`runner.expected_val_set`).
    """
    from nightlab.config import load_lab_config
    from nightlab.harness.cache import VAL_SECRET_NAME, folder_val_secret
    from nightlab.harness.profiles import Profile, data_dir, parse_dataset

    config = load_lab_config(lab_dir).config
    if not config.profile:
        return None
    profile = Profile.from_dict(config.profile)
    if parse_dataset(profile.dataset)[0] != "demo":
        return None
    folder = data_dir(profile)
    folder_val_secret(folder)
    return folder / VAL_SECRET_NAME


def payload_envs(lab_dir: Path, commit: str) -> dict[str, str]:
    """The snapshot as a base64 tar.gz split over `NIGHTLAB_PAYLOAD_<i>` variables."""
    data = base64.b64encode(git(lab_dir, "archive", "--format=tar.gz", commit)).decode()
    if len(data) > PAYLOAD_LIMIT:
        raise NightlabError(
            f"snapshot `{commit[:12]}` is {len(data) / 2**20:.1f} MiB as a payload (limit "
            f"{PAYLOAD_LIMIT / 2**20:.0f} MiB); untrack large files in the lab (`git rm --cached`)"
        )
    chunks = [data[i : i + PAYLOAD_CHUNK] for i in range(0, len(data), PAYLOAD_CHUNK)] or [""]
    envs = {f"NIGHTLAB_PAYLOAD_{i}": c for i, c in enumerate(chunks)}
    envs["NIGHTLAB_PAYLOAD_CHUNKS"] = str(len(chunks))
    return envs


def job_name(spec: RunSpec) -> str:
    """The SkyPilot job name of an attempt; a restarted controller finds the job by it."""
    return f"nightlab-{spec.experiment_id}-a{spec.attempt}"


def experiment_task(
    spec: RunSpec,
    pool: PoolConfig,
    *,
    lab_dir: Path,
    slot_env: dict[str, str] | None = None,
    cpus: str | None = None,
) -> sky.Task:
    """The task `sky.exec` runs for one attempt (see the module docstring).

    Args:
        slot_env: the slot's variables (an N-slot cluster's lane: `NIGHTLAB_GPU`, `NIGHTLAB_SLOTS`).
        cpus: the lane's CPUs on a Slurm cluster of several slots (`core.lane_cpus`), else None.
    """
    from nightlab.fleet.skypilot.core import lane_accelerators

    sky = _sky()
    doc = load_worker_config(lab_dir)
    envs = {str(k): str(v) for k, v in (doc.get("envs") or {}).items()}
    envs.update(slot_env or {})
    envs.update({k: v for k, v in spec.env.items() if k not in _LOCAL_PATHS})
    envs.update(payload_envs(lab_dir, spec.snapshot))
    envs.update(
        {
            "NIGHTLAB_RUN": f"{spec.experiment_id}-a{spec.attempt}",
            "NIGHTLAB_COMMAND": spec.command,
            "NIGHTLAB_REMOTE_TIMEOUT": str(int(spec.timeout) + REMOTE_TIMEOUT_MARGIN),
        }
    )
    accelerators = _resources(doc, pool).get("accelerators")
    if slot_env and "NIGHTLAB_GPU" in slot_env:  # one lane of an N-slot cluster: its share
        accelerators = lane_accelerators(pool)
    # the job must ask for the GPU, or SkyPilot schedules it with no visible device
    resources = sky.Resources(accelerators=accelerators, **({"cpus": cpus} if cpus else {}))
    return sky.Task(name=job_name(spec), run=RUN_SCRIPT, envs=envs, resources=resources)


# ---------------------------------------------------------------------------- reading logs

_COLOR = r"(?:\x1b\[[0-9;]*m)*"
_PREFIX = re.compile(rf"^{_COLOR}\([^()\n]*\bpid=\d+[^()\n]*\){_COLOR} ?")
# Unanchored, last occurrence: a run that ends with half a line (no newline) would otherwise swallow the
# run script's next tag. A tag's authority is its order (the run script prints last), not its column.
_TAG = re.compile(r"^.*nightlab-(gpu|exit|code|version|torch|sandbox|score|health|start|end): ?(.*?)\s*$")


OTHER_FORMAT_LIMIT = 8 * 1024 * 1024  # chars of unprefixed lines kept in case no line has a prefix


class JobLogSink(io.TextIOBase):
    """An `output_stream` for `sky.tail_logs` that writes the job's own output to `out`.

    Lines with SkyPilot's `(name, pid=N)` prefix are the job's: the prefix goes, the run
    script's tags (`nightlab-gpu:`, `nightlab-exit:`) go to `tags`, the rest is written at
    once (so a followed log can be watched while the job runs, and a chatty job's log never
    sits in memory). Lines without a prefix are SkyPilot's progress output and are dropped,
    unless no line has a prefix at all (another SkyPilot log format): then `finish` writes
    those (the last `OTHER_FORMAT_LIMIT` characters).
    """

    def __init__(
        self,
        out: IO[str] | Path,
        *,
        active: Callable[[], bool] | None = None,
        on_tag: Callable[[str, str], None] | None = None,
        raw: bool = False,
    ) -> None:
        super().__init__()
        self._raw = raw  # every line is the job's own: a resident runner's log has no SkyPilot prefix
        self.tags: dict[str, str] = {}
        self._on_tag = on_tag  # told of each tag as it streams in (the job's start)
        self._active = active  # False once another reader owns `out`: stop writing there
        if isinstance(out, Path):
            out.write_text("")  # a fresh log per read; appended batch by batch, never held open
        self._out = out
        self._partial = ""
        self._prefixed = False
        self._other: list[str] = []
        self._other_size = 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        lines = (self._partial + s).split("\n")
        self._partial = lines.pop()
        self._take(lines)
        return len(s)

    def finish(self) -> None:
        """Take the last unterminated line, and write the unprefixed lines if nothing had a prefix."""
        if self._partial:
            self._take([self._partial])
            self._partial = ""
        if not self._prefixed and not self._raw:
            self._emit(self._other)

    def _take(self, lines: list[str]) -> None:
        if self._raw:
            self._emit(lines)
            return
        own = []
        for line in lines:
            if _PREFIX.match(line):
                self._prefixed = True
                own.append(_PREFIX.sub("", line, count=1))
            elif not self._prefixed:
                self._other.append(line)
                self._other_size += len(line) + 1
                while self._other_size > OTHER_FORMAT_LIMIT and len(self._other) > 1:
                    self._other_size -= len(self._other.pop(0)) + 1
        if own:
            self._emit(own)

    def _emit(self, lines: list[str]) -> None:
        kept = []
        for line in lines:
            match = _TAG.match(line)
            if match:
                self.tags[match.group(1)] = match.group(2)
                if self._on_tag is not None:
                    self._on_tag(match.group(1), match.group(2))
            else:
                kept.append(line + "\n")
        if self._active is not None and not self._active():
            return
        if isinstance(self._out, Path):
            with open(self._out, "a") as f:
                f.write("".join(kept))
        else:
            self._out.write("".join(kept))


def clean_job_log(text: str) -> tuple[str, dict[str, str]]:
    """The job's own output in a `tail_logs` text, and the run script's tags (see `JobLogSink`).

    Returns:
        (log text, {"gpu": name, "exit": code}) with the tags found.
    """
    out = io.StringIO()
    sink = JobLogSink(out)
    sink.write(text)
    sink.finish()
    return out.getvalue(), sink.tags


def run_keys(log_tail: str, *, tier: str, gpu: str | None, code: str | None = None) -> str:
    """The lines to append to a log so its summary block carries `tier`, `gpu_name` and `nightlab_code`.

    Empty unless the summary block ends the log: lines added after a traceback would read
    as its exception line.
    """
    from nightlab.fleet.runner import clean_lines, parse_summary

    if parse_summary(log_tail) is None:
        return ""
    lines = [line for line in clean_lines(log_tail) if line.strip()]
    start = max(i for i, line in enumerate(lines) if line.strip() == "---")
    if not all(re.match(r"^\s*[A-Za-z_][\w.\-]*\s*:", line) for line in lines[start + 1 :]):
        return ""
    extra = f"tier: {tier}\n" + (f"gpu_name: {gpu}\n" if gpu and gpu != "none" else "")
    extra += f"nightlab_code: {code}\n" if code and code != "none" else ""
    return ("" if log_tail.endswith("\n") else "\n") + extra


def save_score(run_dir: Path, tags: dict[str, str], *, worker_sandbox: str | None = None) -> bool:
    """Write the supervisor's `score.json` that came back on the job's `nightlab-score:` line.

    Why that line is the harness's and not train.py's, which shares the job's output: the run
    script prints it after the supervisor exited, and in the sandbox (a PID namespace that dies
    with it) no process of the run is left to print anything later. A line the run printed
    before is overwritten (the last tag wins, `JobLogSink`), and a tag counts anywhere in its
    line, so half a line left without a newline cannot swallow it. A run that never reaches
    that line (killed at its deadline, preempted, cancelled) leaves what it printed last; the
    controller ignores any score for such an end (`owned.apply_score`). Unsandboxed, a run can
    kill the run script and speak last: it vouches for nothing (docs/integrity.md), so when the
    worker's set-up probe found no working sandbox (`worker_sandbox="none"`, printed by the
    launch job, before any experiment ran there) the score is marked `sandbox: none` whatever it
    says.

    Returns:
        Whether a score was written (False for no line, `none`, or an unreadable one: the
        controller then records "no harness score").
    """
    from nightlab.atomic import atomic_write_json

    data = _tag_json(tags, "score")
    if data is None:
        return False
    if worker_sandbox == "none" and data.get("sandbox") != "none":
        data.update(sandbox="none", unsandboxed="the worker's set-up probe found no working bubblewrap")
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(run_dir) / "score.json", data, indent=1, sort_keys=True)
    return True


def _tag_json(tags: dict[str, str], key: str) -> dict[str, Any] | None:
    """The JSON object a run-script tag carries base64-encoded; None for no tag, `none`, or garbage."""
    import binascii
    import json

    raw = tags.get(key)
    if not raw or raw == "none":
        return None
    try:
        data = json.loads(base64.b64decode(raw, validate=True))
    except (ValueError, binascii.Error):
        return None
    return data if isinstance(data, dict) else None


def read_health(tags: dict[str, str]) -> dict[str, Any] | None:
    """The worker's health sample from the job's `nightlab-health:` line (printed after the run
    ended, like the score). Not validated here: `Health.from_report` keeps only well-formed figures."""
    return _tag_json(tags, "health")


SUPERVISOR_LINE = "nightlab harness:"  # how the supervisor's own lines start (`harness/attempt.py`)


def add_run_keys(log_path: Path, *, tier: str, gpu: str | None, code: str | None) -> None:
    """Join `run_keys` to the summary block of a finished job's log, in place.

    A supervised run's log ends with the supervisor's lines after train.py's block; the keys go
    before them (the block must stay one run of `key: value` lines), so only the tail is rewritten.
    """
    from nightlab.fleet.runner import read_tail

    tail = read_tail(log_path)
    lines = tail.splitlines(keepends=True)
    cut = len(lines)
    while cut and (not lines[cut - 1].strip() or lines[cut - 1].startswith(SUPERVISOR_LINE)):
        cut -= 1
    head, suffix = "".join(lines[:cut]), "".join(lines[cut:])
    extra = run_keys(head, tier=tier, gpu=gpu, code=code)
    if not extra:
        return
    size = log_path.stat().st_size
    with open(log_path, "r+b") as f:
        f.truncate(size - len(suffix.encode("utf-8", errors="replace")))
        f.seek(0, os.SEEK_END)
        f.write((extra + suffix).encode())


# ---------------------------------------------------------------------------- on the worker


def prepare_worker(lab_dir: Path) -> Path | None:
    """Prepare the lab's data on a worker cluster from its `nightlab.toml` alone.

    The lab synced to a cluster has no `.nightlab/` (it is git-ignored), so `nightlab
    prepare` cannot open it there; set-up calls this instead. The data directory is keyed
    by the profile's fingerprint, the same one the controller checks on every result.
    The lab's validation secret (`REMOTE_VAL_SECRET`, mounted by `cluster_task`) is moved into
    it: a folder prepared with another secret has its validation split made again.

    Returns:
        The data directory, or None for a foreign target (which prepares its own data).
    """
    from nightlab.config import load_lab_config
    from nightlab.harness.data import prepare
    from nightlab.harness.profiles import Profile

    config = load_lab_config(lab_dir).config
    if not config.profile:
        return None
    mounted = Path(os.path.expanduser(REMOTE_VAL_SECRET))
    secret = mounted.read_bytes() if mounted.is_file() else None
    try:
        return prepare(Profile.from_dict(config.profile), progress=False, val_secret=secret)
    finally:
        mounted.unlink(missing_ok=True)  # outside the data folder a run could read it


if __name__ == "__main__":  # `python -m nightlab.fleet.sky_task prepare`, run by the worker's set-up
    import sys

    if sys.argv[1:] != ["prepare"]:
        sys.exit("usage: python -m nightlab.fleet.sky_task prepare")
    print(prepare_worker(Path.cwd()) or "foreign target: nothing to prepare")
