"""The SkyPilot backend: each worker is one long-lived SkyPilot cluster; each attempt one `sky.exec`.

SkyPilot (https://docs.skypilot.co) launches, sets up, autostops and tears down clusters
on 20+ clouds, Kubernetes and Slurm; nightlab only decides what runs where. Written
against the SDK of `skypilot` 0.14 (the `nightlab[skypilot]` extra pins `>=0.14,<0.15`):
every call returns a request id that `sky.get` / `sky.stream_and_get` resolve.

Life of a worker cluster (`nl-<lab hash>-<worker>`): `nightlab fleet up` (or the first
experiment that needs it) runs `sky.launch` with the lab's `fleet/skypilot.yaml`, whose
setup installs nightlab and the target's dependencies and prepares the lab's data; the
cluster stops itself after `autostop` idle minutes, so a dead controller never leaves GPUs
billing; `nightlab fleet down` tears it down. Every change is an event in the ledger
(`cluster-launch`, `cluster-up`, `cluster-failed`, `cluster-lost`, `cluster-down`), which
is where `fleet status` and the cost report read them.

Life of an attempt: `launch` queues the attempt and returns at once; a thread waits for
the cluster to be up and submits `sky.exec` with the snapshot inside the job (see
`sky_task.py`); a thread per job streams its log (`sky.tail_logs(follow=True)`), which
returns the moment the job ends; one monitor thread polls `sky.job_status` of every running
job, which catches preemptions and broken streams, and then reads the log again with
retries. `poll` only reads that cached state, so no network call ever blocks the
controller's loop. A controller that restarts finds its jobs again by the id saved in
`run_dir/sky.json`, or by job name.

Failure mapping (the runner's classes):

    setup fails (FAILED_SETUP)         worker out of service (`cluster-failed`), not retried
                                       before `nightlab fleet up` or the next controller;
                                       no experiment is charged
    job fails with a traceback         crash:<class> from the log, like a local run
    cluster no longer up / preempted   infra: the experiment is requeued on another worker,
                                       and the cluster is relaunched when work needs it
    controller deadline reached        the job is cancelled (`sky.cancel`, sent again while
                                       the job goes on): timeout
    log cannot be read                 retried `log_retries` times with backoff, then infra

The controller should ask `available(slot)` before leasing to a slot: a cluster that is
launching, lost or failed is not offered work. A lease on such a slot anyway waits for
the cluster (and relaunches it) instead of failing.

Modules (one concept each): `core` (names, tunables, the state both halves share, ledger
events), `clusters` (the cluster state machine), `jobs` (the attempt state machine and the
monitor), `backend` (`SkyPilotBackend`, the `BaseBackend` interface over both), `updown`
(`fleet up` / `fleet down`), and for Slurm pools `residents` (one long-lived runner job per
cluster lane that runs the experiments back to back instead of one `sky exec` each),
`runner_job` (that job: its shipped source, its task, finding it by name), `feeds` (the runs
handed to a runner and read back), `channel` (the controller's helper on the runner's node, over
ssh + `srun --overlap`) and `resident` (the runner and helper themselves, shipped as text).
Tests rescale the tunables on `core`. The tasks themselves are `fleet/sky_task.py` (their
templates in `fleet/templates/`), reading a job's log back `fleet/job_log.py`, the worker's
set-up entry point `fleet/worker_setup.py` (`python -m nightlab.fleet.sky_task prepare`, which
set-up scripts already on users' clusters call, still works), and the cost accounting
`fleet/costs.py` (outside this package: `report`, `status` and the supervisor read costs
without SkyPilot installed).
"""

from nightlab.fleet.skypilot.backend import SkyPilotBackend
from nightlab.fleet.skypilot.core import autostop_minutes, cluster_name, lab_hash, skypilot_slots
from nightlab.fleet.skypilot.updown import fleet_down, fleet_up

__all__ = [
    "SkyPilotBackend",
    "autostop_minutes",
    "cluster_name",
    "fleet_down",
    "fleet_up",
    "lab_hash",
    "skypilot_slots",
]
