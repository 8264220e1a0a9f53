"""The controller's side of the resident runner: one long-lived runner job per Slurm cluster.

Why: on Slurm every SkyPilot job pays 10-40 s before its command starts (the step, the
executor's Python, an exec slower under load), which cost a worker 15-20 % of its time with
60 s runs (bench/RESULTS.md). A runner (`resident.py`) is one SkyPilot job that runs the
cluster's experiments one after another with the same run script as `sky exec`; the
controller feeds it through a helper on its node (`channel.py`), so a handover between two
runs is the runner's 0.1 s look at its inbox.

Life of a runner (`Resident`): `starting` (the record `.nightlab/fleet/<cluster>/resident.json`
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
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import hashlib
import json
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightlab import procs
from nightlab.atomic import atomic_write_json
from nightlab.config import slots_per_cluster
from nightlab.fleet.backend import RunExit
from nightlab.fleet.sky_task import _resources, _sky, load_worker_config
from nightlab.fleet.skypilot import core, resident
from nightlab.fleet.skypilot.channel import ASK_TIMEOUT, Channel, ChannelError, local_argv, slurm_argv
from nightlab.fleet.skypilot.core import (
    TERMINAL,
    field_of,
    is_gone,
    lane_accelerators,
    lane_cpus,
    log,
    one_line,
    status_name,
)
from nightlab.locks import try_lock

if TYPE_CHECKING:
    from nightlab.fleet.skypilot.clusters import Cluster
    from nightlab.fleet.skypilot.jobs import Jobs, Run


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


@dataclass
class Resident:
    """One runner job (one epoch) on one cluster, as this backend sees it (module docstring)."""

    cluster: Cluster
    epoch: str
    job_id: int | None = None
    lane: int = 0  # the cluster's slot it runs (one runner per lane of an N-slot cluster)
    info: dict[str, Any] | None = None  # its announcement (`resident.PREFIX`)
    state: str = "attaching"  # attaching | starting | ready | retiring | dead
    channel: Channel | None = None
    runs: dict[str, Run] = field(default_factory=dict)  # by run name
    forgets: list[str] = field(default_factory=list)  # run names whose files may go
    broken_since: float | None = None  # when its helper last stopped answering
    finding: bool = False  # its job id is being looked up by name (`check`)
    wake: threading.Event = field(default_factory=threading.Event)


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


class Residents:
    """The runners of one backend: starting, adopting, feeding, reading and retiring them."""

    def __init__(self, shared: Any, clusters: Any, jobs: Jobs) -> None:
        self.shared = shared
        self.clusters = clusters
        self.jobs = jobs
        self.by_epoch: dict[str, Resident] = {}
        self.current: dict[str, Resident] = {}  # lane key (`lane_key`) -> its ready runner
        self.off: dict[str, str] = {}  # cluster name -> why this backend uses `sky exec` there
        self._starting: set[str] = set()  # lane keys
        self.changed = threading.Condition(self.shared.lock)

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
            if not self.enabled(cluster) and cluster.state == "up" and key not in self._starting:
                record = self._record(cluster, lane)
                if record.get("epoch") and str(record["epoch"]) not in self.by_epoch:
                    res = self.resident(cluster, str(record["epoch"]), record.get("job_id"), lane)
                    self._retire(res, "this pool runs one `sky exec` per run")
                return
            if (
                not self.enabled(cluster)
                or cluster.state != "up"
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
            if res.state in ("attaching", "starting", "ready"):
                self._retire(res, "its cluster is launched again")
        sdk = self.shared.sdk
        deadline = time.time() + core.RESIDENT_READY_PATIENCE
        while time.time() < deadline and not self.shared.stop.is_set():
            try:
                stray = self.stray_jobs(cluster)
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
                    if cluster.state != "up":
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
            self._give_up(cluster, res, e)
        finally:
            with self.changed:
                self._starting.discard(lane_key(cluster, lane))
                self.changed.notify_all()

    def _adopt(self, cluster: Cluster, lane: int = 0) -> Resident | None:
        """The runner of the cluster's record when its job still goes and runs this code; else None.

        A recorded runner of other code is retired (`_retire`): its job queue ahead of ours
        would hold the cluster, and what it reports is not read by this code.
        """
        record = self._record(cluster, lane)
        epoch = record.get("epoch")
        if not epoch:
            return None
        res = self.resident(cluster, str(epoch), record.get("job_id"), lane)
        if res.state in ("retiring", "dead"):  # given up by this backend: a new one queues behind it
            return None
        if record.get("source") != SOURCE_HASH:
            self._retire(res, f"it runs other code ({record.get('source')})")
            return None
        if res.job_id is None:  # its starter died between the record and the exec's answer
            res.job_id = self._find(cluster, res.epoch)
            if res.job_id is None:
                self._dead(res, "its exec never landed")
                return None
        status = self._status_until_read(cluster, res.job_id)
        if status is None or status in TERMINAL:
            self._dead(res, f"its job is {status or 'gone'}")
            return None
        with self.shared.lock:
            res.info = res.info or record.get("info")
            res.state = "starting"
        return res

    def _launch(self, cluster: Cluster, lane: int = 0) -> Resident:
        epoch = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
        res = self.resident(cluster, epoch, None, lane)
        with self.shared.lock:
            res.state = "starting"
        self._write_record(res)  # first: a process that dies during the exec leaves it findable
        sdk = self.shared.sdk
        job_id, _ = sdk.get(sdk.exec(self._task(cluster, epoch, lane), cluster_name=cluster.name))
        with self.shared.lock:
            res.job_id = int(job_id)
        self._write_record(res)
        return res

    def _task(self, cluster: Cluster, epoch: str, lane: int = 0) -> Any:
        sky = _sky()
        doc = load_worker_config(self.shared.lab_dir)
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
        if _lanes(cluster) > 1:
            accelerators = lane_accelerators(cluster.pool, runner=True)
        cpus = lane_cpus(cluster.pool, cluster.cpus)  # a Slurm lane's share, or its step takes them all
        resources = sky.Resources(accelerators=accelerators, **({"cpus": cpus} if cpus else {}))
        return sky.Task(name=JOB_PREFIX + epoch, run=RUNNER_RUN, envs=envs, resources=resources)

    def _connect(self, res: Resident) -> None:
        """Learn the runner's announcement, start its helper, and see it answer for this epoch."""
        deadline = time.time() + core.RESIDENT_READY_PATIENCE
        while res.info is None:
            if time.time() > deadline or self.shared.stop.is_set():
                raise ChannelError(f"runner job {res.job_id} did not announce itself")
            catcher = _Announcement()
            try:
                self.shared.sdk.tail_logs(res.cluster.name, res.job_id, follow=True, output_stream=catcher)
            except _Seen:
                pass
            if catcher.info is None:
                status = self._status_until_read(res.cluster, res.job_id)
                if status is None or status in TERMINAL:
                    raise ChannelError(f"runner job {res.job_id} ended ({status}) before it announced itself")
                self.shared.stop.wait(1.0)
                continue
            with self.shared.lock:
                res.info = catcher.info
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
            res.channel, res.state, res.broken_since = channel, "ready", None
            self.current[lane_key(res.cluster, res.lane)] = res
            self.changed.notify_all()
        self._write_record(res)
        self.shared.thread(self._pump, res)
        # epochs of its lane re-attached before this one was known: not ours to run any more
        for other in self._of(res.cluster):
            if other is not res and other.lane == res.lane and other.state == "attaching":
                self._retire(other, "another runner is the cluster's now")

    def _give_up(self, cluster: Cluster, res: Resident | None, error: BaseException) -> None:
        detail = one_line(error)
        if is_gone(error):
            self.clusters.down(cluster, detail)  # relaunched when work needs it; a runner then too
            if res is not None:
                self._dead(res, detail)
            return
        log.warning("cluster %s: no resident runner (%s); one `sky exec` per run there", cluster.name, detail)
        with self.changed:
            self.off[cluster.name] = detail
            self.changed.notify_all()
        self.shared.event("runner-off", cluster.worker, {"cluster": cluster.name, "detail": detail})
        if res is not None:
            self._retire(res, detail)
        # the other lanes' runners of an N-slot cluster too: each holds its GPU in the allocation,
        # where the runs now exec'd would wait for it (theirs end `infra` once their jobs ended)
        for other in self._of(cluster):
            if other is not res and other.state in ("attaching", "starting", "ready"):
                self._retire(other, f"its cluster runs one `sky exec` per run now ({detail})")

    # ------------------------------------------------------------------ runs

    def feed(self, res: Resident, run: Run, task: Any) -> None:
        """Hand a run to the runner: it is `running` from now on, whatever the put's answer."""
        name = run_name(run)
        with self.shared.lock:
            run.fed, run.state, run.putting = res.epoch, "running", True
            run.sink = self.jobs.sink(run)
            res.runs[name] = run
        try:
            # the epoch first: a controller that dies during the put finds the run again
            self.jobs._save(run, resident={"epoch": res.epoch, "job": res.job_id})
            request = {"script": task.run, "env": {str(k): str(v) for k, v in (task.envs or {}).items()}}
            res.channel.ask("put", epoch=res.epoch, name=name, request=request)
        except ChannelError as e:  # the pump sees whether it landed, and tombs it if it did not
            log.info("put of %s on %s: %s", name, res.cluster.name, e)
        finally:
            with self.shared.lock:
                run.putting = False
            res.wake.set()

    def attach(self, run: Run, saved: dict[str, Any]) -> None:
        """A run an earlier controller handed to a runner (`saved`: its `sky.json` entry)."""
        res = self.resident(run.cluster, str(saved["epoch"]), saved.get("job"), run.lane)
        with self.shared.lock:
            run.fed, run.state = res.epoch, "running"
            run.sink = self.jobs.sink(run)
            res.runs[run_name(run)] = run
            state = res.state
        if state == "ready":
            res.wake.set()
        elif state == "dead" and self._claim(run):  # this backend already saw its runner end
            detail = f"the runner on `{res.cluster.name}` had ended"
            self.jobs._end(run, RunExit(None, lost=True, detail=detail))
        else:
            self.ensure(run.cluster, run.lane)

    def kill(self, run: Run) -> None:
        """Tomb the run now (its pump sends the tomb again while it is unanswered)."""
        with self.shared.lock:
            res = self.by_epoch.get(run.fed or "")
        if res is not None and res.state == "ready":
            self.shared.thread(self._tomb, res, run, ASK_TIMEOUT)

    def _tomb(self, res: Resident, run: Run, timeout: float) -> None:
        with contextlib.suppress(ChannelError):
            res.channel.ask("tomb", timeout=timeout, epoch=res.epoch, name=run_name(run))
            run.kill_sent = True

    def forget(self, run: Run) -> None:
        with self.shared.lock:
            res = self.by_epoch.get(run.fed or "")
            if res is not None and res.runs.pop(run_name(run), None) is not None:
                res.forgets.append(run_name(run))

    def _pump(self, res: Resident) -> None:
        """Poll the runner's runs, stream their logs in, and end them on what its files say."""
        backoff = 0.5
        while not self.shared.stop.is_set():
            with self.shared.lock:
                if res.state != "ready":
                    return
                runs = [r for r in res.runs.values() if r.ended is None and r.state == "running"]
                forgets, res.forgets = res.forgets, []
            if not runs and not forgets:
                res.wake.wait(timeout=5.0)
                res.wake.clear()
                continue
            try:
                for name in forgets:
                    res.channel.ask("forget", epoch=res.epoch, name=name)
                more = self._turn(res, runs)
                res.broken_since, backoff = None, 0.5
            except ChannelError as e:
                now = time.time()
                res.broken_since = res.broken_since or now
                if now - res.broken_since > core.CHANNEL_PATIENCE:
                    self._give_up(res.cluster, None, e)
                    self._retire(res, f"its helper did not answer for {core.CHANNEL_PATIENCE:.0f} s: {e}")
                    return
                self.shared.stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            if not more:
                res.wake.wait(timeout=core.FEED_INTERVAL)
                res.wake.clear()

    def _turn(self, res: Resident, runs: list[Run]) -> bool:
        """One poll of `runs`; True when a log had more to read at once."""
        for run in runs:
            if run.kill_requested and not run.kill_sent:
                res.channel.ask("tomb", epoch=res.epoch, name=run_name(run))
                run.kill_sent = True
        answer = res.channel.ask(
            "poll", epoch=res.epoch, runs=[{"name": run_name(r), "offset": r.offset} for r in runs]
        )
        more = False
        for run in runs:
            seen = answer["runs"].get(run_name(run)) or {}
            more |= self._take(res, res.channel, run, seen)
        if answer.get("exited"):
            self._dead(res, "the runner exited")
        return more

    def _take(self, res: Resident, channel: Channel, run: Run, seen: dict[str, Any]) -> bool:
        """Act on what `poll` said of one run; True when its log has more to read at once."""
        data = base64.b64decode(seen.get("log") or "")
        if data:
            run.sink.write(run.decoder.decode(data))
            run.offset += len(data)
        state = seen.get("state")
        if state in ("queued", "running"):
            run.vague_since = None
        elif state == "done":
            if not seen.get("eof"):
                return True
            self._done(run, seen.get("status") or {})
        elif state == "dropped":
            if self._claim(run):
                self.jobs._end(run, _dropped(run, res, seen.get("why")))
        elif not run.putting:  # unknown or limbo: a put that never landed, or is half done
            now = time.time()
            run.vague_since = run.vague_since or now
            if now - run.vague_since > core.VAGUE_PATIENCE:
                channel.ask("tomb", epoch=res.epoch, name=run_name(run), why="void")  # now it can never run
        return False

    def _done(self, run: Run, status: dict[str, Any]) -> None:
        if not self._claim(run):
            return
        run.sink.write(run.decoder.decode(b"", final=True))
        run.sink.finish()
        if status.get("skipped"):
            self.jobs._end(run, _dropped(run, None, status.get("why")))
        elif status.get("stopped") or status.get("error"):
            why = "its runner was stopped" if status.get("stopped") else status["error"]
            self.jobs._end(run, RunExit(None, lost=True, detail=f"the run ended with its runner: {why}"))
        elif status.get("killed"):
            self.jobs._finish(run, "CANCELLED", run.sink.tags)
        else:
            self.jobs._finish(run, "SUCCEEDED" if status.get("exit") == 0 else "FAILED", run.sink.tags)

    def _claim(self, run: Run) -> bool:
        with self.shared.lock:
            if run.state != "running":
                return False
            run.state = "fetching"
            return True

    # ------------------------------------------------------------------ watching the jobs

    def check(self) -> None:
        """The monitor's turn: see whether each runner job still goes; cancel retiring ones again."""
        with self.shared.lock:
            residents = [r for r in self.by_epoch.values() if r.state in ("ready", "retiring", "attaching")]
        for res in residents:
            if res.state == "attaching":  # runs re-attached before this backend knew the cluster
                if res.cluster.state == "up":
                    self.ensure(res.cluster, res.lane)
                else:
                    self.clusters.ensure(res.cluster)
            if res.job_id is None:
                if res.state == "retiring" and not res.finding:
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
                self._dead(res, f"its job is {status or 'gone'}")
            elif res.state == "retiring":
                self.shared.thread(self._cancel, res)

    def _find_or_bury(self, res: Resident) -> None:
        job_id = self._find(res.cluster, res.epoch)
        with self.shared.lock:
            res.job_id, res.finding = job_id, False
        if job_id is None and not self.shared.stop.is_set():
            self._dead(res, "no job of it on the cluster")
        elif job_id is not None:
            self._cancel(res)

    def cluster_lost(self, cluster: Cluster, detail: str) -> None:
        """The cluster is gone, and every runner on it with it (their runs end `infra` with the cluster)."""
        for res in self._of(cluster):
            self._dead(res, f"cluster lost ({detail})", read=False)

    def _retire(self, res: Resident, why: str) -> None:
        """Give a runner up: cancel its job until SkyPilot shows it ended (`check`), then end its runs."""
        with self.changed:
            if res.state in ("retiring", "dead"):
                return
            res.state = "retiring"
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

    def _dead(self, res: Resident, why: str, *, read: bool = True) -> None:
        """The runner runs nothing any more: read what it finished, end the rest `infra`."""
        with self.changed:
            if res.state == "dead":
                return
            res.state = "dead"
            if self.current.get(lane_key(res.cluster, res.lane)) is res:
                del self.current[lane_key(res.cluster, res.lane)]
            runs = [r for r in res.runs.values() if r.ended is None and r.state == "running"]
            reader = res.channel or next(
                (r.channel for r in self._of(res.cluster) if r.state == "ready" and r.channel), None
            )
            self.changed.notify_all()
        if read and reader is not None and runs:
            with contextlib.suppress(ChannelError):
                for _ in range(64):  # a finished run's log to its end (CHUNK a turn)
                    answer = reader.ask(
                        "poll",
                        epoch=res.epoch,
                        runs=[{"name": run_name(r), "offset": r.offset} for r in runs],
                    )
                    seen = [self._take(res, reader, r, answer["runs"].get(run_name(r)) or {}) for r in runs]
                    if not any(seen):
                        break
                for run in runs:
                    if run.ended is None:
                        reader.ask("reap", epoch=res.epoch, name=run_name(run))
        for run in runs:
            if self._claim(run):
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
                due = res is not None and res.state == "ready" and not run.kill_sent and run.ended is None
            left = deadline - time.time()
            if due and left > 0:
                self._tomb(res, run, left)

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

    def _find(self, cluster: Cluster, epoch: str) -> int | None:
        """The job id of runner `epoch` by its job name, looked for until `core.FIND_PATIENCE`."""
        sdk, name = self.shared.sdk, JOB_PREFIX + epoch
        deadline = time.time() + core.FIND_PATIENCE
        while not self.shared.stop.is_set():
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
            self.shared.stop.wait(self.shared.status_interval)
        return None

    def _status_until_read(self, cluster: Cluster, job_id: int) -> str | None:
        """A runner job's status, asked until SkyPilot answers (a failed read decides nothing)."""
        sdk = self.shared.sdk
        deadline = time.time() + core.RESIDENT_READY_PATIENCE
        while True:
            try:
                return status_name(sdk.get(sdk.job_status(cluster.name, [job_id])).get(job_id))
            except Exception as e:
                if is_gone(e) or time.time() > deadline or self.shared.stop.is_set():
                    raise
            self.shared.stop.wait(min(self.shared.status_interval, 2.0))

    def stray_jobs(self, cluster: Cluster) -> list[int]:
        """Runner jobs still going on the cluster (a relaunch would wait behind them)."""
        sdk = self.shared.sdk
        jobs = sdk.get(sdk.queue(cluster.name, skip_finished=True))
        return [
            int(field_of(j, "job_id"))
            for j in jobs
            if str(field_of(j, "job_name") or "").startswith(JOB_PREFIX)
            and status_name(field_of(j, "status")) not in TERMINAL
        ]

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


def run_name(run: Run) -> str:
    """The run's name on the cluster: the run script's `NIGHTLAB_RUN`."""
    return f"{run.spec.experiment_id}-a{run.spec.attempt}"


def _dropped(run: Run, res: Resident | None, why: str | None) -> RunExit:
    """A run tombed before it started: killed (by this controller or an earlier one), or voided."""
    if run.kill_requested or why == "kill":
        return RunExit(None, detail="stopped before it started")
    where = f" on `{res.cluster.name}`" if res is not None else ""
    return RunExit(None, lost=True, detail=f"the runner{where} dropped it before it started")


def new_decoder() -> Any:
    """A UTF-8 decoder that keeps a character split between two log chunks whole."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace")
