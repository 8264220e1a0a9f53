"""Fault and load scenarios against a real lab, shared by `tests/reliability/` and
`bench/reliability.py` (the tests run them small and assert; the bench runs them long
and prints the figures).

Every scenario drives the real CLI in subprocesses, over a tiny shell target whose
behaviour per attempt is read from `<lab>/.faults/<experiment id>` (one mode per line,
line N for attempt N; no file: `ok`):

    ok        sleep SLEEP seconds, print a summary block (val_bpb = 1 + seed / 1000)
    hang      print nothing and sleep an hour (for SIGSTOP and the hard timeout)
    wait      print `ready`, then sleep an hour (to be killed from outside)
    half      print half a summary block and exit 0 (a log cut mid-write)
    halfkill  print half a summary block and SIGKILL itself
    big       write 64 MiB of log (fills a small disk)

`audit(lab)` reads the ledger back and counts what the issue's goals are about: lost
experiments, duplicated completions, open leases, wrong classes. `stop_lab(lab)` ends
every process of a lab by pid (controller, wrappers, targets), whatever state it is in.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

TARGET_SH = r"""# tiny synthetic target for the reliability suite (see nightlab.testing.reliability)
SLEEP=0.3
F="$NIGHTLAB_LAB/.faults/$NIGHTLAB_EXPERIMENT"
N=$(( $(cat "$F.n" 2>/dev/null || echo 0) + 1 ))
echo $N > "$F.n"
MODE=$(sed -n "${N}p" "$F" 2>/dev/null)
MODE=${MODE:-ok}
echo "attempt $N mode $MODE"
case $MODE in
  hang) exec sleep 3600 ;;
  wait) echo ready; exec sleep 3600 ;;
  half) printf -- '---\nval_b'; exit 0 ;;
  halfkill) printf -- '---\nval_bpb: 0.'; kill -9 $$ ;;
  big) head -c 67108864 /dev/zero | tr '\0' 'x'; exit 0 ;;
esac
sleep $SLEEP
echo ---
echo "val_bpb:          1.$(printf %03d "$NIGHTLAB_SEED")"
echo "env_experiment:   $NIGHTLAB_EXPERIMENT"
"""


def nightlab(*args: str, cwd: Path, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run the real CLI as a user would; AssertionError with its output when `check` fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "nightlab", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"nightlab {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def make_fast_lab(
    root: Path,
    *,
    name: str = "lab",
    slots: int = 2,
    timeout: float = 60,
    retries: int = 2,
    idle_shutdown: float = 60,
    sleep: float = 0.3,
    backup_interval: float | None = None,
) -> Path:
    """A lab over the shell target with `slots` CPU slots, committed and ready."""
    target = root / f"{name}-target"
    target.mkdir(parents=True, exist_ok=True)
    (target / "train.sh").write_text(TARGET_SH.replace("SLEEP=0.3", f"SLEEP={sleep}"))
    lab = root / name
    nightlab(
        "init",
        str(lab),
        "--target",
        str(target),
        "--command",
        "sh train.sh",
        "--editable",
        "train.sh",
        "--cpu-slots",
        str(slots),
        "--timeout",
        str(timeout),
        # the shell target sleeps: more slots than cores cost nothing here (fleet/health.py)
        *(["--oversubscribe"] if slots > len(os.sched_getaffinity(0)) else []),
        cwd=root,
    )
    toml = lab / "nightlab.toml"
    text = toml.read_text().replace("idle_shutdown = 900", f"idle_shutdown = {idle_shutdown}")
    text = text.replace("retries = 2", f"retries = {retries}")
    if backup_interval is not None:
        text = text.replace("[[fleet.pool]]", f"backup_interval = {backup_interval}\n\n[[fleet.pool]]", 1)
    toml.write_text(text)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "test config"],
        cwd=lab,
        check=True,
    )
    (lab / ".faults").mkdir()
    with open(lab / ".git" / "info" / "exclude", "a") as f:
        f.write(".faults/\n")
    return lab


def set_faults(lab: Path, experiment_id: str, *modes: str) -> None:
    """Make attempt N of the experiment behave as `modes[N-1]` (later attempts: ok)."""
    (lab / ".faults" / experiment_id).write_text("\n".join(modes) + "\n")


def submit_many(lab: Path, n: int, *, message: str = "wave", start: bool = False) -> list[str]:
    """Queue `n` experiments of one snapshot (seeds 0..n-1) in one CLI call; returns their ids."""
    args = (
        ["submit", "-m", message, "--repeats", str(n), "--json"]
        if n > 1
        else ["submit", "-m", message, "--json"]
    )
    if not start:
        args.append("--no-start")
    return [e["id"] for e in json.loads(nightlab(*args, cwd=lab).stdout)]


# ---------------------------------------------------------------------------- processes


def _proc_info(pid: int) -> tuple[bytes, bytes, str]:
    base = Path("/proc") / str(pid)
    try:
        cmdline = (base / "cmdline").read_bytes()
    except OSError:
        cmdline = b""
    try:
        environ = (base / "environ").read_bytes()
    except OSError:
        environ = b""
    try:
        cwd = os.readlink(base / "cwd")
    except OSError:
        cwd = ""
    return cmdline, environ, cwd


def lab_processes(lab: Path) -> list[int]:
    """Pids of every live process that belongs to the lab: its controller, run wrappers and targets."""
    lab_s = str(lab)
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        cmdline, environ, cwd = _proc_info(int(entry.name))
        if not cmdline:
            continue  # zombie or gone
        is_controller = b"nightlab.fleet.daemon" in cmdline and lab_s.encode() in cmdline
        is_run = f"NIGHTLAB_LAB={lab_s}".encode() in environ.split(b"\0")
        in_lab = cwd.startswith(lab_s + "/.nightlab/runs/")
        if is_controller or is_run or in_lab:
            found.append(int(entry.name))
    return found


def leftovers(lab: Path) -> list[str]:
    """The command lines of the lab's live processes (`lab_processes`), to say what was left behind."""
    return [
        _proc_info(pid)[0].replace(b"\0", b" ").decode(errors="replace").strip() for pid in lab_processes(lab)
    ]


