"""The training sandbox: what a built-in-target run's train.py can read and write.

Mechanism: bubblewrap (`bwrap`, Debian/Ubuntu package `bubblewrap`, the sandbox Flatpak is built
on). Chosen over Landlock because (1) it comes from the distribution, not from a young Python
binding (the PyPI `landlock` package was at 1.0.0.dev5 when this was written); (2) mount
namespaces *hide* paths (a tmpfs over the data root, /dev/null over the validation files) where
Landlock can only allow-list whole trees, which would mean enumerating every path Python, torch
and CUDA need; (3) a PID namespace with `--die-with-parent` ends every process the run started,
so nothing it spawned outlives it to rewrite the result; (4) it wraps any command, not only
Python. Checked on this project's dev container (Debian 12, bwrap 0.8.0, running as root) and it
works there; where it cannot start (no user namespaces for an unprivileged user, no bwrap) the
run goes on unsandboxed and is flagged `unsandboxed`.

Inside the sandbox:
- everything is read-only (`--ro-bind / /`): the installed nightlab package, the lab, its git;
- the data root (every profile's data, the raw downloads, the demo corpus's validation secret) is
  replaced by an empty tmpfs, and only the profile's manifest and tokenizer are bound back,
  read-only; the token files, training and validation, cannot be read (the supervisor serves the
  training batches: `serve.py`);
- a `local:` dataset's files and folders (`SandboxPlan.hidden`), resolved through symlinks, are
  hidden the same way: a folder becomes an empty tmpfs, a file cannot be read; whatever the run
  needs inside a hidden folder (its Python, the lab) is bound back, read-only, with the corpus
  files in it still hidden;
- the lab's `.nightlab/` is an empty tmpfs: no ledger, no other attempt, no supervisor result;
  only this attempt's `work/` (the snapshot) and `handoff/` (where the model goes) are writable;
- /tmp is private, except the compile caches torch needs (inductor, triton), bound writable, and,
  read-only, whatever of the Python running nightlab and of the lab lives under /tmp (a venv or a
  checkout there, as in a CI clone) — hiding those would leave the run without its interpreter;
- a new PID namespace and session: the supervisor is not visible, and cannot be signalled.

Usage:
    argv, mode = wrap(["/bin/sh", "-c", cmd], plan=SandboxPlan(...))   # mode "bwrap" | "none"
"""

from __future__ import annotations

import functools
import getpass
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from nightlab.harness.profiles import DATA_ROOT_ENV

__all__ = ["INSTALL_HINT", "SandboxPlan", "available", "wrap"]

INSTALL_HINT = "install bubblewrap (`apt-get install bubblewrap`) to sandbox runs"
_TRAIN_FILES = ("manifest.json", "tokenizer.tiktoken")
# the token files: the supervisor alone reads the training split and serves it (serve.py), so a run
# cannot train on it outside the clock (in the warm-up, past the budget); validation is never shown
_HIDDEN_FILES = ("train.tokens.bin", "train.offsets.bin", "val.tokens.bin", "val.offsets.bin")


@dataclass(frozen=True)
class SandboxPlan:
    """What one attempt's sandbox exposes.

    Attributes:
        data_dir: the profile's prepared data, `data_root / fingerprint` (training files exposed,
            validation hidden).
        data_root: the folder of every profile's data and raw downloads (hidden entirely).
        lab_dir: the lab; its `.nightlab/` is hidden.
        writable: the folders the run may write (its work and handoff folders), created if missing.
        caches: compile caches the run may write (`default_caches`).
        hidden: files and folders the run must not read, whatever path leads there (a `local:`
            dataset's: `sources.source_paths`).
    """

    data_dir: Path
    data_root: Path
    lab_dir: Path
    writable: tuple[Path, ...]
    caches: tuple[Path, ...] = field(default_factory=tuple)
    hidden: tuple[Path, ...] = field(default_factory=tuple)


def default_caches() -> tuple[Path, ...]:
    """The compile caches a run may write: torch inductor's, triton's (created if missing)."""
    user = getpass.getuser()
    inductor = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or f"/tmp/torchinductor_{user}")
    triton = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton")
    return inductor, triton


