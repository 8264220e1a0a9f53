"""A real single-node Slurm cluster and a real SkyPilot API server on 127.0.0.1, for tests.

Brings up, each with its own files under one run directory and its own free port, and
records every PID it starts: munged (own key and socket), slurmctld + slurmd (own
slurm.conf via `SLURM_CONF`; nothing under /etc is changed), a dedicated SSH user
(`nightlab-sky`) and an sshd on 127.0.0.1 for it, and the SkyPilot API server with
`~/.slurm/config`, `~/.sky/config.yaml` and `~/.sky/user_hash` in a temporary HOME.
`down()` cancels every Slurm job of the run, stops each process by PID (SIGTERM, then
SIGKILL) and removes the run's files; `up()` calls it itself when a step fails, and
first stops what an earlier run that died left behind (its PID record survives it).

What is missing is installed: the Debian packages (`apt-get`, as root) and
`skypilot[slurm]==SKYPILOT` (pip, into this interpreter's environment).

Offline staging (this fixture only; a machine with internet needs none of it): SkyPilot's
runtime set-up fetches the uv installer from its vendor's site and then a managed Python
3.10 through uv, which a machine that reaches only package registries cannot. The SSH
user's PATH starts with a `shim/` directory whose `curl` answers that one URL with a
script that installs a local `uv` (from PyPI's `uv` wheel) wrapped so that `--python 3.10`
means the system python3; every other call goes to the real curl. Its pip gets this
machine's pip configuration (`PIP_CONFIG_FILE`) and TLS bundle (`SSL_CERT_FILE`, which uv
needs behind an intercepting proxy) through sshd's `SetEnv`.

The clusters' venvs import nightlab's dependencies from this environment's site-packages,
hard-linked once under `RUNS` and kept across runs (`base_env`): two clusters setting up at once do not each
fetch ~60 packages from the index (only what this environment lacks); what set-up installs
as nightlab is still the controller's shipped wheel.

Measured on the shared 2-core machine (2026-12-01, load average 12-18 from other test
runs): `up()` 96-103 s, most of it `sky check slurm`; the wheelhouse 61 s once.

Usage: `python tests/skypilot_real/localsky.py` brings it up, prints the environment to
use (`HOME`, `SKYPILOT_API_SERVER_LOCAL_PORT`, `SLURM_CONF`) and waits for Ctrl-C;
`python tests/skypilot_real/localsky.py --reap` stops what runs whose owner died left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _pinned_skypilot() -> str:
    """The release the project's `skypilot` extra pins (pyproject.toml): the staging above
    depends on that release's runtime set-up commands."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pin,) = [m.group(1) for r in extra["skypilot"] if (m := re.fullmatch(r"skypilot\[slurm\]==(\S+)", r))]
    return pin


SKYPILOT = _pinned_skypilot()
DEBIAN_PACKAGES = ["slurm-wlm", "slurmctld", "slurmd", "munge", "openssh-server", "openssh-client", "rsync"]
COMMANDS = ["munged", "slurmctld", "slurmd", "sbatch", "scancel", "sinfo", "sshd", "ssh", "rsync"]
SSH_USER = "nightlab-sky"
SLURM_CLUSTER = "localslurm"  # the Host in ~/.slurm/config: `infra = "slurm/localslurm"`
RUNS = Path(tempfile.gettempdir()) / "nightlab-localsky"  # one directory per run; short (unix sockets)
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

CURL_SHIM = """#!/bin/bash
# test fixture only: SkyPilot's runtime set-up pipes the uv installer into sh; install the local uv
for a in "$@"; do
  if [ "$a" = "https://astral.sh/uv/install.sh" ]; then
    printf '%s\\n' 'd="${{UV_INSTALL_DIR:-$HOME/.local/bin}}"; mkdir -p "$d" && cp {uv_wrapper} "$d/uv" && chmod 755 "$d/uv"'
    exit 0
  fi
done
exec /usr/bin/curl "$@"
"""

UV_WRAPPER = """#!/bin/bash
# test fixture only: SkyPilot asks uv for a managed Python 3.10 (a download); use the system python3
args=()
prev=""
for a in "$@"; do
  if [ "$prev" = "--python" ] && [ "$a" = "3.10" ]; then a=/usr/bin/python3; fi
  args+=("$a"); prev="$a"
done
exec {uv} "${{args[@]}}"
"""


