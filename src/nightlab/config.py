"""`nightlab.toml`: the lab's configuration, parsed into frozen dataclasses.

Every key is checked when the lab is opened, so a typo fails at once with the key's name
instead of deep inside a run. Unknown keys are errors too: a misspelled `timeout` that
silently fell back to the default would cost a night of GPU time.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nightlab.errors import ConfigError

CONFIG_NAME = "nightlab.toml"
_SUMMARY_KEY = re.compile(r"[A-Za-z_][\w.\-]*")  # what fleet.runner reads as a summary key
_TIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")  # part of worker names, shown in every table
FOREIGN_TIMEOUT = 600.0  # autoresearch's rule: a run that takes over 10 minutes is killed


@dataclass(frozen=True)
class TargetConfig:
    command: str
    editable: tuple[str, ...]
    timeout: float
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
    name: str = "val_bpb"
    direction: str = "lower"

    @property
    def lower_is_better(self) -> bool:
        return self.direction == "lower"


@dataclass(frozen=True)
class PoolConfig:
    """One group of workers of one tier on one backend."""

    backend: str
    tier: str
    slots: int = 1
    threads: int | None = None
    gpus: tuple[int, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)  # backend-specific keys (accelerators, infra, ...)
    # a screening rung (issue 34): the tier trains this many seconds instead of the profile's budget
    budget_seconds: float | None = None
    promote_to: str | None = None  # the next rung: the tier a run here is promoted to (`nightlab.rungs`)


@dataclass(frozen=True)
class FleetConfig:
    pools: tuple[PoolConfig, ...]
    default_tier: str
    idle_shutdown: float = 900.0
    retries: int = 2
    backup_interval: float = 600.0  # seconds between the controller's online ledger backups
    backups: int = 5  # periodic backups kept in .nightlab/backups/
    # machine health (fleet/health.py): a run that got less of the CPU it asked for, or ran at
    # less of its GPU's max SM clock, is `degraded`; 0 turns the check off
    min_cpu_share: float = 0.7
    min_clock_share: float = 0.8
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
    eta: int = 3  # successive halving: a screening run is promoted when it ranks in the top 1/eta


@dataclass(frozen=True)
class AgentConfig:
    """`[agent]`: how `nightlab agent run` starts and watches a coding agent (docs/agents.md)."""

    default: str = "claude"  # the agent `--agent` defaults to
    stall_seconds: float | None = None  # None: derived from target.timeout by the supervisor
    max_restarts_per_hour: int = 6
    commands: dict[str, str] = field(default_factory=dict)  # agent name -> command line (overrides built-ins)
    # API outage: wait api_backoff_seconds before the first retry, doubling up to the cap
    api_backoff_seconds: float = 30.0
    api_backoff_max_seconds: float = 900.0
    # USD per million tokens for a CLI that reports tokens but no cost (Codex). The defaults are
    # OpenAI's list prices for gpt-5 (2026-12): input 1.25, cached input 0.125, output 10.
    token_prices: tuple[float, float, float] = (1.25, 0.125, 10.0)


@dataclass(frozen=True)
class WandbConfig:
    """`[trackers.wandb]`: where every finished run is logged in Weights & Biases (docs/trackers.md)."""

    project: str
    entity: str | None = None  # None: the API key's default entity
    mode: str = "online"  # online | offline (runs kept under .nightlab/wandb/ for `wandb sync`)

    @property
    def key(self) -> str:
        """The destination: a new project (or mode) starts its own outbox cursor."""
        return f"wandb:{self.entity or ''}/{self.project}" + (":offline" if self.mode == "offline" else "")


@dataclass(frozen=True)
class MlflowConfig:
    """`[trackers.mlflow]`: where every finished run is logged in MLflow (docs/trackers.md)."""

    tracking_uri: str  # http(s)://..., or sqlite:///PATH (a relative PATH is the lab's)
    experiment: str = "nightlab"
    ui_url: str | None = None  # the MLflow UI the dashboard links to, when the tracking URI is not it

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
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _table(doc: dict, key: str, *, required: bool = True) -> dict:
    value = doc.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{CONFIG_NAME}: missing table `[{key}]`; see README 'Configuration'")
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{CONFIG_NAME}: `{key}` must be a table")
    return value


def _get(table: dict, where: str, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if key not in table:
        if default is ...:
            raise ConfigError(f"{CONFIG_NAME}: missing key `{where}.{key}`")
        return default
    value = table[key]
    # bool is an int subclass: `slots = true` must not pass as 1
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ConfigError(f"{CONFIG_NAME}: `{where}.{key}` must be {_kind_name(kind)}, got `{value!r}`")
    if not isinstance(value, kind):
        raise ConfigError(f"{CONFIG_NAME}: `{where}.{key}` must be {_kind_name(kind)}, got `{value!r}`")
    if isinstance(value, float) and not math.isfinite(value):  # TOML allows nan and inf
        raise ConfigError(f"{CONFIG_NAME}: `{where}.{key}` must be a finite number, got `{value!r}`")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def _no_unknown(table: dict, where: str, known: set[str]) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(
            f"{CONFIG_NAME}: unknown key `{where}.{unknown[0]}`; known keys: {', '.join(sorted(known))}"
        )


def _parse_pool(raw: Any, index: int) -> PoolConfig:
    where = f"fleet.pool[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{CONFIG_NAME}: `{where}` must be a table ([[fleet.pool]])")
    backend = _get(raw, where, "backend", str, "local")
    tier = _get(raw, where, "tier", str)
    if not _TIER.fullmatch(tier):
        raise ConfigError(f"{CONFIG_NAME}: `{where}.tier` is `{tier!r}`; use a name like `h100` or `cpu`")
    rung = _parse_rung(raw, where)
    raw = {k: v for k, v in raw.items() if k not in _RUNG_KEYS}
    if backend == "local":
        _no_unknown(raw, where, {"backend", "tier", "slots", "threads", "gpus"})
        gpus = tuple(_get(raw, where, "gpus", list, []))
        if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus):
            raise ConfigError(f"{CONFIG_NAME}: `{where}.gpus` must be a list of GPU indices, got `{gpus!r}`")
        slots = _get(raw, where, "slots", int, len(gpus) or 1)
        threads = _get(raw, where, "threads", int, None)
        if gpus and slots != len(gpus):
            raise ConfigError(
                f"{CONFIG_NAME}: `{where}.slots` must equal the number of `gpus` or be left out"
            )
        options: dict[str, Any] = {}
    elif backend == "skypilot":
        slots = _get(raw, where, "workers", int, 1)
        threads = None
        gpus = ()
        options = {k: v for k, v in raw.items() if k not in {"backend", "tier", "workers"}}
        _check_slots_per_cluster(options, where)
    else:
        raise ConfigError(f"{CONFIG_NAME}: `{where}.backend` is `{backend}`; use `local` or `skypilot`")
    if slots < 1:
        raise ConfigError(f"{CONFIG_NAME}: `{where}` needs at least one slot, got `{slots}`")
    if threads is not None and threads < 1:
        raise ConfigError(f"{CONFIG_NAME}: `{where}.threads` must be at least 1, got `{threads}`")
    return PoolConfig(
        backend=backend, tier=tier, slots=slots, threads=threads, gpus=gpus, options=options, **rung
    )


_RUNG_KEYS = ("budget_seconds", "promote_to")


def _parse_rung(raw: dict, where: str) -> dict[str, Any]:
    """A pool's screening-rung keys: `budget_seconds` (its own training budget) and `promote_to`."""
    budget = _get(raw, where, "budget_seconds", (int, float), None)
    if budget is not None and not budget > 0:
        raise ConfigError(
            f"{CONFIG_NAME}: `{where}.budget_seconds` must be a positive number of seconds, e.g. `10`, "
            f"got `{budget}`"
        )
    promote_to = _get(raw, where, "promote_to", str, None)
    return {"budget_seconds": None if budget is None else float(budget), "promote_to": promote_to}


