"""The supervisor from outside: its state, is it running, start it detached, stop it, its status.

One supervisor per lab is a `lifecycle.Singleton` (the fleet controller's rules): an `flock`
on `.nightlab/agent/supervisor.lock` for its life and its pid in `supervisor.pid`. Its state
is in `.nightlab/agent/state.json`, written atomically, for `nightlab agent status`,
`nightlab agent stop` and the dashboard.

Usage:
    pid = start_background(lab.path, ["--agent", "claude", "--max-hours", "8"])
    status(lab.path)["session"]; stop(lab.path)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from nightlab.errors import NightlabError
from nightlab.lifecycle import ProcessTimeout, Singleton, alive

AGENT_DIR = Path(".nightlab") / "agent"
STATE_NAME = "state.json"
STOP_TIMEOUT = 30.0  # the agent's grace period (10 s) plus the supervisor's own shutdown


def agent_dir(lab_dir: Path) -> Path:
    """`.nightlab/agent/` of the lab: prompts, transcripts, the supervisor's lock, log and state."""
    return lab_dir / AGENT_DIR


def process(lab_dir: Path) -> Singleton:
    """The lab's agent supervisor as a background process (lock, pid file)."""
    directory = agent_dir(lab_dir)
    return Singleton(
        directory / "supervisor.lock", directory / "supervisor.pid", marker=str(lab_dir.resolve())
    )


def read_state(lab_dir: Path) -> dict[str, Any] | None:
    """The last state the lab's supervisor wrote, or None if none ever ran."""
    try:
        return json.loads((agent_dir(lab_dir) / STATE_NAME).read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:  # only a crash mid-write by something else could do this
        raise NightlabError(f"`{agent_dir(lab_dir) / STATE_NAME}` is not valid JSON ({e}); delete it") from e


def write_state(lab_dir: Path, state: dict[str, Any]) -> None:
    """Replace the state file atomically (readers see the old or the new one, never half)."""
    path = agent_dir(lab_dir) / STATE_NAME
    tmp = path.with_name(f".{STATE_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str))
    os.replace(tmp, path)


def running_pid(lab_dir: Path) -> int | None:
    """The pid of the lab's live supervisor; -1 while one starts; None when none runs."""
    return process(lab_dir).running_pid()


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
    log_path = agent_dir(lab_dir) / "supervisor.log"
    args = [sys.executable, "-m", "nightlab", "agent", "run", *run_args, "--lab", str(lab_dir.resolve())]
    proc = process(lab_dir).start(args, log_path)
    try:
        pid = process(lab_dir).wait_started(proc, timeout=timeout)
    except ProcessTimeout:
        raise NightlabError(
            f"the agent supervisor did not start within {timeout:.0f} s; see {log_path}"
        ) from None
    if pid is None:
        lines = log_path.read_text(errors="replace").strip().splitlines()
        raise NightlabError(
            f"the agent supervisor exited at start (code {proc.returncode}): {lines[-1] if lines else '?'}; "
            f"see {log_path}"
        )
    return pid


def stop(lab_dir: Path, *, timeout: float = STOP_TIMEOUT) -> int | None:
    """Ask the running supervisor to stop its agent and exit; wait for it. Returns its pid or None.

    Raises:
        NightlabError: it did not stop within `timeout` s.
    """
    try:
        return process(lab_dir).stop(timeout=timeout)
    except ProcessTimeout as e:
        raise NightlabError(
            f"the agent supervisor (pid {e.pid}) did not stop within {timeout:.0f} s; `kill {e.pid}`"
        ) from None


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
    state["agent_alive"] = alive(state.get("agent_pid"))
    state["gpu_cost_usd"] = None
    if (lab_dir / ".nightlab" / "ledger.db").is_file():
        ledger = open_ledger(lab_dir)
        try:
            summary = cost_summary(ledger)
        finally:
            ledger.close()
        state["gpu_cost_usd"] = None if summary is None else summary["total_cost"]
    return state
