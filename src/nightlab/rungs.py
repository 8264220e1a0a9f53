"""Rungs: screening tiers with a shorter budget, and asynchronous successive halving (issue 34).

A tier may train for its own budget (`[[fleet.pool]] budget_seconds`, beside the profile's full
budget) and name the tier a good run there climbs to (`promote_to`). A tier is a *rung*: a
hardware class at a budget. Results compare within a tier only, as ever, so a 10 s rung and the
30 s tier on the same cores never pool a figure.

Successive halving, ASHA-style (Li et al., 2020), with no wave barrier: each time a run on a
screening rung finishes, every screening candidate of that rung is ranked (by its snapshot's mean
on the rung) among the snapshots the rung had measured in the comparison epoch in force when its
own run finished (so a controller that reviews late decides as one on time), and, failing that,
among every snapshot measured now (the cut-off grows with the rung); one in the top floor(n / eta)
is promoted to the next rung at once, unless the incumbent, measured on the rung, is ahead of it
(a run that loses to the incumbent on the screen is not worth a full run). Only the last rung
judges, with the sound rule of `judge.py` (two runs a side, t threshold, Sidak). Every decision,
promoted or not, is stored with its rank and cut-off in the screening wave's spec (`rungs`), which
`show`, `results` and the dashboard read.

A wave takes part when its spec has `asha = {"to": TIER, "repeats": N}`: `nightlab submit
--screen`, `nightlab search --screen-tier` and the promotions made here (to a rung that itself
promotes) write it. The controller's verdict policy (`Judge.ended`, judge.py) calls `review` after
every ok run on an enrolled rung: the fleet never imports the lab.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nightlab.errors import UsageError

if TYPE_CHECKING:
    from nightlab.config import LabConfig
    from nightlab.lab import Lab
    from nightlab.ledger import Experiment, Wave

__all__ = [
    "BUDGET_ENV",
    "Decision",
    "budget_of",
    "decision_line",
    "decisions_for",
    "has_rungs",
    "next_rung",
    "review",
    "screen_spec",
    "screen_tier_for",
    "tier_budget_env",
    "tier_label",
    "transfer",
    "warmup_capped",
]

# What the controller hands every built-in-target run: the budget of the tier it runs on. The
# harness's supervisor (`harness/attempt.py`) reads it, checks it, and runs its batch server's
# clock on it (`harness/serve.py`): train.py cannot change it.
BUDGET_ENV = "NIGHTLAB_TIER_BUDGET"
_LAST = "\U0010ffff"  # sorts after every identity
SPEC_KEY = "asha"  # a wave's spec key: its candidates take part in successive halving
DECISIONS_KEY = "rungs"  # a wave's spec key: experiment id -> its latest Decision


def _pool(config: LabConfig, tier: str) -> Any:
    return next((p for p in config.fleet.pools if p.tier == tier), None)


def full_budget(config: LabConfig) -> float | None:
    """The profile's budget (built-in target), else None."""
    budget = (config.profile or {}).get("budget_seconds")
    return float(budget) if isinstance(budget, (int, float)) else None


def budget_of(config: LabConfig, tier: str) -> float | None:
    """The training budget of a run on `tier`: the tier's own, else the profile's; None for a foreign target."""
    pool = _pool(config, tier)
    if pool is not None and pool.budget_seconds is not None:
        return pool.budget_seconds
    return full_budget(config)


def tier_budget_env(config: LabConfig, tier: str) -> str | None:
    """`NIGHTLAB_TIER_BUDGET` for a built-in-target run on `tier`, or None (a foreign target)."""
    if not config.target.builtin:
        return None
    budget = budget_of(config, tier)
    return None if budget is None else repr(float(budget))


def has_rungs(config: LabConfig) -> bool:
    """Whether any tier trains for its own budget or promotes to another."""
    return any(p.budget_seconds is not None or p.promote_to is not None for p in config.fleet.pools)