def _check_rungs(pools: tuple[PoolConfig, ...], profile: Any) -> None:
    """Rungs must agree per tier, sit below the profile's budget and climb to a known tier."""
    by_tier: dict[str, PoolConfig] = {}
    for p in pools:
        first = by_tier.setdefault(p.tier, p)
        if (first.budget_seconds, first.promote_to) != (p.budget_seconds, p.promote_to):
            raise ConfigError(
                f"{CONFIG_NAME}: the pools of tier `{p.tier}` disagree on `budget_seconds` / `promote_to`; "
                "give every [[fleet.pool]] of one tier the same values"
            )
    full = profile.get("budget_seconds") if isinstance(profile, dict) else None
    for tier, p in by_tier.items():
        if p.budget_seconds is None and p.promote_to is None:
            continue
        if p.budget_seconds is not None and not isinstance(full, (int, float)):
            raise ConfigError(
                f"{CONFIG_NAME}: tier `{tier}` sets `budget_seconds`, which only the built-in target's "
                "clock obeys; remove it (a foreign target keeps its own budget)"
            )
        if p.budget_seconds is not None and isinstance(full, (int, float)) and p.budget_seconds > full:
            raise ConfigError(
                f"{CONFIG_NAME}: tier `{tier}` has `budget_seconds = {p.budget_seconds:g}`, more than the "
                f"profile's {full:g} s; a rung screens with a shorter budget, e.g. `{full / 3:g}`"
            )
        if p.promote_to is None:
            continue
        if p.promote_to not in by_tier or p.promote_to == tier:
            raise ConfigError(
                f"{CONFIG_NAME}: tier `{tier}` has `promote_to = {p.promote_to!r}`, which is not another "
                f"tier; tiers: {', '.join(sorted(by_tier))}"
            )
        mine = p.budget_seconds if p.budget_seconds is not None else full
        nxt = by_tier[p.promote_to].budget_seconds
        nxt = nxt if nxt is not None else full
        if isinstance(mine, (int, float)) and isinstance(nxt, (int, float)) and not mine < nxt:
            raise ConfigError(
                f"{CONFIG_NAME}: tier `{tier}` ({mine:g} s) promotes to `{p.promote_to}` ({nxt:g} s); "
                "the next rung must have a longer budget: give the screening tier a smaller `budget_seconds`"
            )


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


