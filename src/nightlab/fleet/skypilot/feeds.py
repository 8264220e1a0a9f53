"""The runs a resident runner runs: handing them over, reading them back, ending them exactly once.

A run handed to a runner (`residents.py`) keeps its `Run` (`jobs.py`) with a `Feed` beside it:
which runner has it (the epoch) and how far its log has been read. `Feeds` speaks to the
runner's helper through its `Channel` (`channel.py`): `put` hands a run over, `poll` reads each
run's state and the next piece of its log, `tomb` stops one (or keeps it from ever starting),
`forget` lets its files go. One pump thread per ready runner polls its runs.

What the helper reports of a run is a word of `resident.state_of` (that file is shipped as text
and keeps plain strings); it becomes a `RemoteState` where the answer comes in (`_take`), so a
word this side does not know fails there, not in a comparison that is quietly never true.
The rule that keeps every experiment exactly once is `residents.py`'s (module docstring): a
run ends only on what its runner's files say, or once SkyPilot shows the runner gone.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nightlab.fleet.backend import RunExit
from nightlab.fleet.skypilot import core
from nightlab.fleet.skypilot.channel import ASK_TIMEOUT, Channel, ChannelError
from nightlab.fleet.skypilot.core import SkyJobStatus, log
from nightlab.fleet.skypilot.jobs import RunState
from nightlab.fleet.skypilot.residents import ResidentState

if TYPE_CHECKING:
    from nightlab.fleet.skypilot.jobs import Jobs, Run
    from nightlab.fleet.skypilot.residents import Resident, Residents


def new_decoder() -> Any:
    """A UTF-8 decoder that keeps a character split between two log chunks whole."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


@dataclass
class Feed:
    """What a run handed to a resident runner needs beyond its `Run`: the runner's part of it."""

    epoch: str  # the runner's
    sink: Any = None  # where its log goes (`Jobs.sink`: no SkyPilot prefixes)
    offset: int = 0  # log bytes read so far
    decoder: Any = field(default_factory=new_decoder)
    putting: bool = False  # its put is in flight
    kill_sent: bool = False  # its tomb was answered
    vague_since: float | None = None  # when the runner's files first did not show it


class RemoteState(enum.StrEnum):
    """What a runner's files say of one run: `resident.state_of`'s words, in lifecycle order."""

    UNKNOWN = "unknown"  # no mark of it (or not in the answer at all)
    LIMBO = "limbo"  # its directory only: a put that never landed, or is half done
    QUEUED = "queued"  # in the runner's inbox
    RUNNING = "running"  # claimed by the runner
    DONE = "done"  # its status.json is written: it and every process it left have ended
    DROPPED = "dropped"  # tombed before any claim: it will never run

    @classmethod
    def of(cls, word: str | None) -> RemoteState:
        """The state `poll` reported (None: the run was not in the answer); an unknown word raises."""
        return cls.UNKNOWN if word is None else cls(word)


