"""`nightlab doctor`: is this lab and this machine fit to be left alone for a night?

Each check looks at one thing that has cost users a night (stale locks, lost rows, a
controller that looks alive, data from another profile, a full disk) and, when it finds
a problem, names the one command that fixes it. Checks never change the lab; the two
repairs (`restore`, `repair_wal`) are separate functions that refuse while a controller
runs.

The checks work on a damaged lab: nothing here opens the lab through `Lab.open`, which
would stop at the first broken piece. Order: machine (git, Python, torch, disk), then
the lab (config, data, ledger, controller, leases, snapshots, degraded runs), the load
against the CPU slots (a warning: it moves), backups. Measured on the 2-core dev box: 2.7 s
before torch's import left the checks (2.6 s of it), 0.4-0.7 s after (5.4-6.3 s before
under a load of 5.5).

    report = run_checks(lab_dir)
    for c in report.problems: print(c.line())
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nightlab import evidence
from nightlab.errors import LedgerError, NightlabError, UsageError
from nightlab.ledger import ReadOnlyLedger, backup, integrity

MIN_FREE_BYTES = 1 << 30  # 1 GiB: a night of chatty logs (8 MiB kept per run) and a few ledger backups
STALE_LEASE_SECONDS = 120.0  # a live controller heartbeats its runs every second
RECENT_RUNS = 12  # the runs the degraded rate is read over: about one night's wave on a small fleet


@dataclass(frozen=True)
class Check:
    """One finding: `ok` checks carry what was seen, problems carry the fixing command."""

    name: str
    ok: bool
    detail: str
    fix: str | None = None
    warning: bool = False  # ok, but worth a look (a passing state such as the load now): not an exit 1

    def line(self) -> str:
        fix = f"; fix: `{self.fix}`" if self.fix else ""
        if self.ok and self.warning:
            return f"WARN  {self.name}: {self.detail}{fix}"
        if self.ok:
            return f"ok    {self.name}: {self.detail}"
        return f"FAIL  {self.name}: {self.detail}{fix}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "warning": self.warning,
            "detail": self.detail,
            "fix": self.fix,
        }


@dataclass
class Report:
    lab: Path
    checks: list[Check] = field(default_factory=list)
    backups: list[backup.BackupInfo] = field(default_factory=list)

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "lab": str(self.lab),
            "ok": not self.problems,
            "checks": [c.to_dict() for c in self.checks],
            "backups": [b.to_dict() for b in self.backups],
        }


# ---------------------------------------------------------------------------- machine


def _check_git(lab: Path) -> list[Check]:
    if shutil.which("git") is None:
        return [
            Check("git", False, "git is not installed (snapshots are git commits)", "apt-get install git")
        ]
    version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip()
    inside = subprocess.run(["git", "rev-parse", "--git-dir"], cwd=lab, capture_output=True, text=True)
    if inside.returncode != 0:
        return [Check("git", False, f"`{lab}` is not a git repository", f"git -C {lab} init")]
    return [Check("git", True, version)]


def _check_python() -> list[Check]:
    v = sys.version_info
    ok = v >= (3, 11)
    return [
        Check(
            "python",
            ok,
            f"{sys.executable} {v.major}.{v.minor}.{v.micro}",
            None if ok else "install Python 3.11 or newer",
        )
    ]


def _check_torch(config: Any) -> list[Check]:
    """Torch's version and build, read from its metadata: importing it took 2.6 of doctor's 2.7 s
    on the 2-core dev box (8.5 s on a loaded one). It is imported only when nightlab.toml assigns
    GPUs, whose count only torch can check."""
    gpus = [g for p in (config.fleet.pools if config else ()) for g in p.gpus]
    needed = config is not None and (config.target.builtin or gpus)
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is None or importlib.util.find_spec("torch") is None:
        return [Check("torch", not needed, "torch is not installed", "pip install torch")]
    if not gpus:
        return [Check("torch", True, f"torch {version} (no GPU slots configured)")]
    try:
        import torch
    except Exception as e:  # a broken install raises more than ImportError
        return [Check("torch", False, f"cannot import torch ({type(e).__name__}: {e})", "pip install torch")]
    cuda = torch.cuda.is_available()
    device = f"cuda x{torch.cuda.device_count()}" if cuda else "cpu only"
    if not cuda or torch.cuda.device_count() <= max(gpus):
        return [
            Check(
                "torch",
                False,
                f"torch {torch.__version__} sees {device} but nightlab.toml assigns GPUs {gpus}",
                "pip install torch (a CUDA build), or edit `gpus` in nightlab.toml and commit it",
            )
        ]
    return [Check("torch", True, f"torch {torch.__version__}, {device}")]


def _cpu_threads(config: Any) -> int:
    """The threads the lab's local CPU slots run at once when all are busy."""
    from nightlab.fleet.local import local_slots

    pools = [p for p in (config.fleet.pools if config else ()) if p.backend == "local" and not p.gpus]
    return sum(int(s.info["threads"]) for p in pools for s in local_slots(p))