PROFILE = """# written by nightlab's tests/skypilot_real/localsky.py (this user exists for those tests)
if [ -f ~/.profile ]; then . ~/.profile; fi
if [ -n "${NIGHTLAB_LOCALSKY_SHIM:-}" ]; then PATH="$NIGHTLAB_LOCALSKY_SHIM:$PATH"; export PATH; fi
"""


class LocalSkyError(RuntimeError):
    """The local cluster could not be brought up (the message names the step and its log)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 120, check: bool = True):
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise LocalSkyError(
            f"`{' '.join(cmd)}` failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}"
        )
    return proc


def _wait(what: str, ok, timeout: float, log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(Exception):
            if ok():
                return
        time.sleep(0.2)
    tail = log.read_text()[-2000:] if log is not None and log.exists() else ""
    raise LocalSkyError(f"{what} not ready after {timeout:.0f} s" + (f"; {log}:\n{tail}" if tail else ""))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False  # a zombie: dead, not yet reaped
    return True


def stop_pid(pid: int, *, group: bool = False, grace: float = 10.0) -> None:
    """SIGTERM a process (or its process group), then SIGKILL it after `grace` seconds."""
    stop_pids([(pid, group)], grace=grace)


def stop_pids(targets: list[tuple[int, bool]], *, grace: float = 10.0) -> None:
    """`stop_pid` for several (pid, group) at once: all get SIGTERM, then one shared `grace` for
    all of them (one after the other, a teardown waited up to `grace` per process)."""
    for pid, group in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            (os.killpg if group else os.kill)(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and any(_alive(pid) for pid, _ in targets):
        time.sleep(0.1)
    for pid, group in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            (os.killpg if group else os.kill)(pid, signal.SIGKILL)


def missing() -> str | None:
    """What this machine lacks and `ensure_installed` cannot add, in one line; None when nothing is.

    Root is needed (slurmd, a dedicated SSH user); the Debian packages are installed when
    missing, as root, with apt-get (`.ci/run` installs them beforehand), and the pinned
    SkyPilot with pip (`make install` installs it through the `skypilot` extra).
    """
    if os.geteuid() != 0:
        return "root (slurmd runs as root, and the tests add the SSH user `nightlab-sky`)"
    if _missing_commands() and shutil.which("apt-get") is None:
        return (
            f"the commands {_missing_commands()}: install the Debian packages "
            f"{' '.join(DEBIAN_PACKAGES)} (`.ci/run` does)"
        )
    return None


def _missing_commands() -> list[str]:
    return [c for c in COMMANDS if shutil.which(c) is None and not Path(f"/usr/sbin/{c}").exists()]


def ensure_installed() -> None:
    """Install the Debian packages and the pinned SkyPilot when missing."""
    missing = _missing_commands()
    if missing:
        if os.geteuid() != 0:
            raise LocalSkyError(
                f"missing {missing}; run as root or `apt-get install {' '.join(DEBIAN_PACKAGES)}`"
            )
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _run(["apt-get", "update", "-qq"], env=env, timeout=600)
        _run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *DEBIAN_PACKAGES],
            env=env,
            timeout=900,
        )
    probe = "import sky, hostlist; print(sky.__version__)"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if found.returncode != 0 or found.stdout.strip() != SKYPILOT:
        _run([sys.executable, "-m", "pip", "install", "-q", f"skypilot[slurm]=={SKYPILOT}"], timeout=900)


def _uv_binary() -> Path:
    """A uv binary from PyPI's `uv` wheel, cached across runs (installed to a temp name, renamed)."""
    home = RUNS / "uv"
    uv = home / "bin" / "uv"
    if not uv.exists():
        tmp = RUNS / f"uv.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        _run([sys.executable, "-m", "pip", "install", "-q", "--target", str(tmp), "uv"], timeout=600)
        with contextlib.suppress(OSError):
            tmp.rename(home)
        shutil.rmtree(tmp, ignore_errors=True)
    return uv


