"""One conformance suite for the SkyPilot backend: the same scenarios on the fake and the real SDK.

`nightlab.testing.fake_sky` stands in for SkyPilot in the fast tests; these scenarios keep it
honest. Each one drives `SkyPilotBackend` through the backend interface only (launch, poll,
kill, a second backend that re-attaches) and returns what a controller would observe: exit
codes, `lost`, the cleaned log, the summary keys. `tests/fleet/test_skypilot_fleet.py` runs
them on `FakeSky`; against a real SkyPilot API server they run in a subprocess pointed at it
(`python -m nightlab.testing.skypilot_conformance <lab> <worker> <worker>`), and both must
return `EXPECTED`.

Every scenario uses the lab's HEAD as its snapshot and its own command, so it needs no
experiments in the ledger (only cluster events are recorded there). A pool with
`infra = "slurm/<host>"` runs its experiments on a resident runner (`residents.py`); the
scenarios and what they must return are the same, except where a scenario is about how a run
is found again: a runner's run is found by the epoch saved before its put, an exec's job by
its id or, when the id was never saved, by its name.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from nightlab.config import load_config
from nightlab.fleet.backend import RunSpec, WorkerSlot
from nightlab.fleet.skypilot import SkyPilotBackend, skypilot_slots

OK = "import time; time.sleep(1); print('---'); print('val_bpb: 1.25'); print('training_seconds: 1.0')"
CRASH = "print('step 1 loss 3.0'); raise ValueError('boom at step 3')"
SLOW = "import time; print('step 1 loss 3.0', flush=True); time.sleep(8); print('---'); print('val_bpb: 1.0')"
HANG = "import time; time.sleep(600)"

# what a controller sees, the same on every SDK
EXPECTED: dict[str, Any] = {
    "ok": {
        "exit_code": 0,
        "lost": False,
        "summary": ["nightlab_code", "tier", "training_seconds", "val_bpb"],
    },
    "crash": {"exit_code": 1, "lost": False, "last_line": "ValueError: boom at step 3", "prefixes": False},
    "live_log": {"seen_while_running": True, "exit_code": 0, "step_lines": 1},
    "timeout": {"exit_code": None, "lost": False},
    "reattach_by_id": {"exit_code": 0, "lost": False},
    "reattach_by_name_and_kill": {"found": True, "exit_code": None, "lost": False},
    "kill_at_close": {"exit_code": None, "lost": False},
}


# what only the exec path does against the real SDK (SkyPilot's log prefixes, a cancel of a running
# and of an INIT job, a job found by name): on a real Slurm pool the exec lane runs these, so the
# real suite stays within its time; the fake runs every scenario in both modes
EXEC_ONLY = ("crash", "timeout", "kill_at_close", "reattach_by_name_and_kill")


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"{what} after {timeout:.0f} s")


class Suite:
    """The scenarios on one lab; `sdk` is None for the real `sky` module, or a FakeSky."""

    def __init__(self, lab: Path, *, sdk: Any = None, patience: float = 600.0) -> None:
        self.lab = lab.resolve()
        self.sdk = sdk
        self.patience = patience
        self.config = load_config(self.lab / "nightlab.toml")
        self.exec_workers: set[str] = set()  # workers whose backends run one `sky exec` per run (`run_modes`)
        self.slots = {
            s.name: s for p in self.config.fleet.pools if p.backend == "skypilot" for s in skypilot_slots(p)
        }
        self.head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=self.lab, capture_output=True, text=True, check=True
        ).stdout.strip()
        self._n = 0
        self._lock = threading.Lock()

    def backend(self, slot: WorkerSlot | None = None) -> SkyPilotBackend:
        config = self.config
        if slot is not None and slot.name in self.exec_workers:
            pools = [
                dataclasses.replace(p, options={**p.options, "runner": False})
                if p.backend == "skypilot"
                else p
                for p in config.fleet.pools
            ]
            config = dataclasses.replace(config, fleet=dataclasses.replace(config.fleet, pools=pools))
        return SkyPilotBackend(config, lab_dir=self.lab, sdk=self.sdk)

    def spec(self, name: str, code: str, slot: WorkerSlot) -> RunSpec:
        with self._lock:
            self._n += 1
            n = self._n
        eid = f"c{int(time.time()) % 100000:05d}{n:02d}"  # job names stay unique across suite runs
        return RunSpec(
            experiment_id=eid,
            attempt=1,
            snapshot=self.head,
            command=f'python -c "{code}"',
            env={"NIGHTLAB_EXPERIMENT": eid, "NIGHTLAB_SEED": "0", "NIGHTLAB_TIER": slot.tier},
            timeout=300,
            run_dir=self.lab / ".nightlab" / "conformance" / name / eid,
            lab_dir=self.lab,
        )

    def _until_up(self, backend: SkyPilotBackend, slot: WorkerSlot) -> None:
        _wait(lambda: backend.available(slot), self.patience, f"cluster of `{slot.name}` not up")

    def _end(self, backend: SkyPilotBackend, slot: WorkerSlot, spec: RunSpec, handle: dict) -> Any:
        return _wait(
            lambda: backend.poll(slot, spec, handle), self.patience, f"`{spec.experiment_id}` not ended"
        )

    def _running(self, backend: SkyPilotBackend, spec: RunSpec) -> None:
        key = f"{spec.experiment_id}/{spec.attempt}"
        _wait(lambda: backend.jobs.runs[key].state == "running", self.patience, f"`{key}` not running")

    # ------------------------------------------------------------------ scenarios

    def ok(self, slot: WorkerSlot) -> dict[str, Any]:
        from nightlab.fleet.runner import parse_summary, read_tail

        backend = self.backend(slot)
        try:
            self._until_up(backend, slot)
            spec = self.spec("ok", OK, slot)
            ended = self._end(backend, slot, spec, backend.launch(slot, spec))
            summary = parse_summary(read_tail(spec.log_path)) or {}
            # gpu_name only where the cluster has an NVIDIA GPU: not part of the contract here
            keys = sorted(k for k in summary if k != "gpu_name")
            return {"exit_code": ended.exit_code, "lost": ended.lost, "summary": keys}
        finally:
            backend.close()

    def crash(self, slot: WorkerSlot) -> dict[str, Any]:
        from nightlab.fleet.runner import read_tail

        backend = self.backend(slot)
        try:
            self._until_up(backend, slot)
            spec = self.spec("crash", CRASH, slot)
            ended = self._end(backend, slot, spec, backend.launch(slot, spec))
            text = read_tail(spec.log_path)
            lines = [line for line in text.splitlines() if line.strip()]
            return {
                "exit_code": ended.exit_code,
                "lost": ended.lost,
                "last_line": lines[-1] if lines else None,
                "prefixes": "pid=" in text or "Job finished" in text,
            }
        finally:
            backend.close()

    def live_log(self, slot: WorkerSlot) -> dict[str, Any]:
        backend = self.backend(slot)
        try:
            self._until_up(backend, slot)
            spec = self.spec("live", SLOW, slot)
            handle = backend.launch(slot, spec)

            def seen() -> bool:
                return spec.log_path.exists() and "step 1 loss" in spec.log_path.read_text()

            _wait(lambda: seen() or backend.poll(slot, spec, handle), self.patience, "no log line")
            running = seen() and backend.poll(slot, spec, handle) is None
            ended = self._end(backend, slot, spec, handle)
            return {
                "seen_while_running": running,
                "exit_code": ended.exit_code,
                "step_lines": spec.log_path.read_text().count("step 1 loss"),
            }
        finally:
            backend.close()

    def timeout(self, slot: WorkerSlot) -> dict[str, Any]:
        backend = self.backend(slot)
        try:
            self._until_up(backend, slot)
            spec = self.spec("timeout", HANG, slot)
            handle = backend.launch(slot, spec)
            self._running(backend, spec)
            backend.kill(slot, spec, handle)  # what the controller does at the deadline
            ended = self._end(backend, slot, spec, handle)
            return {"exit_code": ended.exit_code, "lost": ended.lost}
        finally:
            backend.close()

    def kill_at_close(self, slot: WorkerSlot) -> dict[str, Any]:
        """A stopping controller: kill, forget and close right after the exec or put.

        On Slurm an exec's job is still INIT then, and SkyPilot ignores its first cancel. The next
        controller must find the run ended by that kill, not running on (a hung run would keep it
        waiting past `patience`).
        """
        backend = self.backend(slot)
        self._until_up(backend, slot)
        spec = self.spec("close", HANG, slot)
        handle = backend.launch(slot, spec)
        self._running(backend, spec)
        backend.kill(slot, spec, handle)
        backend.cleanup(spec)
        backend.close()
        return self._seen_by_the_next_controller(slot, spec, handle)

    def reattach_by_id(self, slot: WorkerSlot) -> dict[str, Any]:
        first = self.backend(slot)
        self._until_up(first, slot)
        spec = self.spec("reattach", SLOW, slot)
        handle = first.launch(slot, spec)
        sky_json = spec.run_dir / "sky.json"

        def found() -> bool:
            text = sky_json.read_text() if sky_json.exists() else ""
            return "job_id" in text or "resident" in text

        _wait(found, self.patience, "no job id or runner")
        first.close()  # the controller dies; the job goes on
        return self._seen_by_the_next_controller(slot, spec, handle)

    def _seen_by_the_next_controller(self, slot: WorkerSlot, spec: RunSpec, handle: dict) -> dict[str, Any]:
        """How a new backend (a restarted controller) sees the run end."""
        second = self.backend(slot)
        try:
            ended = self._end(second, slot, spec, handle)
            return {"exit_code": ended.exit_code, "lost": ended.lost}
        finally:
            second.close()

    def reattach_by_name_and_kill(self, slot: WorkerSlot) -> dict[str, Any]:
        first = self.backend(slot)
        self._until_up(first, slot)
        spec = self.spec("by-name", HANG, slot)
        handle = first.launch(slot, spec)
        self._running(first, spec)
        first.close()
        if first.jobs.runs[f"{spec.experiment_id}/{spec.attempt}"].fed is None:
            (spec.run_dir / "sky.json").unlink()  # died between `sky exec` and learning the job id
        second = self.backend(slot)
        try:
            second.poll(slot, spec, handle)
            key = f"{spec.experiment_id}/{spec.attempt}"
            found = _wait(
                lambda: (
                    second.jobs.runs[key].job_id is not None
                    or second.jobs.runs[key].fed is not None
                    or second.jobs.runs[key].ended
                ),
                self.patience,
                "not found",
            )
            second.kill(slot, spec, handle)
            ended = self._end(second, slot, spec, handle)
            return {
                "found": found is True or isinstance(found, int),
                "exit_code": ended.exit_code,
                "lost": ended.lost,
            }
        finally:
            second.close()

    def run_all(self, workers: list[str], names: list[str] | None = None) -> dict[str, Any]:
        """Every scenario (or `names`), spread over the workers' clusters (one thread per worker)."""
        names = list(names or EXPECTED)
        results: dict[str, Any] = {}
        errors: list[str] = []

        def lane(worker: str, mine: list[str]) -> None:
            for name in mine:
                try:
                    results[name] = getattr(self, name)(self.slots[worker])
                except Exception as e:  # reported, compared like any other observation
                    results[name] = {"error": f"{type(e).__name__}: {e}"}
                    errors.append(name)

        threads = [
            threading.Thread(target=lane, args=(w, names[i :: len(workers)])) for i, w in enumerate(workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {name: results[name] for name in names}

    def run_modes(
        self, runner_worker: str, exec_worker: str, exec_names: list[str] | None = None
    ) -> dict[str, Any]:
        """The scenarios on a resident runner, and at once with one `sky exec` per run.

        The exec worker's backends are built with `runner = false`, so the first of them retires
        the runner `fleet up` started there (its job would hold the cluster's queue). `exec_names`
        limits the exec lane (the real suite's time: `EXEC_ONLY`); None runs every scenario there.
        """
        self.exec_workers.add(exec_worker)
        out: dict[str, Any] = {}
        lanes = [
            threading.Thread(target=lambda: out.update(runner=self.run_all([runner_worker]))),
            threading.Thread(target=lambda: out.update(exec=self.run_all([exec_worker], exec_names))),
        ]
        for t in lanes:
            t.start()
        for t in lanes:
            t.join()
        return out


def main(argv: list[str]) -> None:
    """The real-SDK run: `python -m nightlab.testing.skypilot_conformance LAB W1 [W2]`, or
    `LAB --runner W1 --exec W2` for both modes of a Slurm pool (`Suite.run_modes`)."""
    parser = argparse.ArgumentParser(prog="python -m nightlab.testing.skypilot_conformance")
    parser.add_argument("lab", type=Path)
    parser.add_argument("workers", nargs="*")
    parser.add_argument("--runner")
    parser.add_argument("--exec", dest="exec_worker")
    args = parser.parse_args(argv)
    suite = Suite(args.lab)
    if args.runner and args.exec_worker:
        print(json.dumps(suite.run_modes(args.runner, args.exec_worker, list(EXEC_ONLY))))
    else:
        print(json.dumps(suite.run_all(args.workers)))


if __name__ == "__main__":
    main(sys.argv[1:])
