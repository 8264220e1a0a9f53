"""The supervisor: runs a coding agent headless in the lab overnight, restarting it as needed.

Each *session* starts the agent CLI in the lab with a fresh prompt (`prompt.build_prompt`:
instructions plus the lab's state), its prompt on standard input and the prompt file's path
in `NIGHTLAB_PROMPT_FILE`, and its stdout and stderr in `.nightlab/agent/transcript-<n>.log`.
A session ends when the agent exits (done, crashed, out of context, out of turns) or stalls:
no transcript output and no submission for `stall_seconds`. Then a new session starts with
the state as it is now, so nothing the previous one learned is lost: it is in the ledger.

Limits stop the whole run: `max_hours` of wall clock, `max_experiments` submitted during
the run, and `max_restarts_per_hour` (an agent that dies at once, e.g. for want of a login,
would otherwise restart forever). Experiments already queued keep running in the fleet.

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

from nightlab.config import AgentConfig, LabConfig
from nightlab.errors import NightlabError, UsageError
from nightlab.locks import try_lock

AGENT_DIR = Path(".nightlab") / "agent"
STATE_NAME = "state.json"

# Headless invocations, prompt on stdin. Both agents edit files and run commands without
# asking: nobody is there to approve. Run the lab in a container or VM you can afford to let
# an agent loose in. Claude Code: `-p` prints and exits, stream-json (needs --verbose) makes
# every tool call a transcript line, which is what stall detection watches. Codex: `exec -`
# reads the prompt from stdin, `--json` streams events as JSON lines.
BUILTIN_AGENTS: dict[str, str] = {
    "claude": "claude -p --output-format stream-json --verbose --dangerously-skip-permissions",
    "codex": "codex exec --json --dangerously-bypass-approvals-and-sandbox -",
}
# What agents print when their context is full (Claude Code's result event, Codex's error).
_CONTEXT = re.compile(
    r"prompt is too long|context[_ ]length[_ ]exceeded|maximum context length|out of room in the model's "
    r"context window|context window (?:is )?(?:full|exceeded)",
    re.IGNORECASE,
)
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


@dataclass(frozen=True)
class AgentCommand:
    """A resolved agent: its name (`claude`, `codex`, a `[agent.commands]` key, or `custom`) and argv."""

    name: str
    argv: tuple[str, ...]


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
    reason: str  # exit N | context | max-turns | stall | stopped | max-hours | max-experiments
    final: bool  # the run stops (a limit or a stop request) rather than restarting
    exit_code: int | None


class Supervisor:
    """Runs sessions of one agent in one lab until a limit or a stop request (see the module docstring)."""

    def __init__(
        self,
        lab_dir: Path,
        command: AgentCommand,
        limits: Limits,
        *,
        poll: float | None = None,
        term_grace: float = TERM_GRACE,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.lab_dir = lab_dir.resolve()
        self.command = command
        self.limits = limits
        # a tenth of the stall time: detection is late by at most 10 %
        self.poll = poll if poll is not None else min(1.0, max(0.05, limits.stall_seconds / 10))
        self.term_grace = term_grace
        self.log = log or (lambda message: None)
        self._stop = threading.Event()
        self.state: dict[str, Any] = {}

    def request_stop(self, *_: object) -> None:
        """Stop the agent and the run (signal-handler safe)."""
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
            "stop_reason": None,
        }
        _write_state(self.lab_dir, self.state)
        reason: str | None = None
        with Lab.open(self.lab_dir) as lab:
            self._cursor = self._last_event_id(lab)
            try:
                while True:
                    stop = self._limit_reached()
                    if stop is None and reason is not None:
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
        return None

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

    def _session(self, lab, reason: str | None) -> SessionEnd:
        from nightlab.agent.prompt import build_prompt

        n = self._next_session()
        directory = agent_dir(self.lab_dir)
        prompt_path = directory / f"prompt-{n}.md"
        transcript = directory / f"transcript-{n}.log"
        prompt_path.write_text(build_prompt(lab, session=n, reason=reason, budget=self._budget()))
        argv = [a.replace("{prompt_file}", str(prompt_path)) for a in self.command.argv]
        # the agent's `nightlab` must be this nightlab, whatever PATH the user's shell had
        bindir = str(Path(sys.executable).parent)
        env = {
            **os.environ,
            "NIGHTLAB_PROMPT_FILE": str(prompt_path),
            "NIGHTLAB_DIR": str(self.lab_dir),
            "NIGHTLAB_AGENT_SESSION": str(n),
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        }
        try:
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
        self.state["sessions"].append(
            {
                "n": n,
                "started_at": started,
                "ended_at": time.time(),
                "end": end.reason,
                "exit_code": end.exit_code,
            }
        )
        self.state.update(agent_pid=None, updated_at=time.time())
        _write_state(self.lab_dir, self.state)
        return end

    def _watch(self, lab, proc: subprocess.Popen, transcript: Path) -> SessionEnd:
        size = 0
        written = time.time()
        while True:
            code = proc.poll()
            self._count_submissions(lab)
            if code is not None:
                return SessionEnd(self._exit_reason(code, transcript), False, code)
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

    @staticmethod
    def _exit_reason(code: int, transcript: Path) -> str:
        try:
            with open(transcript, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
                tail = f.read().decode(errors="replace")
        except FileNotFoundError:
            tail = ""
        if _CONTEXT.search(tail):
            return "context"
        if _MAX_TURNS.search(tail):
            return "max-turns"
        return f"exit {code}"

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
    """The supervisor's state with `running` (is it alive now) and `agent_alive` added."""
    state = dict(read_state(lab_dir) or {})
    running = running_pid(lab_dir) is not None
    state["running"] = running
    if state.get("status") == "running" and not running:
        state["status"] = "dead"  # killed without cleaning up: its agent may still run
    state["agent_alive"] = _alive(state.get("agent_pid"))
    return state
