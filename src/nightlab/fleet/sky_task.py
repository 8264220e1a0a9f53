"""The SkyPilot tasks a remote worker runs: the cluster task and the experiment task.

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

The templates are files (`fleet/templates/worker.yaml`, `run.sh`); reading a job's log back
is `fleet/job_log.py`, and what set-up runs on the worker is `fleet/worker_setup.py`.

Usage: `cluster_task(lab_dir, pool, cluster="nl-1a2b3c-h100-k8s-0", builtin=True)`,
`experiment_task(spec, pool, lab_dir=lab_dir)`; both return real `sky.Task` objects.
"""

from __future__ import annotations

import base64
import logging
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightlab import __version__
from nightlab.atomic import atomic_write_text
from nightlab.config import PoolConfig
from nightlab.errors import NightlabError, UsageError
from nightlab.fleet.backend import RunSpec
from nightlab.fleet.build import Wheel, build_wheel
from nightlab.harness.names import MEASUREMENT_OVERRIDES
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

# The worker cluster's SkyPilot YAML (copied into a lab as `fleet/skypilot.yaml`, which users may
# edit) and the per-experiment run script, as the files they are (`fleet/templates/`).
WORKER_YAML = (
    resources.files("nightlab.fleet")
    .joinpath("templates")
    .joinpath("worker.yaml")
    .read_text(encoding="utf-8")
)
RUN_SCRIPT = (
    resources.files("nightlab.fleet").joinpath("templates").joinpath("run.sh").read_text(encoding="utf-8")
)


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
    """Refuse unknown keys of a skypilot pool (`nightlab.config` passes them through as `options`)."""
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
    # every task (set-up, each run, the resident runner) takes the YAML's envs: one of these there
    # would widen the harness's clock or budget on every worker, as a shell's would locally
    envs = doc.get("envs") if isinstance(doc.get("envs"), dict) else {}
    loosening = [str(k) for k in envs if str(k) in MEASUREMENT_OVERRIDES]
    if loosening:
        raise UsageError(
            f"`{path}` sets `{loosening[0]}` in `envs`, which would change what every run on the "
            "workers measures (only the controller sets it, per run); remove it"
        )
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


if __name__ == "__main__":  # labs made before 2026-12-03 name this module in their fleet/skypilot.yaml set-up
    from nightlab.fleet.worker_setup import main

    main()
