"""The sections of `nightlab.toml` as frozen dataclasses: the schema `_parse` reads by.

Each field of a section is one key of its table: its default is the field's (written nowhere
else), its type the annotation (`float` takes an integer too, a tuple is a TOML list), and its
metadata may carry the key's name where it differs (`[[fleet.pool]]` -> `pools`) and the check
of one value (`_rule`). What spans several keys is checked by the section's `_parse_*`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_NAME = "nightlab.toml"
_SUMMARY_KEY = re.compile(r"[A-Za-z_][\w.\-]*")  # what fleet.runner reads as a summary key
_TIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")  # part of worker names, shown in every table
FOREIGN_TIMEOUT = 600.0  # autoresearch's rule: a run that takes over 10 minutes is killed

# What is wrong with one value, as the `nightlab.toml: ...` line says it; None when it is fine.
# It gets the value as the field holds it (a float, a tuple), as written, and the dotted key.
_Check = Callable[[Any, Any, str], "str | None"]


def _rule(ok: Callable[[Any], bool], message: str) -> dict[str, _Check]:
    """Field metadata: a value `ok` refuses fails with `message`, formatted with `key` (the dotted
    key), `v` (the value as the field holds it) and `raw` (as written)."""

    def check(v: Any, raw: Any, key: str) -> str | None:
        return None if ok(v) else message.format(key=key, v=v, raw=raw)

    return {"check": check}


def _editable_paths(v: tuple, raw: Any, key: str) -> str | None:
    if not v or not all(isinstance(e, str) and e for e in v):
        return f"`{key}` must be a non-empty list of file names"
    for name in v:
        # snapshots read these from the working tree: a name must stay inside the lab
        if name.startswith(("/", "\\")) or ".." in Path(name).parts or "\0" in name or name.strip() != name:
            return f"`{key}` entry `{name!r}` must be a file path inside the lab, e.g. `train.py` or `src/model.py`"
    return None


def _command_lines(v: dict, raw: Any, key: str) -> str | None:
    for name, line in v.items():
        if not isinstance(line, str) or not line.strip():
            return f"`{key}.{name}` must be a non-empty command line"
    return None


def _gpu_indices(gpus: tuple) -> bool:
    return all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)


def _share(v: float) -> bool:
    return 0 <= v <= 1


_SHARE = "`{key}` must be between 0 (off) and 1, got `{v:g}`"
_W_AND_B_NAME = "`{key}` is `{v!r}`; use letters, digits, `_`, `.`, `-`"


def _w_and_b_name(v: str) -> bool:
    return re.fullmatch(r"[\w.\-]{1,128}", v) is not None  # path segments of a W&B run's page


@dataclass(frozen=True)
class TargetConfig:
    command: str = field(
        metadata=_rule(
            lambda v: v.strip() and "\0" not in v, "`{key}` must be a command line, e.g. `python train.py`"
        )
    )
    editable: tuple[str, ...] = field(metadata={"check": _editable_paths})
    timeout: float = field(
        default=FOREIGN_TIMEOUT, metadata=_rule(lambda v: v > 0, "`{key}` must be positive, got `{v}`")
    )
    builtin: bool = False

    @property
    def entry_files(self) -> tuple[str, ...]:
        """The editable files the command names (`python train.py` -> `train.py`): a snapshot
        without one can only crash (python exits 2, "can't open file", no traceback).

        Only what the command line shows is knowable; a file it reaches otherwise (`python -m
        pkg`, an import) is not checked.
        """
        import shlex
        from pathlib import PurePosixPath

        try:
            words = shlex.split(self.command)
        except ValueError:  # unbalanced quotes: the shell will say so at run time
            return ()
        named = {str(PurePosixPath(w)) for w in words}  # `./train.py` names `train.py`
        return tuple(name for name in self.editable if str(PurePosixPath(name)) in named)


@dataclass(frozen=True)
class MetricConfig:
    name: str = field(
        default="val_bpb",
        metadata=_rule(
            _SUMMARY_KEY.fullmatch,
            "`{key}` is `{v!r}`; it must be a summary key such as `val_bpb` (letters, digits, `_`, `.`, `-`)",
        ),
    )
    direction: str = field(
        default="lower",
        metadata=_rule(lambda v: v in ("lower", "higher"), "`{key}` is `{v}`; use `lower` or `higher`"),
    )

    @property
    def lower_is_better(self) -> bool:
        return self.direction == "lower"


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """One group of workers of one tier on one backend."""

    backend: str = field(
        default="local",
        metadata=_rule(lambda v: v in ("local", "skypilot"), "`{key}` is `{v}`; use `local` or `skypilot`"),
    )
    tier: str = field(metadata=_rule(_TIER.fullmatch, "`{key}` is `{v!r}`; use a name like `h100` or `cpu`"))
    slots: int = 1  # a skypilot pool's `workers`: its clusters
    threads: int | None = field(
        default=None, metadata=_rule(lambda v: v >= 1, "`{key}` must be at least 1, got `{v}`")
    )
    gpus: tuple[int, ...] = field(
        default=(), metadata=_rule(_gpu_indices, "`{key}` must be a list of GPU indices, got `{v!r}`")
    )
    options: dict[str, Any] = field(default_factory=dict)  # backend-specific keys (accelerators, infra, ...)
    # a screening rung (issue 34): the tier trains this many seconds instead of the profile's budget
    budget_seconds: float | None = field(
        default=None,
        metadata=_rule(
            lambda v: v > 0, "`{key}` must be a positive number of seconds, e.g. `10`, got `{raw}`"
        ),
    )
    promote_to: str | None = None  # the next rung: the tier a run here is promoted to (`nightlab.rungs`)


@dataclass(frozen=True)
class FleetConfig:
    pools: tuple[PoolConfig, ...] = field(metadata={"key": "pool"})  # [[fleet.pool]], see `_parse_pool`
    default_tier: str  # the first pool's tier when left out
    idle_shutdown: float = field(
        default=900.0, metadata=_rule(lambda v: v >= 0, "`{key}` must be 0 or more seconds, got `{v}`")
    )
    retries: int = field(default=2, metadata=_rule(lambda v: v >= 0, "`{key}` must be 0 or more, got `{v}`"))
    backup_interval: float = 600.0  # seconds between the controller's online ledger backups
    backups: int = 5  # periodic backups kept in .nightlab/backups/
    # machine health (fleet/health.py): a run that got less of the CPU it asked for, or ran at
    # less of its GPU's max SM clock, is `degraded`; 0 turns the check off
    min_cpu_share: float = field(default=0.7, metadata=_rule(_share, _SHARE))
    min_clock_share: float = field(default=0.8, metadata=_rule(_share, _SHARE))
    # allow local slots that together ask for more threads than this machine's cores, or that
    # share a GPU: every run then competes with its neighbours and most end `degraded`
    oversubscribe: bool = False

    @property
    def tiers(self) -> list[str]:
        return sorted({p.tier for p in self.pools})


@dataclass(frozen=True)
class SearchConfig:
    z: float = 2.0
    incumbent_max_age_waves: int = 3
    promote_top_k: int = 3
    # successive halving: a screening run is promoted when it ranks in the top 1/eta
    eta: int = field(
        default=3,
        metadata=_rule(lambda v: v >= 2, "`{key}` must be at least 2 (3 promotes the top third), got `{v}`"),
    )


@dataclass(frozen=True)
class AgentConfig:
    """`[agent]`: how `nightlab agent run` starts and watches a coding agent (docs/agents.md)."""

    default: str = "claude"  # the agent `--agent` defaults to
    stall_seconds: float | None = None  # None: derived from target.timeout by the supervisor
    max_restarts_per_hour: int = 6
    # agent name -> command line (overrides built-ins)
    commands: dict[str, str] = field(default_factory=dict, metadata={"check": _command_lines})
    # API outage: wait api_backoff_seconds before the first retry, doubling up to the cap
    api_backoff_seconds: float = 30.0
    api_backoff_max_seconds: float = 900.0
    # USD per million tokens for a CLI that reports tokens but no cost (Codex). The defaults are
    # OpenAI's list prices for gpt-5 (2026-12): input 1.25, cached input 0.125, output 10.
    # In nightlab.toml a table: `[agent.token_prices]` input, cached_input, output (`_parse_agent`).
    token_prices: tuple[float, float, float] = (1.25, 0.125, 10.0)


@dataclass(frozen=True)
class WandbConfig:
    """`[trackers.wandb]`: where every finished run is logged in Weights & Biases (docs/trackers.md)."""

    project: str = field(metadata=_rule(_w_and_b_name, _W_AND_B_NAME))
    # None: the API key's default entity
    entity: str | None = field(default=None, metadata=_rule(_w_and_b_name, _W_AND_B_NAME))
    # online | offline (runs kept under .nightlab/wandb/ for `wandb sync`)
    mode: str = field(
        default="online",
        metadata=_rule(lambda v: v in ("online", "offline"), "`{key}` is `{v}`; use `online` or `offline`"),
    )

    @property
    def key(self) -> str:
        """The destination: a new project (or mode) starts its own outbox cursor."""
        return f"wandb:{self.entity or ''}/{self.project}" + (":offline" if self.mode == "offline" else "")


@dataclass(frozen=True)
class MlflowConfig:
    """`[trackers.mlflow]`: where every finished run is logged in MLflow (docs/trackers.md)."""

    # http(s)://..., or sqlite:///PATH (a relative PATH is the lab's)
    tracking_uri: str = field(
        metadata=_rule(
            lambda v: re.match(r"(https?|sqlite|postgresql|mysql|databricks)[+\w]*:", v),
            "`{key}` is `{v}`; use an MLflow server (`http://host:5000`) or a local store (`sqlite:///mlflow.db`)",
        )
    )
    experiment: str = field(
        default="nightlab", metadata=_rule(str.strip, "`{key}` is empty; name the MLflow experiment")
    )
    # the MLflow UI the dashboard links to, when the tracking URI is not it
    ui_url: str | None = field(
        default=None,
        metadata=_rule(
            lambda v: re.match(r"https?://", v), "`{key}` is `{v}`; use the MLflow UI's http(s) address"
        ),
    )

    @property
    def key(self) -> str:
        return f"mlflow:{self.tracking_uri}#{self.experiment}"


@dataclass(frozen=True)
class TrackersConfig:
    """`[trackers]`: the experiment trackers each finished run is logged to (none by default)."""

    wandb: WandbConfig | None = None
    mlflow: MlflowConfig | None = None

    def __bool__(self) -> bool:
        return self.wandb is not None or self.mlflow is not None


@dataclass(frozen=True)
class LabConfig:
    target: TargetConfig
    metric: MetricConfig
    fleet: FleetConfig
    search: SearchConfig
    profile: dict[str, Any] | None = None
    agent: AgentConfig = field(default_factory=AgentConfig)
    trackers: TrackersConfig = field(default_factory=TrackersConfig)


def cluster_gpus(accelerators: Any) -> float | None:
    """GPUs per cluster of a SkyPilot `accelerators` value (`"H100:8"`, `{"H100": 8}`, `"H100"`); None for none."""
    if accelerators is None:
        return None
    if isinstance(accelerators, dict):
        if len(accelerators) != 1:
            return None
        value = next(iter(accelerators.values()))
        return 1.0 if value is None else float(value)
    _, _, count = str(accelerators).partition(":")
    try:
        return float(count) if count else 1.0
    except ValueError:
        return None


def slots_per_cluster(pool: PoolConfig) -> int:
    """Experiments one cluster of a skypilot pool runs at once: `slots_per_cluster`, else one per GPU.

    An `H100:8` node is 8 slots (each experiment pinned to its GPU); `H100:1`, a fraction, or no
    accelerators is one. Local pools are one slot per GPU already (`gpus = [...]`).
    """
    if pool.backend != "skypilot":
        return 1
    if "slots_per_cluster" in pool.options:
        return int(pool.options["slots_per_cluster"])
    gpus = cluster_gpus(pool.options.get("accelerators"))
    return int(gpus) if gpus is not None and gpus >= 1 and gpus == int(gpus) else 1


def pool_slots(pool: PoolConfig) -> int:
    """Experiments a whole pool runs at once (local GPUs or slots; clusters times their slots)."""
    if pool.gpus:
        return len(pool.gpus)
    return pool.slots * slots_per_cluster(pool)