def controller_pid(lab: Path) -> int | None:
    """The pid of the lab's live controller process (None when none runs)."""
    for pid in lab_processes(lab):
        cmdline, _, _ = _proc_info(pid)
        if b"nightlab.fleet.daemon" in cmdline:
            return pid
    return None


def kill_all(lab: Path, sig: int = signal.SIGKILL) -> int:
    """Send `sig` to every process of the lab at once, until none is left; returns how many."""
    killed: set[int] = set()
    for _ in range(50):
        pids = [p for p in lab_processes(lab) if p not in killed or sig == signal.SIGKILL]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
                killed.add(pid)
            except ProcessLookupError:
                pass
        if sig != signal.SIGKILL:
            break
        time.sleep(0.02)
    return len(killed)


def stop_lab(lab: Path) -> None:
    """End every process of the lab, by pid (for teardown: works whatever state it is in)."""
    for pid in lab_processes(lab):
        try:
            os.kill(pid, signal.SIGCONT)  # a stopped process would not die of SIGTERM
        except ProcessLookupError:
            pass
    kill_all(lab, signal.SIGKILL)


# ---------------------------------------------------------------------------- ledger audit


def audit(lab: Path) -> dict[str, Any]:
    """What the ledger says happened: per-experiment ends, losses, duplicates, leases, classes."""
    from nightlab.ledger import ExperimentStatus, open_ledger

    with open_ledger(lab) as ledger:
        exps = ledger.experiments()
        events = ledger.events(limit=10**9, kinds=["end", "reattach", "controller-start"])
        open_attempts = ledger.open_attempts()
        problems = ledger.check(full=True)
        attempts = {e.id: ledger.attempts(e.id) for e in exps}
    final_ends = Counter(
        e.experiment_id
        for e in events
        if e.kind == "end" and e.data.get("state") in ("finished", "cancelled")
    )
    lost = [e.id for e in exps if not e.status.is_finished()]
    duplicated = [eid for eid, n in final_ends.items() if n > 1]
    unrecorded = [e.id for e in exps if e.status.is_finished() and final_ends[e.id] == 0]
    wrong_metric = [
        e.id
        for e in exps
        if e.ok and e.metrics.get("env_experiment") not in (None, e.id)  # a result from another run
    ]
    return {
        "experiments": len(exps),
        "lost": lost,
        "duplicated": duplicated,
        "unrecorded": unrecorded,
        "wrong_metric": wrong_metric,
        "open_attempts": len(open_attempts),
        "outcomes": dict(Counter(e.outcome for e in exps)),
        "attempts": dict(Counter(e.attempts for e in exps)),
        "infra_attempts": sum(1 for a in attempts.values() for x in a if x.failure == "infra"),
        "reattached": sum(1 for e in events if e.kind == "reattach"),
        "controller_starts": sum(1 for e in events if e.kind == "controller-start"),
        "integrity": problems,
        "by_id": {
            e.id: {
                "status": ExperimentStatus(e.status).label,
                "outcome": e.outcome,
                "attempts": [(x.failure, x.detail) for x in attempts[e.id]],
                "metric": e.metric("val_bpb"),
                "seed": e.seed,
            }
            for e in exps
        },
    }


