"""What every part of the SkyPilot backend shares: names, tunables, SDK helpers, threads, events.

`Shared` is the state the cluster half (`clusters.py`) and the job half (`jobs.py`) both
touch: the SDK, one lock, the stop flag, the thread spawner, and the queue of cluster
events. Those events are recorded in the ledger the backend was handed
(`SkyPilotBackend(ledger=...)` or `use_ledger`), and only on the thread that owns that
ledger: a `Ledger` belongs to one thread (its contract), while cluster launches and job
monitors run on threads of their own. So threads queue events and the owner's calls into
the backend (`available`, `launch`, `poll`, `kill`, `close`, `fleet up/down`) write them.
Without a ledger (a backend driven directly, as in the conformance suite) events are
only logged.

The tunables are module constants so a test or benchmark can rescale them
(`monkeypatch.setattr(core, "STATUS_INTERVAL", 0.02)`); the backend reads them when built.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import math
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightlab.config import PoolConfig, cluster_gpus, slots_per_cluster
from nightlab.errors import NightlabError
from nightlab.fleet.backend import RunSpec, WorkerSlot
from nightlab.fleet.cluster_states import CLUSTER_EVENTS, ClusterEvent
from nightlab.fleet.sky_task import check_pool

if TYPE_CHECKING:
    from nightlab.ledger import Ledger

log = logging.getLogger("nightlab.skypilot")

STATUS_INTERVAL = 5.0  # seconds between job-status polls; a 5-minute run loses at most this much
LOG_RETRIES = 3  # tries to read a finished job's log before the attempt becomes `infra`
STATUS_PATIENCE = 600.0  # seconds of unreadable job status (API server down) before giving a run up
RETRY_DELAY = 2.0  # first backoff between those tries (doubles)
RELAUNCH_BACKOFF = 300.0  # wait after a failed launch (no capacity) before trying again
DEFAULT_AUTOSTOP = 10  # idle minutes before a cluster stops itself
STATUS_RETRY = 5.0  # seconds before a failed `sky status` of the clusters is asked again
CLOSE_GRACE = 10.0  # seconds `close` spends seeing the killed runs' jobs end (`Jobs.settle_kills`)
# seconds past its lease and one run's timeout that a run may wait to start before it is
# requeued: a lost cluster's relaunch with set-up took 616 s on a loaded 2-core box (RESULTS.md)
START_PATIENCE = 1800.0
# seconds between losing a cluster and relaunching it (tests/skypilot_real: an scancel'ed
# allocation's clean-up removed the home of the cluster relaunched under the same name)
LOST_RELAUNCH_DELAY = 60.0
# experiments queued behind the running one on a pipelined cluster (`pipeline = true`): with
# one, an exec slower than one run (35-50 s for 20 s runs on a loaded box, bench/RESULTS.md)
# still left the GPU idle between runs; with two, each exec has two runs' time to land
QUEUE_DEPTH = 2
# seconds a re-attaching controller looks for the job of an exec that was in flight when the
# previous one died: the API server finishes that exec on its own (35-80 s on a loaded box),
# and a job that lands after one empty look would run unobserved beside the run's retry
# (tests/skypilot_real: a SIGKILL 0.1 s after a lease, with two runs queued per cluster)
FIND_PATIENCE = 150.0
# seconds a queued run's `sky exec` waits for the first exec of an idle cluster to land before it
# goes anyway (`Jobs._wait_turn`): one run's time to land is usually far longer than the wait
EXEC_PRIORITY_WAIT = 120.0
# the resident runner (`residents.py`): idle seconds with no controller before it exits,
# seconds to bring one up (its exec, announcement and helper), seconds without an answer from
# its helper before it is given up, seconds between polls of its runs, and seconds a fed run
# may be missing from its files (a put that never landed) before it is tombed
RESIDENT_IDLE = 600.0
RESIDENT_READY_PATIENCE = 300.0
CHANNEL_PATIENCE = 300.0
FEED_INTERVAL = 0.25
VAGUE_PATIENCE = 5.0
_GONE = ("ClusterNotUpError", "ClusterDoesNotExist")


class SkyJobStatus(enum.StrEnum):
    """SkyPilot's job statuses (`sky.JobStatus` of 0.14), as `status_name` reads them off a response.

    SkyPilot's vocabulary, not ours: `status_name` keeps what the SDK says as a plain string (a
    newer server's status is then only unknown, never an error), and the code compares it with these.
    """

    INIT = "INIT"
    PENDING = "PENDING"
    SETTING_UP = "SETTING_UP"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    FAILED_SETUP = "FAILED_SETUP"
    FAILED_DRIVER = "FAILED_DRIVER"
    CANCELLED = "CANCELLED"


class SkyClusterStatus(enum.StrEnum):
    """SkyPilot's cluster statuses (`sky.ClusterStatus`): only an UP cluster runs jobs."""

    INIT = "INIT"
    UP = "UP"
    STOPPED = "STOPPED"


