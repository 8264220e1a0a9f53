"""Starting, finding and stopping a lab's controller.

One controller per lab: it holds an exclusive `flock` on `.nightlab/controller.lock` for
its whole life and writes `.nightlab/controller.pid` (the lock, pid file, start and stop
rules are `nightlab.lifecycle.Singleton`'s, shared with the agent supervisor).

Run in the background as `python -m nightlab.fleet.daemon LAB_DIR [--cpu-slots N]`.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightlab.errors import ControllerError, NightlabError
from nightlab.lifecycle import ProcessTimeout, Singleton

START_TIMEOUT = 20.0


def process(lab_dir: Path) -> Singleton:
    """The lab's controller as a background process (lock, pid file)."""
    state = lab_dir / ".nightlab"
    # the arguments `start_background` passes: `... -m nightlab.fleet.daemon LAB_DIR`
    marker = f"nightlab.fleet.daemon\0{lab_dir.resolve()}\0"
    return Singleton(state / "controller.lock", state / "controller.pid", marker=marker)


def running_pid(lab_dir: Path) -> int | None:
    """The pid of the lab's live controller; -1 while one starts; None when none runs."""
    return process(lab_dir).running_pid()


@dataclass(frozen=True)
class Started:
    """What `start_background` found or did: the controller's pid, and whether this call started it."""

    pid: int  # -1: a controller is still starting (only when not waiting for it)
    new: bool


def start_background(lab_dir: Path, *, cpu_slots: int | None = None, wait: bool = True) -> Started:
    """Start the controller as a detached process unless one runs; its pid either way.

    Starters take turns (`Singleton.starting_alone`): two at once make one controller and both
    return its pid. With `wait`, a start in progress is waited for, so the pid is a real one.

    Raises:
        ControllerError: it did not come up, or another start held the lock too long.
        UsageError: the local slots would oversubscribe the machine (`check_capacity`).
    """
    singleton = process(lab_dir)
    log_path = lab_dir / ".nightlab" / "controller.log"
    with singleton.starting_alone(patience=START_TIMEOUT + 10) as alone:
        if not alone:
            raise ControllerError(
                f"another start of this lab's controller did not finish within {START_TIMEOUT + 10:.0f} s; "
                f"see {log_path}, then `nightlab fleet status`"
            )
        pid = singleton.settled_pid(timeout=START_TIMEOUT) if wait else singleton.running_pid()
        if pid is not None and (pid > 0 or not wait):
            return Started(pid, new=False)
        if pid is not None:
            raise ControllerError(
                f"a controller has been starting for over {START_TIMEOUT:.0f} s; see {log_path}"
            )
        from nightlab.config import load_lab_config
        from nightlab.fleet.health import check_capacity

        # one line, before anything starts
        check_capacity(load_lab_config(lab_dir).config, cpu_slots=cpu_slots)
        args = [sys.executable, "-m", "nightlab.fleet.daemon", str(lab_dir.resolve())]
        if cpu_slots:
            args += ["--cpu-slots", str(cpu_slots)]
        proc = singleton.start(args, log_path)
        if not wait:
            return Started(proc.pid, new=True)
        try:
            pid = singleton.wait_started(proc, timeout=START_TIMEOUT)
        except ProcessTimeout:
            raise ControllerError(
                f"the controller did not start within {START_TIMEOUT:.0f} s; see {log_path}"
            ) from None
    if pid is not None:
        # ours, or one started without the start lock (`fleet start --foreground`): ours then exits 3
        return Started(pid, new=pid == proc.pid)
    if proc.returncode == 3:  # lost the lock to a `--foreground` controller that has not written its pid yet
        settled = singleton.settled_pid(timeout=START_TIMEOUT)
        if settled is not None and settled > 0:
            return Started(settled, new=False)
    raise ControllerError(f"the controller exited at start (code {proc.returncode}); see {log_path}")


def ensure_running(lab_dir: Path) -> int | None:
    """Start a controller unless one runs; returns the new pid, or None if one was running."""
    if running_pid(lab_dir) is not None:
        return None
    started = start_background(lab_dir, wait=False)
    return started.pid if started.new else None


def stop(lab_dir: Path, *, timeout: float = 30.0) -> int | None:
    """Ask the controller to stop (its runs are requeued) and wait; returns its pid or None.

    A controller still starting is stopped too: SIGTERM reaches it once its pid is known
    (`Singleton.stop`). The ledger's stop flag alone did not: the start resets it.
    """
    if running_pid(lab_dir) is None:
        return None
    from nightlab.ledger import open_ledger

    with open_ledger(lab_dir) as ledger:
        ledger.request_controller_stop()
    try:
        return process(lab_dir).stop(timeout=timeout)
    except ProcessTimeout as e:
        raise ControllerError(
            f"the controller (pid {e.pid}) did not stop within {timeout:.0f} s; kill it with `kill {e.pid}`"
        ) from None


