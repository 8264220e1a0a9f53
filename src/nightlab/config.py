"""`nightlab.toml`: the lab's configuration, parsed into frozen dataclasses.

Every key is checked when the lab is opened, so a typo fails at once with the key's name
instead of deep inside a run. Unknown keys are errors too: a misspelled `timeout` that
silently fell back to the default would cost a night of GPU time.

The dataclasses are the schema: each field of a section is one key of its table, with its one
default, its type (from the annotation) and, in its metadata, the check of one value (`_rule`).
`_read` reads a table by them; what spans several keys is checked by the section's `_parse_*`.
"""

from __future__ import annotations

import math
import re
import tomllib
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from functools import cache
from pathlib import Path
from types import UnionType
from typing import Any

from nightlab.errors import ConfigError

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
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False, metadata={"key": None})


# --- reading a table by its dataclass ------------------------------------------------------------


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


@cache
def _keys(cls: type) -> dict[str, Field]:
    """The TOML keys of a section: its fields by key (`metadata["key"]`, else the name; None: none)."""
    return {
        f.metadata.get("key", f.name): f for f in fields(cls) if f.metadata.get("key", f.name) is not None
    }


@cache
def _kind(cls: type, name: str) -> tuple[tuple[type, ...], Callable[[Any], Any]]:
    """The TOML types a field accepts, and how a value becomes the field's (`int` -> `float`,
    list -> tuple): from the annotation, `X | None` being X left out."""
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, UnionType):
        (hint,) = (a for a in typing.get_args(hint) if a is not type(None))
    base = typing.get_origin(hint) or hint
    if base is float:
        return (int, float), float
    if base is tuple:
        return (list,), tuple
    return (base,), (dict if base is dict else lambda v: v)


def _value(
    cls: type, name: str, table: dict, where: str, *, key: str | None = None, default: Any = ...
) -> Any:
    """One key of `table` as field `name` of `cls`: typed, checked, the field's default when left out."""
    f = next(f for f in fields(cls) if f.name == name)
    if default is ...:
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        default = ... if default is MISSING else default  # required
    key = key or f.metadata.get("key", name)
    kinds, convert = _kind(cls, name)
    raw = _get(table, where, key, kinds, default)
    if raw is None:  # an optional key left out (TOML has no null)
        return None
    value = convert(raw)
    check = f.metadata.get("check")
    problem = check(value, raw, f"{where}.{key}") if check is not None else None
    if problem:
        raise ConfigError(f"{CONFIG_NAME}: {problem}")
    return value


def _read(
    cls: type, table: dict, where: str, *, given: dict | None = None, defaults: dict | None = None
) -> Any:
    """Table `where` as a `cls`: unknown keys refused, every other field read by `_value`; `given`
    fields are the caller's (parsed already), `defaults` replace a field's own where it depends
    on other keys."""
    _no_unknown(table, where, set(_keys(cls)))
    values = dict(given or {})
    for f in _keys(cls).values():
        if f.name not in values:
            values[f.name] = _value(cls, f.name, table, where, default=(defaults or {}).get(f.name, ...))
    return cls(**values)


def _fail(message: str) -> typing.NoReturn:
    raise ConfigError(f"{CONFIG_NAME}: {message}")


# --- the sections: what one key's check cannot see -----------------------------------------------


def _parse_pool(raw: Any, index: int) -> PoolConfig:
    where = f"fleet.pool[{index}]"
    if not isinstance(raw, dict):
        _fail(f"`{where}` must be a table ([[fleet.pool]])")
    backend = _value(PoolConfig, "backend", raw, where)
    common = {k: _value(PoolConfig, k, raw, where) for k in ("tier", *_RUNG_KEYS)}
    raw = {k: v for k, v in raw.items() if k not in _RUNG_KEYS}
    if backend == "local":
        _no_unknown(raw, where, {"backend", "tier", "slots", "threads", "gpus"})
        gpus = _value(PoolConfig, "gpus", raw, where)
        slots = _value(PoolConfig, "slots", raw, where, default=len(gpus) or 1)
        threads = _value(PoolConfig, "threads", raw, where)
        if gpus and slots != len(gpus):
            _fail(f"`{where}.slots` must equal the number of `gpus` or be left out")
        options: dict[str, Any] = {}
    else:  # skypilot: every other key is the backend's (accelerators, infra, ...)
        slots = _value(PoolConfig, "slots", raw, where, key="workers")
        threads, gpus = None, ()
        options = {k: v for k, v in raw.items() if k not in {"backend", "tier", "workers"}}
        _check_slots_per_cluster(options, where)
    if slots < 1:
        _fail(f"`{where}` needs at least one slot, got `{slots}`")
    return PoolConfig(backend=backend, slots=slots, threads=threads, gpus=gpus, options=options, **common)