TERMINAL = frozenset(
    {
        SkyJobStatus.SUCCEEDED,
        SkyJobStatus.FAILED,
        SkyJobStatus.FAILED_SETUP,
        SkyJobStatus.FAILED_DRIVER,
        SkyJobStatus.CANCELLED,
    }
)
# sky.exceptions.JobExitCode: what `tail_logs(follow=True)` returns once the job ended
EXIT_STATUS = {0: SkyJobStatus.SUCCEEDED, 100: SkyJobStatus.FAILED, 103: SkyJobStatus.CANCELLED}


# ---------------------------------------------------------------------------- names


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def lab_hash(lab_dir: Path) -> str:
    """Six hex digits naming the lab on the SkyPilot API server (clusters of two labs never clash)."""
    return hashlib.sha1(str(lab_dir.resolve()).encode()).hexdigest()[:6]


def cluster_name(lab_dir: Path, worker: str) -> str:
    """The SkyPilot cluster of one worker of the lab: `nl-<lab hash>-<worker>`."""
    return f"nl-{lab_hash(lab_dir)}-{_slug(worker)}"


def autostop_minutes(pool: PoolConfig) -> int | None:
    """Idle minutes before the pool's clusters stop themselves; None where SkyPilot cannot autostop.

    SkyPilot 0.14 refuses autostop on Slurm except for container clusters (Pyxis): a Slurm
    allocation ends at its time limit instead (`slurm.sbatch_options.time`, docs/skypilot.md).
    """
    if "autostop" in pool.options:
        return int(pool.options["autostop"])
    infra = str(pool.options.get("infra", ""))
    return None if infra.startswith("slurm") else DEFAULT_AUTOSTOP


def queue_depth(pool: PoolConfig) -> int:
    """How many experiments wait in each of the pool's clusters' job queues behind the running one.

    `pipeline = false` -> 0, `true` (the default) -> `QUEUE_DEPTH`, an integer -> itself.
    `sky exec` takes 10-13 s (idle API server) to ~80 s (loaded) before a job runs; queued
    behind the running job, the next one starts the moment it ends. Two deep, a run's exec
    has two runs' time to land, so an exec slower than one run is hidden too (bench/RESULTS.md).
    """
    value = pool.options.get("pipeline", True)
    depth = (QUEUE_DEPTH if value else 0) if isinstance(value, bool) else int(value)
    slots = slots_per_cluster(pool)
    if slots > 1 and not _lane_queue_ok(pool, slots):
        # a lane's queued job would hold a GPU the scheduler counts while it waits at its lane's
        # lock, keeping another lane's next job out (see `lane_accelerators`): no queue then
        return 0
    return depth


def _lane_queue_ok(pool: PoolConfig, slots: int) -> bool:
    """Whether a lane of a multi-slot cluster can queue jobs behind its running one."""
    from nightlab.fleet.skypilot.runner_job import runner_host  # runner_job imports this module

    if runner_host(pool) is not None:
        return True  # one runner job per lane holds the lane's GPU; its queue is in the runner
    if str(pool.options.get("infra", "")).startswith("slurm"):
        return False  # a Slurm step asks whole GPUs: a queued step would take another lane's
    per = int(cluster_gpus(pool.options.get("accelerators")) or slots) // slots
    return per == 1  # Ray: a fraction of the lane's one GPU per job (`lane_accelerators`)


def lane_accelerators(pool: PoolConfig, *, runner: bool = False) -> Any:
    """What each job of one lane asks SkyPilot for (the pool's `accelerators` for a one-slot cluster).

    An N-slot cluster's job asks for its lane's share (`H100:8`, 8 slots -> `{"H100": 1}`), so the
    cluster's scheduler runs N at once (Slurm: one step per lane, `--gpus-per-node=1`; Ray: a
    task with `num_gpus=1`). Which GPU it uses is the run script's pin (`NIGHTLAB_GPU`), never the
    scheduler's choice, with a lock per lane. On Ray-based infra a pipelined lane's jobs ask for
    `1 / (queue + 1)` of a GPU: a lane's queued jobs then fit beside the other lanes' running ones
    and wait at their lane's lock, where a whole GPU each would keep another lane's next job out.
    """
    accelerators = pool.options.get("accelerators")
    slots = slots_per_cluster(pool)
    if slots == 1 or accelerators is None:
        return accelerators
    name = next(iter(accelerators)) if isinstance(accelerators, dict) else str(accelerators).partition(":")[0]
    per = int(cluster_gpus(accelerators) or slots) // slots
    depth = queue_depth(pool)
    if runner or str(pool.options.get("infra", "")).startswith("slurm") or per > 1 or depth == 0:
        return {name: per}
    return {name: math.floor(10_000 / (depth + 1)) / 10_000}


