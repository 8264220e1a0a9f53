"""The controller's side of the resident runner: one long-lived runner job per Slurm cluster.

Why: on Slurm every SkyPilot job pays 10-40 s before its command starts (the step, the
executor's Python, an exec slower under load), which cost a worker 15-20 % of its time with
60 s runs (bench/RESULTS.md). A runner (`resident.py`) is one SkyPilot job that runs the
cluster's experiments one after another with the same run script as `sky exec`; the
controller feeds it through a helper on its node (`channel.py`), so a handover between two
runs is the runner's 0.1 s look at its inbox.

Life of a runner (`Resident`, its states `ResidentState`): `attaching` (known from its record
or from a run an earlier controller handed it, not looked at yet) or `starting` (the record `.nightlab/fleet/<cluster>/resident.json`
is written before its `sky exec`, so a process that dies mid-start leaves it findable; then
its job id; then its announcement: node, allocation, Python, directory) -> `ready` (the
helper answered `hello` with the runner's epoch) -> `dead` (SkyPilot shows its job ended,
its cluster is gone, or it wrote `exited`). A runner this backend gives up (no answer from
its helper for `CHANNEL_PATIENCE`, a runner of other code, a stray epoch) is `retiring`: its
job is cancelled until SkyPilot shows it ended, and only then is it `dead`. A backend that
cannot bring a runner up on a cluster uses one `sky exec` per run there (`off`).

The rule that keeps every experiment exactly once: a run handed to a runner ends only on
what that runner's files say (its status, or a tomb no claim got past), or once SkyPilot
shows the runner's job ended or its cluster gone; never because a read failed or a file
looked absent. A failed `sky status` or `job_status` only means asking again.

This module keeps the runners of each cluster's lanes (bringing them up, watching their jobs,
retiring them); `runner_job.py` is the runner as a SkyPilot job (its shipped source, its task,
finding it by name) and `feeds.py` the runs handed to it (put, poll, tomb: its helper's client).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightlab.atomic import atomic_write_json
from nightlab.config import slots_per_cluster
from nightlab.fleet.backend import RunExit
from nightlab.fleet.cluster_states import ClusterState
from nightlab.fleet.skypilot import core
from nightlab.fleet.skypilot.channel import Channel, ChannelError, local_argv, slurm_argv
from nightlab.fleet.skypilot.core import (
    TERMINAL,
    is_gone,
    log,
    one_line,
    status_name,
)
from nightlab.fleet.skypilot.jobs import RunState
from nightlab.fleet.skypilot.runner_job import (
    SOURCE,
    SOURCE_HASH,
    announcement,
    find_job,
    runner_host,
    runner_task,
    status_until_read,
    stray_jobs,
)
from nightlab.locks import try_lock

if TYPE_CHECKING:
    from nightlab.fleet.skypilot.clusters import Cluster
    from nightlab.fleet.skypilot.jobs import Jobs, Run


class ResidentState(enum.StrEnum):
    """Where one runner is in its life (module docstring)."""

    ATTACHING = "attaching"  # known from its record or a re-attached run; not looked at yet
    STARTING = "starting"  # exec'd or adopted: its announcement and helper are awaited
    READY = "ready"  # its helper answered for its epoch: runs are fed to it
    RETIRING = "retiring"  # given up: its job is cancelled until SkyPilot shows it ended
    DEAD = "dead"  # runs nothing any more


@dataclass
class Resident:
    """One runner job (one epoch) on one cluster, as this backend sees it (module docstring)."""

    cluster: Cluster
    epoch: str
    job_id: int | None = None
    lane: int = 0  # the cluster's slot it runs (one runner per lane of an N-slot cluster)
    info: dict[str, Any] | None = None  # its announcement (`resident.PREFIX`)
    state: ResidentState = ResidentState.ATTACHING
    channel: Channel | None = None
    runs: dict[str, Run] = field(default_factory=dict)  # by run name
    forgets: list[str] = field(default_factory=list)  # run names whose files may go
    broken_since: float | None = None  # when its helper last stopped answering
    finding: bool = False  # its job id is being looked up by name (`check`)
    wake: threading.Event = field(default_factory=threading.Event)


class Residents:
    """The runners of one backend: starting, adopting, watching and retiring them; feeding them (`feeds`)."""

    def __init__(self, shared: Any, clusters: Any, jobs: Jobs) -> None:
        self.shared = shared
        self.clusters = clusters
        self.jobs = jobs
        self.by_epoch: dict[str, Resident] = {}
        self.current: dict[str, Resident] = {}  # lane key (`lane_key`) -> its ready runner
        self.off: dict[str, str] = {}  # cluster name -> why this backend uses `sky exec` there
        self._starting: set[str] = set()  # lane keys
        self.changed = threading.Condition(self.shared.lock)
        from nightlab.fleet.skypilot.feeds import Feeds  # feeds imports this module (ResidentState)

        self.feeds = Feeds(shared, jobs, self)

    def enabled(self, cluster: Cluster) -> bool:
        return runner_host(cluster.pool) is not None and cluster.name not in self.off

    # ------------------------------------------------------------------ bringing one up

    def ensure(self, cluster: Cluster, lane: int = 0) -> None:
        """Start adopting or launching the runner of the cluster's lane unless one is ready or on its way.

        Where this backend runs no runner (`runner = false`, or `off`), a recorded one is retired:
        its job would hold the cluster's queue, and each exec would wait behind it.
        """
        key = lane_key(cluster, lane)
        with self.shared.lock:
            if not self.enabled(cluster) and cluster.state == ClusterState.UP and key not in self._starting:
                record = self._record(cluster, lane)
                if record.get("epoch") and str(record["epoch"]) not in self.by_epoch:
                    res = self.resident(cluster, str(record["epoch"]), record.get("job_id"), lane)
                    self.retire(res, "this pool runs one `sky exec` per run")
                return
            if (
                not self.enabled(cluster)
                or cluster.state != ClusterState.UP
                or key in self.current
                or key in self._starting
                or self.shared.stop.is_set()
            ):
                return
            self._starting.add(key)
        self.shared.thread(self._bring_up, cluster, lane)

    def starting(self, cluster: Cluster) -> bool:
        """Whether a runner of any lane of the cluster is on its way."""
        with self.shared.lock:
            return any(lane_key(cluster, lane) in self._starting for lane in range(_lanes(cluster)))

    def view(self, cluster: Cluster) -> str:
        """What `fleet up` shows: the cluster's runner epoch (or lanes ready), `off: <why>`, or `none`."""
        with self.shared.lock:
            if cluster.name in self.off:
                return f"off: {self.off[cluster.name]}"
            lanes = _lanes(cluster)
            ready = [
                self.current[k] for k in (lane_key(cluster, j) for j in range(lanes)) if k in self.current
            ]
            if lanes == 1:
                return f"ready ({ready[0].epoch})" if ready else "none"
            return f"{len(ready)} of {lanes} lanes ready" if ready else "none"

    def clear_for_launch(self, cluster: Cluster) -> None:
        """Before `sky.launch` of a cluster that may be up: its runner jobs end first.

        The launch's set-up job would wait behind a runner, which only exits when idle; what
        the runners ran ends `infra` once SkyPilot shows their jobs ended (`check`).
        """
        if runner_host(cluster.pool) is None:
            return
        for res in self._of(cluster):
            if res.state in (ResidentState.ATTACHING, ResidentState.STARTING, ResidentState.READY):
                self.retire(res, "its cluster is launched again")
        sdk = self.shared.sdk
        deadline = time.time() + core.RESIDENT_READY_PATIENCE
        while time.time() < deadline and not self.shared.stop.is_set():
            try:
                stray = stray_jobs(self.shared, cluster)
                if not stray:
                    return
                sdk.get(sdk.cancel(cluster.name, job_ids=stray))
            except Exception as e:  # no such cluster (the usual launch): nothing to clear
                log.info("runner jobs on %s before its launch: %s", cluster.name, one_line(e))
                return
            self.shared.stop.wait(min(self.shared.status_interval, 2.0))

    def ready(self, cluster: Cluster, run: Run) -> Resident | None:
        """Wait for the runner of the run's lane; None when there is none (`sky exec` then) or the run was killed."""
        self.ensure(cluster, run.lane)
        key = lane_key(cluster, run.lane)
        with self.changed:
            while True:
                if run.kill_requested or self.shared.stop.is_set() or not self.enabled(cluster):
                    return None
                res = self.current.get(key)
                if res is not None:
                    return res
                if key not in self._starting:
                    if cluster.state != ClusterState.UP:
                        return None  # its cluster went: the caller waits for it again
                    self._starting.add(key)
                    self.shared.thread(self._bring_up, cluster, run.lane)
                self.changed.wait(timeout=1.0)

    def _bring_up(self, cluster: Cluster, lane: int = 0) -> None:
        res = None
        try:
            lock = self._record_path(cluster, lane).with_suffix(".lock")
            with try_lock(lock, patience=core.RESIDENT_READY_PATIENCE) as held:
                if held is None:
                    raise ChannelError(
                        f"another process held `{lock}` for {core.RESIDENT_READY_PATIENCE:.0f} s"
                    )
                res = self._adopt(cluster, lane) or self._launch(cluster, lane)
            self._connect(res)
        except Exception as e:
            self.give_up(cluster, res, e)
        finally:
            with self.changed:
                self._starting.discard(lane_key(cluster, lane))
                self.changed.notify_all()

    def _adopt(self, cluster: Cluster, lane: int = 0) -> Resident | None:
        """The runner of the cluster's record when its job still goes and runs this code; else None.

        A recorded runner of other code is retired (`retire`): its job queue ahead of ours
        would hold the cluster, and what it reports is not read by this code.
        """
        record = self._record(cluster, lane)
        epoch = record.get("epoch")
        if not epoch:
            return None
        res = self.resident(cluster, str(epoch), record.get("job_id"), lane)
        if res.state in (
            ResidentState.RETIRING,
            ResidentState.DEAD,
        ):  # given up by this backend: a new one queues behind it
            return None
        if record.get("source") != SOURCE_HASH:
            self.retire(res, f"it runs other code ({record.get('source')})")
            return None
        if res.job_id is None:  # its starter died between the record and the exec's answer
            res.job_id = find_job(self.shared, cluster, res.epoch)
            if res.job_id is None:
                self.dead(res, "its exec never landed")
                return None
        status = status_until_read(self.shared, cluster, res.job_id)
        if status is None or status in TERMINAL:
            self.dead(res, f"its job is {status or 'gone'}")
            return None
        with self.shared.lock:
            res.info = res.info or record.get("info")
            res.state = ResidentState.STARTING
        return res

    def _launch(self, cluster: Cluster, lane: int = 0) -> Resident:
        epoch = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
        res = self.resident(cluster, epoch, None, lane)
        with self.shared.lock:
            res.state = ResidentState.STARTING
        self._write_record(res)  # first: a process that dies during the exec leaves it findable
        sdk = self.shared.sdk
        job_id, _ = sdk.get(
            sdk.exec(runner_task(self.shared.lab_dir, cluster, epoch), cluster_name=cluster.name)
        )
        with self.shared.lock:
            res.job_id = int(job_id)
        self._write_record(res)
        return res

    def _connect(self, res: Resident) -> None:
        """Learn the runner's announcement, start its helper, and see it answer for this epoch."""
        deadline = time.time() + core.RESIDENT_READY_PATIENCE
        while res.info is None:
            if time.time() > deadline or self.shared.stop.is_set():
                raise ChannelError(f"runner job {res.job_id} did not announce itself")
            info = announcement(self.shared, res.cluster, res.job_id)
            if info is None:
                status = status_until_read(self.shared, res.cluster, res.job_id)
                if status is None or status in TERMINAL:
                    raise ChannelError(f"runner job {res.job_id} ended ({status}) before it announced itself")
                self.shared.stop.wait(1.0)
                continue
            with self.shared.lock:
                res.info = info
        base = os.path.dirname(res.info["dir"])
        if getattr(self.shared.sdk, "local_channels", False):
            argv = local_argv(res.info, base)
        else:
            argv = slurm_argv(runner_host(res.cluster.pool) or "", res.info, base)
        channel = Channel(argv, SOURCE)
        hello: dict[str, Any] = {}
        while True:  # the runner may be a moment behind its announcement on a slow box
            try:
                hello = channel.ask("hello", epoch=res.epoch)
            except ChannelError:
                if time.time() > deadline:
                    channel.close()
                    raise
            if (hello.get("hello") or {}).get("epoch") == res.epoch or time.time() > deadline:
                break
            self.shared.stop.wait(1.0)
        if (hello.get("hello") or {}).get("epoch") != res.epoch:
            channel.close()
            raise ChannelError(
                f"the helper on {res.info.get('host')} does not see runner {res.epoch}'s directory"
            )
        with self.changed:
            res.channel, res.state, res.broken_since = channel, ResidentState.READY, None
            self.current[lane_key(res.cluster, res.lane)] = res
            self.changed.notify_all()
        self._write_record(res)
        self.shared.thread(self.feeds.pump, res)
        # epochs of its lane re-attached before this one was known: not ours to run any more
        for other in self._of(res.cluster):
            if other is not res and other.lane == res.lane and other.state == ResidentState.ATTACHING:
                self.retire(other, "another runner is the cluster's now")

    def give_up(self, cluster: Cluster, res: Resident | None, error: BaseException) -> None:
        """No runner on the cluster: it is gone (down, relaunched when work needs it), or `off`.

        `off` means one `sky exec` per run there from now on (a `runner-off` event), and every
        runner of its lanes retired: each holds a GPU the exec'd runs would wait for.
        """
        detail = one_line(error)
        if is_gone(error):
            self.clusters.down(cluster, detail)  # relaunched when work needs it; a runner then too
            if res is not None:
                self.dead(res, detail)
            return
        log.warning("cluster %s: no resident runner (%s); one `sky exec` per run there", cluster.name, detail)
        with self.changed:
            self.off[cluster.name] = detail
            self.changed.notify_all()
        self.shared.event("runner-off", cluster.worker, {"cluster": cluster.name, "detail": detail})
        if res is not None:
            self.retire(res, detail)
        # the other lanes' runners of an N-slot cluster too: each holds its GPU in the allocation,
        # where the runs now exec'd would wait for it (theirs end `infra` once their jobs ended)
        for other in self._of(cluster):
            if other is not res and other.state in (
                ResidentState.ATTACHING,
                ResidentState.STARTING,
                ResidentState.READY,
            ):
                self.retire(other, f"its cluster runs one `sky exec` per run now ({detail})")

    # ------------------------------------------------------------------ runs (feeds.py)

    def feed(self, res: Resident, run: Run, task: Any) -> None:
        """Hand a run to the runner (`Feeds.feed`)."""
        self.feeds.feed(res, run, task)

    def attach(self, run: Run, saved: dict[str, Any]) -> None:
        """A run an earlier controller handed to a runner (`Feeds.attach`)."""
        self.feeds.attach(run, saved)

    def kill(self, run: Run) -> None:
        """Tomb a fed run now when its runner is ready (its pump sends the tomb again while unanswered)."""
        with self.shared.lock:
            res = self.by_epoch.get(run.fed or "")
        if res is not None and res.state == ResidentState.READY:
            self.feeds.kill(res, run)

    def forget(self, run: Run) -> None:
        with self.shared.lock:
            res = self.by_epoch.get(run.fed or "")
        if res is not None:
            self.feeds.forget(res, run)

    # ------------------------------------------------------------------ watching the jobs

    def check(self) -> None:
        """The monitor's turn: see whether each runner job still goes; cancel retiring ones again."""
        with self.shared.lock:
            residents = [
                r
                for r in self.by_epoch.values()
                if r.state in (ResidentState.READY, ResidentState.RETIRING, ResidentState.ATTACHING)
            ]
        for res in residents:
            if res.state == ResidentState.ATTACHING:  # runs re-attached before this backend knew the cluster
                if res.cluster.state == ClusterState.UP:
                    self.ensure(res.cluster, res.lane)
                else:
                    self.clusters.ensure(res.cluster)
            if res.job_id is None:
                if res.state == ResidentState.RETIRING and not res.finding:
                    res.finding = True  # by name, off the monitor's thread: it may take `FIND_PATIENCE`
                    self.shared.thread(self._find_or_bury, res)
                continue
            sdk = self.shared.sdk
            try:
                status = status_name(sdk.get(sdk.job_status(res.cluster.name, [res.job_id])).get(res.job_id))
            except Exception as e:
                if is_gone(e) or self.clusters.is_up(res.cluster) is False:
                    self.jobs.cluster_lost(res.cluster, one_line(e))
                continue  # the API server hiccuped: the runner goes on, and its runs with it
            if status is None and self.clusters.is_up(res.cluster) is False:
                self.jobs.cluster_lost(res.cluster, f"runner job {res.job_id} not found")
            elif status is None or status in TERMINAL:
                self.dead(res, f"its job is {status or 'gone'}")
            elif res.state == ResidentState.RETIRING:
                self.shared.thread(self._cancel, res)

    def _find_or_bury(self, res: Resident) -> None:
        job_id = find_job(self.shared, res.cluster, res.epoch)
        with self.shared.lock:
            res.job_id, res.finding = job_id, False
        if job_id is None and not self.shared.stop.is_set():
            self.dead(res, "no job of it on the cluster")
        elif job_id is not None:
            self._cancel(res)

    def cluster_lost(self, cluster: Cluster, detail: str) -> None:
        """The cluster is gone, and every runner on it with it (their runs end `infra` with the cluster)."""
        for res in self._of(cluster):
            self.dead(res, f"cluster lost ({detail})", read=False)

    def retire(self, res: Resident, why: str) -> None:
        """Give a runner up: cancel its job until SkyPilot shows it ended (`check`), then end its runs."""
        with self.changed:
            if res.state in (ResidentState.RETIRING, ResidentState.DEAD):
                return
            res.state = ResidentState.RETIRING
            if self.current.get(lane_key(res.cluster, res.lane)) is res:
                del self.current[lane_key(res.cluster, res.lane)]
            self.changed.notify_all()
        log.info("retiring runner %s on %s: %s", res.epoch, res.cluster.name, why)
        if res.job_id is not None:
            self.shared.thread(self._cancel, res)

    def _cancel(self, res: Resident) -> None:
        sdk = self.shared.sdk
        try:
            sdk.get(sdk.cancel(res.cluster.name, job_ids=[res.job_id]))
        except Exception as e:  # `check` asks again while the job goes on
            log.info("cancel of runner job %s on %s: %s", res.job_id, res.cluster.name, one_line(e))

    def dead(self, res: Resident, why: str, *, read: bool = True) -> None:
        """The runner runs nothing any more: read what it finished, end the rest `infra`."""
        with self.changed:
            if res.state == ResidentState.DEAD:
                return
            res.state = ResidentState.DEAD
            if self.current.get(lane_key(res.cluster, res.lane)) is res:
                del self.current[lane_key(res.cluster, res.lane)]
            runs = [r for r in res.runs.values() if r.ended is None and r.state == RunState.RUNNING]
            reader = res.channel or next(
                (r.channel for r in self._of(res.cluster) if r.state == ResidentState.READY and r.channel),
                None,
            )
            self.changed.notify_all()
        if read and reader is not None and runs:
            self.feeds.read_out(res, reader, runs)
        for run in runs:
            if self.feeds.claim(run):
                detail = f"the runner on `{res.cluster.name}` ended ({why})"
                self.jobs._end(run, RunExit(None, lost=True, detail=detail))
        if res.channel is not None:
            res.channel.close()
        with contextlib.suppress(OSError):
            if self._record(res.cluster, res.lane).get("epoch") == res.epoch:
                self._record_path(res.cluster, res.lane).unlink()
        log.info("runner %s on %s is dead: %s", res.epoch, res.cluster.name, why)

    def settle(self, killed: list[Run], deadline: float) -> None:
        """At close: send the tombs of killed runs not answered yet; the runner stops them on its own."""
        for run in killed:
            with self.shared.lock:
                res = self.by_epoch.get(run.fed or "")
            self.feeds.settle(res, run, deadline)

    def close(self) -> None:
        with self.shared.lock:
            channels = [r.channel for r in self.by_epoch.values() if r.channel is not None]
        for channel in channels:
            channel.close()

    # ------------------------------------------------------------------ records and lookups

    def resident(self, cluster: Cluster, epoch: str, job_id: Any, lane: int = 0) -> Resident:
        """The one `Resident` of an epoch (made `attaching` on first use)."""
        with self.shared.lock:
            res = self.by_epoch.get(epoch)
            if res is None:
                res = Resident(cluster, epoch, int(job_id) if job_id is not None else None, lane)
                self.by_epoch[epoch] = res
            elif res.job_id is None and job_id is not None:
                res.job_id = int(job_id)
            return res

    def _of(self, cluster: Cluster) -> list[Resident]:
        with self.shared.lock:
            return [r for r in self.by_epoch.values() if r.cluster is cluster]

    def _record_path(self, cluster: Cluster, lane: int = 0) -> Path:
        """`resident.json` of the cluster's (first) lane; `resident-g<j>.json` of lane j > 0."""
        name = "resident.json" if lane == 0 else f"resident-g{lane}.json"
        return self.shared.lab_dir / ".nightlab" / "fleet" / cluster.name / name

    def _record(self, cluster: Cluster, lane: int = 0) -> dict[str, Any]:
        try:
            data = json.loads(self._record_path(cluster, lane).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write_record(self, res: Resident) -> None:
        path = self._record_path(res.cluster, res.lane)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "epoch": res.epoch,
            "job_id": res.job_id,
            "info": res.info,
            "source": SOURCE_HASH,
            "lane": res.lane,
        }
        atomic_write_json(path, data, unique=True)

    def forget_records(self) -> None:
        """`fleet down`: the clusters and their runners are gone."""
        for cluster in self.clusters.all():
            for lane in range(_lanes(cluster)):
                with contextlib.suppress(OSError):
                    self._record_path(cluster, lane).unlink()


def lane_key(cluster: Cluster, lane: int) -> str:
    """The key of one lane's runner: the cluster's name, with `#<lane>` on an N-slot cluster's lanes > 0."""
    return cluster.name if lane == 0 else f"{cluster.name}#{lane}"


def _lanes(cluster: Cluster) -> int:
    return slots_per_cluster(cluster.pool)
