"""The supervisor from outside: its state, is it running, start it detached, stop it, its status.

One supervisor per lab is a `lifecycle.Singleton` (the fleet controller's rules): an `flock`
on `.nightlab/agent/supervisor.lock` for its life and its pid in `supervisor.pid`. Its state
is a typed record in the ledger (`ledger.AgentRun`, changed field by field in one transaction
each), for `nightlab agent status` and the dashboard; labs from before it have their
`.nightlab/agent/state.json` imported once.

Usage:
    pid = start_background(lab.path, ["--agent", "claude", "--max-hours", "8"])
    status(lab.path)["session"]; stop(lab.path)
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from nightlab.errors import LedgerError, NightlabError
from nightlab.ledger import AgentRun, AgentRunStatus
from nightlab.lifecycle import ProcessTimeout, Singleton, alive

AGENT_DIR = Path(".nightlab") / "agent"
STATE_NAME = "state.json"  # where the state was before it moved into the ledger (imported once)
STOP_TIMEOUT = 30.0  # the agent's grace period (10 s) plus the supervisor's own shutdown


def agent_dir(lab_dir: Path) -> Path:
    """`.nightlab/agent/` of the lab: prompts, transcripts, the supervisor's lock, log and state."""
    return lab_dir / AGENT_DIR


def process(lab_dir: Path) -> Singleton:
    """The lab's agent supervisor as a background process (lock, pid file)."""
    directory = agent_dir(lab_dir)
    # the arguments `start_background` passes end `... --lab LAB_DIR`
    marker = f"--lab\0{lab_dir.resolve()}\0"
    return Singleton(directory / "supervisor.lock", directory / "supervisor.pid", marker=marker)


def read_state(lab_dir: Path, *, import_old: bool = True) -> dict[str, Any] | None:
    """The supervisor's run as the ledger holds it (`ledger.AgentRun.to_dict`), or None if none ran.

    A lab from before the record (its supervisor wrote `.nightlab/agent/state.json`) has that
    file imported once, then renamed `state.json.imported`. With `import_old=False` (the
    dashboard, which never changes a lab) the file is only read.

    Raises:
        NightlabError: an old state file that is not valid JSON.
    """
    from nightlab.ledger import open_ledger

    db = lab_dir / ".nightlab" / "ledger.db"
    run = _recorded(db)
    if run is not None:
        return run.to_dict()
    legacy = agent_dir(lab_dir) / STATE_NAME
    if not legacy.is_file():
        return None
    if not import_old or not db.is_file():
        return _read_legacy(legacy).to_dict()
    with open_ledger(lab_dir) as ledger:
        run = ledger.agent_run() or _import_state_json(legacy, ledger)
    return run.to_dict()


def _recorded(db: Path) -> AgentRun | None:
    from nightlab.ledger import ReadOnlyLedger

    if not db.is_file():
        return None
    try:
        with ReadOnlyLedger(db) as ledger:
            return ledger.agent_run()
    except LedgerError:  # a ledger of an older schema: it has no record yet (`open_ledger` upgrades it)
        return None


def _read_legacy(path: Path) -> AgentRun:
    """An old `state.json` as the record it becomes (the same keys as a recorded run's)."""
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as e:  # only a crash mid-write by something else could do this
        raise NightlabError(f"`{path}` is not valid JSON ({e}); delete it") from e
    if not isinstance(state, dict) or not {"pid", "status", "agent"} <= state.keys():
        raise NightlabError(f"`{path}` is not a supervisor state (pid, status, agent); delete it")
    values = {k: v for k, v in state.items() if k in AgentRun.__dataclass_fields__}
    values.setdefault("cli", None)
    values.setdefault("limits", {})
    values.setdefault("started_at", path.stat().st_mtime)  # every state file had it; the file's time else
    values.setdefault("updated_at", values["started_at"])
    for key in ("command", "restarts", "api_outages", "sessions"):
        values[key] = tuple(values.get(key) or ())
    try:
        values["status"] = AgentRunStatus(values["status"])
    except ValueError:
        raise NightlabError(
            f"`{path}` has an unknown supervisor status `{values['status']}`; delete it"
        ) from None
    return AgentRun(**values)


def _import_state_json(path: Path, ledger) -> AgentRun:
    ledger.start_agent_run(_read_legacy(path))
    with contextlib.suppress(FileNotFoundError):  # a second reader imported it at the same time
        path.rename(path.with_name(STATE_NAME + ".imported"))
    run = ledger.agent_run()
    assert run is not None
    return run


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


def status(lab_dir: Path, *, import_old: bool = True) -> dict[str, Any]:
    """The supervisor's state with `running` (is it alive now), `agent_alive` and `gpu_cost_usd` added.

    `gpu_cost_usd` is the fleet's cost so far (`fleet.costs.cost_summary`), None for a lab
    without priced (remote) workers: the API cost is shown next to it. Reads change nothing
    (a read-only ledger) except the one import of an old state file (`read_state`).
    """
    from nightlab.fleet.costs import cost_summary
    from nightlab.ledger import ReadOnlyLedger

    state = dict(read_state(lab_dir, import_old=import_old) or {})
    running = running_pid(lab_dir) is not None
    state["running"] = running
    if state.get("status") == AgentRunStatus.RUNNING and not running:
        state["status"] = AgentRunStatus.DEAD  # killed without cleaning up: its agent may still run
    state["agent_alive"] = alive(state.get("agent_pid"))
    state["gpu_cost_usd"] = None
    db = lab_dir / ".nightlab" / "ledger.db"
    if db.is_file():
        try:
            with ReadOnlyLedger(db) as ledger:
                summary = cost_summary(ledger)
        except LedgerError:  # an older schema, upgraded by the next `nightlab` command that writes
            summary = None
        state["gpu_cost_usd"] = None if summary is None else summary["total_cost"]
    return state