def cpu_count(cpus: Any) -> float | None:
    """A CPU count as SkyPilot spells it (`4`, `"4"`, `"4+"`: at least 4) as a number; None when unsaid."""
    try:
        return float(str(cpus).rstrip("+")) if cpus not in (None, "") else None
    except ValueError:
        return None


def lane_cpus(pool: PoolConfig, cluster_cpus: Any) -> str | None:
    """The CPUs each job of one lane of a Slurm cluster asks for: the cluster's over its slots.

    SkyPilot runs a Slurm job's step with `--cpus-per-task` = the task's `cpus`, else the whole
    cluster's: every lane's job would then hold all the allocation's CPUs and Slurm would run the
    lanes one after another (measured on the real SkyPilot 0.14: a second lane's runner stayed
    PENDING). None for a one-slot cluster, other infra (Ray counts 0.5 CPU a job), or unknown CPUs.
    """
    slots, total = slots_per_cluster(pool), cpu_count(cluster_cpus)
    if slots == 1 or not str(pool.options.get("infra", "")).startswith("slurm") or total is None:
        return None
    return str(max(1, math.floor(total / slots)))


def cluster_workers(pool: PoolConfig) -> list[str]:
    """The worker name of each cluster of a skypilot pool (`workers = N`): `<tier>-<infra>-<i>`."""
    infra = pool.options.get("infra")
    where = _slug(str(infra).split("/")[0]) if infra else "sky"
    return [f"{pool.tier}-{where}-{i}" for i in range(pool.slots)]


def lane_gpus(pool: PoolConfig, lane: int) -> str | None:
    """The GPU indices of lane `lane` of a cluster (`"3"`, or `"2,3"` for 2 GPUs a lane); None for one lane."""
    slots = slots_per_cluster(pool)
    if slots == 1:
        return None
    per = int(cluster_gpus(pool.options.get("accelerators")) or slots) // slots
    return ",".join(str(lane * per + k) for k in range(per))


def skypilot_slots(pool: PoolConfig) -> list[WorkerSlot]:
    """The worker slots of a skypilot pool: `slots_per_cluster` per cluster (default one per GPU).

    A one-slot cluster's slot is the cluster's worker name (`h100-aws-0`), as before; an N-slot
    cluster's slots are `h100-aws-0-g0` ... `-g<N-1>`, each pinned to its GPU by the run script
    (`NIGHTLAB_GPU` -> `CUDA_VISIBLE_DEVICES`) with its share of the node's CPUs (`NIGHTLAB_SLOTS`).
    """
    check_pool(pool)
    slots = slots_per_cluster(pool)
    info = {k: pool.options[k] for k in ("accelerators", "infra", "use_spot") if k in pool.options}
    out = []
    for worker in cluster_workers(pool):
        for lane in range(slots):
            gpus = lane_gpus(pool, lane)
            env = {} if gpus is None else {"NIGHTLAB_GPU": gpus, "NIGHTLAB_SLOTS": str(slots)}
            extra = {} if gpus is None else {"cluster": worker, "gpu": gpus, "slots": slots}
            name = worker if gpus is None else f"{worker}-g{lane}"
            out.append(
                WorkerSlot(name=name, tier=pool.tier, backend="skypilot", env=env, info={**info, **extra})
            )
    return out


def lane_of(slot: WorkerSlot) -> tuple[str, int]:
    """The cluster worker and lane of a skypilot slot (`h100-aws-0-g3` -> (`h100-aws-0`, 3))."""
    worker = slot.info.get("cluster")
    if not worker:
        return slot.name, 0
    return str(worker), int(slot.name.rsplit("-g", 1)[1])


def run_key(spec: RunSpec) -> str:
    return f"{spec.experiment_id}/{spec.attempt}"


# ---------------------------------------------------------------------------- SDK responses


def status_name(status: Any) -> str | None:
    return None if status is None else str(getattr(status, "value", status))


def is_gone(error: BaseException) -> bool:
    """Whether an SDK error says the cluster is not there (down, preempted, never launched)."""
    return type(error).__name__ in _GONE


def field_of(record: Any, name: str) -> Any:
    """A field of an SDK response, which is a pydantic model or (older servers) a dict."""
    if isinstance(record, dict):
        return record.get(name)
    return getattr(record, name, None)


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