@functools.cache
def available() -> str | None:
    """None when bwrap can start a sandbox here, else why not (one line)."""
    if os.environ.get("NIGHTLAB_NO_SANDBOX") == "1":
        return "NIGHTLAB_NO_SANDBOX=1 is set; unset it to sandbox runs"
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap not found; " + INSTALL_HINT
    try:
        probe = subprocess.run(
            [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "true"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap failed to start ({e})"
    if probe.returncode != 0:
        first = (probe.stderr.strip().splitlines() or ["no output"])[0]
        return f"bwrap cannot create a sandbox here ({first}); allow user namespaces or run as root"
    return None


def _needed_inside(plan: SandboxPlan, masks: list[Path]) -> list[Path]:
    """The folders inside `masks` the run needs to see: its Python, nightlab's import path, the lab.

    Nested ones are kept: a hidden folder may lie between them (a venv inside a corpus inside the lab).
    """
    import nightlab

    wanted = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), plan.lab_dir}
    wanted.add(Path(nightlab.__file__).resolve().parent.parent)
    wanted.update(Path(entry) for entry in sys.path if entry and Path(entry).is_dir())
    # both spellings: the command names the venv as given, a symlinked folder resolves elsewhere
    both = {form for p in wanted if p.exists() for form in (p.absolute(), p.resolve())}
    return sorted(p for p in both - set(masks) if any(p.is_relative_to(m) for m in masks))


def _hiding_mounts(plan: SandboxPlan) -> list[str]:
    """bwrap's mounts for the private /tmp and `plan.hidden`, with what the run needs bound back.

    Hidden paths are resolved, so no symlink leads around them. A folder becomes an empty tmpfs, a
    file `/dev/null` (unreadable: a device on a nodev mount), the latter only where the run could
    see it otherwise. The mounts go shallowest first, so the deepest one decides what the run sees
    at any path: a corpus folder inside the lab stays hidden though the lab is bound back.
    """
    resolved = {p.resolve() for p in plan.hidden if p.exists()}
    masks = [Path("/tmp"), *(p for p in resolved if p.is_dir())]
    needed = _needed_inside(plan, masks)
    mounts = [(p, ["--tmpfs", str(p)]) for p in masks] + [(p, ["--ro-bind", str(p), str(p)]) for p in needed]
    for file in sorted(resolved - set(masks)):
        around = [a for a in (*masks, *needed) if file.is_relative_to(a)]
        if not around or max(around, key=lambda a: len(a.parts)) in needed:
            mounts.append((file, ["--ro-bind", "/dev/null", str(file)]))
    return [arg for _, mount in sorted(mounts, key=lambda m: len(m[0].parts)) for arg in mount]


def wrap(argv: list[str], *, plan: SandboxPlan) -> tuple[list[str], str]:
    """The command line that runs `argv` in the sandbox, and the mode: "bwrap", or "none".

    The writable folders and caches are created here, so the bind mounts find them.
    """
    if available() is not None:
        return argv, "none"
    # the host's /dev, not bwrap's minimal one: CUDA and ROCm need /dev/nvidia*, /dev/kfd, /dev/dri
    args = [
        shutil.which("bwrap") or "bwrap",
        "--ro-bind",
        "/",
        "/",
        "--dev-bind",
        "/dev",
        "/dev",
        "--proc",
        "/proc",
    ]
    args += ["--unshare-pid", "--unshare-ipc", "--die-with-parent", "--new-session"]
    args += _hiding_mounts(plan)  # before the data root's and the lab's mounts below, so those still apply
    for cache in plan.caches:
        cache.mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(cache), str(cache)]
    # Resolved: bwrap cannot mount over a destination reached through an absolute symlink (it resolves
    # it outside the sandbox's new root: "Can't mount tmpfs ... No such file or directory"), so a data
    # root named through one stopped every run. The run is told the real path, so it needs no symlink
    # inside (one under the private /tmp would be gone).
    data_dir = plan.data_dir.resolve()
    args += ["--setenv", DATA_ROOT_ENV, str(plan.data_root.resolve())]
    for hidden in {plan.data_root.resolve(), data_dir.parent}:
        if hidden.exists():
            args += ["--tmpfs", str(hidden)]
    for name in _TRAIN_FILES:
        path = data_dir / name
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    for name in _HIDDEN_FILES:  # present but unreadable: the loader fails, nothing leaks
        if (data_dir / name).exists():  # bwrap cannot create a mount point in the read-only root
            args += ["--ro-bind", "/dev/null", str(data_dir / name)]
    nightlab_dir = plan.lab_dir / ".nightlab"
    if nightlab_dir.exists():
        args += ["--tmpfs", str(nightlab_dir)]
    for folder in plan.writable:
        folder.mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(folder), str(folder)]
    return [*args, "--chdir", os.getcwd(), "--", *argv], "bwrap"