def tier_label(config: LabConfig, tier: str) -> str:
    """`tier` with its rung (`cpu-10s`, shown `cpu-10s (10 s rung)`) when the lab has rungs."""
    if not has_rungs(config):
        return tier
    budget = budget_of(config, tier)
    return tier if budget is None else f"{tier} ({budget:g} s rung)"


def next_rung(config: LabConfig, tier: str) -> str | None:
    """The tier a run on `tier` is promoted to (`promote_to`), or None on a last rung."""
    pool = _pool(config, tier)
    return pool.promote_to if pool is not None else None


def screen_tier_for(config: LabConfig, tier: str) -> str:
    """The lowest rung whose `promote_to` chain climbs to `tier` (`nightlab submit --screen`).

    Raises:
        UsageError: no tier promotes to `tier` (names the config to add).
    """
    below = []
    for t in config.fleet.tiers:
        seen, cur = {t}, next_rung(config, t)
        while cur is not None and cur not in seen and cur != tier:
            seen.add(cur)
            cur = next_rung(config, cur)
        if t != tier and cur == tier:
            below.append(t)
    if not below:
        raise UsageError(
            f"no screening rung promotes to tier `{tier}`; add a [[fleet.pool]] with a short "
            f'`budget_seconds` and `promote_to = "{tier}"` (docs/search.md, "Screening") and commit nightlab.toml'
        )
    return min(below, key=lambda t: (budget_of(config, t) or 0.0, t))


def screen_spec(to: str, repeats: int, max_promotions: int | None = None) -> dict[str, Any]:
    """The wave-spec entry that enrols a wave's candidates in successive halving (`max_promotions`
    caps how many of them are promoted: a search's `--top`)."""
    entry: dict[str, Any] = {"to": to, "repeats": int(repeats)}
    if max_promotions is not None:
        entry["max_promotions"] = int(max_promotions)
    return {SPEC_KEY: entry}


@dataclass(frozen=True)
class Decision:
    """Why a screening candidate was or was not promoted (stored in its wave's spec).

    Attributes:
        tier: the rung it was ranked on; to: the next rung.
        rank: its snapshot's place on the rung (1 = best); seen: snapshots the rung has measured.
        cutoff: floor(seen / eta), the ranks promoted; eta: the halving rate.
        capped: in the top, but its wave's promotions (a search's `--top`) were used up.
        behind_incumbent: the incumbent's mean on the rung is ahead of it.
        promoted: the promotion wave, or None.
    """

    tier: str
    to: str
    rank: int
    seen: int
    cutoff: int
    eta: int
    behind_incumbent: bool = False
    promoted: str | None = None
    capped: bool = False  # in the top, but its wave's promotions (a search's `--top`) are used up

    @property
    def qualifies(self) -> bool:
        return self.rank <= self.cutoff and not self.behind_incumbent and not self.capped

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def line(self) -> str:
        where = f"rank {self.rank} of {self.seen} on {self.tier}, cut-off top {self.cutoff} (1/{self.eta})"
        if self.promoted:
            return f"promoted to {self.to} ({self.promoted}): {where}"
        if self.behind_incumbent and self.rank <= self.cutoff:
            return f"not promoted: {where}, but behind the incumbent there"
        if self.capped and self.rank <= self.cutoff:
            return f"not promoted: {where}, but its wave's promotions (--top) are used up"
        if self.cutoff == 0:
            return f"not promoted yet: {where}; the rung needs {self.eta * self.rank} snapshots to promote it"
        return f"not promoted: {where}"


def decision_line(d: dict[str, Any] | None) -> str | None:
    return Decision.from_dict(d).line() if d else None


def decision_count(wave: Wave) -> int:
    """How many of the wave's candidates were promoted (or are being)."""
    return sum(1 for d in decisions_for(wave).values() if d.get("promoted") or d.get("claimed"))


def decisions_for(wave: Wave | None) -> dict[str, dict[str, Any]]:
    """experiment id -> its stored decision, for a wave (empty when it is not a screening wave)."""
    if wave is None:
        return {}
    return dict((wave.spec or {}).get(DECISIONS_KEY) or {})