def serve(
    lab_dir: Path,
    *,
    policy: Callable[..., Any],
    cpu_slots: int | None = None,
    sidecar: Callable[[Any], list[str] | None] | None = None,
) -> int:
    """Run the controller in this process while holding the lab's lock. Returns an exit code.

    `policy(ledger, config, lab_dir)` makes the verdict policy the controller stores with each
    run's end (`fleet.controller.VerdictPolicy`); the lab's is `nightlab.judge.Judge`.
    `sidecar(config)`: the command line of a helper process to keep running beside the
    controller under that config, or None (`fleet.sidecar`); the lab's is the trackers' worker.
    """
    from nightlab.config import load_lab_config
    from nightlab.fleet.controller import Controller, build_slots
    from nightlab.fleet.sidecar import Sidecar
    from nightlab.ledger import open_ledger

    problem = _ledger_problem(lab_dir)
    if problem is not None:
        # before the pid file: `start_background` then reports the failed start instead of a pid
        logging.getLogger("nightlab.controller").error("controller refused to start: %s", problem)
        print(f"nightlab: {problem}", file=sys.stderr)
        return 1
    stop_early: list[int] = []  # a SIGTERM while it starts, kept until the controller exists
    with process(lab_dir).hold(
        patience=0.5, on_stop=lambda signum, _frame: stop_early.append(signum)
    ) as held:
        if not held:
            print(f"nightlab: a controller already runs for {lab_dir}", file=sys.stderr)
            return 3
        try:
            loaded = load_lab_config(lab_dir)
            if loaded.warning:
                logging.getLogger("nightlab.controller").warning(loaded.warning)
            config = loaded.config
            from nightlab.errors import UsageError
            from nightlab.fleet.health import check_capacity

            try:
                check_capacity(config, cpu_slots=cpu_slots)
            except UsageError as e:
                print(f"nightlab: {e}", file=sys.stderr)
                return 2
            slots, backends = build_slots(config, cpu_slots=cpu_slots, lab_dir=lab_dir)
            with open_ledger(lab_dir) as ledger:
                from nightlab import identity

                identity.rekey(lab_dir, ledger)
                controller = Controller(
                    lab_dir,
                    config,
                    ledger,
                    slots=slots,
                    backends=backends,
                    policy=policy(ledger, config, lab_dir),
                    watch_config=True,
                    cpu_slots=cpu_slots,
                    sidecar=None
                    if sidecar is None
                    else Sidecar(sidecar, lab_dir / ".nightlab" / "trackers.log"),
                )
                signal.signal(signal.SIGTERM, controller.request_stop)
                signal.signal(signal.SIGINT, controller.request_stop)
                if stop_early:
                    controller.request_stop()
                controller.run()
        except NightlabError as e:
            # one line in controller.log, no traceback: `nightlab doctor` and `status` say what to do
            logging.getLogger("nightlab.controller").error("controller stopped: %s", e)
            return 1
    return 0


def _ledger_problem(lab_dir: Path) -> str | None:
    """Why the ledger must not be written (damaged, cut WAL, unreadable), or None."""
    from nightlab.ledger import open_ledger
    from nightlab.ledger.integrity import RESTORE_HINT

    try:
        with open_ledger(lab_dir) as ledger:
            problems = ledger.check()
    except NightlabError as e:
        return str(e)
    if problems:
        # writing on top of a damaged b-tree spreads the damage: refuse before the first write
        return f"ledger `{lab_dir / '.nightlab' / 'ledger.db'}` fails its integrity check ({problems[0]}); {RESTORE_HINT}"
    return None


def revive(lab_dir: Path, ledger=None) -> int | None:
    """Restart a controller that died without releasing the lab (SIGKILL, OOM killer, reboot).

    A controller that stops on purpose (`fleet stop`, idle shutdown) deletes its ledger row;
    one that was killed leaves it. So a row with no live lock holder means work was
    interrupted: the next CLI call starts a controller, which re-attaches or requeues the
    runs that were in flight. Returns the new pid, or None when nothing needed starting.
    """
    from nightlab.ledger import open_ledger

    if running_pid(lab_dir) is not None:
        return None
    if ledger is None:
        with open_ledger(lab_dir) as own:
            died = own.controller() is not None
    else:
        died = ledger.controller() is not None
    if not died:
        return None
    started = start_background(lab_dir, wait=False)  # another CLI call may have restarted it first
    return started.pid if started.new else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nightlab.fleet.daemon")
    parser.add_argument("lab_dir", type=Path)
    parser.add_argument(
        "--cpu-slots", type=int, default=None, help="number of CPU slots (default: from nightlab.toml)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # a fatal signal (SIGSEGV, SIGBUS, SIGABRT) otherwise ends the controller without a word in
    # controller.log: a SIGBUS in a ledger query took a debugging session to find (2026-12-05)
    faulthandler.enable()
    # the process's entry point wires the lab's verdict policy in; the fleet modules never import it
    from nightlab.judge import Judge

    lab_dir = args.lab_dir.resolve()
    return serve(lab_dir, policy=Judge, cpu_slots=args.cpu_slots, sidecar=_tracker_worker(lab_dir))


def _tracker_worker(lab_dir: Path) -> Callable[[Any], list[str] | None]:
    """The trackers' worker (`python -m nightlab.trackers`) while `[trackers]` is configured.

    A command line, not an import: the fleet never loads the trackers or their libraries. The
    section's digest in it restarts the worker when a re-committed nightlab.toml changes it.
    """
    import hashlib

    def argv(config: Any) -> list[str] | None:
        if not config.trackers:
            return None
        digest = hashlib.sha256(repr(config.trackers).encode()).hexdigest()[:12]
        return [sys.executable, "-m", "nightlab.trackers", str(lab_dir), digest]

    return argv


if __name__ == "__main__":
    sys.exit(main())
