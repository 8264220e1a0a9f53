"""Reading `nightlab.toml` by its schema (`_schema`): one line per bad key, naming the fix."""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, fields
from functools import cache
from typing import Any

from nightlab.config._schema import (
    CONFIG_NAME,
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
)
from nightlab.errors import ConfigError

# --- reading a table by its dataclass ------------------------------------------------------------


def _table(doc: dict, key: str, *, required: bool = True) -> dict:
    value = doc.get(key)
    if value is None:
        if required:
            _fail(f"missing table `[{key}]`; see README 'Configuration'")
        return {}
    if not isinstance(value, dict):
        _fail(f"`{key}` must be a table")
    return value


def _get(table: dict, where: str, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if key not in table:
        if default is ...:
            _fail(f"missing key `{where}.{key}`")
        return default
    value = table[key]
    # bool is an int subclass: `slots = true` must not pass as 1
    # bool is an int subclass: `slots = true` must not pass as 1
    bool_refused = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    if bool_refused or not isinstance(value, kind):
        _fail(f"`{where}.{key}` must be {_kind_name(kind)}, got `{value!r}`")
    if isinstance(value, float) and not math.isfinite(value):  # TOML allows nan and inf
        _fail(f"`{where}.{key}` must be a finite number, got `{value!r}`")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def _no_unknown(table: dict, where: str, known: set[str]) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        _fail(f"unknown key `{where}.{unknown[0]}`; known keys: {', '.join(sorted(known))}")


@cache
def _keys(cls: type) -> dict[str, Field]:
    """The TOML keys of a section: its fields by key (`metadata["key"]`, else the field's name)."""
    return {f.metadata.get("key", f.name): f for f in fields(cls)}


def _same(value: Any) -> Any:
    return value


# The TOML types a field's annotation accepts, and how a value becomes the field's: an integer
# where a float is asked (`timeout = 600`), a list where a tuple is held. The annotations are
# strings (`from __future__ import annotations`), read as such: `typing.get_type_hints` cost
# each process ~10 ms more for the eight sections (2-core box, 2026-12-03).
_TOML_TYPES: dict[str, tuple[tuple[type, ...], Callable[[Any], Any]]] = {
    "str": ((str,), _same),
    "int": ((int,), _same),
    "float": ((int, float), float),
    "bool": ((bool,), _same),
}


@cache
def _schema(cls: type) -> dict[str, tuple[Field, tuple[type, ...], Callable[[Any], Any]]]:
    """Each field of a section with the TOML types it accepts and its conversion (`X | None`: X,
    left out)."""
    out = {}
    for f in fields(cls):
        name = str(f.type).removesuffix(" | None")
        if name.startswith("tuple["):
            out[f.name] = (f, (list,), tuple)
        elif name.startswith("dict["):
            out[f.name] = (f, (dict,), dict)
        else:
            out[f.name] = (f, *_TOML_TYPES[name])
    return out


def _value(
    cls: type, name: str, table: dict, where: str, *, key: str | None = None, default: Any = ...
) -> Any:
    """One key of `table` as field `name` of `cls`: typed, checked, the field's default when left out."""
    f, kinds, convert = _schema(cls)[name]
    if default is ...:
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        default = ... if default is MISSING else default  # required
    key = key or f.metadata.get("key", name)
    raw = _get(table, where, key, kinds, default)
    if raw is None:  # an optional key left out (TOML has no null)
        return None
    value = convert(raw)
    check = f.metadata.get("check")
    problem = check(value, raw, f"{where}.{key}") if check is not None else None
    if problem:
        _fail(problem)
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
            _fail(
                f"the pools of tier `{p.tier}` disagree on `budget_seconds` / `promote_to`; "
                "give every [[fleet.pool]] of one tier the same values"
            )
    full = profile.get("budget_seconds") if isinstance(profile, dict) else None
    for tier, p in by_tier.items():
        if p.budget_seconds is None and p.promote_to is None:
            continue
        if p.budget_seconds is not None and not isinstance(full, (int, float)):
            _fail(
                f"tier `{tier}` sets `budget_seconds`, which only the built-in target's "
                "clock obeys; remove it (a foreign target keeps its own budget)"
            )
        if p.budget_seconds is not None and isinstance(full, (int, float)) and p.budget_seconds > full:
            _fail(
                f"tier `{tier}` has `budget_seconds = {p.budget_seconds:g}`, more than the "
                f"profile's {full:g} s; a rung screens with a shorter budget, e.g. `{full / 3:g}`"
            )
        if p.promote_to is None:
            continue
        if p.promote_to not in by_tier or p.promote_to == tier:
            _fail(
                f"tier `{tier}` has `promote_to = {p.promote_to!r}`, which is not another "
                f"tier; tiers: {', '.join(sorted(by_tier))}"
            )
        mine = p.budget_seconds if p.budget_seconds is not None else full
        nxt = by_tier[p.promote_to].budget_seconds
        nxt = nxt if nxt is not None else full
        if isinstance(mine, (int, float)) and isinstance(nxt, (int, float)) and not mine < nxt:
            _fail(
                f"tier `{tier}` ({mine:g} s) promotes to `{p.promote_to}` ({nxt:g} s); "
                "the next rung must have a longer budget: give the screening tier a smaller `budget_seconds`"
            )


def _check_slots_per_cluster(options: dict[str, Any], where: str) -> None:
    """`slots_per_cluster` of a skypilot pool: a whole number that divides the cluster's GPUs."""
    if "slots_per_cluster" not in options:
        return
    value = options["slots_per_cluster"]
    gpus = cluster_gpus(options.get("accelerators"))
    whole = gpus is not None and gpus >= 1 and gpus == int(gpus)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        _fail(f"`{where}.slots_per_cluster` must be a whole number of at least 1, got `{value!r}`")
    if value > 1 and not (whole and int(gpus) % value == 0):  # type: ignore[arg-type]
        have = options.get("accelerators")
        _fail(
            f"`{where}.slots_per_cluster = {value}` must divide the GPUs of each cluster "
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
