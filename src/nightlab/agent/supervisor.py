"""The supervisor: runs a coding agent headless in the lab overnight, restarting it as needed.

Each *session* starts the agent CLI in the lab with a fresh prompt (`prompt.build_prompt`:
instructions plus the lab's state), its prompt on standard input and the prompt file's path
in `NIGHTLAB_PROMPT_FILE`, and its stdout and stderr in `.nightlab/agent/transcript-<n>.log`.
A session ends when the agent exits (done, crashed, out of context, out of turns) or stalls:
no transcript output and no submission for `stall_seconds`. Then a new session starts with
the state as it is now, so nothing the previous one learned is lost: it is in the ledger.

Limits stop the whole run: `max_hours` of wall clock, `max_experiments` submitted during
the run (the controller's re-runs of degraded runs are not the agent's: they count neither
here nor as activity), `max_cost` USD of API cost reported by the agent CLI, and
`max_restarts_per_hour` (an agent that dies at once, e.g. for want of a login, would otherwise
restart forever; `agent run` exits 1 then). Restarts back off: the n-th restart within the last
hour waits `restart_backoff * 2**(n-1)` s, at most `restart_backoff_max` (1, 2, 4, ... s: a
failing agent no longer burns its restarts in a second, a healthy one waits a moment). A
built-in CLI that exits at start without writing a single transcript event (Claude Code as
root without `IS_SANDBOX`, a missing login) stops the run at once with its one-line error
(`failed-at-start`). Experiments already queued keep running in the fleet.

The transcript is read as JSON lines (`transcripts.read_transcript`): it tells why a session
ended, what it cost and what it did. A session that ended because the model API failed
(Claude Code's `terminal_reason: api_error`, Codex's `turn.failed`) is not a restart: the
supervisor waits `api_backoff` s, doubling per failure up to `api_backoff_max`, shows "API
unavailable since …, next try at …" in the state, and clears it once a model turn succeeds.
The fleet keeps running meanwhile: it does not depend on the agent.

The agent runs in its own process group, so stopping it (SIGTERM, then SIGKILL after
`term_grace` s) also stops the commands it started; the fleet controller has its own session
and survives. One supervisor per lab (`control.process`, the fleet controller's lifecycle
rules); `control` also reads its state, starts it detached, stops it and reports its status.
Which CLI runs is `commands.resolve_agent`; the one-line views of the state are `lines`.

Usage:
    command = commands.resolve_agent("claude", lab.config.agent)
    Supervisor(lab.path, command, Limits(max_hours=8)).run()   # returns the stop reason
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nightlab.agent.commands import CLAUDE_SANDBOX_ENV, AgentCommand, session_argv, session_env, start_failure
from nightlab.agent.control import agent_dir, process, running_pid
from nightlab.agent.transcripts import (
    SessionReport,
    TokenPrices,
    codex_rollout,
    context_full,
    read_transcript,
    rollout_tokens,
)
from nightlab.config import AgentConfig
from nightlab.display import clock
from nightlab.errors import NightlabError
from nightlab.ledger import AgentRun, AgentRunStatus
from nightlab.lifecycle import stop_group

START_FAILURE_SECONDS = 30.0  # a built-in CLI that exits this soon without one JSON event did not start
_MAX_TURNS = re.compile(r'"subtype"\s*:\s*"error_max_turns"')
TAIL_BYTES = 8192  # the end of a transcript is where an agent reports why it stopped
TERM_GRACE = 10.0
STATE_EVERY = 5.0  # seconds between state.json refreshes while nothing happens


@dataclass(frozen=True)
class Limits:
    """When the supervisor stops (None: no limit) and when a session counts as stalled."""

    max_hours: float | None = None
    max_experiments: int | None = None
    max_restarts_per_hour: int = 6
    stall_seconds: float = 900.0
    max_cost: float | None = None  # USD of API cost over the run
    api_backoff: float = 30.0  # seconds before the first retry after an API failure, doubling
    api_backoff_max: float = 900.0
    restart_backoff: float = 1.0  # seconds before the first restart in an hour, doubling per restart
    restart_backoff_max: float = 300.0


# ---------------------------------------------------------------------------- the supervisor


@dataclass(frozen=True)
class SessionEnd:
    reason: str  # exit N | context | max-turns | api-error | stall | stopped | failed-at-start | a limit
    final: bool  # the run stops (a limit or a stop request) rather than restarting
    exit_code: int | None
    report: SessionReport | None = None


class Supervisor:
    """Runs sessions of one agent in one lab until a limit or a stop request (see the module docstring)."""

    def __init__(
        self,
        lab_dir: Path,
        command: AgentCommand,
        limits: Limits,
        *,
        prices: TokenPrices | None = None,
        poll: float | None = None,
        term_grace: float = TERM_GRACE,
        log: Callable[[str], None] | None = None,
        pause: Callable[[float], object] | None = None,
    ) -> None:
        self.lab_dir = lab_dir.resolve()
        self.command = command
        self.limits = limits
        self.prices = prices or TokenPrices(*AgentConfig.token_prices)
        # at most a tenth of the stall time (and 1 s): detection is late by at most 10 %
        self.poll = min(1.0 if poll is None else poll, max(0.05, limits.stall_seconds / 10))
        self.term_grace = term_grace
        self.log = log or (lambda message: None)
        self._stop = threading.Event()
        # waits out a restart's backoff; a stop request ends it at once (tests pass a recorder)
        self.pause = pause or self._stop.wait
        self.stopped_by: int | None = None  # the signal that asked the run to stop, if one did
        self.state: AgentRun | None = None  # the run's record as the ledger last returned it
        self._ledger = None  # the lab's ledger while `run` runs
        self._spent: tuple[int, int, int] | None = None  # the running session's tokens, as Codex counts them
        self._last_end = ""  # why the last session ended, for the restart line
        self._rollout: Path | None = None

    def request_stop(self, signum: int | None = None, *_: object) -> None:
        """Stop the agent and the run (signal-handler safe); `stopped_by` keeps the signal."""
        if signum is not None and self.stopped_by is None:
            self.stopped_by = signum  # Ctrl-C (SIGINT) makes `agent run` exit 130, as `wait` does
        self._stop.set()

    # -------------------------------------------------------------- run

    def run(self) -> str:
        """Run sessions until a limit or a stop request; return why it stopped.

        Raises:
            NightlabError: another supervisor runs for this lab, or the agent cannot be started.
        """
        with process(self.lab_dir).hold(patience=0.5, on_stop=self.request_stop) as held:
            if not held:
                pid = running_pid(self.lab_dir)
                raise NightlabError(
                    f"an agent supervisor already runs for this lab (pid {pid}); "
                    "stop it with `nightlab agent stop`"
                )
            previous = self._install_signals()
            try:
                return self._run()
            finally:
                self._restore_signals(previous)

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        # SIGHUP too: a closed terminal must not leave the agent running unsupervised
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            previous[sig] = signal.signal(sig, self.request_stop)
        return previous

    @staticmethod
    def _restore_signals(previous: dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def _run(self) -> str:
        from nightlab.lab import Lab

        reason: str | None = None
        with Lab.open(self.lab_dir) as lab:
            self._ledger = lab.ledger
            now = time.time()
            lab.ledger.start_agent_run(
                AgentRun(
                    pid=os.getpid(),
                    status=AgentRunStatus.RUNNING,
                    agent=self.command.name,
                    cli=self.command.cli,
                    command=self.command.argv,
                    limits=asdict(self.limits),
                    started_at=now,
                    updated_at=now,
                    lab=str(self.lab_dir),
                    last_activity=now,
                )
            )
            self.state = lab.ledger.agent_run()
            self._cursor = self._last_event_id(lab)
            try:
                while True:
                    stop = self._limit_reached()
                    if stop is None and reason == "api-error":
                        stop = self._back_off(lab)  # an outage is waited out, not counted as a restart
                    elif stop is None and reason is not None:
                        stop = self._count_restart()
                    if stop is not None:
                        return self._finish(stop)
                    end = self._session(lab, reason)
                    self._last_end = end.reason
                    if end.final:
                        return self._finish(end.reason)
                    reason = end.reason
            except BaseException:
                self._finish("error")
                raise

    def _save(self, *, add: dict[str, float] | None = None, **fields: Any) -> None:
        """Change the run's record in one ledger transaction and keep what it is now."""
        self.state = self._ledger.update_agent_run(add=add, **fields)

    def _finish(self, reason: str) -> str:
        self._save(status=AgentRunStatus.STOPPED, stop_reason=reason, agent_pid=None, updated_at=time.time())
        self.log(f"supervisor stopped: {reason}")
        return reason

    def _count_restart(self) -> str | None:
        """Count a restart and wait out its backoff; the stop reason when it may not happen."""
        now = time.time()
        recent = [t for t in self.state.restarts if now - t < 3600]
        if len(recent) >= self.limits.max_restarts_per_hour:
            self.log(f"session {self.state.session} ended ({self._last_end}); not restarting")
            return "max-restarts-per-hour"
        delay = restart_delay(len(recent) + 1, self.limits)
        if self.limits.max_hours is not None:  # no wait past the end of the run
            delay = min(delay, max(0.0, self.state.started_at + self.limits.max_hours * 3600 - now))
        self.log(f"session {self.state.session} ended ({self._last_end}); restarting in {delay:g} s")
        self._save(restarts=[*recent, now], add={"restarts_total": 1})
        self.pause(delay)
        return self._limit_reached()

    def _limit_reached(self) -> str | None:
        if self._stop.is_set():
            return "stopped"
        lim = self.limits
        if lim.max_hours is not None and time.time() - self.state.started_at >= lim.max_hours * 3600:
            return "max-hours"
        if lim.max_experiments is not None and self.state.experiments_submitted >= lim.max_experiments:
            return "max-experiments"
        if lim.max_cost is not None and self.state.cost_usd + self._running_cost() >= lim.max_cost:
            return "max-cost"
        return None

    def _running_cost(self) -> float:
        """What the running session has cost so far (Codex's rollout; 0 where the CLI stops itself)."""
        return self.prices.cost(*self._spent) if self._spent else 0.0

    def _follow_tokens(self, env: dict[str, str], started: float) -> None:
        """Codex: read the session's running token count from its rollout (see `transcripts`)."""
        if self.command.cli != "codex":
            return
        if self._rollout is None:
            home = Path(env.get("CODEX_HOME") or Path(env.get("HOME", "~")).expanduser() / ".codex")
            self._rollout = codex_rollout(home, self.lab_dir, started)
        if self._rollout is not None:
            self._spent = rollout_tokens(self._rollout) or self._spent

    # -------------------------------------------------------------- API outages

    def _api_failed(self, report: SessionReport, session_started: float) -> None:
        """Record a session lost to the model API and schedule the next try (capped doubling)."""
        now = time.time()
        api = dict(self.state.api or {"since": session_started, "failures": 0})
        api["failures"] += 1
        delay = min(self.limits.api_backoff_max, self.limits.api_backoff * 2 ** (api["failures"] - 1))
        api.update(delay=delay, next_try_at=now + delay, last_error=report.error, status=report.api_status)
        self._save(api=api)
        self.log(
            f"API unavailable since {clock(api['since'])} ({report.error or 'no detail'}); "
            f"next try at {clock(api['next_try_at'])} (in {delay:.0f} s)"
        )

    def _api_back(self) -> None:
        api = self.state.api
        if api is None:
            return
        now = time.time()
        outage = {"since": api["since"], "until": now, "failures": api["failures"]}
        self._save(api=None, api_outages=[*self.state.api_outages, outage])
        self.log(f"API available again after {now - api['since']:.0f} s ({api['failures']} failed sessions)")

    def _back_off(self, lab) -> str | None:
        """Wait until the next try, still counting submissions and obeying stop requests and limits."""
        written = 0.0
        while (left := self.state.api["next_try_at"] - time.time()) > 0:
            stop = self._limit_reached()
            if stop is not None:
                return stop
            self._count_submissions(lab)
            if time.time() - written >= STATE_EVERY:
                written = time.time()
                self._save(updated_at=written)
            self._stop.wait(min(self.poll, left))
        return self._limit_reached()

    # -------------------------------------------------------------- one session

    def _next_session(self) -> int:
        numbers = [
            int(m.group(1))
            for p in agent_dir(self.lab_dir).glob("prompt-*.md")
            if (m := re.fullmatch(r"prompt-(\d+)\.md", p.name))
        ]
        return max(numbers, default=0) + 1

    def _budget(self):
        from nightlab.agent.prompt import Budget

        lim = self.limits
        hours = None
        if lim.max_hours is not None:
            hours = max(0.0, lim.max_hours - (time.time() - self.state.started_at) / 3600)
        left = None
        if lim.max_experiments is not None:
            left = max(0, lim.max_experiments - self.state.experiments_submitted)
        return Budget(hours_left=hours, experiments_left=left)

    def _session(self, lab, reason: str | None) -> SessionEnd:
        from nightlab.agent.prompt import build_prompt

        n = self._next_session()
        directory = agent_dir(self.lab_dir)
        prompt_path = directory / f"prompt-{n}.md"
        transcript = directory / f"transcript-{n}.log"
        prompt_path.write_text(build_prompt(lab, session=n, reason=reason, budget=self._budget()))
        cost_left = None if self.limits.max_cost is None else self.limits.max_cost - self.state.cost_usd
        argv = session_argv(self.command, prompt_path, cost_left=cost_left)
        env = session_env(self.command, prompt_path, session=n, lab_dir=self.lab_dir)
        if reason is None and env.get(CLAUDE_SANDBOX_ENV) != os.environ.get(CLAUDE_SANDBOX_ENV):
            self.log(f"running as root: {CLAUDE_SANDBOX_ENV}=1 set for Claude Code's unattended line")
        try:
            # stdin is the prompt file: the agent reads it to its end and then sees EOF, never a
            # terminal or a pipe left open (Codex waits forever for more input on an open stdin)
            with open(prompt_path, "rb") as stdin, open(transcript, "ab") as out:
                proc = subprocess.Popen(
                    argv,
                    cwd=self.lab_dir,
                    stdin=stdin,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
        except OSError as e:
            raise NightlabError(f"cannot start agent `{argv[0]}`: {e}; check `--agent`") from e
        started = time.time()
        self._spent, self._rollout = None, None
        self._save(
            session=n,
            agent_pid=proc.pid,
            session_started_at=started,
            transcript=str(transcript),
            prompt=str(prompt_path),
            last_activity=started,
            updated_at=started,
        )
        self.log(f"session {n} started: {self.command.name} (pid {proc.pid}), transcript {transcript}")
        try:
            end = self._watch(lab, proc, transcript, lambda: self._follow_tokens(env, started))
        finally:
            self._kill(proc)
        self._count_submissions(lab)
        end = self._settle(end, transcript, started)
        report = end.report or read_transcript(transcript)
        self._follow_tokens(env, started)
        if self._spent and not report.finished:
            # killed mid-turn (the cap, a stall): the transcript never got its `turn.completed`
            tokens, cost = self._spent, self._running_cost()
        else:
            tokens = (report.input_tokens, report.cached_input_tokens, report.output_tokens)
            cost = report.cost_usd(self.prices)
        self._spent = None
        session = {
            "n": n,
            "started_at": started,
            "ended_at": time.time(),
            "end": end.reason,
            "exit_code": end.exit_code,
            "cost_usd": cost,
            "turns": report.turns,
            "commands": report.commands,
            "input_tokens": tokens[0],
            "cached_input_tokens": tokens[1],
            "output_tokens": tokens[2],
            "last_command": report.last_command,
            "last_message": report.last_message,
            "error": report.error,
        }
        lab.ledger.add_agent_session(session)
        lab.ledger.log_event(
            "agent-session",
            run_started_at=self.state.started_at,
            agent=self.command.name,
            cli=self.command.cli,
            **{k: session[k] for k in ("n", "started_at", "ended_at", "end", "cost_usd")},
            input_tokens=tokens[0],
            output_tokens=tokens[2],
        )
        self._save(agent_pid=None, updated_at=time.time(), add={"cost_usd": cost or 0.0})
        return end

    def _settle(self, end: SessionEnd, transcript: Path, started: float) -> SessionEnd:
        """Turn a plain exit into what the transcript says it was; track the API's availability."""
        report = read_transcript(transcript)
        if report.failure == "api":
            self._api_failed(report, started)
        elif report.turns > 0:
            self._api_back()
        if end.exit_code is None:  # stalled, stopped or at a limit: the agent did not choose to end
            return SessionEnd(end.reason, end.final, None, report)
        code = end.exit_code
        if report.failure == "api":
            return SessionEnd("api-error", False, code, report)
        if report.failure == "context":
            return SessionEnd("context", False, code, report)
        if report.failure == "max-turns":
            return SessionEnd("max-turns", False, code, report)
        tail = _tail(transcript)
        if report.cli is None and context_full(tail):
            return SessionEnd("context", False, code, report)
        if report.cli is None and _MAX_TURNS.search(tail):
            return SessionEnd("max-turns", False, code, report)
        if (
            code != 0
            and self.command.cli is not None
            and report.cli is None
            and time.time() - started < START_FAILURE_SECONDS
        ):
            error = start_failure(self.command, code, tail)
            self._save(error=error)
            self.log(error)
            return SessionEnd("failed-at-start", True, code, report)
        return SessionEnd(f"exit {code}", False, code, report)

    def _watch(self, lab, proc: subprocess.Popen, transcript: Path, follow: Callable[[], None]) -> SessionEnd:
        size = 0
        written = time.time()
        activity = self.state.last_activity
        while True:
            code = proc.poll()
            self._count_submissions(lab)
            if code is not None:
                return SessionEnd(f"exit {code}", False, code)
            stop = self._limit_reached()
            if stop is not None:
                return SessionEnd(stop, True, None)
            now = time.time()
            try:
                current = transcript.stat().st_size
            except FileNotFoundError:
                current = 0
            if current != size:
                size, activity = current, now
                follow()  # the session's cost so far, for the cap
                if self.state.api is not None and read_transcript(transcript).turns > 0:
                    self._api_back()  # the model answered: the outage is over
            activity = max(activity, self.state.last_activity)  # a submission counts too
            if now - activity > self.limits.stall_seconds:
                self.log(
                    f"session {self.state.session} stalled: no output or submission for {now - activity:.1f} s"
                )
                return SessionEnd("stall", False, None)
            if now - written >= STATE_EVERY or self.state.last_activity < activity:
                self._save(updated_at=now, last_activity=activity)
                written = now
            # returns as soon as the agent exits; a stop request waits at most one poll
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=self.poll)

    def _last_event_id(self, lab) -> int:
        cursor = 0
        while True:
            events = lab.ledger.events(after=cursor, limit=5000)
            if not events:
                return cursor
            cursor = events[-1].id

    def _count_submissions(self, lab) -> None:
        """New `submit` events since the last look: each is one experiment and counts as activity,
        except the controller's re-run of a degraded run (`rerun_of`), which nobody submitted."""
        events = lab.ledger.events(after=self._cursor, limit=5000)
        if not events:
            return
        self._cursor = events[-1].id
        submitted = sum(1 for e in events if e.kind == "submit" and not e.data.get("rerun_of"))
        if submitted:
            self._save(add={"experiments_submitted": submitted}, last_activity=time.time())

    def _kill(self, proc: subprocess.Popen) -> None:
        """Stop the agent's whole process group (SIGTERM, SIGKILL after the grace period).

        Also after a normal exit: commands the agent left running in the background go too.
        """
        stop_group(proc, grace=self.term_grace)


def restart_delay(n: int, limits: Limits) -> float:
    """Seconds before the `n`-th restart within an hour: `restart_backoff` doubling, capped."""
    return min(limits.restart_backoff_max, limits.restart_backoff * 2 ** (n - 1))


def _tail(transcript: Path) -> str:
    try:
        with open(transcript, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
