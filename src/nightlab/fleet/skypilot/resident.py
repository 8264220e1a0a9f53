"""What runs on a worker cluster for the resident runner: the runner loop and the channel helper.

This file is shipped as text (its source travels in the runner job's environment and on the
helper's first stdin line), so it uses the standard library only and runs on Python >= 3.8:
the cluster always runs the controller's own copy, whatever nightlab its set-up installed. Its
one import of nightlab, the run's processes (`nightlab/procs.py`, the same rules as every local
run's), is replaced by that module's text in the shipped source (`runner_job.SOURCE`).

The runner is one long-lived SkyPilot job per cluster (`python -c SOURCE runner BASE EPOCH
IDLE`). It holds the cluster's GPU like any experiment job, and runs experiments one after
another in that one job, so a worker pays SkyPilot's per-job start (10-40 s on Slurm) once
instead of per run. The helper (`python -c SOURCE helper BASE`) is the controller's hand on
the same node: started over `ssh` + `srun --overlap` into the allocation (or locally for
the fake SDK), it answers one JSON request per stdin line. Runner and helper meet only in
the epoch directory `BASE/EPOCH`, on the node's own filesystem, and every decision there is
one atomic file operation, so a run is never started twice and never lost unseen:

    runs/NAME/          made by `put` with mkdir: a put repeated after a lost answer finds it
                        and does not queue the run again; it holds request.json, log, status.json
    inbox/NS.NAME       queued (NS orders the queue)
    claimed/NAME        the runner took it: rename(inbox -> claimed) succeeds for one taker only
    tomb/NAME           it must not run, or must stop: the runner checks it after every claim
                        and every 0.1 s while the run goes; `tomb` checks the claim after
                        making it, so one of the two always sees the other
    runs/NAME/status.json   written once the run and every process it left have ended
    exited              the runner wrote it as its last act: it runs nothing any more
    alive               touched by every helper: a runner with no helper for IDLE s and
                        nothing queued exits

States as `poll` reports them, read in lifecycle order (each mark is made only after the
one before it, and none is removed while the epoch lives, so a state read while it changes
is still one the run has had): unknown -> limbo (runs/NAME only) -> queued -> running
(claimed) -> done (status.json); or dropped (tombed before any claim: it will never run).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from nightlab.procs import MARK, end_run, run_processes, signal_all  # inlined when shipped

POLL = 0.1  # seconds between the runner's looks at its inbox and at the running run's tomb
KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL of a run's processes
ALIVE_EVERY = 10.0  # seconds between a helper's touches of `alive`
CHUNK = 256 * 1024  # log bytes per run per poll answer
KEEP_EPOCHS = 2 * 86400  # seconds after which another epoch's directory is removed at start
PREFIX = "nightlab-resident: "  # the runner's first output line: where and what it is


def _write(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _touch(path: str) -> None:
    with open(path, "a"):
        pass
    os.utime(path, None)


# ---------------------------------------------------------------------------- the runner


class Runner:
    """The loop of the runner job (module docstring)."""

    def __init__(self, base: str, epoch: str, idle: float) -> None:
        self.dir = os.path.join(base, epoch)
        self.epoch = epoch
        self.idle = idle
        self.stopping = False
        for sub in ("inbox", "claimed", "tomb", "runs"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        self._sweep(base)

    def _sweep(self, base: str) -> None:
        """Remove other epochs' directories that have not been touched for `KEEP_EPOCHS`."""
        now = time.time()
        for name in os.listdir(base):
            path = os.path.join(base, name)
            if name == self.epoch or not os.path.isdir(path):
                continue
            try:
                if now - os.stat(path).st_mtime > KEEP_EPOCHS:
                    subprocess.run(["rm", "-rf", path], check=False)
            except OSError:
                continue

    def announce(self, source: str) -> None:
        info = {
            "epoch": self.epoch,
            "dir": self.dir,
            "python": sys.executable,
            "host": socket.gethostname(),
            "slurm_job": os.environ.get("SLURM_JOB_ID"),
            "pid": os.getpid(),
            "source": source,
        }
        _write(os.path.join(self.dir, "hello.json"), info)
        _touch(os.path.join(self.dir, "alive"))
        print(PREFIX + json.dumps(info), flush=True)

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def loop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._stop)
        last_work = time.time()
        while not self.stopping:
            entry = self._next()
            if entry is None:
                try:
                    contact = os.stat(os.path.join(self.dir, "alive")).st_mtime
                except OSError:
                    contact = 0.0
                if time.time() - max(contact, last_work) > self.idle:
                    break
                time.sleep(POLL)
                continue
            name = entry.split(".", 1)[1]
            try:
                os.rename(os.path.join(self.dir, "inbox", entry), os.path.join(self.dir, "claimed", name))
            except FileNotFoundError:
                continue
            tomb = os.path.join(self.dir, "tomb", name)
            if os.path.exists(tomb):
                _write(self._status(name), {"skipped": True, "why": _tomb_why(tomb), "ended": time.time()})
            else:
                self.run(name)
            last_work = time.time()
        _touch(os.path.join(self.dir, "exited"))

    def _next(self) -> str | None:
        try:
            entries = [e for e in os.listdir(os.path.join(self.dir, "inbox")) if "." in e]
        except OSError:
            return None
        return min(entries) if entries else None

    def _status(self, name: str) -> str:
        return os.path.join(self.dir, "runs", name, "status.json")

    def run(self, name: str) -> None:
        """Run one claimed experiment to its end, and every process it left with it."""
        run_dir = os.path.join(self.dir, "runs", name)
        request = _read(os.path.join(run_dir, "request.json"))
        if request is None:
            _write(self._status(name), {"error": "no readable request.json", "ended": time.time()})
            return
        mark = f"{self.epoch}/{name}"
        env = dict(os.environ)
        env.update(request.get("env") or {})
        env[MARK] = mark
        home = os.environ.get("HOME", "/")
        cwd = os.path.join(home, "sky_workdir")
        started = time.time()
        with open(os.path.join(run_dir, "log"), "ab") as log:
            child = subprocess.Popen(
                ["bash", "-c", request["script"]],
                cwd=cwd if os.path.isdir(cwd) else home,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        tomb = os.path.join(self.dir, "tomb", name)
        termed = killed = None
        while child.poll() is None:
            if termed is None and (self.stopping or os.path.exists(tomb)):
                termed = time.time()
                signal_all(run_processes(child.pid, mark), signal.SIGTERM)
            elif termed is not None and killed is None and time.time() - termed > KILL_GRACE:
                killed = time.time()
                signal_all(run_processes(child.pid, mark), signal.SIGKILL)
            time.sleep(POLL)
        # what the run left behind must not outlive it: it would share the GPU with the next one
        end_run(None, mark, patience=KILL_GRACE)
        status = {"exit": child.returncode, "started": started, "ended": time.time()}
        if termed is not None:
            # a tomb is the controller's kill; a stopping runner (cancelled job) is not a verdict on the run
            status["killed" if os.path.exists(tomb) else "stopped"] = True
        _write(self._status(name), status)


# ---------------------------------------------------------------------------- the helper


def _tomb_why(path: str) -> str:
    """Why a run was tombed: `kill` (the controller's kill) or `void` (a put it could not find)."""
    try:
        with open(path) as f:
            return f.read().strip() or "kill"
    except OSError:
        return "kill"


def state_of(epoch_dir: str, name: str) -> str:
    """unknown | limbo | queued | running | done | dropped, read in lifecycle order (module docstring)."""

    def has(*parts: str) -> bool:
        return os.path.exists(os.path.join(epoch_dir, *parts))

    tombed = has("tomb", name)  # first: a tomb before any claim is a drop (module docstring)
    state = "unknown"
    if has("runs", name):
        state = "limbo"
    try:
        if any(e.split(".", 1)[-1] == name for e in os.listdir(os.path.join(epoch_dir, "inbox"))):
            state = "queued"
    except OSError:
        pass
    if has("claimed", name):
        state = "running"
    if has("runs", name, "status.json"):
        state = "done"
    if tombed and state in ("unknown", "limbo", "queued"):
        return "dropped"
    return state


class Helper:
    """Answers the controller's requests, one JSON line each (module docstring)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self._epochs: set = set()
        self._lock = threading.Lock()

    def _dir(self, req: dict) -> str:
        epoch = str(req["epoch"])
        if "/" in epoch or epoch.startswith("."):
            raise ValueError(f"bad epoch {epoch!r}")
        with self._lock:
            self._epochs.add(epoch)
        return os.path.join(self.base, epoch)

    def touch_alive(self) -> None:
        while True:
            with self._lock:
                epochs = list(self._epochs)
            for epoch in epochs:
                path = os.path.join(self.base, epoch)
                if os.path.isdir(path):
                    _touch(os.path.join(path, "alive"))
            time.sleep(ALIVE_EVERY)

    def op_hello(self, req: dict) -> dict:
        d = self._dir(req)
        if os.path.isdir(d):
            _touch(os.path.join(d, "alive"))
        return {
            "hello": _read(os.path.join(d, "hello.json")),
            "exited": os.path.exists(os.path.join(d, "exited")),
        }

    def op_put(self, req: dict) -> dict:
        d, name = self._dir(req), _name(req["name"])
        run_dir = os.path.join(d, "runs", name)
        try:
            os.mkdir(run_dir)
        except FileExistsError:
            state = state_of(d, name)
            if state != "limbo":
                return {"state": state}  # put before: its answer was lost
        if not os.path.exists(os.path.join(run_dir, "request.json")):
            _write(os.path.join(run_dir, "request.json"), req["request"])
        if state_of(d, name) == "limbo":
            entry = f"{time.time_ns():020d}.{name}"
            _touch(os.path.join(d, "inbox", entry))
        return {"state": state_of(d, name)}

    def op_tomb(self, req: dict) -> dict:
        d, name = self._dir(req), _name(req["name"])
        os.makedirs(os.path.join(d, "tomb"), exist_ok=True)
        path = os.path.join(d, "tomb", name)
        if not os.path.exists(path):  # the first reason stays
            with open(path, "w") as f:
                f.write("void" if req.get("why") == "void" else "kill")
        return {"state": state_of(d, name)}

    def op_poll(self, req: dict) -> dict:
        d = self._dir(req)
        out = {}
        for item in req["runs"]:
            name, offset = _name(item["name"]), int(item.get("offset", 0))
            state = state_of(d, name)
            answer: dict = {"state": state}
            if state == "dropped":
                answer["why"] = _tomb_why(os.path.join(d, "tomb", name))
            if state == "done":
                answer["status"] = _read(os.path.join(d, "runs", name, "status.json"))
            if state in ("running", "done"):
                # read after the state: a `done` run's log is complete, so a short read is its end
                try:
                    with open(os.path.join(d, "runs", name, "log"), "rb") as f:
                        f.seek(offset)
                        data = f.read(CHUNK)
                except OSError:
                    data = b""
                answer["log"] = base64.b64encode(data).decode()
                answer["eof"] = len(data) < CHUNK
            out[name] = answer
        return {"runs": out, "exited": os.path.exists(os.path.join(d, "exited"))}

    def op_forget(self, req: dict) -> dict:
        d, name = self._dir(req), _name(req["name"])
        # the payload and log go; runs/NAME stays, so a late put of the same run is still refused
        for part in ("request.json", "log"):
            try:
                os.remove(os.path.join(d, "runs", name, part))
            except OSError:
                pass
        return {}

    def op_reap(self, req: dict) -> dict:
        """Kill what a dead runner's run left (the runner cannot any more)."""
        mark = f"{req['epoch']}/{_name(req['name'])}"
        pids = run_processes(None, mark)
        signal_all(pids, signal.SIGKILL)
        return {"killed": len(pids)}

    def serve(self) -> None:
        threading.Thread(target=self.touch_alive, daemon=True).start()
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                req = json.loads(line)
                answer = getattr(self, "op_" + str(req["op"]))(req)
                answer.update(id=req.get("id"), ok=True)
            except Exception as e:  # answered, not raised: the controller decides
                answer = {
                    "id": req.get("id") if isinstance(req, dict) else None,
                    "ok": False,
                    "error": repr(e),
                }
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()


def _name(name: str) -> str:
    if not name or "/" in name or name.startswith(".") or "." in name:
        raise ValueError(f"bad run name {name!r}")
    return name


def main(argv: list) -> None:
    if argv[:1] == ["runner"] and len(argv) == 4:
        base, epoch, idle = argv[1], argv[2], float(argv[3])
        os.makedirs(base, exist_ok=True)
        runner = Runner(base, epoch, idle)
        runner.announce(os.environ.get("NIGHTLAB_RESIDENT_SOURCE", ""))
        runner.loop()
    elif argv[:1] == ["helper"] and len(argv) == 2:
        Helper(argv[1]).serve()
    else:
        sys.exit("usage: resident.py runner BASE EPOCH IDLE | helper BASE")


if __name__ == "__main__":
    main(sys.argv[1:])
