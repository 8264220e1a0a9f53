"""Support for the real-CLI tests: the pinned CLIs, a loopback-only network, the CLIs' settings.

- `installed_clis()`: `@anthropic-ai/claude-code` and `@openai/codex` at the pinned versions,
  installed by `npm install` into a cache outside the repository
  (`$NIGHTLAB_AGENT_CLI_CACHE`, default `~/.cache/nightlab-agent-clis/<package>-<version>`)
  when missing, under a lock so parallel runs install once. ~15 s each, ~400 MB each.
  Without npm the tests are skipped with the command that installs it (tests/needs.py; `.ci/
  install-test-deps` installs it).
- `LoopbackNet`: a thread living in a new network namespace where only `lo` is up. The
  scripted server's socket is bound there and `nightlab agent run` is started from there, so
  the CLIs (and everything they start) can reach the server and nothing else: a new
  phone-home fails at once instead of leaking. Needs CAP_SYS_ADMIN (root); elsewhere the
  tests run on the host network, bound to 127.0.0.1, and `LoopbackNet.reason` says why.
- `cli_env()`: the environment and config each CLI needs to run headless against the server
  (see ../../../shared/agent-clis-offline.md), with its retries cut so failure tests are short.

Not a conftest.py: tests/conftest.py is imported as `conftest` by the other test folders.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import queue
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

PINNED = {"claude": ("@anthropic-ai/claude-code", "2.1.332"), "codex": ("@openai/codex", "0.171.0")}
CLONE_NEWNET = 0x40000000


def cache_root() -> Path:
    if os.environ.get("NIGHTLAB_AGENT_CLI_CACHE"):
        return Path(os.environ["NIGHTLAB_AGENT_CLI_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "nightlab-agent-clis"


CLIS = ("claude", "codex")  # the agent CLIs tested for real, as `--agent` names them


def cli_binary(name: str) -> Path:
    """Where the pinned CLI `name` is (or will be) installed."""
    _, version = PINNED[name]
    return cache_root() / f"{name}-{version}" / "node_modules" / ".bin" / name


def cli_installed(name: str) -> bool:
    return cli_binary(name).exists()


def install_cli(name: str) -> Path:
    """The `bin` directory of the pinned CLI `name`, installed with npm first if missing.

    Tests get here only when npm is on PATH or the CLIs are installed (tests/needs.py).
    """
    package, version = PINNED[name]
    binary = cli_binary(name)
    prefix = binary.parents[2]
    if binary.exists():
        return binary.parent
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm not found: `apt-get install nodejs npm`")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            tmp = prefix.with_name(prefix.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            # the native binary is an optional dependency: never --omit=optional
            proc = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--prefix", str(tmp), f"{package}@{version}"],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"npm install {package}@{version} failed:\n{proc.stderr[-2000:]}")
            shutil.rmtree(prefix, ignore_errors=True)
            os.replace(tmp, prefix)
    return binary.parent


# ---------------------------------------------------------------------------- loopback-only network


class LoopbackNet:
    """Runs callables in a thread inside a fresh network namespace with only `lo` up.

    A socket keeps the namespace it was created in, and a child process inherits the calling
    thread's, so `call(ScriptedServer)` and `call(subprocess.Popen, ...)` put the server and
    the CLIs in the namespace while the test itself stays outside.
    """

    def __init__(self, watchdog: Any = None) -> None:
        self.isolated = False
        self.reason = ""
        self.watchdog = watchdog  # tests/services.py: ends what `agent_run` started if pytest dies
        self._jobs: queue.Queue = queue.Queue()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(ready,), name="loopback-net", daemon=True)
        self._thread.start()
        ready.wait(30)

    def _loop(self, ready: threading.Event) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNET) != 0:
            self.reason = f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())} (needs root)"
        else:
            up = subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True, text=True)
            if up.returncode == 0:
                self.isolated = True
            else:  # a namespace without loopback is useless: the server could not be reached
                self.reason = f"`ip link set lo up` failed: {up.stderr.strip()}"
        ready.set()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, kwargs, box = job
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as e:  # handed back to the caller
                box["error"] = e
            box["done"].set()

    def call(self, fn, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` run in the namespace's thread (or on the host network, see `reason`)."""
        box: dict[str, Any] = {"done": threading.Event()}
        self._jobs.put((fn, args, kwargs, box))
        box["done"].wait()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)


# ---------------------------------------------------------------------------- the CLIs' settings


def cli_env(
    cli: str, server_url: str, home: Path, bins: dict[str, Path], *, model: str | None = None
) -> dict[str, str]:
    """Environment for `nightlab agent run --agent CLI` against the scripted server.

    A fresh HOME per test; retries cut so that an outage costs seconds, not minutes:
    Claude Code 1 retry (its default is 10 over ~3 min), Codex 1 request and 1 stream retry
    (default ~30 requests over ~25 s), an idle stream ends after 3 s.
    """
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "HOME": str(home),
        "PATH": os.pathsep.join(str(b) for b in bins.values()) + os.pathsep + os.environ["PATH"],
    }
    if cli == "claude":
        env.update(
            ANTHROPIC_BASE_URL=server_url,
            ANTHROPIC_API_KEY="scripted-key",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            DISABLE_TELEMETRY="1",
            DISABLE_AUTOUPDATER="1",
            DISABLE_ERROR_REPORTING="1",
            CLAUDE_CODE_MAX_RETRIES="1",
        )
        if model:
            env["ANTHROPIC_MODEL"] = model
        return env
    codex_home = home / ".codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(
        f"""model = "{model or "gpt-5"}"
model_provider = "scripted"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false

[model_providers.scripted]
name = "scripted"
base_url = "{server_url}/v1"
env_key = "SCRIPTED_API_KEY"
wire_api = "responses"
request_max_retries = 1
stream_max_retries = 1
stream_idle_timeout_ms = 3000
"""
    )
    env.update(CODEX_HOME=str(codex_home), SCRIPTED_API_KEY="scripted-key")
    return env


def agent_run(net: LoopbackNet, lab: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    """`nightlab agent run ARGS` started inside the loopback namespace (stdout/stderr piped).

    Its process group is ended by the session's watchdog (tests/services.py) if pytest dies first.
    """
    proc = net.call(
        subprocess.Popen,
        [sys.executable, "-m", "nightlab", "agent", "run", *args],
        cwd=lab,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    if net.watchdog is not None:
        net.watchdog.guard(proc.pid, group=True)
    return proc


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """Wait for a supervisor; on timeout stop it (SIGTERM to its pid, then its group) and fail."""
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        stop(proc)
        out, err = proc.communicate()
        raise AssertionError(f"the supervisor ran past {timeout} s\n{out}\n{err}") from None


def stop(proc: subprocess.Popen) -> None:
    """Stop a supervisor we started, by its pid (it stops its agent), then its process group."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


def state(lab: Path) -> dict:
    """The supervisor's run as the ledger holds it ({} before one started)."""
    from nightlab.agent.control import read_state

    return read_state(lab) or {}
