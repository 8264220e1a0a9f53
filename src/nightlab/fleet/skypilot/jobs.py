"""The job half of the SkyPilot backend: one state machine per attempt, and the monitor thread.

States of a run: `waiting` (for its cluster to be up) -> `running` (a SkyPilot job exists:
its id is saved in `run_dir/sky.json`, a thread streams its log) -> `fetching` (the job
ended: its whole log is read again) -> `done` (`ended` holds the `RunExit`). A thread per
job follows its log (`sky.tail_logs(follow=True)`), which returns the moment the job ends;
one monitor thread polls `sky.job_status` of every running job, which catches preemptions
and broken streams, and then reads the log with retries. A controller that restarts finds
its jobs again by the saved id, or by job name when the exec was in flight; a kill is saved
there too, so a job an earlier controller killed is cancelled until it ends. A killed job the
closing backend could not see end, whose attempt no controller will re-attach (a stop requeues
it), is left in the lab for the next backend to cancel (`left_kills.py`).
"""

from __future__ import annotations

import enum
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nightlab.atomic import atomic_write_json
from nightlab.fleet.backend import RunExit, RunSpec
from nightlab.fleet.cluster_states import ClusterState
from nightlab.fleet.job_log import JobLogSink, add_run_keys, read_health, save_score
from nightlab.fleet.sky_task import job_name
from nightlab.fleet.skypilot import core
from nightlab.fleet.skypilot.clusters import Cluster, Clusters
from nightlab.fleet.skypilot.core import (
    EXIT_STATUS,
    TERMINAL,
    Shared,
    SkyJobStatus,
    field_of,
    is_gone,
    log,
    one_line,
    run_key,
    status_name,
)
from nightlab.fleet.skypilot.left_kills import LeftKills

if TYPE_CHECKING:
    from nightlab.fleet.skypilot.feeds import Feed

STREAMS = 3  # log streams per job: SkyPilot's tail of a queued job gives up after 5 s, so follow again


class RunState(enum.StrEnum):
    """Where an attempt is in this backend (module docstring)."""

    WAITING = "waiting"  # for its cluster to be up, or for its turn to be exec'd
    RUNNING = "running"  # its job exists (or a resident runner has it)
    FETCHING = "fetching"  # its job ended: its log is being read whole
    DONE = "done"  # `ended` holds its `RunExit`


@dataclass
class Run:
    """One attempt on one cluster, as this backend sees it (module docstring)."""

    key: str
    spec: RunSpec
    cluster: Cluster
    job_id: int | None = None
    lane: int = 0  # its slot on an N-slot cluster (0 on a one-slot cluster)
    state: RunState = RunState.WAITING
    ended: RunExit | None = None
    kill_requested: bool = False
    unreadable_since: float | None = None  # when its job status last became unreadable
    started_at: float | None = None  # when the run script got the cluster (`nightlab-start:`)
    streams: int = 0  # log streams started (one normally; the monitor restarts a broken one)
    streaming: bool = False
    seq: int = 0  # lease order (`Jobs.add`)
    submitting: bool = False  # `submit` owns it (not a re-attached run looking for its job)
    cancelling: bool = False  # a cancel of its job is in flight
    cancel_answered: float | None = None  # when SkyPilot last answered one
    feed: Feed | None = None  # handed to a resident runner instead of its own job (`feeds.py`)

    @property
    def fed(self) -> str | None:
        """The epoch of the resident runner it was handed to; None when it has a job of its own."""
        return None if self.feed is None else self.feed.epoch


def _stamp(value: str) -> float | None:
    """A `date +%s.%N` stamp the run script printed, or None when it is not one."""
    try:
        return float(value)
    except ValueError:
        return None