def base_env() -> Path:
    """nightlab's dependencies (torch, scipy, ...) for the clusters: this environment's, hard-linked.

    A worker's set-up spent ~10 minutes pip-installing them into each cluster's fresh venv on
    the loaded 2-core box; `worker_yaml` points each venv at this directory with a `.pth` file
    instead, so set-up installs only the shipped nightlab wheel (seconds). The directory is
    this interpreter's site-packages (the very versions the controller runs) linked file by
    file under `RUNS` (copied where that is another file system), minus nightlab itself.

    It is kept across runs, named by the installed distributions: made in each run's own
    directory, removing its 55,818 entries took most of the ~131 s teardown at load 20-31
    (`rm -rf` alone 19.6 s at load 4). A different environment gets a new one, and the old ones
    go when no other run is using them.
    """
    site = Path(sysconfig.get_paths()["purelib"])
    dists = sorted(d.name for d in site.glob("*.dist-info") if not d.name.lower().startswith("nightlab"))
    key = hashlib.sha256("\n".join([sys.version, str(site), *dists]).encode()).hexdigest()[:12]
    base = RUNS / f"base-{key}"
    if base.is_dir():
        return base
    tmp = RUNS / f"base-{key}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if _run(["cp", "-al", str(site), str(tmp)], timeout=600, check=False).returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)  # another file system: no hard links across it
        _run(["cp", "-a", str(site), str(tmp)], timeout=1200)
    # the clusters install the shipped build themselves; an editable install's hook is no package
    for own in [*tmp.glob("nightlab*"), *tmp.glob("__editable__*nightlab*")]:
        shutil.rmtree(own) if own.is_dir() else own.unlink()
    _run(["chmod", "-R", "a+rX", str(tmp)])  # the SSH user reads it (adds read bits only)
    try:
        tmp.rename(base)
    except OSError:  # a run beside this one made it first
        shutil.rmtree(tmp, ignore_errors=True)
    if len(list(RUNS.glob("run-*"))) <= 1:  # only this run's own directory: no one uses the old ones
        for old in RUNS.glob("base-*"):
            if old != base:
                shutil.rmtree(old, ignore_errors=True)
    return base


def worker_yaml(base: Path) -> str:
    """The default worker YAML with one staging line: the cluster's venv also imports from `base`."""
    from nightlab.fleet.sky_task import WORKER_YAML

    lines = WORKER_YAML.splitlines(keepends=True)
    (i,) = [i for i, line in enumerate(lines) if "python3 -m venv --clear " in line]
    venv = lines[i].split("python3 -m venv --clear ", 1)[1].strip()  # the template's quoted venv path
    stage = (
        "  # test fixture only (tests/skypilot_real/localsky.py): dependencies installed once\n"
        f'  for d in {venv}/lib/python3*/site-packages; do echo {base} > "$d/localsky-base.pth"; done\n'
    )
    return "".join([*lines[: i + 1], stage, *lines[i + 1 :]])


POOL = f"""
[[fleet.pool]]
backend = "skypilot"
tier = "slurm"
workers = 2
infra = "slurm/{SLURM_CLUSTER}"
"""
POOL_WORKERS = ["slurm-slurm-0", "slurm-slurm-1"]  # its workers, as nightlab names them


def add_pool(lab: Path, base: Path, *, extra: str = "") -> None:
    """Give a lab `POOL` (2 SkyPilot workers on this cluster, plus `extra` keys) and `worker_yaml`."""
    toml = lab / "nightlab.toml"
    toml.write_text(toml.read_text().replace("[search]", POOL + extra + "\n[search]"))
    (lab / "fleet").mkdir(exist_ok=True)
    (lab / "fleet" / "skypilot.yaml").write_text(worker_yaml(base))


def _pip_config() -> str:
    """pip.conf for the SSH user: this machine's pip settings (its index, its proxy's certificates).

    Set-up installs the shipped wheel, whose dependencies `base_env` provides, so pip fetches
    only what this environment lacks or holds too old (torch 2.13 asks for setuptools>=77.0.3,
    newer than a venv's own).
    """
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    values: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.split(".", 1)[-1]
        if name and value:
            values.setdefault(name, value.strip().strip("'\""))
    for key, value in os.environ.items():
        if key.startswith("PIP_") and key != "PIP_CONFIG_FILE":
            values[key[4:].lower().replace("_", "-")] = value
    return "[global]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(values.items()))