def _check_load(config: Any, own_threads: int) -> list[Check]:
    """Whether other work on this machine leaves the cores the CPU slots need (a warning: load moves).

    The 1-minute load average counts the lab's own runs too (`own_threads`, busy slots now);
    the rest is other work. Runs that get less than 70 % of the CPU they ask for end
    `degraded` (`fleet/health.py`), so slots needing more cores than the others leave are starved.
    """
    threads = _cpu_threads(config)
    if not threads:
        return []
    from nightlab.fleet.capacity import usable_cores

    cores = usable_cores()
    load = os.getloadavg()[0]
    other = max(0.0, load - own_threads)
    free = max(0.0, cores - other)
    seen = f"load {load:.1f} on {cores} cores ({other:.1f} of it other work) for {threads} CPU slot thread(s)"
    if threads <= free + 0.5:  # half a core of slack: a shell or an editor is not starvation
        return [Check("load", True, seen)]
    return [
        Check(
            "load",
            True,
            f"{seen}: runs started now get ~{min(1.0, free / threads):.0%} of the CPU they need and end "
            "`degraded`",
            "end the other work (top shows it) before the night, or lower slots / threads of the "
            "[[fleet.pool]] in nightlab.toml and commit it",
            warning=True,
        )
    ]


def _check_degraded(ledger: ReadOnlyLedger) -> list[Check]:
    """The share of recent runs the machine starved or throttled (`degraded`: never judged, re-run once)."""
    outcomes = ledger.recent_outcomes(RECENT_RUNS)
    degraded = sum(1 for o in outcomes if o == "degraded")
    if not outcomes:
        return [Check("degraded runs", True, "no finished runs yet")]
    seen = f"{degraded} of the last {len(outcomes)} runs degraded"
    if degraded * 3 <= len(outcomes):  # up to a third: a neighbour's burst; more: the machine is the problem
        return [Check("degraded runs", True, seen)]
    return [
        Check(
            "degraded runs",
            False,
            f"{seen} (their machine starved or throttled them: recorded, never judged, each re-run once, "
            "so the night yields little)",
            "free the machine's cores (top shows what uses them), or lower slots / threads of the "
            "[[fleet.pool]] in nightlab.toml and commit it; nightlab results names the starved runs",
        )
    ]


def _check_disk(name: str, path: Path) -> Check:
    free = integrity.free_bytes(path)
    if free is None:
        return Check(name, True, f"`{path}`: free space unknown")
    text = f"{free / 2**30:.2f} GiB free for `{path}`"
    if free < MIN_FREE_BYTES:
        return Check(
            name,
            False,
            f"only {text} (runs fail when it fills)",
            f"free space on the filesystem of {path} (`du -sh {path}/*` finds the big files)",
        )
    return Check(name, True, text)


# ---------------------------------------------------------------------------- lab


def _load_config(lab: Path) -> tuple[Any, list[Check]]:
    from nightlab.config import load_lab_config

    try:
        loaded = load_lab_config(lab)
    except NightlabError as e:
        return None, [Check("config", False, str(e), "edit nightlab.toml and `git commit nightlab.toml`")]
    if loaded.broken is not None:
        text = f"the uncommitted edit is broken and ignored, fix it or drop it ({loaded.broken})"
        return loaded.config, [Check("config", False, text, "git checkout nightlab.toml")]
    note = " (uncommitted edits are not in force)" if loaded.uncommitted else ""
    return loaded.config, [Check("config", True, f"nightlab.toml parses{note}")]


def _check_data(config: Any) -> list[Check]:
    if config is None or not config.profile:
        return []
    from nightlab.harness.cache import load_manifest
    from nightlab.harness.profiles import Profile, data_dir, fingerprint

    try:
        profile = Profile.from_dict(config.profile)
        folder = data_dir(profile)
        load_manifest(folder, profile=profile)
    except NightlabError as e:
        return [Check("data", False, str(e), "nightlab prepare")]
    return [
        Check("data", True, f"fingerprint {fingerprint(profile)} prepared in `{folder}`"),
        _check_disk("disk (data)", folder),
    ]