def screening_tier(ledger: Any, tier: str) -> bool:
    """Whether some wave enrols candidates on `tier` (a finished run there may promote one)."""
    return any(SPEC_KEY in (w.spec or {}) and _on_tier(ledger, w, tier) for w in ledger.waves())


def _on_tier(ledger: Any, wave: Wave, tier: str) -> bool:
    return wave.tier == tier or any(
        e.tier == tier for e in ledger.experiments(wave=wave.id, with_metrics=False)
    )


def _ranking(lab: Lab, tier: str) -> tuple[list[tuple[str, float, float]], str]:
    """(identity, metric, finished_at) of every ok run on `tier` in the epoch in force (runs the
    harness recorded at another budget than the tier's today left out), and the incumbent's identity."""
    from nightlab import identity

    epoch = identity.epoch_key(lab.config)
    name = lab.config.metric.name
    budget = budget_of(lab.config, tier)
    runs = []
    for e in lab.ledger.experiments(tier=tier):
        value = e.metric(name) if e.ok else None
        ran = e.metrics.get("budget_seconds")  # the harness's record of the run's budget
        if isinstance(ran, (int, float)) and budget is not None and float(ran) != budget:
            continue  # the tier's budget changed since: that run screened at another rung
        if value is not None and math.isfinite(value) and (not e.epoch or e.epoch == epoch):
            runs.append((e.identity, value, e.finished_at or math.inf))
    return runs, lab.head_identity()


def _means(runs: list[tuple[str, float, float]], until: float = math.inf) -> dict[str, float]:
    """identity -> mean metric of the runs that had finished by `until`."""
    values: dict[str, list[float]] = {}
    for who, value, finished in runs:
        if finished <= until:
            values.setdefault(who, []).append(value)
    return {t: statistics.fmean(v) for t, v in values.items()}


def _candidates(lab: Lab, tier: str) -> list[tuple[Wave, Experiment]]:
    """(screening wave, its representative ok run) per snapshot of the waves enrolled on `tier`."""
    out = []
    head = lab.head_identity()
    for wave in lab.ledger.waves():
        if SPEC_KEY not in (wave.spec or {}):
            continue
        seen = set()
        for e in lab.ledger.experiments(wave=wave.id, tier=tier, with_metrics=False):
            if e.ok and e.identity != head and e.identity not in seen:
                seen.add(e.identity)
                out.append((wave, e))
    return out


def _claim(lab: Lab, wave_id: str, exp_id: str, decision: Decision) -> bool:
    """Store `decision` for `exp_id` in the wave's spec, in one transaction; False when it was
    promoted, or is being promoted, already (the controller and a search loop may both review).

    A decision that qualifies is stored `claimed`: whoever stored it makes the promotion."""

    def change(spec: dict[str, Any]) -> dict[str, Any] | None:
        decisions = dict(spec.get(DECISIONS_KEY) or {})
        old = decisions.get(exp_id) or {}
        if old.get("promoted") or old.get("claimed"):
            return None
        decisions[exp_id] = {**decision.to_dict(), "claimed": decision.qualifies}
        return {**spec, DECISIONS_KEY: decisions}

    return lab.ledger.change_wave_spec(wave_id, change)


def _set_promoted(lab: Lab, wave_id: str, exp_id: str, promoted: str | None) -> None:
    """Record the promotion wave (None: the promotion failed, the claim is dropped)."""

    def change(spec: dict[str, Any]) -> dict[str, Any]:
        decisions = dict(spec.get(DECISIONS_KEY) or {})
        decisions[exp_id] = {**(decisions.get(exp_id) or {}), "promoted": promoted, "claimed": False}
        return {**spec, DECISIONS_KEY: decisions}

    lab.ledger.change_wave_spec(wave_id, change)