def wait_finished(lab: Path, ids: list[str], *, timeout: float = 300, revive: bool = True) -> None:
    """Poll the ledger until every id is finished; each poll goes through `nightlab status` when
    `revive` (so a dead controller is restarted the way a user's next CLI call restarts it)."""
    from nightlab.ledger import open_ledger

    deadline = time.time() + timeout
    while time.time() < deadline:
        with open_ledger(lab) as ledger:
            pending = [
                e.id for e in ledger.experiments(ids=ids, with_metrics=False) if not e.status.is_finished()
            ]
        if not pending:
            return
        if revive:
            nightlab("status", "--json", cwd=lab, check=False)
        time.sleep(0.5)
    raise AssertionError(f"{len(pending)} experiments still pending after {timeout:.0f} s: {pending[:10]}")


def lock_free(lab: Path) -> bool:
    """Whether nothing holds the lab's controller lock (no stale lock can block a restart)."""
    from nightlab.locks import try_lock

    with try_lock(lab / ".nightlab" / "controller.lock") as got:
        return got is not None


# ---------------------------------------------------------------------------- scenarios


def controller_kill_wave(
    root: Path, *, experiments: int = 200, slots: int = 8, kills: int = 20, seed: int = 0, sleep: float = 0.5
) -> dict[str, Any]:
    """SIGKILL the controller at random moments during a wave; each time the next CLI call
    (`nightlab status`) restarts it. Returns the audit plus `kills` and timings."""
    rng = random.Random(seed)
    # retries: a kill between a lease and the launch costs the experiment an attempt (honest `infra`)
    lab = make_fast_lab(root, name=f"kills{seed}", slots=slots, retries=8, sleep=sleep)
    try:
        ids = submit_many(lab, experiments)
        started = time.time()
        nightlab("fleet", "start", cwd=lab)
        done_kills = 0
        restarts = 0
        while done_kills < kills:
            time.sleep(rng.uniform(0.0, 0.8))  # any moment: start-up, recovery, dispatch, recording
            pid = controller_pid(lab)
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                    done_kills += 1
                except ProcessLookupError:
                    pass
            proc = nightlab("status", "--json", cwd=lab, check=False)
            restarts += "restarted it" in proc.stderr
            if proc.returncode != 0:
                raise AssertionError(f"status failed after a kill: {proc.stderr}")
        wait_finished(lab, ids, timeout=600)
        wall = time.time() - started
        nightlab("fleet", "stop", cwd=lab)
        result = audit(lab)
        result.update(
            kills=done_kills,
            restarts_by_cli=restarts,
            wall_seconds=wall,
            lock_free=lock_free(lab),
            leftover_processes=leftovers(lab),
        )
        return result
    finally:
        stop_lab(lab)