def _check_ledger(lab: Path) -> tuple[ReadOnlyLedger | None, list[Check]]:
    """Open the ledger read-only and run the full integrity check; returns (ledger, checks)."""
    path = lab / ".nightlab" / "ledger.db"
    if not path.exists():
        return None, [Check("ledger", False, f"`{path}` is missing", "nightlab doctor --restore")]
    cut = integrity.check_wal(path)
    if cut is not None:
        return None, [
            Check("ledger", False, f"{cut}: its last transactions are lost", "nightlab doctor --repair-wal")
        ]
    try:
        ledger = ReadOnlyLedger(path, any_version=True)
    except LedgerError as e:
        return None, [Check("ledger", False, str(e), "nightlab doctor --restore")]
    started = time.perf_counter()
    problems = ledger.check(full=True)
    took = time.perf_counter() - started
    if problems:
        ledger.close()
        shown = "; ".join(problems[:2])
        return None, [Check("ledger", False, f"integrity check failed: {shown}", "nightlab doctor --restore")]
    try:
        n, version = ledger.count(), ledger.schema_version()
    except LedgerError as e:
        ledger.close()
        return None, [Check("ledger", False, str(e), "nightlab doctor --restore")]
    size = path.stat().st_size
    return ledger, [
        Check(
            "ledger",
            True,
            f"integrity ok ({n} experiments, schema v{version}, {size / 2**20:.1f} MiB, checked in {took:.2f} s)",
        )
    ]


def _check_controller(lab: Path, ledger: ReadOnlyLedger) -> list[Check]:
    from nightlab.fleet.daemon import running_pid

    pid = running_pid(lab)
    row = ledger.controller()
    open_attempts = ledger.open_attempts()
    out = []
    if pid is None and row is not None:
        out.append(
            Check(
                "controller",
                False,
                f"the ledger says controller pid {row.pid} runs, but no process holds the lab's lock "
                "(it was killed)",
                "nightlab fleet start",
            )
        )
    elif pid is None:
        out.append(Check("controller", True, "not running (starts with the next submit)"))
    else:
        out.append(Check("controller", True, f"running (pid {pid})"))
    if open_attempts and pid is None:
        ids = ", ".join(f"{a.experiment_id}/{a.number}" for a in open_attempts[:5])
        more = f" and {len(open_attempts) - 5} more" if len(open_attempts) > 5 else ""
        out.append(
            Check(
                "leases",
                False,
                f"{len(open_attempts)} run(s) leased by a controller that is gone ({ids}{more})",
                "nightlab fleet start",
            )
        )
    elif open_attempts:
        now = time.time()
        stale = [a for a in open_attempts if now - a.heartbeat_at > STALE_LEASE_SECONDS]
        if stale:
            out.append(
                Check(
                    "leases",
                    False,
                    f"{len(stale)} run(s) not heartbeaten for over {STALE_LEASE_SECONDS:.0f} s by controller "
                    f"pid {pid} (first: {stale[0].experiment_id}): it is stuck",
                    "nightlab fleet stop && nightlab fleet start",
                )
            )
        else:
            out.append(Check("leases", True, f"{len(open_attempts)} run(s) in flight, all heartbeating"))
    else:
        out.append(Check("leases", True, "no run in flight"))
    return out


def _check_snapshots(lab: Path, ledger: ReadOnlyLedger) -> list[Check]:
    refs = evidence.refs(lab)
    if refs is None:
        return []  # the git check already says why
    rows = ledger.snapshot_states()
    missing = [(eid, snapshot, status) for eid, snapshot, status in rows if eid not in refs]
    if not missing:
        return [Check("snapshots", True, f"{len(rows)} experiments, every ref present")]
    # one git call for all: which of the missing commits are still in the object store
    probe = subprocess.run(
        ["git", "cat-file", "--batch-check"],
        cwd=lab,
        input="".join(f"{snapshot}\n" for _, snapshot, _ in missing),
        capture_output=True,
        text=True,
    )
    # each answer line is "<sha> commit <size>" or "<sha> missing"
    present = {parts[0] for parts in map(str.split, probe.stdout.splitlines()) if parts[1:2] == ["commit"]}
    out = []
    for eid, snapshot, status in missing[:10]:
        if snapshot in present:
            fix = f"git -C {lab} update-ref refs/nightlab/{eid} {snapshot}"
            detail = f"{eid}: ref refs/nightlab/{eid} is missing (its commit is still there)"
        elif not status.is_finished():  # queued / running: it cannot run without its files
            fix = f"nightlab cancel {eid}"
            detail = f"{eid}: its snapshot {snapshot[:12]} is gone from git, so it cannot run"
        else:
            fix = "copy the lab's .git/objects back from a backup of the lab"
            detail = f"{eid}: its snapshot {snapshot[:12]} is gone (diff and adopt will fail)"
        out.append(Check("snapshots", False, detail, fix))
    if len(missing) > 10:
        out.append(
            Check("snapshots", False, f"... and {len(missing) - 10} more experiments without a ref", None)
        )
    return out


