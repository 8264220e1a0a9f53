"""A snapshot's research identity: the files a run uses and the setup it is measured under.

Results are pooled and compared by this key (the ledger's `identity` column, named `tree`
before ledger schema v6), not by the git tree of the whole commit. The whole tree holds the lab's paperwork too, `nightlab.toml`,
`program.md`, notes, agent skills, so a commit of the config alone used to make the same
`train.py` a new, unmeasured incumbent. The key is a sha256 over

    files   every blob of the commit (mode, blob id, path) except the paperwork below;
            the editable files always count, whatever their name
    command the target's command line (it is what runs)
    epoch   `epoch_key`: the measurement setup, i.e. the profile (budget, data, eval tokens...),
            the metric and its direction, the hard timeout, the dataset's source version
            when its split changed while labs used it (`profiles.SOURCE_VERSIONS`), and for a
            built-in target the harness clock's version (`serve.CLOCK_VERSION`)

Paperwork (never run): `nightlab.toml`, Markdown files (`program.md`, `program.nightlab.md`,
READMEs), `.gitignore`, and the `notes/`, `.claude/` and `.agents/` folders.

So a config-only commit that does not touch the measurement keeps the incumbent and all its
runs; one that changes the budget, profile, metric or timeout starts a new comparison
*epoch*: the same files get a new key, their earlier runs stay in the ledger but are never
pooled or compared with the new ones. The epoch key is stored on each experiment too, so
listings can say which epoch a run belongs to.

Keys of a commit never change, so they are cached per commit. `rekey` brings a ledger whose
keys were whole-tree hashes (before this scheme) onto it once.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightlab import snapshots
from nightlab.config import CONFIG_NAME, LabConfig, parse_config, tomllib
from nightlab.errors import ConfigError, NightlabError
from nightlab.harness.profiles import source_version
from nightlab.harness.serve import CLOCK_VERSION

PAPERWORK_FILES = (CONFIG_NAME, ".gitignore")
PAPERWORK_DIRS = ("notes/", ".claude/", ".agents/")
REKEY_META = "identity_scheme"
SCHEME = "files+epoch-v1"


def measurement(config: LabConfig) -> dict[str, Any]:
    """What decides how a result is measured; a change of any of it starts a new epoch.

    A dataset whose source changed its split since (`profiles.SOURCE_VERSIONS`) adds its version,
    so its labs start a new epoch and every other lab keeps its key. A built-in-target lab adds the
    harness clock's version (`serve.CLOCK_VERSION`): version 2 (issue 30) serves one repeated batch in
    the warm-up and times runs in the supervisor, so its results are not pooled with earlier ones.
    """
    out: dict[str, Any] = {
        "profile": config.profile,
        "metric": config.metric.name,
        "direction": config.metric.direction,
        "timeout": config.target.timeout,
    }
    version = source_version(str(config.profile.get("dataset", ""))) if config.profile else None
    if version is not None:
        out["source_version"] = version
    if getattr(config.target, "builtin", False):  # the harness's clock measures its runs
        out["clock"] = CLOCK_VERSION
    return out


def epoch_key(config: LabConfig) -> str:
    """A short stable key of `measurement(config)`."""
    text = json.dumps(measurement(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _is_paperwork(path: str, editable: tuple[str, ...]) -> bool:
    if path in editable:
        return False
    return path in PAPERWORK_FILES or path.endswith(".md") or path.startswith(PAPERWORK_DIRS)


@functools.lru_cache(maxsize=4096)
def _config_of(lab_dir: Path, commit: str) -> LabConfig:
    """The configuration committed in `commit`."""
    try:
        text = snapshots.git(lab_dir, "show", f"{commit}:{CONFIG_NAME}").decode("utf-8")
        return parse_config(tomllib.loads(text))
    except (NightlabError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"commit {commit[:12]} has no readable {CONFIG_NAME}: {e}") from e


@functools.lru_cache(maxsize=4096)
def _files_of(lab_dir: Path, commit: str, editable: tuple[str, ...]) -> str:
    """Digest of the run files of `commit` (everything but the paperwork)."""
    listing = snapshots.git(lab_dir, "ls-tree", "-r", "--full-tree", commit).decode("utf-8", "replace")
    h = hashlib.sha256()
    for line in listing.splitlines():
        meta, _, path = line.partition("\t")
        if not _is_paperwork(path, editable):
            mode, _kind, blob = meta.split()
            h.update(f"{mode} {blob} {path}\n".encode())
    return h.hexdigest()


def _of_commit(lab_dir: Path, commit: str) -> tuple[str, LabConfig]:
    """(digest of the run files, the commit's own configuration)."""
    config = _config_of(lab_dir, commit)
    return _files_of(lab_dir, commit, config.target.editable), config


def _key(files: str, config: LabConfig) -> str:
    text = f"{files}\ncommand {config.target.command}\nepoch {epoch_key(config)}\n"
    return hashlib.sha256(text.encode()).hexdigest()


def _commit(lab_dir: Path, rev: str) -> str:
    if len(rev) == 40 and all(c in "0123456789abcdef" for c in rev):
        return rev  # already a commit hash (a snapshot): no git call
    return snapshots.git_text(lab_dir, "rev-parse", "--verify", f"{rev}^{{commit}}")


def of(lab_dir: Path, rev: str = "HEAD", *, config: LabConfig | None = None) -> str:
    """The research identity of a commit (`HEAD`, a snapshot hash, ...).

    `config` is the configuration the run is measured under (the one in force when it was
    submitted); by default the commit's own, which for HEAD is the one in force.
    """
    lab_dir = Path(lab_dir)
    commit = _commit(lab_dir, rev)
    if config is None:
        config = _config_of(lab_dir, commit)
    return _key(_files_of(lab_dir, commit, config.target.editable), config)


@dataclass(frozen=True)
class Incumbent:
    """The lab's incumbent: its commit (HEAD) and its research identity (what its runs are keyed on)."""

    commit: str
    identity: str


def incumbent(lab_dir: Path) -> Incumbent:
    """The incumbent now, with one git process (`rev-parse HEAD`); the identity of a commit is cached.

    Every caller that needs HEAD or its identity asks this: an operation that reads the incumbent
    once and passes it on judges every run against the same one, even if HEAD moves meanwhile.
    """
    lab_dir = Path(lab_dir)
    commit = snapshots.head(lab_dir)
    return Incumbent(commit, of(lab_dir, commit))


def rekey(lab_dir: Path, ledger: Any) -> int:
    """Re-key a ledger written before this scheme (keys were whole-tree hashes); returns rows changed.

    Runs once per ledger (a `meta` entry records it). A snapshot whose commit is gone keeps
    its old key, which then matches nothing new.
    """
    if ledger.meta(REKEY_META) == SCHEME:
        return 0
    changed: dict[str, tuple[str, str]] = {}
    for e in ledger.experiments(with_metrics=False):
        if e.snapshot in changed:
            continue
        try:
            files, own = _of_commit(Path(lab_dir), e.snapshot)
        except NightlabError:
            continue
        changed[e.snapshot] = (_key(files, own), epoch_key(own))
    return ledger.rekey(changed, meta=(REKEY_META, SCHEME))


def _changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """`key a → b` for each measurement setting that differs (profile keys one by one)."""
    out = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}.{c}" for c in _changes(a, b)]
        else:
            out.append(f"{key} {json.dumps(a, default=str)} → {json.dumps(b, default=str)}")
    return out