_RUNG_KEYS = ("budget_seconds", "promote_to")


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
    _no_unknown(doc, "", set(_keys(LabConfig)))
    target = _read(TargetConfig, _table(doc, "target"), "target")
    metric = _read(MetricConfig, _table(doc, "metric", required=False), "metric")
    fleet = _parse_fleet(_table(doc, "fleet"))
    search = _parse_search(_table(doc, "search", required=False))
    profile = doc.get("profile")
    if profile is not None and not isinstance(profile, dict):
        _fail("`profile` must be a table")
    _check_rungs(fleet.pools, profile)
    return LabConfig(
        target=target,
        metric=metric,
        fleet=fleet,
        search=search,
        profile=profile,
        agent=_parse_agent(_table(doc, "agent", required=False)),
        trackers=_parse_trackers(_table(doc, "trackers", required=False)),
    )


def _parse_fleet(f: dict) -> FleetConfig:
    """`[fleet]` and its `[[fleet.pool]]` tables; the default tier is the first pool's."""
    _no_unknown(f, "fleet", set(_keys(FleetConfig)))  # a misspelled key first: it explains what follows
    pools_raw = _get(f, "fleet", "pool", list)
    if not pools_raw:
        _fail("`fleet.pool` needs at least one [[fleet.pool]] table")
    pools = tuple(_parse_pool(p, i) for i, p in enumerate(pools_raw))
    fleet = _read(FleetConfig, f, "fleet", given={"pools": pools}, defaults={"default_tier": pools[0].tier})
    if fleet.default_tier not in fleet.tiers:
        _fail(
            f"`fleet.default_tier` is `{fleet.default_tier}` but no pool has that tier; "
            f"tiers: {', '.join(fleet.tiers)}"
        )
    if not fleet.backup_interval > 0 or fleet.backups < 1:
        _fail(
            "`fleet.backup_interval` must be positive and `fleet.backups` at least 1, "
            f"got `{fleet.backup_interval}` and `{fleet.backups}`"
        )
    return fleet


def _parse_search(s: dict) -> SearchConfig:
    search = _read(SearchConfig, s, "search")
    if search.z <= 0 or search.incumbent_max_age_waves < 1 or search.promote_top_k < 1:
        _fail(
            "`search.z` must be positive and `search.incumbent_max_age_waves` and "
            f"`search.promote_top_k` at least 1, got `{search.z}`, `{search.incumbent_max_age_waves}` "
            f"and `{search.promote_top_k}`"
        )
    return search


_PRICES = ("input", "cached_input", "output")  # `[agent.token_prices]`, in `AgentConfig.token_prices`' order


def _parse_agent(a: dict) -> AgentConfig:
    """`[agent]`; its `token_prices` is a table of the three prices, each defaulting to the field's."""
    _no_unknown(a, "agent", set(_keys(AgentConfig)))
    prices = _get(a, "agent", "token_prices", dict, {})
    _no_unknown(prices, "agent.token_prices", set(_PRICES))
    token_prices = []
    for key, default in zip(_PRICES, AgentConfig.token_prices, strict=True):
        value = _get(prices, "agent.token_prices", key, (int, float), default)
        if value < 0:
            _fail(f"`agent.token_prices.{key}` must be >= 0 USD per million tokens")
        token_prices.append(float(value))
    agent = _read(AgentConfig, a, "agent", given={"token_prices": tuple(token_prices)})
    if (agent.stall_seconds is not None and agent.stall_seconds <= 0) or agent.max_restarts_per_hour < 1:
        _fail(
            "`agent.stall_seconds` must be positive and `agent.max_restarts_per_hour` "
            f"at least 1, got `{a.get('stall_seconds')}` and `{agent.max_restarts_per_hour}`"
        )
    if agent.api_backoff_seconds <= 0 or agent.api_backoff_max_seconds < agent.api_backoff_seconds:
        _fail(
            "`agent.api_backoff_seconds` must be positive and at most `agent.api_backoff_max_seconds`, "
            f"got `{agent.api_backoff_seconds}` and `{agent.api_backoff_max_seconds}`"
        )
    return agent


def _parse_trackers(t: dict) -> TrackersConfig:
    """`[trackers.wandb]` and `[trackers.mlflow]`; the libraries are imported only when a run is sent."""
    _no_unknown(t, "trackers", set(_keys(TrackersConfig)))
    return TrackersConfig(
        wandb=_read(WandbConfig, _table(t, "wandb"), "trackers.wandb") if "wandb" in t else None,
        mlflow=_read(MlflowConfig, _table(t, "mlflow"), "trackers.mlflow") if "mlflow" in t else None,
    )


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