class _Standings:
    """A rung's ranking as its runs are added in the order they ended (`review`).

    Each snapshot's place is what `_means` of the runs added so far, sorted by mean, would give
    (ties in the order of their first run in the ledger, as that stable sort keeps them), at the
    cost of a bisection per run and per question instead of a sort of every snapshot per
    candidate: a review after every run on a rung of thousands of ideas kept the controller busy
    for seconds (bench/rung_review.py).
    """

    def __init__(self, runs: list[tuple[str, float, float]], sign: float, head: str) -> None:
        self._runs = runs
        self._ended = sorted(range(len(runs)), key=lambda i: runs[i][2])  # run indices by end time
        self._added = 0  # how many of `_ended` are in
        self._sign = sign
        self._head = head
        self._values: dict[str, list[float]] = {}
        self._first: dict[str, int] = {}  # the ledger index of each snapshot's first run added
        self._score: dict[str, float] = {}  # sign * mean: lower is better
        self._order: list[tuple[float, str]] = []  # (score, identity), sorted

    def advance(self, until: float = math.inf) -> None:
        """Add every run that had ended by `until` (each once; `until` never goes back)."""
        while self._added < len(self._ended) and self._runs[self._ended[self._added]][2] <= until:
            i = self._ended[self._added]
            self._added += 1
            who, value, _ = self._runs[i]
            if who in self._score:
                del self._order[bisect.bisect_left(self._order, (self._score[who], who))]
            values = self._values.setdefault(who, [])
            values.append(value)
            self._first[who] = min(self._first.get(who, i), i)
            self._score[who] = self._sign * statistics.fmean(values)
            bisect.insort(self._order, (self._score[who], who))

    def place(self, who: str) -> tuple[int, int, bool] | None:
        """(rank, snapshots measured, whether the incumbent is ahead of or level with it), or None
        when `who` has no run added yet."""
        score = self._score.get(who)
        if score is None:
            return None
        better = bisect.bisect_left(self._order, (score, ""))
        level = self._order[better : bisect.bisect_right(self._order, (score, _LAST))]
        ahead = sum(1 for _, other in level if self._first[other] < self._first[who])
        head = self._score.get(self._head)
        return better + ahead + 1, len(self._order), head is not None and head <= score