def _check_slots_per_cluster(options: dict[str, Any], where: str) -> None:
    """`slots_per_cluster` of a skypilot pool: a whole number that divides the cluster's GPUs."""
    if "slots_per_cluster" not in options:
        return
    value = options["slots_per_cluster"]
    gpus = cluster_gpus(options.get("accelerators"))
    whole = gpus is not None and gpus >= 1 and gpus == int(gpus)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(
            f"{CONFIG_NAME}: `{where}.slots_per_cluster` must be a whole number of at least 1, got `{value!r}`"
        )
    if value > 1 and not (whole and int(gpus) % value == 0):  # type: ignore[arg-type]
        have = options.get("accelerators")
        raise ConfigError(
            f"{CONFIG_NAME}: `{where}.slots_per_cluster = {value}` must divide the GPUs of each cluster "
            f"(`accelerators = {have!r}`); use a divisor of its GPU count, or leave it out (one slot per GPU)"
        )


def parse_config(doc: dict[str, Any]) -> LabConfig:
    """Validate a parsed `nightlab.toml` document.

    Raises:
        ConfigError: naming the first bad or missing key.
    """
    _no_unknown(doc, "", {"target", "metric", "fleet", "search", "profile", "agent", "trackers"})
    t = _table(doc, "target")
    _no_unknown(t, "target", {"command", "editable", "timeout", "builtin"})
    editable = _get(t, "target", "editable", list)
    if not editable or not all(isinstance(e, str) and e for e in editable):
        raise ConfigError(f"{CONFIG_NAME}: `target.editable` must be a non-empty list of file names")
    for name in editable:
        # snapshots read these from the working tree: a name must stay inside the lab
        if name.startswith(("/", "\\")) or ".." in Path(name).parts or "\0" in name or name.strip() != name:
            raise ConfigError(
                f"{CONFIG_NAME}: `target.editable` entry `{name!r}` must be a file path inside the lab, "
                "e.g. `train.py` or `src/model.py`"
            )
    timeout = float(_get(t, "target", "timeout", (int, float), FOREIGN_TIMEOUT))
    if timeout <= 0:
        raise ConfigError(f"{CONFIG_NAME}: `target.timeout` must be positive, got `{timeout}`")
    command = _get(t, "target", "command", str)
    if not command.strip() or "\0" in command:
        raise ConfigError(f"{CONFIG_NAME}: `target.command` must be a command line, e.g. `python train.py`")
    target = TargetConfig(
        command=command,
        editable=tuple(editable),
        timeout=timeout,
        builtin=_get(t, "target", "builtin", bool, False),
    )

    m = _table(doc, "metric", required=False)
    _no_unknown(m, "metric", {"name", "direction"})
    direction = _get(m, "metric", "direction", str, "lower")
    if direction not in ("lower", "higher"):
        raise ConfigError(f"{CONFIG_NAME}: `metric.direction` is `{direction}`; use `lower` or `higher`")
    metric_name = _get(m, "metric", "name", str, "val_bpb")
    if not _SUMMARY_KEY.fullmatch(metric_name):
        raise ConfigError(
            f"{CONFIG_NAME}: `metric.name` is `{metric_name!r}`; it must be a summary key such as `val_bpb` "
            "(letters, digits, `_`, `.`, `-`)"
        )
    metric = MetricConfig(name=metric_name, direction=direction)

    f = _table(doc, "fleet")
    _no_unknown(
        f,
        "fleet",
        {
            "pool",
            "default_tier",
            "idle_shutdown",
            "retries",
            "backup_interval",
            "backups",
            "min_cpu_share",
            "min_clock_share",
            "oversubscribe",
        },
    )
    pools_raw = _get(f, "fleet", "pool", list)
    if not pools_raw:
        raise ConfigError(f"{CONFIG_NAME}: `fleet.pool` needs at least one [[fleet.pool]] table")
    pools = tuple(_parse_pool(p, i) for i, p in enumerate(pools_raw))
    tiers = sorted({p.tier for p in pools})
    default_tier = _get(f, "fleet", "default_tier", str, pools[0].tier)
    if default_tier not in tiers:
        raise ConfigError(
            f"{CONFIG_NAME}: `fleet.default_tier` is `{default_tier}` but no pool has that tier; "
            f"tiers: {', '.join(tiers)}"
        )
    retries = _get(f, "fleet", "retries", int, 2)
    if retries < 0:
        raise ConfigError(f"{CONFIG_NAME}: `fleet.retries` must be 0 or more, got `{retries}`")
    backup_interval = float(_get(f, "fleet", "backup_interval", (int, float), 600.0))
    backups = _get(f, "fleet", "backups", int, 5)
    if not backup_interval > 0 or backups < 1:
        raise ConfigError(
            f"{CONFIG_NAME}: `fleet.backup_interval` must be positive and `fleet.backups` at least 1, "
            f"got `{backup_interval}` and `{backups}`"
        )
    idle_shutdown = float(_get(f, "fleet", "idle_shutdown", (int, float), 900.0))
    if idle_shutdown < 0:
        raise ConfigError(
            f"{CONFIG_NAME}: `fleet.idle_shutdown` must be 0 or more seconds, got `{idle_shutdown}`"
        )
    shares = {}
    for key, default in (("min_cpu_share", 0.7), ("min_clock_share", 0.8)):
        shares[key] = float(_get(f, "fleet", key, (int, float), default))
        if not 0 <= shares[key] <= 1:
            raise ConfigError(
                f"{CONFIG_NAME}: `fleet.{key}` must be between 0 (off) and 1, got `{shares[key]:g}`"
            )
    fleet = FleetConfig(
        pools=pools,
        default_tier=default_tier,
        idle_shutdown=idle_shutdown,
        retries=retries,
        backup_interval=backup_interval,
        backups=backups,
        min_cpu_share=shares["min_cpu_share"],
        min_clock_share=shares["min_clock_share"],
        oversubscribe=_get(f, "fleet", "oversubscribe", bool, False),
    )

    s = _table(doc, "search", required=False)
    _no_unknown(s, "search", {"z", "incumbent_max_age_waves", "promote_top_k", "eta"})
    search = SearchConfig(
        z=float(_get(s, "search", "z", (int, float), 2.0)),
        incumbent_max_age_waves=_get(s, "search", "incumbent_max_age_waves", int, 3),
        promote_top_k=_get(s, "search", "promote_top_k", int, 3),
        eta=_parse_eta(s),
    )
    if search.z <= 0 or search.incumbent_max_age_waves < 1 or search.promote_top_k < 1:
        raise ConfigError(
            f"{CONFIG_NAME}: `search.z` must be positive and `search.incumbent_max_age_waves` and "
            f"`search.promote_top_k` at least 1, got `{search.z}`, `{search.incumbent_max_age_waves}` "
            f"and `{search.promote_top_k}`"
        )
    profile = doc.get("profile")
    if profile is not None and not isinstance(profile, dict):
        raise ConfigError(f"{CONFIG_NAME}: `profile` must be a table")
    _check_rungs(pools, profile)

    a = _table(doc, "agent", required=False)
    _no_unknown(
        a,
        "agent",
        {
            "default",
            "stall_seconds",
            "max_restarts_per_hour",
            "commands",
            "api_backoff_seconds",
            "api_backoff_max_seconds",
            "token_prices",
        },
    )
    commands = _get(a, "agent", "commands", dict, {})
    for name, line in commands.items():
        if not isinstance(line, str) or not line.strip():
            raise ConfigError(f"{CONFIG_NAME}: `agent.commands.{name}` must be a non-empty command line")
    stall = _get(a, "agent", "stall_seconds", (int, float), None)
    restarts = _get(a, "agent", "max_restarts_per_hour", int, 6)
    if (stall is not None and stall <= 0) or restarts < 1:
        raise ConfigError(
            f"{CONFIG_NAME}: `agent.stall_seconds` must be positive and `agent.max_restarts_per_hour` "
            f"at least 1, got `{stall}` and `{restarts}`"
        )
    backoff = float(_get(a, "agent", "api_backoff_seconds", (int, float), 30.0))
    backoff_max = float(_get(a, "agent", "api_backoff_max_seconds", (int, float), 900.0))
    if backoff <= 0 or backoff_max < backoff:
        raise ConfigError(
            f"{CONFIG_NAME}: `agent.api_backoff_seconds` must be positive and at most "
            f"`agent.api_backoff_max_seconds`, got `{backoff}` and `{backoff_max}`"
        )
    prices = _get(a, "agent", "token_prices", dict, {})
    _no_unknown(prices, "agent.token_prices", {"input", "cached_input", "output"})
    default_prices = dict(zip(("input", "cached_input", "output"), AgentConfig.token_prices, strict=True))
    token_prices = []
    for key, default in default_prices.items():
        value = _get(prices, "agent.token_prices", key, (int, float), default)
        if value < 0:
            raise ConfigError(
                f"{CONFIG_NAME}: `agent.token_prices.{key}` must be >= 0 USD per million tokens"
            )
        token_prices.append(float(value))
    agent = AgentConfig(
        default=_get(a, "agent", "default", str, "claude"),
        stall_seconds=None if stall is None else float(stall),
        max_restarts_per_hour=restarts,
        commands=dict(commands),
        api_backoff_seconds=backoff,
        api_backoff_max_seconds=backoff_max,
        token_prices=(token_prices[0], token_prices[1], token_prices[2]),
    )
    return LabConfig(
        target=target,
        metric=metric,
        fleet=fleet,
        search=search,
        profile=profile,
        agent=agent,
        trackers=_parse_trackers(_table(doc, "trackers", required=False)),
    )


