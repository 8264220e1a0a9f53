"""`nightlab.toml`: the lab's configuration, parsed into frozen dataclasses.

Every key is checked when the lab is opened, so a typo fails at once with the key's name
instead of deep inside a run. Unknown keys are errors too: a misspelled `timeout` that
silently fell back to the default would cost a night of GPU time.

The dataclasses are the schema (`_schema.py`): each field is one key, with its one default, its
type and its check; `_parse.py` reads a document by them. Loading (which file is in force) is here.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from nightlab.config._parse import parse_config
from nightlab.config._schema import (
    CONFIG_NAME,
    FOREIGN_TIMEOUT,
    AgentConfig,
    FleetConfig,
    LabConfig,
    MetricConfig,
    MlflowConfig,
    PoolConfig,
    SearchConfig,
    TargetConfig,
    TrackersConfig,
    WandbConfig,
    cluster_gpus,
    pool_slots,
    slots_per_cluster,
)
from nightlab.errors import ConfigError

__all__ = [
    "CONFIG_NAME",
    "FOREIGN_TIMEOUT",
    "UNCOMMITTED_WARNING",
    "AgentConfig",
    "FleetConfig",
    "LabConfig",
    "LoadedConfig",
    "MetricConfig",
    "MlflowConfig",
    "PoolConfig",
    "SearchConfig",
    "TargetConfig",
    "TrackersConfig",
    "WandbConfig",
    "cluster_gpus",
    "load_config",
    "load_lab_config",
    "parse_config",
    "pool_slots",
    "slots_per_cluster",
    "tomllib",
]


def load_config(path: Path) -> LabConfig:
    """Read and validate the lab's `nightlab.toml`."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ConfigError(f"`{path}` is missing; run `nightlab init` to create a lab") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{CONFIG_NAME} is not valid TOML: {e}") from e
    return parse_config(doc)


@dataclass(frozen=True)
class LoadedConfig:
    """The configuration in force, and how the working copy differs from it.

    Attributes:
        uncommitted: the working copy differs from the committed file (not in force).
        broken: why the working copy does not load (bad TOML with its line, or the bad key),
            None when it loads; it is ignored either way, the committed file rules.
    """

    config: LabConfig
    uncommitted: bool
    broken: str | None = None

    @property
    def warning(self) -> str | None:
        """The one stderr line about the working copy, or None when it is the committed file."""
        if self.broken is not None:
            return (
                f"warning: the uncommitted {CONFIG_NAME} is broken and ignored ({self.broken}); the "
                f"committed version is in force: fix the edit, or drop it with `git checkout {CONFIG_NAME}`"
            )
        return UNCOMMITTED_WARNING if self.uncommitted else None


def load_lab_config(lab_dir: Path) -> LoadedConfig:
    """The lab's configuration as committed on its branch (HEAD:nightlab.toml).

    The committed file is the one in force, for the controller and the CLI alike: an agent
    editing nightlab.toml cannot quietly change the time limit or the metric, and every
    result's configuration is recorded in git. Uncommitted edits are still parsed, so a bad
    key or a TOML syntax error is named at once (`broken`, the caller warns), yet it blocks
    nothing: `nightlab results` works while someone is half-way through an edit. Outside a
    git checkout (a synced copy on a remote worker) the file on disk is used.

    Raises:
        ConfigError: naming the first bad key of the committed file (or of the file on disk
            outside git).
    """
    import subprocess

    path = lab_dir / CONFIG_NAME
    try:
        proc = subprocess.run(
            ["git", "show", f"HEAD:{CONFIG_NAME}"], cwd=lab_dir, capture_output=True, check=False
        )
    except OSError:  # no such directory, or no git: the file on disk (or its clear error)
        proc = None
    if proc is None or proc.returncode != 0:
        return LoadedConfig(load_config(path), uncommitted=False)
    committed = proc.stdout.decode("utf-8")
    try:
        working = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        working = committed
    try:
        config = parse_config(tomllib.loads(committed))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"the committed {CONFIG_NAME} is not valid TOML: {e}") from e
    if working == committed:
        return LoadedConfig(config, uncommitted=False)
    try:
        load_config(path)
    except ConfigError as e:
        return LoadedConfig(config, uncommitted=True, broken=str(e))
    return LoadedConfig(config, uncommitted=True)


UNCOMMITTED_WARNING = (
    f"warning: {CONFIG_NAME} has uncommitted edits; nightlab uses the committed version until you "
    f"`git commit {CONFIG_NAME}`"
)