def epoch_info(lab_dir: Path, ledger: Any, config: LabConfig) -> dict[str, Any]:
    """Which comparison epoch the configuration in force is, for `results`, the dashboard and the CLI.

    Returns:
        number (1-based, in order of first use), key, total epochs, `since` (its first
        experiment, None when it has none yet) and `changes` against the epoch before it.
    """
    key = epoch_key(config)
    first = {epoch: (eid, snapshot) for epoch, eid, snapshot in ledger.epochs()}
    order = list(first)
    number = order.index(key) + 1 if key in first else len(order) + 1
    changes: list[str] = []
    if number > 1:
        try:
            _, before = _of_commit(Path(lab_dir), first[order[number - 2]][1])
            changes = _changes(measurement(before), measurement(config))
        except NightlabError:
            changes = []
    return {
        "number": number,
        "key": key,
        "total": max(len(order), number),
        "since": first[key][0] if key in first else None,
        "changes": changes,
    }


def epoch_line(info: dict[str, Any]) -> str | None:
    """One line about the epoch for people, or None while the lab has only ever had one."""
    if info["total"] <= 1:
        return None
    changed = f" ({', '.join(info['changes'])})" if info["changes"] else ""
    since = f"since {info['since']}" if info["since"] else "no runs yet"
    return (
        f"comparison epoch {info['number']} of {info['total']}{changed}, {since}: results of other "
        "epochs were measured differently and are never compared with these"
    )
