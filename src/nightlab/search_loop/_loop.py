"""The search loop's callables bound to one lab (`_LabLoop`), and the plan they follow.

`nightlab.search_loop` (the package) wires them into `search.strategies.run_loop`; its docstring
describes what each step does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nightlab import identity, rungs
from nightlab.analysis import ok_values
from nightlab.errors import DuplicateExperimentError, LedgerError
from nightlab.ledger import Experiment, ExperimentStatus, SearchProgress, Source, Verdict
from nightlab.reruns import Reruns
from nightlab.search.decide import FLOOR_REPEATS, runs_without_floor
from nightlab.waves import (
    head_knobs,
    noise,
    submit_incumbent,
    submit_repeats,
    submit_wave,
    wave_effects,
    wave_points,
)

if TYPE_CHECKING:
    from nightlab.lab import Lab


@dataclass(frozen=True)
class WaitProgress:
    """Where the runs a search waits for stand (what `nightlab search` shows while it waits).

    Attributes:
        label: what is waited for (`w002 (search wave 1)`, `w003 settling e0007`, ...).
        done / running / queued: the runs finished (ok or not), running, and queued.
        crashed: finished runs that gave no result (degraded ones apart).
        elapsed: seconds since the wait began.
        best: (id, metric value) of the best ok run so far, or None.
        degraded: finished runs the machine starved; each is re-run once, and waited for.
    """

    label: str
    done: int
    running: int
    queued: int
    crashed: int
    elapsed: float
    best: tuple[str, float] | None
    degraded: int = 0

    def line(self, metric: str) -> str:
        text = f"{self.label}: {self.done} done, {self.running} running, {self.queued} queued"
        failed = [f"{self.crashed} crashed"] if self.crashed else []
        if self.degraded:
            failed.append(f"{self.degraded} degraded, re-run")
        if failed:
            text += f" ({', '.join(failed)})"
        if self.best is not None:
            text += f", best {metric} {self.best[1]:.6f} ({self.best[0]})"
        return text


def tier_slots(lab: Lab, tier: str) -> int:
    """How many experiments the lab's pools of `tier` run at once (the fleet's rule)."""
    from nightlab.fleet.slots import tier_slot_count

    return tier_slot_count(lab.config, tier, lab.ledger.workers())


@dataclass(frozen=True)
class SearchPlan:
    """What a `nightlab search` was asked for, resolved (tiers checked, sizes chosen).

    Attributes:
        strategy: `factorial`, `optuna`, `greedy`, `pattern` or `surface`.
        spaces: canonical space specs (`Dimension.spec()`).
        tier: the validation tier, where winners are judged and adopted.
        screen_tier: a cheaper tier each wave runs on first, or None.
        wave_size: proposals per wave.
        top_k: candidates promoted from the screen per wave.
        repeats: runs of each promoted candidate on the validation tier.
        settle: whether a within-noise best gets the repeats that would settle it (once per wave).
        effects_step: whether a factorial wave also measures the point its main effects predict.
    """

    strategy: str
    spaces: tuple[str, ...]
    tier: str
    screen_tier: str | None
    wave_size: int
    top_k: int
    repeats: int
    settle: bool = True
    effects_step: bool = False

    def key(self) -> dict[str, Any]:
        """The identity a resumed search is matched on (sizes may change between runs)."""
        return {
            "strategy": self.strategy,
            "spaces": list(self.spaces),
            "tier": self.tier,
            "screen_tier": self.screen_tier,
        }


class _LabLoop:
    """The callables `run_loop` needs, bound to one lab and one search plan."""

    def __init__(
        self,
        lab: Lab,
        plan: SearchPlan,
        dims: Sequence[Any],
        *,
        poll: float,
        note: Callable[[str], None],
        progress: Callable[[WaitProgress], None] | None = None,
    ):
        self.lab, self.plan, self.dims, self.poll, self.note = lab, plan, dims, poll, note
        self.progress = progress
        self.metric = lab.config.metric.name
        self.names = [d.name for d in dims]
        self.floor_ids: list[str] = []  # the noise floor's runs, in flight with the first wave
        self.judge = lab.judge()  # the one reader of verdicts: noise floor, incumbent values, best of a wave
        self.reruns = Reruns(lab.ledger)  # degraded runs followed to their one re-run

    # --- the ledger view of this search

    def waves(self) -> list[SearchProgress]:
        return self.lab.ledger.search_waves(self.plan.key())

    def observations(self, wave_id: str, index: int, adopted: str | None = None) -> list[Any]:
        from nightlab.search.strategies import Observation

        out = []
        for e, params in wave_points(self.lab, self.lab.ledger.wave(wave_id)):
            if e.status != ExperimentStatus.FINISHED:
                continue
            knobs = {k: v for k, v in params.items() if k in self.names}
            value = e.metric(self.metric) if e.ok else None
            out.append(Observation(e.id, knobs, value, index, e.id == adopted, degraded=e.degraded))
        return out

    def replay(self) -> tuple[list[Any], int, str | None]:
        """(history, waves judged, id of a wave submitted but not judged) from the ledger."""
        history: list[Any] = []
        done, pending = 0, None
        for w in self.waves():
            if w.judged:
                history += self.observations(w.wave_id, w.index, w.adopted)
                done += 1
            else:
                pending = w.wave_id
        return history, done, pending

    def past_incumbents(self) -> list[tuple[dict[str, str], list[float]]]:
        """Each incumbent this search's waves ran on, oldest first: (its searched knobs, its metric
        values on the validation tier). A resumed strategy gets them as the running one did."""
        out, seen = [], set()
        for w in self.waves():
            members = self.lab.ledger.experiments(wave=w.wave_id, with_metrics=False)
            parent = min(members, key=lambda e: e.seq).parent if members else None
            if parent is None or parent in seen:
                continue
            seen.add(parent)
            knobs = head_knobs(self.lab, parent)
            if any(n not in knobs for n in self.names):
                continue  # the editable file changed outside the search
            runs = self.lab.ledger.experiments(
                identity=identity.of(self.lab.path, parent), tier=self.plan.tier
            )
            out.append(({n: knobs[n].source for n in self.names}, ok_values(runs, self.metric)))
        return out

    def finish_adoption(self) -> None:
        """Complete an adoption that was decided before an interruption but not carried out."""
        for w in self.waves():
            if w.adopted and self.lab.ledger.get(w.adopted).adopted_at is None:
                self.note(f"completing the adoption of {w.adopted} decided in {w.wave_id}")
                self.adopt_id(w.adopted)

    def state(self, wave_id: str) -> SearchProgress:
        progress = self.lab.ledger.search_progress(wave_id)
        if progress is None:  # only the loop's own waves come here
            raise LedgerError(f"wave `{wave_id}` has no search record; run `nightlab doctor`")
        return progress

    def set_state(self, wave_id: str, **changes: Any) -> None:
        self.lab.ledger.update_search_progress(wave_id, **changes)

    # --- the loop's callables

    def start_noise_floor(self, wave: str = "the first wave") -> int:
        """Submit the incumbent's repeats when the tier has no noise floor, without waiting for them.

        They run alongside the first wave (which `wait` then waits for too), so the other workers
        do not idle through a round of three runs; when they all failed, again alongside the next
        wave (`submit`). Returns how many are in flight.
        """
        if self.floor_ids or self.judge.sigma(self.plan.tier) is not None:
            return len(self.floor_ids)
        ident, tier = self.lab.head_identity(), self.plan.tier
        # an interrupted search may have submitted them already
        pending = [
            e.id for e in self.lab.ledger.experiments(identity=ident, tier=tier) if not e.status.is_finished()
        ]
        if not pending:
            n = FLOOR_REPEATS
            self.note(f"no noise floor on tier {tier}: running the incumbent {n} times alongside {wave}")
            pending = [e.id for e in noise(self.lab, repeats=n, tier=tier).experiments]
        self.floor_ids = pending
        return len(pending)

    def report_noise_floor(self, runs: Sequence[Experiment]) -> None:
        sigma = self.judge.sigma(self.plan.tier)
        if sigma is not None:
            self.note(f"noise floor on {self.plan.tier}: {sigma:.6f}")
            return
        failed = [e for e in runs if not e.ok]
        degraded = sum(1 for e in failed if e.degraded)
        why = ", ".join(
            f"{n} {w}" for n, w in ((degraded, "degraded"), (len(failed) - degraded, "failed")) if n
        )
        self.note(
            f"noise floor on {self.plan.tier}: unmeasured (of the incumbent's {len(runs)} runs: "
            f"{why or 'none failed'}); "
            "measuring it again alongside the next wave"
        )

    def wait_ids(self, ids: list[str], label: str) -> list[Experiment]:
        """Wait for the runs `ids` and for the re-run of each that ends degraded: the search is
        judged on the re-runs' results, and the fleet's slots hold them before the next wave."""
        ids = list(ids)
        started = time.time()
        while True:
            final = self._wait_once(ids, label, started)
            more = self.reruns.of(final)
            if not more:
                return final
            ids += more

    def _wait_once(self, ids: list[str], label: str, started: float) -> list[Experiment]:
        if any(not e.status.is_finished() for e in self.lab.ledger.experiments(ids=ids, with_metrics=False)):
            from nightlab.fleet.daemon import ensure_running

            ensure_running(self.lab.path)  # a resumed search may find the controller gone idle
        if self.progress is None:
            return self.lab.wait(ids, poll=self.poll)
        report = self.progress
        sign = 1 if self.lab.config.metric.lower_is_better else -1

        def tick(exps: list[Experiment]) -> None:
            ok = [(e.id, e.metric(self.metric)) for e in exps if e.ok and e.metric(self.metric) is not None]
            report(
                WaitProgress(
                    label=label,
                    done=sum(1 for e in exps if e.status.is_finished()),
                    running=sum(1 for e in exps if e.status == ExperimentStatus.RUNNING),
                    queued=sum(1 for e in exps if e.status == ExperimentStatus.QUEUED),
                    crashed=sum(
                        1
                        for e in exps
                        if e.status == ExperimentStatus.FINISHED and not e.ok and not e.degraded
                    ),
                    elapsed=time.time() - started,
                    best=min(ok, key=lambda pair: sign * pair[1]) if ok else None,
                    degraded=sum(1 for e in exps if e.degraded),
                )
            )

        final = self.lab.wait(ids, poll=self.poll, on_tick=tick)
        tick(final)
        return final

    def submit(self, proposals: list[dict[str, str]], index: int) -> str:
        plan = self.plan
        if index > 0:  # the floor's runs failed before: measure it again alongside this wave
            self.start_noise_floor(f"search wave {index + 1}")
        wave = submit_wave(
            self.lab,
            proposals,
            design=f"search:{plan.strategy}",
            description=f"search {plan.strategy} wave {index + 1}",
            tier=plan.screen_tier or plan.tier,
            spec={"spaces": list(plan.spaces), **self.screening()},
            source=Source.SEARCH,
            search=(plan.key(), index),
        )
        return wave.wave.id

    def wait(self, wave_id: str) -> list[Any]:
        wave = self.lab.ledger.wave(wave_id)
        members = self.lab.ledger.experiments(wave=wave_id, with_metrics=False)
        reused = [e.id for e, _ in wave_points(self.lab, wave) if e.wave != wave_id]
        index = self.state(wave_id).index
        floor = list(self.floor_ids)
        ended = self.wait_ids(
            [e.id for e in members] + reused + floor, f"{wave_id} (search wave {index + 1})"
        )
        if floor:
            self.floor_ids = []
            head = self.lab.head_identity()  # the floor's runs and their re-runs
            self.report_noise_floor([e for e in ended if e.identity == head and e.tier == self.plan.tier])
        if self.plan.strategy == "factorial" and self.plan.effects_step and self.plan.screen_tier is None:
            self.effects_step(wave_id)
        if self.plan.screen_tier is not None:
            self.promote(wave_id)
        return self.observations(wave_id, index)

    def effects_step(self, wave_id: str) -> None:
        """After a factorial wave, also measure the point its main effects predict.

        The best corner of a fraction moves every knob, the right way or not; the fitted main
        effects say, knob by knob, which level is better. Every knob whose effect is significant
        (p < 0.05) moves to its better level, the others stay: one more round of up to 4 runs in
        the same wave, judged with the corners. Done once per wave (a resumed wave is not stepped
        again).
        """
        lab, plan = self.lab, self.plan
        if self.state(wave_id).stepped is not None:
            return
        result, values = wave_effects(lab, wave_id, interactions=False)
        lower = lab.config.metric.lower_is_better
        point: dict[str, str] = {}
        for term in result.main_effects:
            if term.p_value is None or term.p_value >= 0.05:
                continue
            levels = values[term.term]  # coded level -> source text
            point[term.term] = levels[min(levels) if (term.coefficient > 0) == lower else max(levels)]
        knobs = head_knobs(lab)
        full = {name: knobs[name].source for name in self.names}
        full.update(point)
        measured = [k for _, k in wave_points(lab, lab.ledger.wave(wave_id))]
        if not point or any({**full, **k} == full for k in measured):
            self.set_state(wave_id, stepped=())
            return
        n = min(tier_slots(lab, plan.tier), 4)
        try:
            exps = lab.submit(
                f"search {plan.strategy}: main-effects step from {wave_id}",
                sets=full,
                overrides=lab.files_at(),
                tier=plan.tier,
                repeats=n,
                wave=wave_id,
                source=Source.SEARCH,
            )
        except DuplicateExperimentError:  # measured before, outside this wave: nothing new to learn
            self.set_state(wave_id, stepped=())
            return
        self.set_state(wave_id, stepped=tuple(e.id for e in exps))
        self.wait_ids([e.id for e in exps], f"{wave_id} main-effects step")

    def screening(self) -> dict[str, Any]:
        """The wave spec that enrols a screened wave in successive halving (`nightlab.rungs`): its
        candidates go up the rungs to the validation tier, at most `top_k` of them."""
        plan = self.plan
        if plan.screen_tier is None:
            return {}
        step = rungs.next_rung(self.lab.config, plan.screen_tier)
        climbs = step is not None and self._climbs_to(step, plan.tier)
        return rungs.screen_spec(step if climbs else plan.tier, plan.repeats, plan.top_k)

    def _climbs_to(self, tier: str, target: str) -> bool:
        seen = set()
        while tier is not None and tier not in seen:
            if tier == target:
                return True
            seen.add(tier)
            tier = rungs.next_rung(self.lab.config, tier)
        return False

    def promote(self, wave_id: str) -> str | None:
        """Wait for the screened wave's promotions, rung by rung (asynchronous successive halving:
        the controller promotes a candidate as soon as it ranks in its rung's top 1/eta,
        `nightlab.rungs.review`), and for their runs. Returns the first promotion wave, or None."""
        lab = self.lab
        wave = lab.ledger.wave(wave_id)
        if rungs.SPEC_KEY not in (wave.spec or {}):
            # submitted before successive halving (a search resumed across an upgrade): enrol it now
            lab.ledger.update_wave_spec(wave_id, {**(wave.spec or {}), **self.screening()})
            rungs.review(lab, self.plan.screen_tier or self.plan.tier, start_controller=True)
        todo, seen = [(wave_id, self.plan.screen_tier or self.plan.tier)], set()
        while todo:
            wid, tier = todo.pop(0)
            self._await_decisions(wid, tier)
            for promo in self._promotions(wid):
                if promo in seen:
                    continue
                seen.add(promo)
                self.wait_ids(
                    [e.id for e in lab.ledger.experiments(wave=promo, with_metrics=False)],
                    f"promotion {promo}",
                )
                w = lab.ledger.wave(promo)
                if rungs.SPEC_KEY in (w.spec or {}):
                    todo.append((promo, w.tier or self.plan.tier))
        promotions = rungs.promotions_of(lab, wave_id)
        if promotions:
            self.set_state(wave_id, promotion=promotions[0])
            return promotions[0]
        self.set_state(
            wave_id,
            promotion=None,
            screened=f"no candidate ranked in the top 1/{lab.config.search.eta} of rung "
            f"{self.plan.screen_tier} ahead of the incumbent",
        )
        return None

    def _promotions(self, wave_id: str) -> list[str]:
        return [
            d["promoted"]
            for d in rungs.decisions_for(self.lab.ledger.wave(wave_id)).values()
            if d.get("promoted")
        ]

    def _await_decisions(self, wave_id: str, tier: str, patience: float = 30.0) -> None:
        """Until every candidate of the wave on `tier` has its decision and none is mid-promotion.
        The controller makes them as runs end; after `patience` seconds without them (a controller
        that stopped) this process reviews the rung itself."""
        lab = self.lab
        deadline = time.time() + patience
        while True:
            wave = lab.ledger.wave(wave_id)
            head = lab.head_identity()
            reps, idents = [], set()
            for e in lab.ledger.experiments(wave=wave_id, tier=tier, with_metrics=False):
                if e.ok and e.identity != head and e.identity not in idents:
                    idents.add(e.identity)
                    reps.append(e.id)
            decided = rungs.decisions_for(wave)
            if all(r in decided for r in reps) and not any(d.get("claimed") for d in decided.values()):
                return
            if time.time() > deadline:
                rungs.review(lab, tier, start_controller=True)
                return
            time.sleep(min(self.poll, 0.5))

    def pick_best(self, wave_id: str, observations: list[Any]) -> tuple[str, Any] | None:
        """The wave's best candidate on the validation tier and its decision (None: nothing to judge)."""
        lab, plan = self.lab, self.plan
        inc = lab.incumbent()
        by_obs = {o.id for o in observations}
        idents: dict[str, str] = {}  # identity -> the observation (screen run) that stands for it
        for e, _ in wave_points(lab, lab.ledger.wave(wave_id)):
            if e.id in by_obs and e.identity != inc.identity:
                idents.setdefault(e.identity, e.id)
        # the observation -> the snapshot judged on the validation tier: a screened wave's candidates
        # that climbed the rungs to it (`promote`), else the wave's own
        sources = rungs.promotions_of(lab, wave_id) if plan.screen_tier else [wave_id]
        judged = {
            e.identity
            for w in sources
            for e in lab.ledger.experiments(wave=w, with_metrics=False)
            if e.tier == plan.tier
        }
        candidates = {rep: ident for ident, rep in idents.items() if ident in judged}
        return self.judge.best_of_wave(candidates, plan.tier, inc)

    def settle(self, wave_id: str, rep: str, decision: Any) -> bool:
        """Run the repeats that would settle a within-noise best, once per wave; False when out of reach."""
        plan, lab = self.plan, self.lab
        needed = decision.repeats_to_settle
        # One round of the validation tier's slots, and at least 4 runs for a single worker.
        slots = tier_slots(lab, plan.tier)
        cap = max(slots, 4)
        if self.state(wave_id).settled:
            return False
        if needed is None and decision.se is None and decision.delta > 0:
            # no noise floor (its runs failed): a gain of any size stays within the noise until
            # the candidate has the runs a keep needs and the incumbent those of a floor
            ident = lab.ledger.get(rep).identity
            needed = runs_without_floor(
                len(self.judge.values(ident, plan.tier)),
                len(self.judge.values(lab.head_identity(), plan.tier)),
            )
        if needed is None:
            self.note(
                f"{wave_id}: best {rep} is within the noise and not settled: no affordable number of "
                "repeats would make its gain significant"
            )
            return False
        if needed.candidate + needed.incumbent > cap:
            self.note(
                f"{wave_id}: best {rep} is within the noise and not settled: it needs "
                f"{needed.candidate} + {needed.incumbent} runs, more than one round of tier {plan.tier} "
                f"({slots} slot{'s' if slots != 1 else ''}, at least 4); queue them by hand with "
                f"`nightlab submit --from {rep} --repeats {needed.candidate}`"
            )
            return False
        self.set_state(wave_id, settled=True)
        self.note(
            f"{wave_id}: best {rep} is within the noise; {needed.candidate} + {needed.incumbent} runs to settle it"
        )
        ids = [e.id for e in submit_repeats(lab, rep, tier=plan.tier, n=needed.candidate, wave=wave_id)]
        if needed.incumbent:
            ids += [e.id for e in submit_incumbent(lab, plan.tier, wave_id, needed.incumbent)]
        self.wait_ids(ids, f"{wave_id} settling {rep}")
        return True

    def decide(self, wave_id: str, observations: list[Any]) -> tuple[Any, str | None]:
        lab = self.lab
        picked = self.pick_best(wave_id, observations)
        within = picked is not None and picked[1].verdict == Verdict.WITHIN_NOISE
        if within and self.plan.settle and self.settle(wave_id, *picked):
            picked = self.pick_best(wave_id, observations)
        if picked is None:
            has_incumbent = bool(self.judge.values(lab.head_identity(), self.plan.tier))
            verdict = "no candidate" if has_incumbent else "incumbent unmeasured"
            self.set_state(wave_id, judged=True, adopted=None, verdict=verdict)
            return None, verdict
        rep, decision = picked
        adopted = rep if decision.verdict == Verdict.KEEP else None
        self.set_state(wave_id, judged=True, adopted=adopted, verdict=decision.verdict)
        winner = next((o for o in observations if o.id == adopted), None)
        return winner, decision.verdict

    def adopt(self, observation: Any) -> None:
        self.adopt_id(observation.id)

    def adopt_id(self, experiment_id: str) -> None:
        # The loop's own decision (best of the wave, corrected z) is the authority here: the stored
        # verdict of a screen run or of a run recorded before the incumbent's figure may differ.
        self.lab.adopt(experiment_id, force=True, decided_on=self.plan.tier)