class Jobs:
    """The attempts of one backend: submitting, following, cancelling and re-attaching them."""

    def __init__(self, shared: Shared, clusters: Clusters) -> None:
        self.shared = shared
        self.clusters = clusters
        self.runs: dict[str, Run] = {}
        self._monitor: threading.Thread | None = None
        self._seq = itertools.count(1)
        self._killed: list[Run] = []  # kept after `forget`: `settle_kills` checks them at close
        self._saving = threading.Lock()  # `sky.json` is read, updated and written by several threads
        self.left = LeftKills(shared)
        from nightlab.fleet.skypilot.residents import Residents  # residents imports this module (RunState)

        self.residents = Residents(shared, clusters, self)

    def get(self, spec: RunSpec) -> Run | None:
        with self.shared.lock:
            return self.runs.get(run_key(spec))

    def add(self, spec: RunSpec, cluster: Cluster, lane: int = 0) -> Run:
        run = Run(run_key(spec), spec, cluster, lane=lane, seq=next(self._seq), submitting=True)
        with self.shared.lock:
            self.runs[run.key] = run
        return run

    def forget(self, spec: RunSpec) -> None:
        with self.shared.lock:
            run = self.runs.pop(run_key(spec), None)
        if run is not None and run.fed is not None:
            self.residents.forget(run)

    def request_kill(self, run: Run) -> None:
        """Mark the run killed and cancel its job when it exists (`_running` does it otherwise).

        The kill is saved in `sky.json`: a controller that stops right after it may close before
        SkyPilot acts on the cancel (an INIT job ignores it, `_cancel_again`), and the backend
        that re-attaches the run next must go on cancelling it, not follow it to its own limit.
        """
        with self.shared.lock:
            if run.kill_requested or run.ended is not None:
                return
            run.kill_requested = True
            job_id = run.job_id
            self._killed = [r for r in self._killed if r.ended is None] + [run]
        try:
            self._save(run, killed=True)
        except OSError as e:  # a full disk: the kill goes on; only a restart before it lands would miss it
            log.warning("could not save the kill of %s: %s", run.key, e)
        with run.cluster.changed:
            run.cluster.changed.notify_all()  # a run waiting for its cluster gives up now
        with self.residents.changed:
            self.residents.changed.notify_all()  # and one waiting for its runner
        if run.fed is not None:
            self.residents.kill(run)
        elif job_id is not None:
            self.shared.thread(self.cancel, run)

    # ------------------------------------------------------------------ submitting

    def submit(self, run: Run, task: Any) -> None:
        """Wait for the cluster, `sky.exec` the task, and follow the job (a thread's body)."""
        cluster, sdk = run.cluster, self.shared.sdk
        for _ in range(2):  # a cluster found stopped (autostop) at exec time is relaunched once
            if not self._wait_up(run):
                return
            while self.residents.enabled(cluster):
                res = self.residents.ready(cluster, run)
                if res is not None:
                    self.residents.feed(res, run, task)
                    return
                if run.kill_requested or self.shared.stop.is_set() or not self.residents.enabled(cluster):
                    break
                if not self._wait_up(run):  # its cluster went while its runner came up
                    return
            if not self._wait_turn(run):
                return
            try:
                request = sdk.exec(task, cluster_name=cluster.name)
                self._save(run, request_id=str(request))
                job_id, _ = sdk.get(request)
                break
            except Exception as e:
                if not is_gone(e):
                    detail = f"sky exec on `{cluster.name}` failed: {one_line(e)}"
                    self._end(run, RunExit(None, lost=True, detail=detail))
                    return
                self.clusters.down(cluster, one_line(e))
        else:
            self._end(run, RunExit(None, lost=True, detail=f"cluster `{cluster.name}` went down twice"))
            return
        self._running(run, int(job_id))

    def _running(self, run: Run, job_id: int) -> None:
        """The run's job exists: record its id, stream its log, and cancel it if a kill came first."""
        with self.shared.lock:
            run.job_id, run.state = job_id, RunState.RUNNING
            kill = run.kill_requested
        self._save(run, job_id=job_id)
        self._stream(run)
        if kill:
            self.cancel(run)

    def _stream(self, run: Run) -> None:
        with self.shared.lock:
            run.streams, run.streaming = run.streams + 1, True
        self.shared.thread(self._follow, run)

    def _started(self, run: Run, stamp: str | None) -> None:
        """The run script holds the cluster now: the controller's deadline counts from here.

        The script's own clock is taken when it is plausible (not ahead of ours, and not a
        whole budget ago), so a log replayed after a controller restart keeps the start;
        otherwise the moment we saw the line.
        """
        now = time.time()
        remote = _stamp(stamp) if stamp is not None else None
        plausible = remote is not None and now - run.spec.timeout - 60 < remote <= now
        at = remote if plausible else now
        with self.shared.lock:
            if run.started_at is not None:
                return
            run.started_at = at
        self._save(run, started_at=at)

    def _wait_up(self, run: Run) -> bool:
        """Wait until the run's cluster is up (launching it when needed); False ends the run."""
        cluster = run.cluster
        with cluster.changed:
            while True:
                with self.shared.lock:
                    state, kill, hopeless = cluster.state, run.kill_requested, cluster.hopeless
                if kill or self.shared.stop.is_set():
                    self._end(run, RunExit(None, detail="stopped before it started"))
                    return False
                if state == ClusterState.UP:
                    return True
                if hopeless:
                    detail = f"cluster `{cluster.name}`: {cluster.detail}"
                    self._end(run, RunExit(None, lost=True, detail=detail))
                    return False
                self.clusters.ensure(cluster)
                cluster.changed.wait(timeout=1.0)

    def _wait_turn(self, run: Run) -> bool:
        """Wait while an idle cluster's first exec is in flight, unless this run is one (see `_urgent`).

        A fleet's lease fills every worker's queue at once: 3 execs per cluster at the same
        moment on the API server made each cluster's first one, the only one a GPU idles for,
        take 20-37 s instead of 10-13 (issue 14, 2 workers on a 2-core box). The queued ones
        have a whole run's time to land; one never waits longer than `core.EXEC_PRIORITY_WAIT`
        (an exec that hangs must not hold the others). False ends the run (killed, or the
        backend stopped).
        """
        deadline = time.time() + core.EXEC_PRIORITY_WAIT
        while True:
            with self.shared.lock:
                kill = run.kill_requested
                urgent = self._urgent()
            if kill or self.shared.stop.is_set():
                self._end(run, RunExit(None, detail="stopped before it started"))
                return False
            if not urgent or any(r is run for r in urgent) or time.time() > deadline:
                return True
            self.shared.stop.wait(0.05)

    def _urgent(self) -> list[Run]:
        """Per lane of an up cluster with no job of ours, its earliest run still to be exec'd (caller holds the lock)."""
        first: dict[tuple[str, int], Run] = {}
        busy = set()
        for run in self.runs.values():
            name = (run.cluster.name, run.lane)
            if run.state in (RunState.RUNNING, RunState.FETCHING):
                busy.add(name)
            elif (
                run.state == RunState.WAITING
                and run.submitting
                and not run.kill_requested
                and (name not in first or run.seq < first[name].seq)
            ):
                first[name] = run
        return [r for name, r in first.items() if name not in busy and r.cluster.state == ClusterState.UP]

    def cancel(self, run: Run) -> None:
        """Ask SkyPilot to cancel the run's job; the monitor asks again while the job goes on."""
        sdk = self.shared.sdk
        with self.shared.lock:
            if run.cancelling:
                return
            run.cancelling = True
        try:
            sdk.get(sdk.cancel(run.cluster.name, job_ids=[run.job_id]))
        except Exception as e:  # the job may have ended or its cluster gone: the monitor sees it
            log.info("cancel of job %s on %s: %s", run.job_id, run.cluster.name, e)
        finally:
            with self.shared.lock:
                run.cancelling, run.cancel_answered = False, time.time()

    def settle_kills(self, deadline: float) -> None:
        """Until `deadline`, cancel killed runs' jobs again until SkyPilot shows each one ended.

        The backend's close calls it: the monitor stops with the backend, so a controller that
        stops right after an exec would otherwise leave its only cancel to an INIT job, which
        SkyPilot ignores (`_cancel_again`), and the job would run on to its own limit. A kill
        whose exec is still in flight waits for its job id (`_running` cancels it then). Jobs not
        seen ended by `deadline` are left in the lab for the next backend (`LeftKills`).
        """
        with self.shared.lock:
            fed = [r for r in self._killed if r.fed is not None]
        self.residents.settle(fed, deadline)
        sdk, settled = self.shared.sdk, set[str]()
        while True:
            with self.shared.lock:
                waiting = [r for r in self._killed if r.job_id is None and r.fed is None and r.ended is None]
                to_check = [
                    r
                    for r in self._killed
                    if r.job_id is not None and r.ended is None and r.key not in settled
                ]
            if (not waiting and not to_check) or time.time() >= deadline:
                self.left.leave(waiting + to_check)
                return
            asked = time.time()
            by_cluster: dict[str, list[Run]] = {}
            for run in to_check:
                by_cluster.setdefault(run.cluster.name, []).append(run)
            for name, runs in by_cluster.items():
                try:
                    statuses = sdk.get(sdk.job_status(name, [r.job_id for r in runs]))
                except Exception as e:  # its cluster is gone, or the API server is: nothing to cancel
                    log.info("job status on %s at close: %s", name, one_line(e))
                    settled.update(r.key for r in runs)
                    continue
                for run in runs:
                    status = status_name(statuses.get(run.job_id))
                    if status is None or status in TERMINAL:
                        settled.add(run.key)
                        continue
                    with self.shared.lock:
                        answered = run.cancel_answered
                        due = not run.cancelling and (answered is None or answered < asked)
                    if due:
                        self.shared.thread(self.cancel, run)
            time.sleep(min(self.shared.status_interval, 0.5))

    # ------------------------------------------------------------------ re-attaching

    def reattach(self, spec: RunSpec, cluster: Cluster, lane: int = 0) -> Run:
        """Take over an attempt an earlier controller launched."""
        run = Run(run_key(spec), spec, cluster, lane=lane)
        try:
            saved = json.loads((spec.run_dir / "sky.json").read_text())
        except (OSError, ValueError):
            saved = {}
        with self.shared.lock:
            existing = self.runs.get(run.key)
            if existing is not None:
                return existing
            self.runs[run.key] = run
        self.start()
        if saved.get("started_at") is not None:
            run.started_at = float(saved["started_at"])
        if isinstance(saved.get("resident"), dict) and saved["resident"].get("epoch"):
            self.residents.attach(run, saved["resident"])
        elif saved.get("job_id") is not None:
            self._running(run, int(saved["job_id"]))
        else:
            self.shared.thread(self._find_job, run)
        if saved.get("killed"):
            self.request_kill(run)
        return run

    def _find_job(self, run: Run) -> None:
        """The job id of a run whose exec was in flight when the controller died, by job name.

        Looked for until `core.FIND_PATIENCE` has passed: the API server finishes an exec its
        client no longer waits for, so the job may land after the first look.
        """
        name, sdk = job_name(run.spec), self.shared.sdk
        deadline = time.time() + core.FIND_PATIENCE
        while True:
            try:
                jobs = sdk.get(sdk.queue(run.cluster.name, skip_finished=False))
            except Exception as e:
                detail = f"cannot list jobs on `{run.cluster.name}`: {one_line(e)}"
                self._end(run, RunExit(None, lost=True, detail=detail))
                return
            ids = [field_of(j, "job_id") for j in jobs if field_of(j, "job_name") == name]
            if ids:
                self._running(run, int(max(ids)))
                return
            if time.time() >= deadline or self.shared.stop.is_set():
                detail = f"no job `{name}` on cluster `{run.cluster.name}` after {core.FIND_PATIENCE:.0f} s"
                self._end(run, RunExit(None, lost=True, detail=detail))
                return
            self.shared.stop.wait(self.shared.status_interval)

    def _save(self, run: Run, **data: Any) -> None:
        path = run.spec.run_dir / "sky.json"
        with self._saving:
            try:
                saved = json.loads(path.read_text())
            except (OSError, ValueError):
                saved = {}
            saved.update(data, cluster=run.cluster.name)
            atomic_write_json(path, saved, unique=True)

    def _end(self, run: Run, ended: RunExit) -> None:
        with self.shared.lock:
            if run.ended is None:
                run.ended, run.state = ended, RunState.DONE

    # ------------------------------------------------------------------ monitoring

    def start(self) -> None:
        """Start the monitor thread (once)."""
        with self.shared.lock:
            if self._monitor is None:
                self._monitor = threading.Thread(target=self._monitor_loop, name="sky-monitor", daemon=True)
                self._monitor.start()

    def _monitor_loop(self) -> None:
        while not self.shared.stop.wait(self.shared.status_interval):
            try:
                self._check_jobs()
                self.residents.check()
                self.left.settle()
            except Exception:
                log.exception("SkyPilot monitor turn failed")

    def _check_jobs(self) -> None:
        sdk = self.shared.sdk
        with self.shared.lock:
            by_cluster: dict[str, list[Run]] = {}
            for run in self.runs.values():
                if run.state == RunState.RUNNING and run.fed is None:
                    by_cluster.setdefault(run.cluster.name, []).append(run)
        requests, asked = {}, time.time()
        for name, runs in by_cluster.items():
            try:
                requests[name] = sdk.job_status(name, [r.job_id for r in runs])
            except Exception as e:
                self._status_failed(runs, e)
        for name, request in requests.items():
            runs = by_cluster[name]
            try:
                statuses = sdk.get(request)
            except Exception as e:
                self._status_failed(runs, e)
                continue
            for run in runs:
                run.unreadable_since = None
                status = status_name(statuses.get(run.job_id))
                if status is None or status == SkyJobStatus.FAILED_DRIVER:
                    # the job vanished or its driver died: preemption shows up this way
                    if self.clusters.is_up(run.cluster) is False:
                        self.cluster_lost(run.cluster, f"job {run.job_id} status {status}")
                        continue
                    if status is None:
                        self._end(
                            run, RunExit(None, lost=True, detail=f"job {run.job_id} not found on `{name}`")
                        )
                        continue
                if status == SkyJobStatus.RUNNING and run.started_at is None and not run.streaming:
                    # its log stream gave up before the job started (SkyPilot's tail waits 5 s
                    # for a queued job's log): follow it again, or take this moment as its start
                    if run.streams < STREAMS:
                        self._stream(run)
                    else:
                        self._started(run, None)
                if status in TERMINAL:
                    with self.shared.lock:
                        if run.state != RunState.RUNNING:
                            continue
                        run.state = RunState.FETCHING
                    self.shared.thread(self._fetch, run, status)
                else:
                    self._cancel_again(run, asked)

    def _cancel_again(self, run: Run, asked: float) -> None:
        """Cancel a killed run's job again: its status, read after the last cancel's answer, is not terminal.

        On Slurm `sky exec` answers while its job is still INIT, and SkyPilot's cancel of an
        INIT job cancels nothing ("No jobs cancelled"): the job would run on to its own limit,
        holding the GPU (the real conformance suite's `timeout` scenario, once in CI).
        """
        with self.shared.lock:
            answered = run.cancel_answered
            due = run.kill_requested and not run.cancelling and answered is not None and answered < asked
        if due:
            self.shared.thread(self.cancel, run)

    def _status_failed(self, runs: list[Run], error: BaseException) -> None:
        cluster = runs[0].cluster
        if is_gone(error) or self.clusters.is_up(cluster) is False:
            self.cluster_lost(cluster, one_line(error))
            return
        now = time.time()
        patience = core.STATUS_PATIENCE
        for run in runs:  # the API server hiccuped: the job goes on, ask again next turn
            run.unreadable_since = run.unreadable_since or now
            if now - run.unreadable_since > patience:
                detail = f"job status unreadable for {patience:.0f} s: {one_line(error)}"
                self._end(run, RunExit(None, lost=True, detail=detail))

    def cluster_lost(self, cluster: Cluster, detail: str) -> None:
        """The cluster is no longer up: its running jobs end as `infra`; it relaunches when work needs it."""
        with self.shared.lock:
            for run in self.runs.values():
                if run.cluster is cluster and run.state in (RunState.RUNNING, RunState.FETCHING):
                    ended = RunExit(
                        None, lost=True, detail=f"cluster `{cluster.name}` is no longer up ({detail})"
                    )
                    self._end(run, ended)
        self.residents.cluster_lost(cluster, detail)
        self.clusters.down(cluster, detail)

    # ------------------------------------------------------------------ reading the log

    def _follow(self, run: Run) -> None:
        """Stream the job's log into `log.txt` until the job ends, so its end is seen at once.

        Anything unclear (an error, a failure without the run script's exit line, which is how
        a preemption looks) is left to the monitor, which polls the job's status and reads the
        log again with retries.
        """

        # once the monitor has taken the run over, it rewrites the log: this stream stops writing
        sink = JobLogSink(
            run.spec.log_path, active=lambda: run.state == RunState.RUNNING, on_tag=self._on_tag(run)
        )
        try:
            code = self.shared.sdk.tail_logs(run.cluster.name, run.job_id, follow=True, output_stream=sink)
        except Exception as e:
            log.info("log stream of job %s on %s broke: %s", run.job_id, run.cluster.name, e)
            with self.shared.lock:  # an unreachable API server: no new stream, the monitor goes on
                run.streams = max(run.streams, STREAMS)
            return
        finally:
            run.streaming = False
        sink.finish()
        status = EXIT_STATUS.get(code)
        if status is None or (status == SkyJobStatus.FAILED and "exit" not in sink.tags):
            return
        with self.shared.lock:
            if run.state != RunState.RUNNING:
                return
            run.state = RunState.FETCHING
        self._finish(run, status, sink.tags)

    def _on_tag(self, run: Run) -> Any:
        def on_tag(key: str, value: str) -> None:
            if key == "start":
                self._started(run, value)
            elif key == "end":  # when the command ended, by the worker's clock (bench/fleet_real.py)
                self._save(run, command_ended_at=_stamp(value))

        return on_tag

    def sink(self, run: Run) -> JobLogSink:
        """A fresh log for a run a resident runner runs (its log has no SkyPilot prefixes)."""
        return JobLogSink(run.spec.log_path, on_tag=self._on_tag(run), raw=True)

    def _fetch(self, run: Run, status: str) -> None:
        try:
            sink = self.shared.tail(run.cluster.name, run.job_id, lambda: JobLogSink(run.spec.log_path))
        except Exception as e:
            detail = (
                f"the log of job {run.job_id} on `{run.cluster.name}` could not be read "
                f"after {self.shared.log_retries} tries: {one_line(e)}"
            )
            self._end(run, RunExit(None, lost=True, detail=detail))
            return
        sink.finish()
        self._finish(run, status, sink.tags)

    def _finish(self, run: Run, status: str, tags: dict[str, str]) -> None:
        """Complete the log where the controller reads it, then report the end."""
        if self.shared.stop.is_set():
            return  # this backend was closed: a newer controller owns the run now
        code = tags.get("code") if tags.get("code") not in (None, "", "none") else None
        add_run_keys(
            run.spec.log_path, tier=run.spec.env.get("NIGHTLAB_TIER", ""), gpu=tags.get("gpu"), code=code
        )
        # a supervised run's `score.json` (job_log.save_score); the worker's probe can only mark it down
        sandbox = run.cluster.software.get("sandbox")
        if sandbox is None:  # a cluster an earlier controller launched: its probe is in the ledger
            with self.shared.lock:
                sandbox = self.shared.recorded_software.get(run.cluster.worker, {}).get("sandbox")
        save_score(run.spec.run_dir, tags, worker_sandbox=sandbox)
        exit_tag = tags.get("exit")
        health = read_health(tags)
        if exit_tag is not None and re.fullmatch(r"-?\d+", exit_tag):
            ended = RunExit(int(exit_tag), code=code, health=health)
        elif status == SkyJobStatus.SUCCEEDED:
            ended = RunExit(0, code=code, health=health)
        elif status == SkyJobStatus.CANCELLED:
            ended = RunExit(None, detail="job cancelled", code=code)
        else:  # the run script itself died (driver failure, OOM kill of the node)
            what = f"job {run.job_id}" if run.fed is None else f"its run script on runner {run.fed}"
            ended = RunExit(None, lost=True, detail=f"{what} ended {status} without an exit status")
        self._end(run, ended)