def _parse_eta(s: dict) -> int:
    """`[search] eta`: successive halving promotes the top 1/eta of a rung (2 or more)."""
    eta = _get(s, "search", "eta", int, 3)
    if eta < 2:
        raise ConfigError(
            f"{CONFIG_NAME}: `search.eta` must be at least 2 (3 promotes the top third), got `{eta}`"
        )
    return eta


def _parse_trackers(t: dict) -> TrackersConfig:
    """`[trackers.wandb]` and `[trackers.mlflow]`; the libraries are imported only when a run is sent."""
    _no_unknown(t, "trackers", {"wandb", "mlflow"})
    wandb = mlflow = None
    if "wandb" in t:
        w = _table(t, "wandb")
        _no_unknown(w, "trackers.wandb", {"project", "entity", "mode"})
        project = _get(w, "trackers.wandb", "project", str)
        entity = _get(w, "trackers.wandb", "entity", str, None)
        mode = _get(w, "trackers.wandb", "mode", str, "online")
        if mode not in ("online", "offline"):
            raise ConfigError(f"{CONFIG_NAME}: `trackers.wandb.mode` is `{mode}`; use `online` or `offline`")
        for name, value in (("project", project), ("entity", entity)):
            # W&B names are path segments of the run's page: no slashes, no blanks
            if value is not None and not re.fullmatch(r"[\w.\-]{1,128}", value):
                raise ConfigError(
                    f"{CONFIG_NAME}: `trackers.wandb.{name}` is `{value!r}`; use letters, digits, `_`, `.`, `-`"
                )
        wandb = WandbConfig(project=project, entity=entity, mode=mode)
    if "mlflow" in t:
        m = _table(t, "mlflow")
        _no_unknown(m, "trackers.mlflow", {"tracking_uri", "experiment", "ui_url"})
        uri = _get(m, "trackers.mlflow", "tracking_uri", str)
        if not re.match(r"(https?|sqlite|postgresql|mysql|databricks)[+\w]*:", uri):
            raise ConfigError(
                f"{CONFIG_NAME}: `trackers.mlflow.tracking_uri` is `{uri}`; use an MLflow server "
                "(`http://host:5000`) or a local store (`sqlite:///mlflow.db`)"
            )
        experiment = _get(m, "trackers.mlflow", "experiment", str, "nightlab")
        ui_url = _get(m, "trackers.mlflow", "ui_url", str, None)
        if not experiment.strip():
            raise ConfigError(
                f"{CONFIG_NAME}: `trackers.mlflow.experiment` is empty; name the MLflow experiment"
            )
        if ui_url is not None and not re.match(r"https?://", ui_url):
            raise ConfigError(
                f"{CONFIG_NAME}: `trackers.mlflow.ui_url` is `{ui_url}`; use the MLflow UI's http(s) address"
            )
        mlflow = MlflowConfig(tracking_uri=uri, experiment=experiment, ui_url=ui_url)
    return TrackersConfig(wandb=wandb, mlflow=mlflow)


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