def review(lab: Lab, tier: str, *, start_controller: bool = False) -> list[Decision]:
    """Rank every screening candidate on `tier` and promote those in the top 1/eta (see the module
    docstring). Returns the decisions made now; idempotent: a promoted candidate stays promoted."""
    from nightlab.waves import promote

    candidates = _candidates(lab, tier)
    if not candidates:
        return []
    runs, head = _ranking(lab, tier)
    eta = lab.config.search.eta
    sign = 1.0 if lab.config.metric.lower_is_better else -1.0

    def decide(place: tuple[int, int, bool], **fields: Any) -> Decision:
        rank, seen, behind = place
        return Decision(rank=rank, seen=seen, cutoff=seen // eta, eta=eta, behind_incumbent=behind, **fields)

    # as it stood when each candidate's run finished ("as soon as"), so a review that comes late (a
    # busy controller) decides as one on time; else as it stands now: the cut-off grows with the rung.
    # One pass over the runs in the order they ended answers both (`_Standings`).
    board = _Standings(runs, sign, head)
    then: dict[int, tuple[int, int, bool] | None] = {}
    for k in sorted(range(len(candidates)), key=lambda k: candidates[k][1].finished_at or math.inf):
        board.advance(candidates[k][1].finished_at or math.inf)
        then[k] = board.place(candidates[k][1].identity)
    board.advance()
    made: list[Decision] = []
    to_promote: list[tuple[int, Wave, Experiment, int]] = []
    claimed: dict[str, int] = {}  # per wave with a cap: its promotions so far
    for k, (wave, e) in enumerate(candidates):
        old = decisions_for(wave).get(e.id) or {}
        now = board.place(e.identity)
        if old.get("promoted") or now is None:
            continue
        asha = wave.spec[SPEC_KEY]
        to = str(asha.get("to") or next_rung(lab.config, tier) or "")
        if not to:
            continue
        cap = asha.get("max_promotions")  # a search's `--top`: at most that many from one wave
        if cap is not None and wave.id not in claimed:
            claimed[wave.id] = decision_count(lab.ledger.wave(wave.id))
        capped = cap is not None and claimed[wave.id] >= int(cap)
        decision = decide(then[k], tier=tier, to=to, capped=capped) if then[k] is not None else None
        if decision is None or not decision.qualifies:
            decision = decide(now, tier=tier, to=to, capped=capped)
        if not decision.qualifies and old == {**decision.to_dict(), "claimed": False}:
            continue  # left out so at an earlier review: nothing new to store
        if not _claim(lab, wave.id, e.id, decision):
            continue
        made.append(decision)
        if decision.qualifies:
            if cap is not None:
                claimed[wave.id] += 1
            to_promote.append((len(made) - 1, wave, e, int(asha.get("repeats") or 2)))
    # every decision is stored first: a promotion that fails leaves the others' reasons on record
    failed: Exception | None = None
    for i, wave, e, repeats in to_promote:
        decision = made[i]
        try:
            promoted = promote(
                lab,
                [e.id],
                tier=decision.to,
                repeats=repeats,
                description=f"promote {e.id} from rung {tier} (rank {decision.rank} of {decision.seen}) to {decision.to}",
                start_controller=start_controller,
            )
        except Exception as err:  # noqa: BLE001 - re-raised below, once the others are promoted
            _set_promoted(lab, wave.id, e.id, None)  # the claim is dropped: the next review tries again
            failed = failed or err
            continue
        further = next_rung(lab.config, decision.to)
        if further:  # the next rung screens too: its runs take part in turn
            spec = {**promoted.wave.spec, **screen_spec(further, repeats)}
            lab.ledger.update_wave_spec(promoted.wave.id, spec)
        _set_promoted(lab, wave.id, e.id, promoted.wave.id)
        made[i] = Decision(**{**decision.to_dict(), "promoted": promoted.wave.id})
        lab.ledger.log_event(
            "promote", e.id, to=decision.to, wave=promoted.wave.id, rank=decision.rank, seen=decision.seen
        )
    if failed is not None:
        raise failed
    return made


def promotions_of(lab: Lab, wave_id: str) -> list[str]:
    """The promotion waves made from a screening wave, and from theirs in turn (every rung up)."""
    out: list[str] = []
    todo = [wave_id]
    while todo:
        w = lab.ledger.wave(todo.pop())
        for d in decisions_for(w).values():
            p = d.get("promoted")
            if p and p not in out:
                out.append(p)
                todo.append(p)
    return out


def submit_screened(
    lab: Lab, description: str, *, tier: str | None = None, promote_repeats: int = 2, **submit: Any
) -> list[Experiment]:
    """`nightlab submit --screen`: queue the idea on the lowest rung below `tier` (default: the
    fleet's default tier); the controller promotes it, rung by rung, when it ranks in the top
    1/eta there (`review`), and the last rung judges it. The incumbent gets one run on the
    screening rung when it has none there, so the rung has a reference from the start.

    Raises:
        UsageError: no rung promotes to `tier`.
    """
    from nightlab.ledger import Source
    from nightlab.waves import submit_incumbent

    target = lab.check_tier(tier or lab.config.fleet.default_tier)
    screen = screen_tier_for(lab.config, target)
    head = lab.incumbent()
    wave = lab.ledger.add_wave(
        design="screen",
        description=f"screen: {description}",
        spec=screen_spec(next_rung(lab.config, screen) or target, promote_repeats),
        tier=screen,
        base_snapshot=head.commit,
    )
    start = submit.pop("start_controller", True)
    try:
        exps = lab.submit(
            description, tier=screen, wave=wave.id, start_controller=False, source=Source.CLI, **submit
        )
    except Exception:
        lab.ledger.drop_empty_wave(wave.id)  # nothing half-written: a refused idea leaves no wave
        raise
    if not lab.ledger.experiments(identity=head.identity, tier=screen, with_metrics=False):
        exps += submit_incumbent(lab, screen, wave.id, 1, lab.files_at(head.commit))
    if start:
        from nightlab.fleet.daemon import ensure_running

        ensure_running(lab.path)
    return exps


def screening_waves(lab: Any) -> dict[str, Wave]:
    """The lab's waves that hold successive-halving decisions, by id (one query: listings of
    many runs look their decisions up here instead of a wave per run)."""
    return {w.id: w for w in lab.ledger.waves() if (w.spec or {}).get(DECISIONS_KEY)}


def rung_info(lab: Any, e: Experiment, waves: dict[str, Wave] | None = None) -> dict[str, Any]:
    """A run's rung, for `show` / `results` / the dashboard: its budget (the harness's figure when
    it ran, else its tier's), the rung it reached (following its promotions up) and why it was or
    was not promoted there. `waves`: `screening_waves(lab)`, for a listing (read here when None)."""
    recorded = e.metrics.get("budget_seconds") if e.metrics else None
    budget = float(recorded) if isinstance(recorded, (int, float)) else budget_of(lab.config, e.tier)
    out: dict[str, Any] = {"budget_seconds": budget, "label": tier_label(lab.config, e.tier)}
    if waves is None:
        waves = screening_waves(lab)
    decision = _decision_of(lab, waves.get(e.wave), e) if e.wave else None
    out["promotion"] = decision
    out["why"] = decision_line(decision)
    reached, d = e.tier, decision
    while d and d.get("promoted"):
        reached = d.get("to") or reached
        w = lab.ledger.wave(d["promoted"])
        mine = [x for x in lab.ledger.experiments(wave=w.id, with_metrics=False) if x.identity == e.identity]
        d = decisions_for(w).get(mine[0].id) if mine else None
    out["reached"] = reached
    return out


def _decision_of(lab: Any, wave: Wave | None, e: Experiment) -> dict[str, Any] | None:
    """The decision stored for `e`'s snapshot in its wave (made on its representative run)."""
    decisions = decisions_for(wave)
    if not decisions or wave is None:
        return None
    if e.id in decisions:
        return decisions[e.id]
    for other in lab.ledger.experiments(wave=wave.id, tier=e.tier, with_metrics=False):
        if other.identity == e.identity and other.id in decisions:
            return decisions[other.id]
    return None


def rank_transfer(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """Spearman's rho between the two coordinates of `pairs` (a snapshot's mean on a rung, on the
    next), with a 95 % Fisher interval (z = atanh rho, se = 1.06 / sqrt(n - 3), Fieller et al.
    1957) and a warning: unmeasured below 4 pairs, misleading when the interval includes 0 or
    rho < 0.5."""
    from scipy.stats import spearmanr

    n = len(pairs)
    row: dict[str, Any] = {"n": n, "rho": None, "interval": None, "warning": None}
    if n >= 3:
        xs, ys = zip(*pairs, strict=True)
        rho = float(spearmanr(xs, ys).statistic)
        row["rho"] = None if math.isnan(rho) else rho
    if row["rho"] is not None and n >= 4:
        z, se = math.atanh(max(min(row["rho"], 0.999999), -0.999999)), 1.06 / math.sqrt(n - 3)
        row["interval"] = [math.tanh(z - 1.96 * se), math.tanh(z + 1.96 * se)]
    if row["interval"] is None:
        row["warning"] = f"only {n} promoted snapshots measured on both rungs; the transfer is unmeasured"
    elif row["interval"][0] <= 0 or row["rho"] < 0.5:
        row["warning"] = (
            f"rho {row['rho']:+.2f}, 95 % interval [{row['interval'][0]:+.2f}, {row['interval'][1]:+.2f}]; "
            "lengthen the rung's budget, or promote more of it (a smaller eta)"
        )
    return row


def transfer(lab: Lab) -> list[dict[str, Any]]:
    """Rank transfer between rungs, measured on the lab's own promoted snapshots (successive
    halving's and `nightlab promote`'s): for each pair (rung, next rung), Spearman's rho between their means on the two, with a 95 % Fisher interval
    (z = atanh rho, se = 1.06 / sqrt(n - 3), Fieller et al. 1957), and a warning when the screen
    misleads (interval includes 0, rho < 0.5) or too few snapshots say anything (n < 4)."""

    pairs: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    lower = lab.config.metric.lower_is_better
    cache: dict[str, dict[str, float]] = {}

    def means(tier: str) -> dict[str, float]:
        if tier not in cache:
            cache[tier] = _means(_ranking(lab, tier)[0])
        return cache[tier]

    def add(exp_id: str, tier: str, to: str) -> None:
        ident = lab.ledger.get(exp_id).identity
        low, high = means(tier), means(to)
        if ident in low and ident in high:
            pairs.setdefault((tier, to), {})[ident] = (low[ident], high[ident])

    for wave in lab.ledger.waves():
        for exp_id, d in decisions_for(wave).items():
            if d.get("promoted"):
                add(exp_id, d["tier"], d["to"])
        if wave.design == "promote" and wave.tier:  # `nightlab promote`, by hand or `--wave`
            for exp_id, tier in ((wave.spec or {}).get("screen_tiers") or {}).items():
                add(exp_id, tier, wave.tier)
    out = []
    for (tier, to), by_identity in sorted(pairs.items()):
        row = {"rung": tier, "next": to, **rank_transfer(list(by_identity.values()))}
        if row["warning"] and row["rho"] is not None and row["interval"] is not None:
            row["warning"] = f"screening on {tier} misleads: {row['warning']}"
        row["lower_is_better"] = lower
        out.append(row)
    # a rung whose runs' compile ran into the timed budget is reported with or without promotions
    for tier, warmup in warmup_capped(lab).items():
        row = next((r for r in out if r["rung"] == tier), None)
        if row is None:
            row = {"rung": tier, "next": next_rung(lab.config, tier), "n": 0, "rho": None, "interval": None}
            row.update(warning=None, lower_is_better=lower)
            out.append(row)
        row["warmup"] = warmup
    return out


def warmup_capped(lab: Lab) -> dict[str, dict[str, Any]]:
    """Per screening rung, how many of its ok runs (in the epoch in force, at the rung's budget)
    had their untimed warm-up ended by the cap rather than by their first steps, and a warning
    when any did.

    The clock's warm-up ends after the device's first steps or at a cap, a quarter of the budget
    (at most 60 s): a run whose compile outlasts the cap trains less in its timed budget. On a
    short rung that is a bias, not noise: a snapshot whose graph the worker has compiled before
    (a re-run, a learning-rate edit) starts warm, one that changes the model's shapes compiles
    cold. On an H200 the default model's cold compile took ~35-40 s (bench/RESULTS.md): a 75 s
    budget lost ~28 s of its training to it. Only runs that recorded both figures count (the
    built-in target's); foreign targets have no harness clock.
    """
    from nightlab import identity
    from nightlab.harness.serve import WARMUP_FRACTION_CAP, WARMUP_SECONDS_CAP

    epoch = identity.epoch_key(lab.config)
    out: dict[str, dict[str, Any]] = {}
    for tier in lab.config.fleet.tiers:
        budget = budget_of(lab.config, tier)
        if budget is None or next_rung(lab.config, tier) is None:
            continue
        cap = min(WARMUP_SECONDS_CAP, WARMUP_FRACTION_CAP * budget)
        runs = capped = 0
        for e in lab.ledger.experiments(tier=tier):
            warm, ran = e.metrics.get("warmup_seconds"), e.metrics.get("budget_seconds")
            if not e.ok or (e.epoch and e.epoch != epoch) or not isinstance(warm, (int, float)):
                continue
            if isinstance(ran, (int, float)) and float(ran) != budget:
                continue  # recorded at another budget: another rung's run
            runs += 1
            capped += warm >= cap - 1e-3  # the clock records the cap itself, rounded to 1 ms
        if not runs:
            continue
        warning = None
        if capped:
            warning = (
                f"{capped} of {runs} ok runs on {tier} ({budget:g} s) hit the untimed warm-up's cap of "
                f"{cap:g} s: their compile or start-up ran into the timed budget, which favours snapshots "
                "whose compile the worker had cached; lengthen the rung to at least four times the "
                "compile (docs/search.md)"
            )
        out[tier] = {"runs": runs, "capped": capped, "cap_seconds": cap, "warning": warning}
    return out
