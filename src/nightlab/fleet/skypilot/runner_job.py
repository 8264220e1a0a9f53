"""The resident runner as a SkyPilot job: what it runs, what it asks for, and how it is found again.

The runner (`resident.py`) travels as text in its job's environment (`SOURCE`, with
`nightlab/procs.py` inlined), so the cluster always runs the controller's own copy; `SOURCE_HASH`
names that copy in the runner's record, and a recorded runner of another hash is retired
(`residents.py`). Its job is named `nightlab-runner-<epoch>`, which is how a controller that
died mid-start finds it (`find_job`), and how a relaunch finds the runner jobs it would queue
behind (`stray_jobs`). Its first output line is its announcement (`resident.PREFIX`: node,
allocation, Python, directory), which `announcement` reads off the job's log.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightlab import procs
from nightlab.config import slots_per_cluster
from nightlab.fleet.sky_task import _resources, _sky, load_worker_config
from nightlab.fleet.skypilot import core, resident
from nightlab.fleet.skypilot.core import (
    TERMINAL,
    Shared,
    field_of,
    is_gone,
    lane_accelerators,
    lane_cpus,
    status_name,
)

if TYPE_CHECKING:
    from nightlab.fleet.skypilot.clusters import Cluster


def _shipped_source() -> str:
    """resident.py as the cluster runs it: `nightlab/procs.py`'s text in place of its import line."""
    text = Path(resident.__file__).read_text()
    [line] = [x for x in text.splitlines(keepends=True) if x.startswith("from nightlab.procs import ")]
    shared = Path(procs.__file__).read_text().replace("from __future__ import annotations\n", "", 1)
    return text.replace(line, shared, 1)


SOURCE = _shipped_source()
SOURCE_HASH = hashlib.sha1(SOURCE.encode()).hexdigest()[:12]
JOB_PREFIX = "nightlab-runner-"
BASE = ".nightlab/resident"  # under the runner job's HOME (on Slurm, SkyPilot's cluster home)
RUNNER_RUN = r"""venv="${NIGHTLAB_VENV:-$HOME/nightlab-venv}"; venv="${venv/#\~/$HOME}"
py="$venv/bin/python"; if [ ! -x "$py" ]; then py=python3; fi
exec "$py" -u -c 'import os; exec(compile(os.environ["NIGHTLAB_RESIDENT_CODE"], "resident.py", "exec"))' runner "$HOME/.nightlab/resident" "$NIGHTLAB_RESIDENT_EPOCH" "$NIGHTLAB_RESIDENT_IDLE"
"""


def runner_host(pool: Any) -> str | None:
    """The `~/.slurm/config` host of a pool that runs a resident runner, or None (one exec per run).

    On by default for `infra = "slurm/<host>"`; `runner = false` in the pool turns it off.
    """
    if pool.options.get("runner", True) is False:
        return None
    match = re.fullmatch(r"slurm/([^/]+)", str(pool.options.get("infra", "")))
    return match.group(1) if match else None


def runner_task(lab_dir: Path, cluster: Cluster, epoch: str) -> Any:
    """The `sky.Task` of runner `epoch` on `cluster` (one per lane of an N-slot cluster)."""
    sky = _sky()
    doc = load_worker_config(lab_dir)
    envs = {str(k): str(v) for k, v in (doc.get("envs") or {}).items()}
    envs.update(
        NIGHTLAB_RESIDENT_CODE=SOURCE,
        NIGHTLAB_RESIDENT_EPOCH=epoch,
        NIGHTLAB_RESIDENT_IDLE=str(core.RESIDENT_IDLE),
        NIGHTLAB_RESIDENT_SOURCE=SOURCE_HASH,
    )
    # it asks for the GPU like an experiment job: no job of ours ever runs beside it (on an
    # N-slot cluster, for its lane's GPU: the N lanes' runners run side by side)
    accelerators = _resources(doc, cluster.pool).get("accelerators")
    if slots_per_cluster(cluster.pool) > 1:
        accelerators = lane_accelerators(cluster.pool, runner=True)
    cpus = lane_cpus(cluster.pool, cluster.cpus)  # a Slurm lane's share, or its step takes them all
    resources = sky.Resources(accelerators=accelerators, **({"cpus": cpus} if cpus else {}))
    return sky.Task(name=JOB_PREFIX + epoch, run=RUNNER_RUN, envs=envs, resources=resources)


class _Seen(Exception):
    """Raised by `_Announcement` to end a log stream once the announcement is in."""


class _Announcement:
    """An `output_stream` that catches the runner's first line (`resident.PREFIX`)."""

    def __init__(self) -> None:
        self.info: dict[str, Any] | None = None
        self._partial = ""

    def write(self, s: str) -> int:
        lines = (self._partial + s).split("\n")
        self._partial = lines.pop()
        for line in lines:
            at = line.find(resident.PREFIX)
            if at >= 0:
                with contextlib.suppress(ValueError):
                    self.info = json.loads(line[at + len(resident.PREFIX) :])
                    raise _Seen
        return len(s)

    def flush(self) -> None:
        pass


def announcement(shared: Shared, cluster: Cluster, job_id: int) -> dict[str, Any] | None:
    """The runner job's announcement, followed in its log; None when the stream ended without one."""
    catcher = _Announcement()
    try:
        shared.sdk.tail_logs(cluster.name, job_id, follow=True, output_stream=catcher)
    except _Seen:
        pass
    return catcher.info


def find_job(shared: Shared, cluster: Cluster, epoch: str) -> int | None:
    """The job id of runner `epoch` by its job name, looked for until `core.FIND_PATIENCE`."""
    sdk, name = shared.sdk, JOB_PREFIX + epoch
    deadline = time.time() + core.FIND_PATIENCE
    while not shared.stop.is_set():
        try:
            jobs = sdk.get(sdk.queue(cluster.name, skip_finished=False))
            ids = [field_of(j, "job_id") for j in jobs if field_of(j, "job_name") == name]
            if ids:
                return int(max(ids))
        except Exception as e:
            if is_gone(e):
                return None
        if time.time() >= deadline:
            return None
        shared.stop.wait(shared.status_interval)
    return None


def status_until_read(shared: Shared, cluster: Cluster, job_id: int) -> str | None:
    """A runner job's status, asked until SkyPilot answers (a failed read decides nothing)."""
    sdk = shared.sdk
    deadline = time.time() + core.RESIDENT_READY_PATIENCE
    while True:
        try:
            return status_name(sdk.get(sdk.job_status(cluster.name, [job_id])).get(job_id))
        except Exception as e:
            if is_gone(e) or time.time() > deadline or shared.stop.is_set():
                raise
        shared.stop.wait(min(shared.status_interval, 2.0))


def stray_jobs(shared: Shared, cluster: Cluster) -> list[int]:
    """Runner jobs still going on the cluster (a relaunch would wait behind them)."""
    sdk = shared.sdk
    jobs = sdk.get(sdk.queue(cluster.name, skip_finished=True))
    return [
        int(field_of(j, "job_id"))
        for j in jobs
        if str(field_of(j, "job_name") or "").startswith(JOB_PREFIX)
        and status_name(field_of(j, "status")) not in TERMINAL
    ]