class Feeds:
    """The runs of one backend's runners: put, polled, tombed, ended (module docstring)."""

    def __init__(self, shared: Any, jobs: Jobs, residents: Residents) -> None:
        self.shared = shared
        self.jobs = jobs
        self.residents = residents

    def feed(self, res: Resident, run: Run, task: Any) -> None:
        """Hand a run to the runner: it is `running` from now on, whatever the put's answer."""
        name = run_name(run)
        with self.shared.lock:
            run.feed = Feed(res.epoch, sink=self.jobs.sink(run), putting=True)
            run.state = RunState.RUNNING
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
                run.feed.putting = False
            res.wake.set()

    def attach(self, run: Run, saved: dict[str, Any]) -> None:
        """A run an earlier controller handed to a runner (`saved`: its `sky.json` entry)."""
        res = self.residents.resident(run.cluster, str(saved["epoch"]), saved.get("job"), run.lane)
        with self.shared.lock:
            run.feed = Feed(res.epoch, sink=self.jobs.sink(run))
            run.state = RunState.RUNNING
            res.runs[run_name(run)] = run
            state = res.state
        if state == ResidentState.READY:
            res.wake.set()
        elif state == ResidentState.DEAD and self.claim(run):  # this backend already saw its runner end
            detail = f"the runner on `{res.cluster.name}` had ended"
            self.jobs._end(run, RunExit(None, lost=True, detail=detail))
        else:
            self.residents.ensure(run.cluster, run.lane)

    def kill(self, res: Resident, run: Run) -> None:
        """Tomb the run now (its pump sends the tomb again while it is unanswered)."""
        self.shared.thread(self.tomb, res, run, ASK_TIMEOUT)

    def tomb(self, res: Resident, run: Run, timeout: float) -> None:
        with contextlib.suppress(ChannelError):
            res.channel.ask("tomb", timeout=timeout, epoch=res.epoch, name=run_name(run))
            run.feed.kill_sent = True

    def forget(self, res: Resident, run: Run) -> None:
        with self.shared.lock:
            if res.runs.pop(run_name(run), None) is not None:
                res.forgets.append(run_name(run))

    def pump(self, res: Resident) -> None:
        """Poll the runner's runs, stream their logs in, and end them on what its files say."""
        backoff = 0.5
        while not self.shared.stop.is_set():
            with self.shared.lock:
                if res.state != ResidentState.READY:
                    return
                runs = [r for r in res.runs.values() if r.ended is None and r.state == RunState.RUNNING]
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
                    self.residents.give_up(res.cluster, None, e)
                    self.residents.retire(
                        res, f"its helper did not answer for {core.CHANNEL_PATIENCE:.0f} s: {e}"
                    )
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
            if run.kill_requested and not run.feed.kill_sent:
                res.channel.ask("tomb", epoch=res.epoch, name=run_name(run))
                run.feed.kill_sent = True
        answer = res.channel.ask(
            "poll", epoch=res.epoch, runs=[{"name": run_name(r), "offset": r.feed.offset} for r in runs]
        )
        more = False
        for run in runs:
            seen = answer["runs"].get(run_name(run)) or {}
            more |= self._take(res, res.channel, run, seen)
        if answer.get("exited"):
            self.residents.dead(res, "the runner exited")
        return more

    def read_out(self, res: Resident, reader: Channel, runs: list[Run]) -> None:
        """A runner that runs nothing any more: what its files say of `runs`, their logs to the end.

        `reader` is its own channel or another runner's on the same node (the same files). The
        runs still not ended afterwards are reaped: the runner will never finish them.
        """
        with contextlib.suppress(ChannelError):
            for _ in range(64):  # a finished run's log to its end (CHUNK a turn)
                answer = reader.ask(
                    "poll",
                    epoch=res.epoch,
                    runs=[{"name": run_name(r), "offset": r.feed.offset} for r in runs],
                )
                seen = [self._take(res, reader, r, answer["runs"].get(run_name(r)) or {}) for r in runs]
                if not any(seen):
                    break
            for run in runs:
                if run.ended is None:
                    reader.ask("reap", epoch=res.epoch, name=run_name(run))

    def _take(self, res: Resident, channel: Channel, run: Run, seen: dict[str, Any]) -> bool:
        """Act on what `poll` said of one run; True when its log has more to read at once."""
        feed = run.feed
        data = base64.b64decode(seen.get("log") or "")
        if data:
            feed.sink.write(feed.decoder.decode(data))
            feed.offset += len(data)
        state = RemoteState.of(seen.get("state"))
        if state in (RemoteState.QUEUED, RemoteState.RUNNING):
            feed.vague_since = None
        elif state == RemoteState.DONE:
            if not seen.get("eof"):
                return True
            self._done(run, seen.get("status") or {})
        elif state == RemoteState.DROPPED:
            if self.claim(run):
                self.jobs._end(run, _dropped(run, res, seen.get("why")))
        elif not feed.putting:  # unknown or limbo: a put that never landed, or is half done
            now = time.time()
            feed.vague_since = feed.vague_since or now
            if now - feed.vague_since > core.VAGUE_PATIENCE:
                channel.ask("tomb", epoch=res.epoch, name=run_name(run), why="void")  # now it can never run
        return False

    def _done(self, run: Run, status: dict[str, Any]) -> None:
        if not self.claim(run):
            return
        feed = run.feed
        feed.sink.write(feed.decoder.decode(b"", final=True))
        feed.sink.finish()
        if status.get("skipped"):
            self.jobs._end(run, _dropped(run, None, status.get("why")))
        elif status.get("stopped") or status.get("error"):
            why = "its runner was stopped" if status.get("stopped") else status["error"]
            self.jobs._end(run, RunExit(None, lost=True, detail=f"the run ended with its runner: {why}"))
        elif status.get("killed"):
            self.jobs._finish(run, SkyJobStatus.CANCELLED, feed.sink.tags)
        else:
            ok = status.get("exit") == 0
            self.jobs._finish(run, SkyJobStatus.SUCCEEDED if ok else SkyJobStatus.FAILED, feed.sink.tags)

    def claim(self, run: Run) -> bool:
        """Take the run's end for this caller (running -> fetching); False when another has it."""
        with self.shared.lock:
            if run.state != RunState.RUNNING:
                return False
            run.state = RunState.FETCHING
            return True

    def settle(self, res: Resident | None, run: Run, deadline: float) -> None:
        """At close: send a killed run's tomb if none was answered yet; the runner stops it on its own."""
        with self.shared.lock:
            due = (
                res is not None
                and res.state == ResidentState.READY
                and not run.feed.kill_sent
                and run.ended is None
            )
        left = deadline - time.time()
        if due and left > 0:
            self.tomb(res, run, left)


def run_name(run: Run) -> str:
    """The run's name on the cluster: the run script's `NIGHTLAB_RUN`."""
    return f"{run.spec.experiment_id}-a{run.spec.attempt}"


def _dropped(run: Run, res: Resident | None, why: str | None) -> RunExit:
    """A run tombed before it started: killed (by this controller or an earlier one), or voided."""
    if run.kill_requested or why == "kill":
        return RunExit(None, detail="stopped before it started")
    where = f" on `{res.cluster.name}`" if res is not None else ""
    return RunExit(None, lost=True, detail=f"the runner{where} dropped it before it started")
