"""The judge: the only code that decides and writes a verdict, and the source of every hint about one.

A verdict is written at three moments, all of them here:

    a run ends           `Judge.end` gives the verdict stored with the outcome, in the ledger
                         transaction that ends the attempt; `Judge.ended` then gives the
                         snapshot's other runs the verdict their pooled figure earns, and, when the
                         incumbent's own figure moved, re-judges the candidates judged too early
    a run cannot start   the same `Judge.end`: a launch refused is `invalid`, like a run that says
                         its result cannot be trusted
    adoption             `Judge.adopted`: for a search's own decision, the snapshot's runs on the
                         tier it was decided on carry `keep`; a forced adoption keeps the run's
                         own verdict (none included: no verdict is no `keep`, `Lab.adopt`)

The fleet's controller never imports this module: the lab hands it a `Judge` as its verdict
policy (`fleet.controller.VerdictPolicy`).

Outcome -> verdict (`Judge.verdict`):

    cancelled                               none (it says nothing about the idea)
    degraded                                degraded: the machine starved or throttled the run
                                            (fleet/health.py); recorded, never judged, re-run once
    invalid                                 invalid: integrity probe, data fingerprint, harness
                                            refusal, a remote worker's other code hash, a refused
                                            launch (fleet/runner.py, harness/owned.py)
    crash:*, timeout, infra (retries spent) crash
    ok, the incumbent's own files           keep when the snapshot was ever adopted, else baseline
    ok, a candidate                         `search.decide.verdict` against the incumbent on the
                                            same tier: keep / within-noise / discard; none while
                                            the incumbent has no figure there

Noise: the floor is the tier's pooled sd with its degrees of freedom (`Judge.floor`), and the
threshold is the Student-t quantile for them (`search.decide.critical`): a floor of three repeats
is itself noisy, and treated as exact it made wrong keeps (bench/RESULTS.md, issue 17). A
snapshot whose own runs scatter more than the floor allows is judged on its own spread.

z: a candidate of a wave of m candidates is one of m comparisons against one incumbent, so its z
is raised by the Sidak correction (`search.decide.adjusted_z`; at z = 2 the best of 8 null
candidates is kept in 13 % of waves uncorrected, 2.3 % for one comparison). The wave that counts
is the one the snapshot first ran in on that tier (`Judge.z_for`): repeats submitted afterwards
(`nightlab submit --from`, settle repeats) are judged with the same z, and so is the settle hint
that told someone to run them (`Judge.settle_hint`), so the printed repeats do settle the call.

A verdict keeps what it was judged against (`Judge.context`: incumbent commit, identity, figure).
Trust marks (`harness` / `unsandboxed` / `self-reported`, harness/owned.py) never change a
verdict: they say who vouches for the figure it was reached on, and `Judge.trust` is what listings
print beside it. `results.tsv`'s status column is the judge's too (`tsv_status`): `keep` only for
the snapshots the lab adopted and its baseline, so a `keep` nobody adopted reads `discard` there,
as in autoresearch, where `keep` means the change is on the branch.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightlab import identity
from nightlab.analysis import figure, noise_sigma, ok_values
from nightlab.config import LabConfig
from nightlab.identity import Incumbent
from nightlab.ledger import Experiment, ExperimentStatus, Ledger, Outcome, Verdict
from nightlab.search.decide import (
    MAX_REPEATS,
    Decision,
    Figure,
    adjusted_z,
    best_of_wave,
    promote,
    verdict,
)

__all__ = ["Judge", "Screened", "kept", "trust", "tsv_status", "verdict_label"]

# verdicts a run still earns again when the incumbent's figure or the noise floor moves
_PROVISIONAL = (None, Verdict.WITHIN_NOISE)
# what a screened candidate needs to be promoted to the validation tier
_PROMOTABLE = (Verdict.KEEP, Verdict.WITHIN_NOISE)


def kept(e: Experiment, adopted_identities: Iterable[str]) -> bool:
    """Whether a run counts as kept: its snapshot was adopted (or is the baseline) and it ran ok.

    A run that beat the incumbent but lost to its wave's best carries `keep` without being on the
    branch: not kept. `report.progress_png`, the dashboard's progress line and results.tsv all ask this.
    """
    if not e.ok:
        return False
    if e.adopted_at is not None or e.verdict == Verdict.BASELINE:
        return True
    return e.verdict == Verdict.KEEP and e.identity in set(adopted_identities)


def tsv_status(e: Experiment, adopted_identities: Iterable[str]) -> str:
    """The autoresearch status of a run in results.tsv: keep, discard or crash."""
    if e.degraded:  # it ran to the end on a starved or throttled machine: not kept, not a crash
        return "discard"
    if not e.ok:
        return "crash"
    return "keep" if kept(e, adopted_identities) else "discard"


def verdict_context(
    verdict: str | None, *, incumbent: bool, earlier_incumbent: bool, earlier_figure: bool = False
) -> str | None:
    """What a listing must say beside a verdict: "incumbent", "earlier incumbent", "earlier figure",
    or None.

    Args:
        incumbent: the run is of today's incumbent (its verdict is history, not a judgement of it).
        earlier_incumbent: the verdict was judged against another incumbent than today's.
        earlier_figure: judged against today's incumbent when its figure (mean, n) was another, so
            the delta beside it, against today's figure, may disagree with it (`analysis.ranking`).
    """
    if incumbent and verdict not in (Verdict.KEEP, Verdict.BASELINE):
        return "incumbent"  # judged before it was adopted, or adopted by force without a verdict
    if earlier_incumbent:
        return "earlier incumbent"
    if earlier_figure:
        return "earlier figure"
    return None


def verdict_label(
    verdict: str | None, *, incumbent: bool, earlier_incumbent: bool, earlier_figure: bool = False
) -> str:
    """A verdict as listings show it, with `verdict_context` when there is one."""
    shown = verdict or "-"
    context = verdict_context(
        verdict, incumbent=incumbent, earlier_incumbent=earlier_incumbent, earlier_figure=earlier_figure
    )
    if context == "incumbent":
        return f"incumbent (was {verdict})" if verdict else "incumbent (not judged)"
    if context is not None:
        return f"{shown} (vs {context})"
    return str(shown)


def trust(e: Experiment, config: LabConfig) -> str | None:
    """Who vouches for a run's figures: `harness`, `unsandboxed` or `self-reported` (harness/owned.py);
    None while it is queued or running (it has no figures yet).

    Shown beside every verdict (results, show, the dashboard, results-wide.tsv); it never changes one.
    """
    from nightlab.harness.owned import trust as vouched

    if not e.status.is_finished():
        return None
    return vouched(e.metrics, builtin=config.target.builtin)


@dataclass(frozen=True)
class Screened:
    """The candidates of a screening wave that go on to the validation tier, with their screen means."""

    means: dict[str, float]  # the run standing for each snapshot -> its mean on the screening tier
    chosen: list[str]  # the top k of `means`, best first


class Judge:
    """The verdict policy of one lab: decides verdicts and hints, and is the only writer of verdicts.

    Args:
        ledger: the lab's ledger.
        config: the configuration in force (metric, direction, `[search] z`).
        lab_dir: the lab (its HEAD is the incumbent).
    """

    def __init__(self, ledger: Ledger, config: LabConfig, lab_dir: Path) -> None:
        self.ledger, self.config, self.lab_dir = ledger, config, Path(lab_dir)
        self._lab: Any = None  # the lab, opened when a screening run first ends (`_review_rung`)
        self.metric = config.metric.name
        self.lower_is_better = config.metric.lower_is_better

    # ------------------------------------------------------------------ figures

    def incumbent(self) -> Incumbent:
        return identity.incumbent(self.lab_dir)

    def values(self, ident: str, tier: str) -> list[float]:
        """The metric of every ok run of the snapshot `ident` on `tier`."""
        return ok_values(self.ledger.experiments(identity=ident, tier=tier), self.metric)

    def incumbent_figure(self, tier: str, inc: Incumbent | None = None) -> Figure | None:
        return figure(self.values((inc or self.incumbent()).identity, tier))

    def sigma(self, tier: str) -> float | None:
        """The tier's noise floor in the comparison epoch in force."""
        return self.floor(tier)[0]

    def floor(self, tier: str) -> tuple[float | None, int]:
        """The tier's noise floor in the comparison epoch in force and its degrees of freedom: every
        verdict uses both (`search.decide.verdict` takes a t quantile for that many)."""
        return noise_sigma(self.ledger, self.metric, tier, epoch=identity.epoch_key(self.config))

    def context(self, tier: str, inc: Incumbent | None = None) -> dict[str, Any]:
        """What a verdict given now is judged against: the incumbent (commit, identity) and its figure."""
        inc = inc or self.incumbent()
        f = self.incumbent_figure(tier, inc)
        return {
            "incumbent": inc.commit,
            "identity": inc.identity,
            "mean": f.mean if f else None,
            "n": f.n if f else 0,
        }

    # ------------------------------------------------------------------ the rules

    def wave_z(self, wave: str | None, head_identity: str) -> float:
        """`[search] z`, raised for a member of `wave` by the Sidak correction for its candidate count."""
        if wave is None:
            return self.config.search.z
        idents = {e.identity for e in self.ledger.experiments(wave=wave, with_metrics=False)} - {
            head_identity
        }
        return adjusted_z(self.config.search.z, len(idents))

    def z_for(self, ident: str, tier: str, head_identity: str) -> float:
        """The z a snapshot is judged with on `tier`: that of the wave it first ran in there."""
        runs = self.ledger.experiments(identity=ident, tier=tier, with_metrics=False)
        first = min(runs, key=lambda e: e.seq, default=None)
        return self.wave_z(first.wave if first else None, head_identity)

    def decision(
        self, ident: str, tier: str, *, extra: float | None = None, inc: Incumbent | None = None
    ) -> Decision | None:
        """The `Decision` for the snapshot `ident` on `tier` against the incumbent, or None if undecidable.

        `extra` is a result of `ident` that is not in the ledger yet (the run being recorded).
        """
        inc = inc or self.incumbent()
        incumbent = self.values(inc.identity, tier)
        candidate = self.values(ident, tier)
        if extra is not None:
            candidate.append(extra)
        if not incumbent or not candidate:
            return None
        sigma, dof = self.floor(tier)
        return verdict(
            candidate,
            incumbent,
            noise_sigma=sigma,
            noise_dof=dof,
            z=self.z_for(ident, tier, inc.identity),
            lower_is_better=self.lower_is_better,
        )

    def verdict(
        self, exp: Experiment, outcome: Outcome | str, value: float | None, inc: Incumbent | None = None
    ) -> Verdict | None:
        """The verdict a run of `exp` that ended with `outcome` and metric `value` earns now (module table)."""
        outcome = Outcome(outcome)
        if outcome == Outcome.CANCELLED:
            return None
        if outcome == Outcome.DEGRADED:
            return Verdict.DEGRADED
        if outcome == Outcome.INVALID:
            return Verdict.INVALID
        if outcome != Outcome.OK:
            return Verdict.CRASH
        inc = inc or self.incumbent()
        if exp.identity == inc.identity:
            # the incumbent's own runs: kept if it came from an adoption, else the starting point
            runs = self.ledger.experiments(identity=exp.identity, with_metrics=False)
            return Verdict.KEEP if any(e.adopted_at is not None for e in runs) else Verdict.BASELINE
        decision = self.decision(exp.identity, exp.tier, extra=value, inc=inc)
        return Verdict(decision.verdict) if decision is not None else None

    def settle_hint(self, exp: Experiment, inc: Incumbent | None = None) -> str:
        """One line telling how to settle a within-noise result: which repeats to run.

        The repeats come from the same decision (and z) that gave the stored verdict.
        """
        decision = self.decision(exp.identity, exp.tier, inc=inc)
        noise = f"`nightlab noise --tier {exp.tier}`"
        if decision is None:  # the incumbent's runs there are gone from the figures (degraded, crashed)
            return f"{exp.id} is within noise, and the incumbent has no ok run on {exp.tier} now: run {noise}"
        if decision.se is None:
            # not a small gain: nothing measures the noise yet (a side of one run, no floor on the tier)
            single = len(self.values(exp.identity, exp.tier)) == 1
            steps = [f"{noise} (the tier's noise floor, from more runs of the incumbent)"]
            if single:
                steps.insert(0, f'`nightlab submit --from {exp.id} --repeats 1 -m "repeat {exp.id}"`')
            side = "one run a side shows" if single else "the incumbent's one run shows"
            return (
                f"{exp.id} is within noise because its gain ({decision.delta:+.6f}) cannot be weighed yet: "
                f"{side} no spread and {exp.tier} has no noise floor; settle it with " + " and ".join(steps)
            )
        repeats = decision.repeats_to_settle
        if repeats is None:
            return (
                f"{exp.id} is within noise: its gain ({decision.delta:+.6f}, {decision.z_score:.1f} standard "
                f"errors) would need more than {MAX_REPEATS} more runs a side to settle; treat it as no gain"
            )
        steps = [f'`nightlab submit --from {exp.id} --repeats {repeats.candidate} -m "repeat {exp.id}"`']
        if repeats.incumbent:
            steps.append(f"`nightlab noise --repeats {repeats.incumbent} --tier {exp.tier}`")
        return f"{exp.id} is within noise: settle it with " + " and ".join(steps)

    def explain(self, exp: Experiment, inc: Incumbent | None = None) -> tuple[str | None, str | None]:
        """Why a run has its verdict and what to do next, in one line each (None where nothing is due).

        The experiment page of the dashboard and `nightlab show --json` (`reason`, `next_step`) say
        what `nightlab results` prints below its table: a within-noise run's settle hint, and the
        decision's numbers behind a keep, within-noise or discard.
        """
        if exp.degraded:
            return exp.detail, None  # its re-run is named beside it (`Ledger.rerun_links`)
        inc = inc or self.incumbent()
        if not exp.ok or exp.identity == inc.identity:
            return None, None  # a crash says why in its detail; the incumbent is not a candidate
        if exp.verdict is None:
            return (
                f"not judged: the incumbent had no ok run on tier {exp.tier} when it ended",
                f"measure the incumbent with `nightlab noise --tier {exp.tier}`",
            )
        decision = self.decision(exp.identity, exp.tier, inc=inc)
        if decision is None or decision.verdict != exp.verdict:
            judged = exp.judged or {}
            mean = judged.get("mean")
            then = "no figure" if mean is None else f"{mean:.6f} (n={judged.get('n', 0)})"
            return (
                f"judged against the incumbent {str(judged.get('incumbent', ''))[:10]} at {then}"
                + (
                    f"; against today's figure it is {decision.verdict}: {decision.reason}"
                    if decision
                    else ""
                ),
                None,
            )
        if exp.verdict == Verdict.WITHIN_NOISE:
            return decision.reason, self.settle_hint(exp, inc)
        if exp.verdict == Verdict.KEEP and exp.adopted_at is None:
            return decision.reason, f"adopt it with `nightlab adopt {exp.id}`"
        return decision.reason, None

    def trust(self, exp: Experiment) -> str | None:
        """Who vouches for the figure a verdict was reached on (`trust`); None before it ends."""
        return trust(exp, self.config)

    def best_of_wave(
        self, candidates: Mapping[str, str], tier: str, inc: Incumbent | None = None
    ) -> tuple[str, Decision] | None:
        """A search wave's best candidate on `tier` and its decision, z corrected for the candidates measured.

        Args:
            candidates: the run standing for each candidate -> its snapshot (`ident`).

        Returns:
            (run id, decision), or None when the incumbent or every candidate is unmeasured there.
        """
        inc = inc or self.incumbent()
        incumbent = self.values(inc.identity, tier)
        if not incumbent:
            return None
        sigma, dof = self.floor(tier)
        return best_of_wave(
            {rep: self.values(ident, tier) for rep, ident in candidates.items()},
            incumbent,
            noise_sigma=sigma,
            noise_dof=dof,
            z=self.config.search.z,
            lower_is_better=self.lower_is_better,
        )

    def screened(self, runs: Sequence[Experiment], k: int, inc: Incumbent | None = None) -> Screened:
        """The candidates among a screening wave's `runs` to promote: verdict keep or within-noise on
        their tier (they beat the incumbent there), the best `k` by mean.

        `waves.promote_wave` and the search loop's screen both ask this, so they promote the same runs.
        """
        head_identity = (inc or self.incumbent()).identity
        by_identity: dict[str, list[Experiment]] = {}
        for e in runs:
            if e.ok and e.identity != head_identity and e.verdict in _PROMOTABLE:
                by_identity.setdefault(e.identity, []).append(e)
        means = {
            group[0].id: statistics.fmean(self.values(ident, group[0].tier))
            for ident, group in by_identity.items()
        }
        chosen = promote(means, k, lower_is_better=self.lower_is_better) if means else []
        return Screened(means, chosen)

    # ------------------------------------------------------------------ the writes

    def end(
        self, exp: Experiment, outcome: Outcome, value: float | None
    ) -> tuple[Verdict | None, dict[str, Any] | None]:
        """The verdict and judged context to store with a final end of `exp` (`Ledger.finish_attempt`)."""
        inc = self.incumbent()
        judged = self.context(exp.tier, inc) if outcome == Outcome.OK else None
        return self.verdict(exp, outcome, value, inc), judged

    def ended(
        self, exp: Experiment, outcome: Outcome, verdict: Verdict | str | None, judged: dict[str, Any] | None
    ) -> None:
        """After a run's final end was stored: its siblings' verdicts, the candidates judged too early,
        and, on a screening rung, the promotions the run makes due (`nightlab.rungs.review`)."""
        if outcome != Outcome.OK:
            return
        self._refresh_siblings(exp, verdict, judged)
        if verdict in (Verdict.KEEP, Verdict.BASELINE):
            inc = self.incumbent()
            if exp.identity == inc.identity:
                # the incumbent's figure (and maybe the noise floor) changed: candidates judged
                # too early get their verdict now, not when someone happens to read them
                self.refresh_pending(exp.tier, inc)
        self._review_rung(exp.tier)

    def _review_rung(self, tier: str) -> None:
        """A run on a screening rung ended: promote the rung's candidates now in its top 1/eta
        (asynchronous successive halving: no wave waits for another). A promotion that cannot be
        made is logged, never raised: it must not stop the fleet; the next run's review retries."""
        from nightlab import rungs
        from nightlab.errors import NightlabError

        if not rungs.screening_tier(self.ledger, tier):
            return
        try:
            if self._lab is None:
                from nightlab.lab import Lab

                self._lab = Lab(self.lab_dir)
            rungs.review(self._lab, tier)
        except NightlabError as e:
            self.ledger.log_event("promote-failed", None, tier=tier, error=str(e))

    def _refresh_siblings(
        self, exp: Experiment, verdict: Verdict | str | None, judged: dict[str, Any] | None
    ) -> None:
        """Give the snapshot's other ok runs on the tier the verdict their pooled figure earns now.

        An adopted run keeps the verdict it was adopted with: a forced adoption stays on record as
        what it was (`incumbent (was within-noise)`), not a `keep` its later repeats carry.
        """
        for other in self.ledger.experiments(identity=exp.identity, tier=exp.tier, with_metrics=False):
            if other.id == exp.id or not other.ok or other.adopted_at is not None:
                continue
            # a candidate's same verdict on a newer figure is stored with it too: listings mark a
            # verdict judged on another figure than today's (`analysis.ranking`)
            newer = judged is not None and judged.get("identity") != exp.identity and other.judged != judged
            if other.verdict != verdict or newer:
                self.ledger.set_verdict(other.id, verdict, judged=judged)

    def refresh_pending(self, tier: str, inc: Incumbent | None = None) -> None:
        """Re-judge the incumbent's candidates on `tier` whose verdict was recorded before it could be.

        A run that ended before the incumbent had a figure on its tier has no verdict, and one judged
        before the tier had a noise floor is `within-noise` by default. Every snapshot derived from
        the incumbent (its parent is HEAD) with such a verdict gets the one its runs earn now.
        """
        inc = inc or self.incumbent()
        seen: set[str] = set()
        candidates = self.ledger.experiments(
            status=ExperimentStatus.FINISHED, tier=tier, parent=inc.commit, with_metrics=False
        )
        for e in candidates:
            if e.identity in seen or e.identity == inc.identity or not e.ok or e.verdict not in _PROVISIONAL:
                continue
            seen.add(e.identity)
            new = self.verdict(e, Outcome.OK, None, inc)
            judged = self.context(tier, inc)
            if new is not None and (new != e.verdict or e.judged != judged):
                self.ledger.set_verdict(e.id, new, judged=judged)
                self._refresh_siblings(e, new, judged)

    def adopted(self, exp: Experiment, *, decided_on: str | None = None) -> None:
        """Record the adoption of `exp` and the verdicts it implies.

        A forced adoption keeps the run's own verdict, none included: it was adopted, not judged
        better, and listings show it as `incumbent (was ...)` (`verdict_label`), never as a `keep`.
        `decided_on` is the tier a search judged it on (its decision, best of the wave with the
        corrected z, is the authority there): the snapshot's ok runs on that tier then carry `keep`,
        whatever a screen run or a run recorded too early said.
        """
        self.ledger.mark_adopted(exp.id, verdict=exp.verdict)
        if decided_on is None:
            return
        for e in self.ledger.experiments(identity=exp.identity, tier=decided_on, with_metrics=False):
            if e.ok:
                self.ledger.set_verdict(e.id, Verdict.KEEP)