def _check_trackers(config: Any, ledger: ReadOnlyLedger) -> list[Check]:
    """Each configured experiment tracker: installed, reachable, its backlog (docs/trackers.md)."""
    from nightlab.ledger import SCHEMA_VERSION
    from nightlab.trackers import tracker_status

    if config is None or not config.trackers or ledger.schema_version() != SCHEMA_VERSION:
        return []
    out = []
    for t in tracker_status(config, ledger):
        name, queued = t["tracker"], t["queued"]
        if not t["installed"]:
            out.append(
                Check(
                    f"tracker {name}",
                    False,
                    f"{name} is not installed; {queued} run(s) queued",
                    f"pip install 'nightlab[{name}]'",
                )
            )
        elif t["error"]:
            since = time.strftime("%Y-%m-%d %H:%M", time.localtime(t["failing_since"]))
            out.append(
                Check(
                    f"tracker {name}",
                    False,
                    f"{t['destination']} failing since {since} ({t['failures']} tries): {t['error']}; "
                    f"{queued} run(s) queued, sent when it works",
                    f"check `[trackers.{name}]` in nightlab.toml, then `nightlab export {name}`",
                )
            )
        else:
            out.append(
                Check(
                    f"tracker {name}", True, f"{t['destination']}: {t['sent']} run(s) sent, {queued} queued"
                )
            )
    return out


def _check_backups(lab: Path, config: Any, report: Report) -> list[Check]:
    ledger_path = lab / ".nightlab" / "ledger.db"
    report.backups = backup.list_backups(ledger_path)
    if not report.backups:
        return [Check("backups", True, "none yet (the controller takes one when it runs)")]
    newest = report.backups[-1]
    age = time.time() - newest.taken_at
    return [
        Check(
            "backups",
            True,
            f"{len(report.backups)} kept, newest {age / 60:.0f} min old: `{newest.path.name}`",
        )
    ]


def run_checks(lab: Path, *, torch_check: bool = True) -> Report:
    """Every check on the lab at `lab` (see the module docstring); never raises for a broken lab."""
    report = Report(lab)
    config, config_checks = _load_config(lab)
    report.checks += _check_git(lab)
    report.checks += _check_python()
    if torch_check:
        report.checks += _check_torch(config)
    report.checks.append(_check_disk("disk (logs)", lab / ".nightlab"))
    report.checks += config_checks
    report.checks += _check_data(config)
    ledger, ledger_checks = _check_ledger(lab)
    report.checks += ledger_checks
    own_threads = 0
    if ledger is not None:
        try:
            report.checks += _check_controller(lab, ledger)
            report.checks += _check_snapshots(lab, ledger)
            report.checks += _check_degraded(ledger)
            own_threads = sum(
                int(w.info.get("threads") or 0)
                for w in ledger.workers()
                if w.state == "busy" and w.backend == "local"
            )
            report.checks += _check_trackers(config, ledger)
        except LedgerError as e:
            report.checks.append(Check("ledger", False, str(e), "nightlab doctor --restore"))
        finally:
            ledger.close()
    report.checks += _check_load(config, own_threads)
    report.checks += _check_backups(lab, config, report)
    return report


# ---------------------------------------------------------------------------- repairs


def _refuse_while_running(lab: Path, what: str) -> None:
    from nightlab.fleet.daemon import running_pid

    pid = running_pid(lab)
    if pid is not None:
        raise UsageError(
            f"a controller (pid {pid}) is using the ledger; stop it with `nightlab fleet stop`, then {what}"
        )


def restore(lab: Path, path: Path | None = None) -> dict[str, Any]:
    """Put a backup (default: the newest good one) in place of the ledger, and recover what the
    lab's files and the damaged ledger still prove (`nightlab.restore`).

    Raises:
        UsageError: a controller runs, or there is no usable backup.
    """
    _refuse_while_running(lab, "restore")
    from nightlab.restore import restore as restore_and_recover

    return restore_and_recover(lab, path)


def repair_wal(lab: Path) -> dict[str, Any]:
    """Keep what a cut WAL committed before the cut: let SQLite recover it, then checkpoint.

    The damaged files are copied aside first (`ledger.db.cut-<time>` and its `-wal`).

    Raises:
        UsageError: a controller runs, or the WAL is not cut.
    """
    _refuse_while_running(lab, "repair")
    ledger_path = lab / ".nightlab" / "ledger.db"
    problem = integrity.check_wal(ledger_path)
    if problem is None:
        raise UsageError(
            "the ledger's write-ahead log is whole; nothing to repair (`nightlab doctor` checks the rest)"
        )
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for suffix in ("", "-wal"):
        src = Path(str(ledger_path) + suffix)
        if src.exists():
            shutil.copy2(src, src.with_name(f"{ledger_path.name}.cut-{stamp}{suffix}"))
    problems, n = integrity.recover_wal(ledger_path)
    if problems:
        raise NightlabError(
            f"the recovered ledger still fails its integrity check ({problems[0]}); run `nightlab doctor --restore`"
        )
    return {"repaired": str(ledger_path), "experiments": n, "kept_copy": f"{ledger_path.name}.cut-{stamp}"}
