"""Snapshots: the exact files an experiment runs, stored as git commits.

A snapshot is a commit on the hidden ref `refs/nightlab/<id>` whose parent is the lab's
HEAD at submission. It is built with git plumbing and a private index file, so taking
one never touches the user's index or working tree and 20 `nightlab submit` processes
can snapshot at once. Diffs, archives and adoption are then plain git operations.
"""

from __future__ import annotations

import functools
import io
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

from nightlab.errors import SnapshotError

_IDENTITY = ("-c", "user.name=nightlab", "-c", "user.email=nightlab@localhost")


def git(lab_dir: Path, *args: str, input: bytes | None = None, env: dict[str, str] | None = None) -> bytes:
    """Run git in the lab and return stdout; SnapshotError with git's message on failure."""
    full_env = {**os.environ, **(env or {})}
    try:
        proc = subprocess.run(
            ["git", *args], cwd=lab_dir, input=input, capture_output=True, env=full_env, check=False
        )
    except FileNotFoundError as e:
        raise SnapshotError("git is not installed; nightlab stores snapshots as git commits") from e
    if proc.returncode != 0:
        message = proc.stderr.decode(errors="replace").strip().splitlines()
        raise SnapshotError(f"git {args[0]} failed: {message[-1] if message else proc.returncode}")
    return proc.stdout


def git_text(lab_dir: Path, *args: str) -> str:
    return git(lab_dir, *args).decode().strip()


def identity_args(lab_dir: Path) -> tuple[str, ...]:
    """`-c user.*` flags when the machine has no git identity, so commits never fail for want of one."""
    probe = subprocess.run(["git", "config", "user.email"], cwd=lab_dir, capture_output=True, check=False)
    return () if probe.stdout.strip() else _IDENTITY


def head(lab_dir: Path) -> str:
    return git_text(lab_dir, "rev-parse", "HEAD")


def tree_of(lab_dir: Path, commit: str) -> str:
    return git_text(lab_dir, "rev-parse", f"{commit}^{{tree}}")


def create_snapshot(
    lab_dir: Path,
    editable: tuple[str, ...],
    *,
    overrides: dict[str, bytes] | None = None,
    message: str,
    base: str = "HEAD",
) -> tuple[str, str, str]:
    """Commit the editable files (working-tree state, or `overrides`) on top of `base`.

    Returns:
        (commit, tree, parent) hashes; `tree` is git's whole tree, not the research identity the
        ledger keys runs on (`nightlab.identity.of`). The commit is not yet referenced: call `set_ref`.
    """
    overrides = overrides or {}
    base_commit = git_text(lab_dir, "rev-parse", "--verify", f"{base}^{{commit}}")
    with tempfile.TemporaryDirectory(prefix="nightlab-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(lab_dir, "read-tree", base_commit, env=env)
        for name in editable:
            path = lab_dir / name
            if name in overrides:
                content = overrides[name]
            elif path.is_file():
                content = path.read_bytes()
            else:
                git(lab_dir, "update-index", "--force-remove", "--", name, env=env)
                continue
            blob = git(lab_dir, "hash-object", "-w", "--stdin", input=content).decode().strip()
            mode = "100755" if path.is_file() and os.access(path, os.X_OK) else "100644"
            git(lab_dir, "update-index", "--add", "--cacheinfo", f"{mode},{blob},{name}", env=env)
        tree = git(lab_dir, "write-tree", env=env).decode().strip()
    commit = (
        git(lab_dir, *identity_args(lab_dir), "commit-tree", tree, "-p", base_commit, input=message.encode())
        .decode()
        .strip()
    )
    return commit, tree, base_commit


def set_ref(lab_dir: Path, experiment_id: str, commit: str) -> None:
    git(lab_dir, "update-ref", f"refs/nightlab/{experiment_id}", commit)


def read_file(lab_dir: Path, commit: str, name: str) -> bytes:
    return git(lab_dir, "show", f"{commit}:{name}")


@functools.lru_cache(maxsize=32)
def _archive(lab_dir: Path, commit: str) -> bytes:
    # a commit's content never changes, so repeats of a snapshot reuse one archive
    return git(lab_dir, "archive", "--format=tar", commit)


def materialise(lab_dir: Path, commit: str, dest: Path) -> None:
    """Write the snapshot's whole tree into `dest` (created fresh).

    Raises:
        SnapshotError: the commit is gone (e.g. the ref was deleted and git gc ran).
    """
    try:
        archive = _archive(lab_dir, commit)
    except SnapshotError as e:
        raise SnapshotError(f"snapshot `{commit[:12]}` cannot be materialised: {e}") from e
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - older patch releases; git archives hold no links outside the tree
            tar.extractall(dest)


def diff(lab_dir: Path, a: str | None, b: str, *, stat: bool = False) -> str:
    """Unified diff from `a` (or the empty tree) to `b`."""
    args = ["diff", "--no-color", "--stat" if stat else "--patch"]
    if a is None:
        a = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # git's empty tree
    return git(lab_dir, *args, a, b).decode(errors="replace")


def is_dirty(lab_dir: Path, names: tuple[str, ...]) -> list[str]:
    """The editable files whose working-tree content differs from HEAD."""
    out = git(
        lab_dir, "status", "--porcelain", "--", *names
    ).decode()  # not stripped: column 1 may be a space
    return [line[3:] for line in out.splitlines() if line.strip()]


def commit_files(lab_dir: Path, names: list[str], message: str) -> str:
    """Stage and commit exactly `names`; returns the new HEAD."""
    git(lab_dir, "add", "--", *names)
    git(lab_dir, *identity_args(lab_dir), "commit", "--quiet", "--no-verify", "-m", message, "--", *names)
    return head(lab_dir)
