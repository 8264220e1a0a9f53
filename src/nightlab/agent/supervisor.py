"""The supervisor: runs a coding agent headless in the lab overnight, restarting it as needed.

Each *session* starts the agent CLI in the lab with a fresh prompt (`prompt.build_prompt`:
instructions plus the lab's state), its prompt on standard input and the prompt file's path
in `NIGHTLAB_PROMPT_FILE`, and its stdout and stderr in `.nightlab/agent/transcript-<n>.log`.
A session ends when the agent exits (done, crashed, out of context, out of turns) or stalls:
no transcript output and no submission for `stall_seconds`. Then a new session starts with
the state as it is now, so nothing the previous one learned is lost: it is in the ledger.

Limits stop the whole run: `max_hours` of wall clock, `max_experiments` submitted during
the run, `max_cost` USD of API cost reported by the agent CLI, and `max_restarts_per_hour`
(an agent that dies at once, e.g. for want of a login, would otherwise restart forever). A
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
and survives. One supervisor per lab: it holds an `flock` on `.nightlab/agent/supervisor.lock`
for its life, and its state is in `.nightlab/agent/state.json` (written atomically) for
`nightlab agent status`, `nightlab agent stop` and the dashboard.

Usage:
    command = resolve_agent("claude", lab.config.agent)
    Supervisor(lab.path, command, Limits(max_hours=8)).run()   # returns the stop reason
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nightlab.agent.transcripts import SessionReport, TokenPrices, context_full, read_transcript
from nightlab.config import AgentConfig, LabConfig
from nightlab.errors import NightlabError, UsageError
from nightlab.locks import try_lock

AGENT_DIR = Path(".nightlab") / "agent"
STATE_NAME = "state.json"

# Headless invocations, prompt on stdin. Both agents edit files and run commands without
# asking: nobody is there to approve. Run the lab in a container or VM you can afford to let
# an agent loose in. Claude Code: `-p` prints and exits, stream-json (needs --verbose) makes
# every tool call a transcript line, which is what stall detection watches. Codex: `exec -`
# reads the prompt from stdin, `--json` streams events as JSON lines; its shell tool runs
# `bash -lc` by default, and a login shell resets PATH from /etc/profile (measured on Codex
# 0.171.0: `nightlab: command not found`), so login shells are off.
BUILTIN_AGENTS: dict[str, str] = {
    "claude": "claude -p --output-format stream-json --verbose --dangerously-skip-permissions",
    "codex": "codex exec --json --dangerously-bypass-approvals-and-sandbox -c allow_login_shell=false -",
}
# Claude Code refuses --dangerously-skip-permissions as root (exit 1 in 0.5 s) unless this
# documented variable says the machine is a sandbox. Choosing the unattended line on a box
# where you are root (rented GPU machines, containers) is that statement; it is set only then.
CLAUDE_SANDBOX_ENV = "IS_SANDBOX"
CLAUDE_UNATTENDED_FLAG = "--dangerously-skip-permissions"
KNOWN_CLIS = ("claude", "codex")
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


@dataclass(frozen=True)
class AgentCommand:
    """A resolved agent: its name (`claude`, `codex`, a `[agent.commands]` key, or `custom`) and argv."""

    name: str
    argv: tuple[str, ...]

    @property
    def cli(self) -> str | None:
        """`claude` or `codex` when the command runs one of them (also behind `env` or a path)."""
        return next((Path(a).name for a in self.argv[:4] if Path(a).name in KNOWN_CLIS), None)


def default_stall_seconds(config: LabConfig) -> float:
    """`agent.stall_seconds`, or long enough for one `nightlab wait` on a run at the time limit."""
    if config.agent.stall_seconds is not None:
        return config.agent.stall_seconds
    return max(900.0, config.target.timeout + 300.0)


def resolve_agent(agent: str | None, config: AgentConfig) -> AgentCommand:
    """Turn `--agent` (a known name or a command line) into the command to run.

    Raises:
        UsageError: an unknown name, an unparsable command line, or an executable not on PATH.
    """
    agent = agent or config.default
    commands = {**BUILTIN_AGENTS, **config.commands}
    if agent in commands:
        name, line = agent, commands[agent]
    elif any(c.isspace() for c in agent) or os.sep in agent or shutil.which(agent):
        name, line = "custom", agent
    else:
        raise UsageError(
            f"unknown agent `{agent}`; use {', '.join(sorted(commands))}, or a command line "
            "(e.g. `--agent 'opencode run'`)"
        )
    try:
        argv = tuple(shlex.split(line))
    except ValueError as e:
        raise UsageError(f"agent command `{line}` does not parse: {e}") from e
    if not argv:
        raise UsageError(
            f"agent `{agent}` has an empty command line; fix `[agent.commands]` in nightlab.toml"
        )
    if shutil.which(argv[0]) is None:
        raise UsageError(
            f"`{argv[0]}` (agent `{name}`) is not on PATH; install it, or pass the full command with "
            "`--agent 'COMMAND'`"
        )
    return AgentCommand(name, argv)


# ---------------------------------------------------------------------------- state and lock


def agent_dir(lab_dir: Path) -> Path:
    return lab_dir / AGENT_DIR


def read_state(lab_dir: Path) -> dict[str, Any] | None:
    """The last state the lab's supervisor wrote, or None if none ever ran."""
    try:
        return json.loads((agent_dir(lab_dir) / STATE_NAME).read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:  # only a crash mid-write by something else could do this
        raise NightlabError(f"`{agent_dir(lab_dir) / STATE_NAME}` is not valid JSON ({e}); delete it") from e


def _write_state(lab_dir: Path, state: dict[str, Any]) -> None:
    path = agent_dir(lab_dir) / STATE_NAME
    tmp = path.with_name(f".{STATE_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str))
    os.replace(tmp, path)  # readers see the old or the new file, never half of one


def _lock(lab_dir: Path, *, patience: float = 0.0):
    """The lab's supervisor lock (see `nightlab.locks.try_lock`)."""
    return try_lock(agent_dir(lab_dir) / "supervisor.lock", patience=patience)


def running_pid(lab_dir: Path) -> int | None:
    """The pid of the lab's live supervisor; -1 while one starts; None when none runs."""
    with _lock(lab_dir) as got:
        if got is not None:
            return None
    state = read_state(lab_dir) or {}
    return state.get("pid") if state.get("status") == "running" else -1


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    ) -> None:
        self.lab_dir = lab_dir.resolve()
        self.command = command
        self.limits = limits
        self.prices = prices or TokenPrices(*AgentConfig.token_prices)
        # a tenth of the stall time: detection is late by at most 10 %
        self.poll = poll if poll is not None else min(1.0, max(0.05, limits.stall_seconds / 10))
        self.term_grace = term_grace
        self.log = log or (lambda message: None)
        self._stop = threading.Event()
        self.stopped_by: int | None = None  # the signal that asked the run to stop, if one did
        self.state: dict[str, Any] = {}

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
        with _lock(self.lab_dir, patience=0.5) as lock:
            if lock is None:
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

        now = time.time()
        self.state = {
            "pid": os.getpid(),
            "status": "running",
            "lab": str(self.lab_dir),
            "agent": self.command.name,
            "cli": self.command.cli,
            "command": list(self.command.argv),
            "limits": asdict(self.limits),
            "started_at": now,
            "updated_at": now,
            "session": None,
            "agent_pid": None,
            "session_started_at": None,
            "transcript": None,
            "prompt": None,
            "last_activity": now,
            "experiments_submitted": 0,
            "restarts": [],
            "restarts_total": 0,
            "sessions": [],
            "cost_usd": 0.0,
            "api": None,  # while the model API is down: since, failures, next_try_at, last_error
            "api_outages": [],
            "error": None,
            "stop_reason": None,
        }
        _write_state(self.lab_dir, self.state)
        reason: str | None = None
        with Lab.open(self.lab_dir) as lab:
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
                    if end.final:
                        return self._finish(end.reason)
                    reason = end.reason
                    self.log(f"session {self.state['session']} ended ({end.reason}); restarting")
            except BaseException:
                self._finish("error")
                raise

    def _finish(self, reason: str) -> str:
        self.state.update(status="stopped", stop_reason=reason, agent_pid=None, updated_at=time.time())
        _write_state(self.lab_dir, self.state)
        self.log(f"supervisor stopped: {reason}")
        return reason

    def _count_restart(self) -> str | None:
        now = time.time()
        recent = [t for t in self.state["restarts"] if now - t < 3600]
        if len(recent) >= self.limits.max_restarts_per_hour:
            return "max-restarts-per-hour"
        self.state["restarts"] = [*recent, now]
        self.state["restarts_total"] += 1
        return None

    def _limit_reached(self) -> str | None:
        if self._stop.is_set():
            return "stopped"
        lim = self.limits
        if lim.max_hours is not None and time.time() - self.state["started_at"] >= lim.max_hours * 3600:
            return "max-hours"
        if lim.max_experiments is not None and self.state["experiments_submitted"] >= lim.max_experiments:
            return "max-experiments"
        if lim.max_cost is not None and self.state["cost_usd"] >= lim.max_cost:
            return "max-cost"
        return None

    # -------------------------------------------------------------- API outages

    def _api_failed(self, report: SessionReport, session_started: float) -> None:
        """Record a session lost to the model API and schedule the next try (capped doubling)."""
        now = time.time()
        api = self.state["api"] or {"since": session_started, "failures": 0}
        api["failures"] += 1
        delay = min(self.limits.api_backoff_max, self.limits.api_backoff * 2 ** (api["failures"] - 1))
        api.update(delay=delay, next_try_at=now + delay, last_error=report.error, status=report.api_status)
        self.state["api"] = api
        self.log(
            f"API unavailable since {_clock(api['since'])} ({report.error or 'no detail'}); "
            f"next try at {_clock(api['next_try_at'])} (in {delay:.0f} s)"
        )

    def _api_back(self) -> None:
        api = self.state["api"]
        if api is None:
            return
        now = time.time()
        self.state["api_outages"].append({"since": api["since"], "until": now, "failures": api["failures"]})
        self.state["api"] = None
        self.log(f"API available again after {now - api['since']:.0f} s ({api['failures']} failed sessions)")

    def _back_off(self, lab) -> str | None:
        """Wait until the next try, still counting submissions and obeying stop requests and limits."""
        written = 0.0
        while (left := self.state["api"]["next_try_at"] - time.time()) > 0:
            stop = self._limit_reached()
            if stop is not None:
                return stop
            self._count_submissions(lab)
            if time.time() - written >= STATE_EVERY:
                self.state["updated_at"] = written = time.time()
                _write_state(self.lab_dir, self.state)
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
            hours = max(0.0, lim.max_hours - (time.time() - self.state["started_at"]) / 3600)
        left = None
        if lim.max_experiments is not None:
            left = max(0, lim.max_experiments - self.state["experiments_submitted"])
        return Budget(hours_left=hours, experiments_left=left)

    def _argv(self, prompt_path: Path) -> list[str]:
        argv = [a.replace("{prompt_file}", str(prompt_path)) for a in self.command.argv]
        if (
            Path(argv[0]).name == "claude"
            and self.limits.max_cost is not None
            and "--max-budget-usd" not in argv
        ):
            # Claude Code stops itself at what is left of the cap, so a long session cannot overrun it
            left = max(0.0, self.limits.max_cost - self.state["cost_usd"])
            argv[1:1] = ["--max-budget-usd", f"{left:.4f}"]
        return argv

    def _env(self, prompt_path: Path, n: int) -> dict[str, str]:
        # the agent's `nightlab` must be this nightlab, whatever PATH the user's shell had
        bindir = str(Path(sys.executable).parent)
        env = {
            **os.environ,
            "NIGHTLAB_PROMPT_FILE": str(prompt_path),
            "NIGHTLAB_DIR": str(self.lab_dir),
            "NIGHTLAB_AGENT_SESSION": str(n),
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        }
        if self.command.cli == "claude" and CLAUDE_UNATTENDED_FLAG in self.command.argv and os.geteuid() == 0:
            # only "1" counts: measured, `IS_SANDBOX=yes` (set on some hosted machines) is refused
            env[CLAUDE_SANDBOX_ENV] = "1"
        return env

    def _session(self, lab, reason: str | None) -> SessionEnd:
        from nightlab.agent.prompt import build_prompt

        n = self._next_session()
        directory = agent_dir(self.lab_dir)
        prompt_path = directory / f"prompt-{n}.md"
        transcript = directory / f"transcript-{n}.log"
        prompt_path.write_text(build_prompt(lab, session=n, reason=reason, budget=self._budget()))
        argv = self._argv(prompt_path)
        env = self._env(prompt_path, n)
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
        self.state.update(
            session=n,
            agent_pid=proc.pid,
            session_started_at=started,
            transcript=str(transcript),
            prompt=str(prompt_path),
            last_activity=started,
            updated_at=started,
        )
        _write_state(self.lab_dir, self.state)
        self.log(f"session {n} started: {self.command.name} (pid {proc.pid}), transcript {transcript}")
        try:
            end = self._watch(lab, proc, transcript)
        finally:
            self._kill(proc)
        self._count_submissions(lab)
        end = self._settle(end, transcript, started)
        report = end.report or read_transcript(transcript)
        cost = report.cost_usd(self.prices)
        self.state["cost_usd"] += cost or 0.0
        session = {
            "n": n,
            "started_at": started,
            "ended_at": time.time(),
            "end": end.reason,
            "exit_code": end.exit_code,
            "cost_usd": cost,
            "turns": report.turns,
            "commands": report.commands,
            "input_tokens": report.input_tokens,
            "cached_input_tokens": report.cached_input_tokens,
            "output_tokens": report.output_tokens,
            "last_command": report.last_command,
            "last_message": report.last_message,
            "error": report.error,
        }
        self.state["sessions"].append(session)
        lab.ledger.log_event(
            "agent-session",
            run_started_at=self.state["started_at"],
            agent=self.command.name,
            cli=self.command.cli,
            **{k: session[k] for k in ("n", "started_at", "ended_at", "end", "cost_usd")},
            input_tokens=report.input_tokens,
            output_tokens=report.output_tokens,
        )
        self.state.update(agent_pid=None, updated_at=time.time())
        _write_state(self.lab_dir, self.state)
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
            self.state["error"] = self._start_failure(code, tail)
            self.log(self.state["error"])
            return SessionEnd("failed-at-start", True, code, report)
        return SessionEnd(f"exit {code}", False, code, report)

    def _start_failure(self, code: int, tail: str) -> str:
        lines = [line.strip() for line in tail.splitlines() if line.strip()]
        last = lines[-1] if lines else "(no output)"
        hint = "run it by hand in the lab to see why"
        if "root" in last and self.command.cli == "claude":
            hint = (
                f"run as a normal user, or use the built-in `--agent claude` line (it sets {CLAUDE_SANDBOX_ENV}=1 "
                "as root)"
            )
        return f"`{self.command.cli}` exited at start (code {code}) without a transcript: {last}; {hint}"

    def _watch(self, lab, proc: subprocess.Popen, transcript: Path) -> SessionEnd:
        size = 0
        written = time.time()
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
                size = current
                self.state["last_activity"] = now
                if self.state["api"] is not None and read_transcript(transcript).turns > 0:
                    self._api_back()  # the model answered: the outage is over
            if now - self.state["last_activity"] > self.limits.stall_seconds:
                return SessionEnd("stall", False, None)
            if now - written >= STATE_EVERY or self.state["updated_at"] < self.state["last_activity"]:
                self.state["updated_at"] = now
                _write_state(self.lab_dir, self.state)
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
        """New `submit` events since the last look: each is one experiment and counts as activity."""
        events = lab.ledger.events(after=self._cursor, limit=5000)
        if not events:
            return
        self._cursor = events[-1].id
        submitted = sum(1 for e in events if e.kind == "submit")
        if submitted:
            self.state["experiments_submitted"] += submitted
            self.state["last_activity"] = time.time()

    def _kill(self, proc: subprocess.Popen) -> None:
        """Stop the agent's whole process group: SIGTERM, then SIGKILL after the grace period.

        Also after a normal exit: commands the agent left running in the background go too.
        """
        for sig, patience in ((signal.SIGTERM, self.term_grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            deadline = time.time() + patience
            while time.time() < deadline:
                if proc.poll() is not None and not _group_alive(proc.pid):
                    return
                time.sleep(0.05)
        proc.wait()


def _tail(transcript: Path) -> str:
    try:
        with open(transcript, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(ts))


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------- background, stop


def start_background(lab_dir: Path, run_args: list[str], *, timeout: float = 30.0) -> int:
    """Start `nightlab agent run RUN_ARGS` detached and return the supervisor's pid.

    Raises:
        NightlabError: one already runs, or the new one exited or did not come up in `timeout` s.
    """
    pid = running_pid(lab_dir)
    if pid is not None:
        raise NightlabError(
            f"an agent supervisor already runs for this lab (pid {pid}); stop it with `nightlab agent stop`"
        )
    directory = agent_dir(lab_dir)
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "supervisor.log"
    args = [sys.executable, "-m", "nightlab", "agent", "run", *run_args, "--lab", str(lab_dir)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.time() + timeout
    while time.time() < deadline:
        if running_pid(lab_dir) == proc.pid:
            return proc.pid
        code = proc.poll()
        if code is not None:
            lines = log_path.read_text(errors="replace").strip().splitlines()
            raise NightlabError(
                f"the agent supervisor exited at start (code {code}): {lines[-1] if lines else '?'}; see {log_path}"
            )
        time.sleep(0.05)
    raise NightlabError(f"the agent supervisor did not start within {timeout:.0f} s; see {log_path}")


def stop(lab_dir: Path, *, timeout: float = TERM_GRACE + 20.0) -> int | None:
    """Ask the running supervisor to stop its agent and exit; wait for it. Returns its pid or None.

    Raises:
        NightlabError: it did not stop within `timeout` s.
    """
    pid = running_pid(lab_dir)
    if pid is None:
        return None
    if pid > 0:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if running_pid(lab_dir) is None:
            return pid
        time.sleep(0.05)
    raise NightlabError(f"the agent supervisor (pid {pid}) did not stop within {timeout:.0f} s; `kill {pid}`")


def status(lab_dir: Path) -> dict[str, Any]:
    """The supervisor's state with `running` (is it alive now), `agent_alive` and `gpu_cost_usd` added.

    `gpu_cost_usd` is the fleet's cost so far (`fleet.costs.cost_summary`), None for a lab
    without priced (remote) workers: the API cost is shown next to it.
    """
    from nightlab.fleet.costs import cost_summary
    from nightlab.ledger import open_ledger

    state = dict(read_state(lab_dir) or {})
    running = running_pid(lab_dir) is not None
    state["running"] = running
    if state.get("status") == "running" and not running:
        state["status"] = "dead"  # killed without cleaning up: its agent may still run
    state["agent_alive"] = _alive(state.get("agent_pid"))
    state["gpu_cost_usd"] = None
    if (lab_dir / ".nightlab" / "ledger.db").is_file():
        ledger = open_ledger(lab_dir)
        try:
            summary = cost_summary(ledger)
        finally:
            ledger.close()
        state["gpu_cost_usd"] = None if summary is None else summary["total_cost"]
    return state


# ---------------------------------------------------------------------------- one-line views
# `nightlab agent status` and the dashboard show the same lines, so they are written once here.


def outage_line(state: dict[str, Any], *, now: float | None = None) -> str | None:
    """ "API unavailable since …, next try at …" while the model API is down, else None."""
    api = state.get("api")
    if not api:
        return None
    now = time.time() if now is None else now
    next_try = api["next_try_at"]
    when = f"in {next_try - now:.0f} s" if next_try > now else "now"
    failures = api["failures"]
    return (
        f"API unavailable since {_clock(api['since'])} ({now - api['since']:.0f} s), next try at "
        f"{_clock(next_try)} ({when}); {failures} failed session{'s' if failures != 1 else ''}, "
        f"last error: {api.get('last_error') or '-'}"
    )


def cost_line(state: dict[str, Any]) -> str:
    """API cost of the run, of the last session and the cap, next to the fleet's GPU cost."""
    sessions = state.get("sessions") or []
    parts = [f"API ${state.get('cost_usd') or 0.0:.2f} this run"]
    last = sessions[-1].get("cost_usd") if sessions else None
    if last is not None:
        parts.append(f"${last:.2f} last session")
    cap = (state.get("limits") or {}).get("max_cost")
    if cap is not None:
        parts.append(f"cap ${cap:.2f}")
    gpu = state.get("gpu_cost_usd")
    parts.append(f"GPU {'-' if gpu is None else f'${gpu:.2f}'} (fleet)")
    return ", ".join(parts)


def session_line(session: dict[str, Any]) -> str:
    """One finished session from its transcript: how it ended, what it did and cost, its last words."""
    cost = session.get("cost_usd")
    line = (
        f"session {session['n']}: {session['end']} after {session['ended_at'] - session['started_at']:.0f} s, "
        f"{session.get('turns', 0)} turns, {session.get('commands', 0)} commands"
        + ("" if cost is None else f", ${cost:.2f}")
    )
    said = session.get("error") or session.get("last_message")
    return line + (f"; {said}" if said else "")