def reap_stale_runs() -> None:
    """Stop what earlier runs left running (their owner process died) and remove their files."""
    if not RUNS.exists():
        return
    for run in RUNS.glob("run-*"):
        record = run / "pids.json"
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            data = {"owner": None, "pids": {}}
        owner = data.get("owner")
        if owner and _alive(int(owner)):
            continue  # another test session is using it
        for name, pid in reversed(list(data.get("pids", {}).items())):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(run) in cmdline or (name == "api-server" and "sky.server.server" in cmdline):
                stop_pid(int(pid), group=name == "api-server", grace=3)
        _kill_run_processes(run)
        shutil.rmtree(run, ignore_errors=True)


def _descendants(pid: int) -> list[int]:
    """Every live descendant of a process (by /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((proc / "stat").read_text().rsplit(") ", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_run_processes(run: Path) -> None:
    """Stop every process whose environment points at this run's slurm.conf (jobs, steps, shells),
    and the SSH user's sshd sessions whose listener is gone (orphans: no live run owns them)."""
    marker = f"SLURM_CONF={run}/".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            ppid = int((proc / "stat").read_text().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        orphan = ppid == 1 and cmdline.startswith(f"sshd: {SSH_USER}")
        if marker in environ or orphan:
            found.append((int(proc.name), False))
    stop_pids(found, grace=2)


class LocalSky:
    """One run of the local Slurm + SkyPilot stack (see the module docstring).

    Args:
        cpus: the CPUs slurm.conf declares for the node (SkyPilot asks for some per cluster;
            more than the machine has is fine, as jobs here are sleeps and tiny scripts).
        gpus: the GPUs the node declares as generic resources (`Gres=gpu:h100:N`; gres.conf names
            N empty files as their devices): enough for Slurm and SkyPilot to schedule and count
            them (a pool of `accelerators = "H100:4"`, one slot per GPU); no job sees a device.
        watchdog: tests/services.py's `Watchdog`: if this process dies before `down()`, it reaps
            the run (`python localsky.py --reap`: jobs, job steps, sshd sessions) and ends every
            process `_start` started.
    """

    def __init__(self, *, cpus: int = 16, gpus: int = 4, watchdog: Any = None) -> None:
        self.cpus = cpus
        self.gpus = gpus
        self.watchdog = watchdog
        if watchdog is not None:
            watchdog.on_death([sys.executable, str(Path(__file__).resolve()), "--reap"])
        self.root: Path | None = None
        self.pids: dict[str, int] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.env: dict[str, str] = {}
        self.api_port = 0
        self.user_hash = secrets.token_hex(4)
        self.base: Path | None = None  # nightlab's dependencies for the clusters (`base_env`)

    # ------------------------------------------------------------------ paths

    def path(self, *parts: str) -> Path:
        assert self.root is not None
        return self.root.joinpath(*parts)

    @property
    def home(self) -> Path:
        return self.path("home")

    @property
    def slurm_conf(self) -> Path:
        return self.path("slurm", "slurm.conf")

    def _record(self) -> None:
        tmp = self.path("pids.json.tmp")
        tmp.write_text(json.dumps({"owner": os.getpid(), "pids": self.pids}))
        os.replace(tmp, self.path("pids.json"))

    def _start(self, name: str, cmd: list[str], *, env: dict[str, str] | None = None, session: bool = False):
        log = open(self.path("logs", f"{name}.log"), "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=session,
        )
        log.close()
        self.procs[name] = proc
        self.pids[name] = proc.pid
        self._record()
        if self.watchdog is not None:
            self.watchdog.guard(proc.pid, group=session)
        return proc

    def _check_alive(self, name: str) -> bool:
        proc = self.procs[name]
        if proc.poll() is not None:
            log = self.path("logs", f"{name}.log")
            raise LocalSkyError(f"{name} exited with {proc.returncode}; {log}:\n{log.read_text()[-2000:]}")
        return True

    # ------------------------------------------------------------------ up

    def up(self) -> LocalSky:
        """Bring everything up; on any failure tear down what started and raise LocalSkyError."""
        start = time.time()
        ensure_installed()
        RUNS.mkdir(parents=True, exist_ok=True)
        os.chmod(RUNS, 0o755)
        reap_stale_runs()
        self.root = Path(tempfile.mkdtemp(prefix="run-", dir=RUNS))
        os.chmod(self.root, 0o755)  # the SSH user reads slurm.conf, the shims and pip.conf here
        for d in ("logs", "run", "slurm/state", "slurm/spool", "shim", "home/.slurm", "home/.sky"):
            self.path(d).mkdir(parents=True, exist_ok=True)
        self._record()
        try:
            self._munge()
            self._slurm()
            self._ssh()
            self._skypilot()
        except BaseException:
            self.down()
            raise
        self.startup_seconds = time.time() - start
        return self

    def _munge(self) -> None:
        key_dir = self.path("munge-key")
        key_dir.mkdir(mode=0o700)
        key = key_dir / "munge.key"
        key.write_bytes(secrets.token_bytes(128))
        key.chmod(0o400)
        sock = self.path("run", "munge.sock")
        self._start(
            "munged",
            [
                "munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                f"--pid-file={key_dir / 'munged.pid'}", f"--seed-file={key_dir / 'munged.seed'}",
                f"--log-file={self.path('logs', 'munged.file.log')}",
            ],
        )  # fmt: skip
        _wait(
            "munged",
            lambda: self._check_alive("munged") and sock.exists(),
            20,
            self.path("logs", "munged.log"),
        )

    def _slurm(self) -> None:
        node = socket.gethostname().split(".")[0]
        s = self.path("slurm")
        gres = f" Gres=gpu:h100:{self.gpus}" if self.gpus else ""
        self.slurm_conf.write_text(
            f"""# written by tests/skypilot_real/localsky.py for one test run
ClusterName={SLURM_CLUSTER}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.path("run", "munge.sock")}
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
SlurmctldPidFile={s}/slurmctld.pid
SlurmdPidFile={s}/slurmd.pid
StateSaveLocation={s}/state
SlurmdSpoolDir={s}/spool
SlurmctldLogFile={self.path("logs", "slurmctld.file.log")}
SlurmdLogFile={self.path("logs", "slurmd.file.log")}
KillWait=5
MinJobAge=300
GresTypes=gpu
NodeName={node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=16000{gres} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        # generic GPUs: counted and scheduled, never a device. Slurm 22.05's gpu plugin reports 0
        # GPUs for a gres.conf line without `File=` (the node is drained: "gres/gpu count reported
        # lower than configured"), so each GPU is an empty file here (slurmd reads gres.conf
        # beside slurm.conf)
        for i in range(self.gpus):
            s.joinpath(f"gpu{i}").touch()
        files = f"{s}/gpu[0-{self.gpus - 1}]" if self.gpus > 1 else f"{s}/gpu0"
        s.joinpath("gres.conf").write_text(
            f"NodeName={node} Name=gpu Type=h100 File={files}\n" if self.gpus else ""
        )
        env = {**os.environ, "SLURM_CONF": str(self.slurm_conf)}
        self.env["SLURM_CONF"] = str(self.slurm_conf)
        self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.slurm_conf)], env=env)
        self._start("slurmd", ["slurmd", "-D", "-f", str(self.slurm_conf), "-N", node], env=env)

        def idle() -> bool:
            self._check_alive("slurmctld") and self._check_alive("slurmd")
            out = _run(["sinfo", "-h", "-o", "%T"], env=env, timeout=10, check=False).stdout
            return out.strip() == "idle"

        _wait("slurm (sinfo idle)", idle, 45, self.path("logs", "slurmctld.file.log"))
        _run(["srun", "-N1", "-t", "1", "true"], env=env, timeout=60)

    def _ssh(self) -> None:
        try:
            pwd.getpwnam(SSH_USER)
        except KeyError:
            _run(["useradd", "--create-home", "--shell", "/bin/bash", SSH_USER], check=False)
            pwd.getpwnam(SSH_USER)  # a concurrent run may have created it first; either way it exists now
        _run(["usermod", "-p", "*", SSH_USER])  # sshd refuses a user whose password is locked (`!`)
        # SkyPilot runs every command in a login shell, whose /etc/profile resets PATH: the
        # user's profile puts the shims back in front, only for sessions of a fixture's sshd
        profile = Path(pwd.getpwnam(SSH_USER).pw_dir) / ".bash_profile"
        profile.write_text(PROFILE)
        ssh = self.path("ssh")
        ssh.mkdir(mode=0o700)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "id")])
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "host")])
        auth = self.path("auth")  # sshd reads it as the user: outside the private key's directory
        auth.mkdir()
        shutil.copy(ssh / "id.pub", auth / "authorized_keys")
        (auth / "authorized_keys").chmod(0o644)
        uv = _uv_binary()
        wrapper = self.path("shim", "uv-wrapper")
        wrapper.write_text(UV_WRAPPER.format(uv=uv))
        curl = self.path("shim", "curl")
        curl.write_text(CURL_SHIM.format(uv_wrapper=wrapper))
        for f in (wrapper, curl):
            f.chmod(0o755)
        self.base = base_env()
        pip_conf = self.path("pip.conf")
        pip_conf.write_text(_pip_config())
        pip_conf.chmod(0o644)
        self.ssh_port = free_port()
        config = self.path("sshd_config")
        set_env = {
            "NIGHTLAB_LOCALSKY_SHIM": str(self.path("shim")),
            "SLURM_CONF": str(self.slurm_conf),
            "PIP_CONFIG_FILE": str(pip_conf),
            "SSL_CERT_FILE": CA_BUNDLE,
        }
        config.write_text(
            f"""ListenAddress 127.0.0.1
Port {self.ssh_port}
HostKey {ssh / "host"}
PidFile {self.path("run", "sshd.pid")}
AuthorizedKeysFile {auth / "authorized_keys"}
AllowUsers {SSH_USER}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding yes
PermitUserEnvironment no
AcceptEnv SKYPILOT_*
SetEnv {" ".join(f"{k}={v}" for k, v in set_env.items())}
Subsystem sftp internal-sftp
LogLevel INFO
"""
        )
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        self._start("sshd", ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)])
        probe = [
            "ssh", "-i", str(ssh / "id"), "-p", str(self.ssh_port), "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "LogLevel=ERROR", f"{SSH_USER}@127.0.0.1", "sinfo -h -o %T",
        ]  # fmt: skip

        def ssh_ok() -> bool:
            self._check_alive("sshd")
            return _run(probe, timeout=15, check=False).stdout.strip() == "idle"

        _wait("sshd (ssh + sinfo as the SSH user)", ssh_ok, 30, self.path("logs", "sshd.log"))

    def _skypilot(self) -> None:
        home = self.home
        (home / ".slurm" / "config").write_text(
            f"""Host {SLURM_CLUSTER}
  HostName 127.0.0.1
  Port {self.ssh_port}
  User {SSH_USER}
  IdentityFile {self.path("ssh", "id")}
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
"""
        )
        tmpdir = self.path("cluster-tmp")
        tmpdir.mkdir()
        tmpdir.chmod(0o1777)  # the SSH user keeps the clusters' runtime there
        (home / ".sky" / "config.yaml").write_text(
            f"""allowed_clouds: [slurm]
slurm:
  cluster_configs:
    {SLURM_CLUSTER}:
      tmpdir: {tmpdir}
"""
        )
        (home / ".sky" / "user_hash").write_text(self.user_hash)
        self.api_port = free_port()
        # test fixture only: a GPU name (`accelerators = "H100:4"`) makes SkyPilot read its common
        # accelerator catalog, downloaded from GitHub on first use; this machine has no internet,
        # so the one row it looks up is written where that download would land
        catalog = home / ".sky" / "catalogs" / "v8" / "common" / "accelerators.csv"
        catalog.parent.mkdir(parents=True, exist_ok=True)
        catalog.write_text("AcceleratorName,Clouds\nH100,\"['Slurm']\"\n")
        self.env.update(
            {
                "HOME": str(home),
                "SKYPILOT_API_SERVER_LOCAL_PORT": str(self.api_port),
                "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
            }
        )
        env = self.environ()
        self._start(
            "api-server",
            [sys.executable, "-m", "sky.server.server", "--host", "127.0.0.1", "--port", str(self.api_port)],
            env=env,
            session=True,  # its workers share its process group: stopped together
        )

        def healthy() -> bool:
            self._check_alive("api-server")
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/api/health", timeout=5) as r:
                return r.status == 200

        _wait("the SkyPilot API server", healthy, 120, self.path("logs", "api-server.log"))
        sky = str(Path(sys.executable).with_name("sky"))
        out = _run([sky, "check", "slurm"], env=env, timeout=180)
        if "enabled" not in out.stdout.lower():
            raise LocalSkyError(f"`sky check slurm` did not enable Slurm:\n{out.stdout[-2000:]}")

    def environ(self) -> dict[str, str]:
        """This process's environment pointed at the local SkyPilot and Slurm."""
        return {**os.environ, **self.env}

    # ------------------------------------------------------------------ down

    def user_processes(self) -> list[int]:
        """Live processes of the SSH user that belong to this run (sshd sets its SLURM_CONF in each)."""
        uid, marker, found = pwd.getpwnam(SSH_USER).pw_uid, f"SLURM_CONF={self.slurm_conf}".encode(), []
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if (
                    proc.name.isdigit()
                    and proc.stat().st_uid == uid
                    and marker in (proc / "environ").read_bytes()
                ):
                    found.append(int(proc.name))
        return found

    def resident_claims(self) -> list[Path]:
        """Every run a resident runner claimed on this run's clusters (`resident.py`'s `claimed/`)."""
        home = Path(pwd.getpwnam(SSH_USER).pw_dir) / ".sky_clusters"
        return sorted(home.glob(f"*{self.user_hash}*/.nightlab/resident/*/claimed/*"))

    def jobs(self) -> list[str]:
        """Slurm jobs of this run (all users), as `id state name` lines."""
        out = _run(["squeue", "-h", "-o", "%i %T %j"], env=self.environ(), timeout=15, check=False)
        return [line for line in out.stdout.splitlines() if line.strip()]

    def down(self) -> None:
        """Stop everything this run started, by PID, and remove its files. Safe to call twice."""
        if self.root is None:
            return
        env = self.environ()
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            _run(["scancel", "--full", "-u", SSH_USER], env=env, timeout=15, check=False)
            deadline = time.time() + 20
            while time.time() < deadline and self.jobs():
                time.sleep(0.5)
        # sshd's per-connection children outlive the listener: find them before it goes
        children = [
            pid
            for name in ("sshd", "api-server")
            if name in self.pids
            for pid in _descendants(self.pids[name])
        ]
        live = {name: proc for name, proc in self.procs.items() if proc.poll() is None}
        stop_pids([(proc.pid, name == "api-server") for name, proc in live.items()])
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            if self.watchdog is not None:
                self.watchdog.release(proc.pid)
        stop_pids([(pid, False) for pid in children if _alive(pid)], grace=2)
        _kill_run_processes(self.root)
        self._remove_user_files()
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None
        self.pids.clear()
        self.procs.clear()

    def _remove_user_files(self) -> None:
        """The SSH user's cluster homes of this run (their names end in this run's user hash)."""
        with contextlib.suppress(KeyError):
            clusters = Path(pwd.getpwnam(SSH_USER).pw_dir) / ".sky_clusters"
            for d in clusters.glob(f"*{self.user_hash}*"):
                shutil.rmtree(d, ignore_errors=True)
        # SkyPilot's SSH control sockets, named by the user hash
        shutil.rmtree(Path(tempfile.gettempdir()) / f"sky_ssh_{self.user_hash}", ignore_errors=True)
        # the SSH user's uv cache, shared by concurrent runs: removed by the last one
        if not [r for r in RUNS.glob("run-*") if r != self.root]:
            with contextlib.suppress(KeyError):
                uid = pwd.getpwnam(SSH_USER).pw_uid
                shutil.rmtree(Path(tempfile.gettempdir()) / f"uv_cache_{uid}", ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--reap"]:  # the watchdog's command when the test session died
        reap_stale_runs()
        sys.exit(0)
    local = LocalSky().up()
    try:
        print(f"up in {local.startup_seconds:.1f} s; run directory {local.root}")
        for key, value in local.env.items():
            print(f"export {key}={value}")
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        local.down()