def reboot_wave(root: Path, *, experiments: int = 12, slots: int = 4, sleep: float = 1.5) -> dict[str, Any]:
    """Kill every process of the lab at once mid-wave (a reboot), then run `nightlab status`."""
    lab = make_fast_lab(root, name="reboot", slots=slots, sleep=sleep)
    try:
        ids = submit_many(lab, experiments)
        nightlab("fleet", "start", cwd=lab)
        from nightlab.ledger import ExperimentStatus, open_ledger

        deadline = time.time() + 60
        in_flight: list[str] = []
        while time.time() < deadline:
            with open_ledger(lab) as ledger:
                running = ledger.experiments(status=ExperimentStatus.RUNNING, with_metrics=False)
                launched = [a for a in ledger.open_attempts() if a.handle.get("pid")]
            if len(running) == slots and len(launched) == slots:
                break
            time.sleep(0.05)
        killed = kill_all(lab)
        with open_ledger(lab) as ledger:
            in_flight = [
                e.id for e in ledger.experiments(status=ExperimentStatus.RUNNING, with_metrics=False)
            ]
        status = nightlab("status", cwd=lab, check=False)
        wait_finished(lab, ids, timeout=300)
        nightlab("fleet", "stop", cwd=lab)
        result = audit(lab)
        result.update(
            killed_processes=killed,
            in_flight=in_flight,
            status_rc=status.returncode,
            status_stderr=status.stderr,
            lock_free=lock_free(lab),
            leftover_processes=leftovers(lab),
        )
        return result
    finally:
        stop_lab(lab)


READ_COMMANDS = ("status", "results", "show", "wait")


def load_wave(
    root: Path, *, clients: int = 50, rounds: int = 1, experiments: int = 40, slots: int = 4
) -> dict[str, Any]:
    """`clients` concurrent CLI processes (submit / status / results / show / wait, in turn)
    against one lab while a wave runs. Returns latencies per command, lock errors, lost submits."""
    lab = make_fast_lab(root, name="load", slots=slots, sleep=0.5)
    try:
        ids = submit_many(lab, experiments, start=True)
        latencies: dict[str, list[float]] = {k: [] for k in ("submit", *READ_COMMANDS)}
        errors: list[str] = []
        submitted: list[str] = []

        def client(i: int) -> None:
            kind = ("submit", *READ_COMMANDS)[i % 5]
            for r in range(rounds):
                if kind == "submit":
                    args = ["submit", "-m", f"load {i}.{r}", "--seed", str(1000 + i * rounds + r), "--json"]
                elif kind == "show":
                    args = ["show", ids[(i + r) % len(ids)], "--json", "--no-diff"]
                elif kind == "wait":
                    args = ["wait", ids[(i + r) % len(ids)], "--timeout", "300", "--json"]
                else:
                    args = [kind, "--json"]
                t0 = time.perf_counter()
                proc = nightlab(*args, cwd=lab, check=False)
                latencies[kind].append(time.perf_counter() - t0)
                if proc.returncode != 0:
                    errors.append(f"{' '.join(args)} -> {proc.returncode}: {proc.stderr.strip()[-300:]}")
                elif kind == "submit":
                    submitted.extend(e["id"] for e in json.loads(proc.stdout))

        with ThreadPoolExecutor(max_workers=clients) as pool:
            list(pool.map(client, range(clients)))
        from nightlab.ledger import open_ledger

        with open_ledger(lab) as ledger:
            recorded = {e.id for e in ledger.experiments(with_metrics=False)}
        wait_finished(lab, ids + submitted, timeout=600)
        nightlab("fleet", "stop", cwd=lab)
        result = audit(lab)
        expected_submits = sum(rounds for i in range(clients) if i % 5 == 0)
        result.update(
            clients=clients,
            calls=sum(len(v) for v in latencies.values()),
            errors=errors,
            locked=sum("database is locked" in e for e in errors),
            submits_expected=expected_submits,
            submits_ok=len(submitted),
            submits_lost=[s for s in submitted if s not in recorded],
            p50={k: statistics.median(v) for k, v in latencies.items() if v},
            p95={k: _p95(v) for k, v in latencies.items() if v},
        )
        return result
    finally:
        stop_lab(lab)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