# ---------------------------------------------------------------------------- shared state


class Shared:
    """The SDK, lock, stop flag, threads and event queue the cluster and job halves share."""

    def __init__(
        self,
        sdk: Any,
        *,
        lab_dir: Path | None,
        status_interval: float,
        log_retries: int,
        retry_delay: float,
    ) -> None:
        self.sdk = sdk
        self.lab_dir = lab_dir
        self.status_interval = status_interval
        self.log_retries = log_retries
        self.retry_delay = retry_delay
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.ledger: Ledger | None = None
        self._pending: list[tuple[str, str, dict[str, Any]]] = []
        # the kind of each worker's latest cluster event: read once from the ledger, then kept
        # current by `event` (this backend records every cluster event it causes)
        self.last_cluster_event: dict[str, str] = {}
        # what each worker's latest set-up probe found (its `cluster-up` event), for a cluster this
        # backend did not launch itself: a controller that re-attaches must not take a score's word
        # for a worker whose probe found no sandbox
        self.recorded_software: dict[str, dict[str, Any]] = {}

    def use_ledger(self, ledger: Ledger) -> None:
        """Record events in `ledger` from now on; call on the thread that owns it."""
        self.ledger = ledger
        try:
            events = ledger.events(limit=1_000_000, kinds=CLUSTER_EVENTS)
        except NightlabError as e:
            log.warning("could not read cluster events: %s", e)
            return
        recorded = {e.worker: e.kind for e in events if e.worker}
        software: dict[str, dict[str, Any]] = {}
        for e in events:
            if e.worker:
                _note_software(software, e.kind, e.worker, e.data)
        with self.lock:  # what this backend queued meanwhile is newer
            self.last_cluster_event = {**recorded, **self.last_cluster_event}
            self.recorded_software = {**software, **self.recorded_software}

    def event(self, kind: str, worker: str, data: dict[str, Any]) -> None:
        """Queue a ledger event (any thread); the owner's next call into the backend writes it."""
        with self.lock:
            self._pending.append((kind, worker, data))
            if kind in CLUSTER_EVENTS:
                self.last_cluster_event[worker] = kind
                _note_software(self.recorded_software, kind, worker, data)

    def flush(self) -> None:
        """Write the queued events to the ledger; only on the ledger's own thread."""
        with self.lock:
            if self.ledger is None or not self._pending:
                return
            pending, self._pending = self._pending, []
        try:
            for kind, worker, data in pending:
                self.ledger.log_event(kind, None, worker=worker, **data)
        except NightlabError as e:
            log.warning("could not record cluster events: %s", e)

    # ------------------------------------------------------------------ threads

    def thread(self, target: Any, *args: Any) -> threading.Thread:
        # daemon threads: a launch blocked for minutes must not keep the controller from exiting
        thread = threading.Thread(target=self._guarded, args=(target, *args), daemon=True)
        thread.start()
        return thread

    def _guarded(self, target: Any, *args: Any) -> None:
        try:
            target(*args)
        except Exception:
            log.exception("SkyPilot backend thread %s failed", getattr(target, "__name__", target))

    # ------------------------------------------------------------------ SDK helpers

    def wait_job(self, cluster: str, job_id: int) -> str | None:
        """Poll a job until it ends; its final status (None: unknown, or the backend stopped)."""
        while not self.stop.is_set():
            status = status_name(self.sdk.get(self.sdk.job_status(cluster, [job_id])).get(job_id))
            if status is None or status in TERMINAL:
                return status
            self.stop.wait(self.status_interval)
        return None

    def tail(self, cluster: str, job_id: int, make_out: Any) -> Any:
        """A finished job's whole log into a fresh `make_out()` per try, retried with backoff.

        Returns:
            The output object that received the log; the last error is raised.
        """
        for i in range(self.log_retries):
            out = make_out()
            try:
                self.sdk.tail_logs(cluster, job_id, follow=False, output_stream=out)
                return out
            except Exception as e:
                if is_gone(e) or i == self.log_retries - 1:
                    raise
                self.stop.wait(self.retry_delay * 2**i)
        raise AssertionError("unreachable")


def _note_software(software: dict[str, dict[str, Any]], kind: str, worker: str, data: dict[str, Any]) -> None:
    """Keep `software[worker]` to what the worker's latest `cluster-up` probe found.

    Any other cluster event (a launch, a loss, a teardown) means a new cluster whose probe is
    not known yet, so the old one is forgotten.
    """
    if kind == ClusterEvent.UP:
        software[worker] = {"sandbox": data.get("sandbox")}
    else:
        software.pop(worker, None)
