"""`nightlab demo`: the whole loop, offline, on a CPU, in a few minutes, with a real find.

It creates a lab of the built-in GPT target with the `cpu` profile in `./nightlab-demo`, and
asks the question the RTX 5090 write-up had to answer (shared/CONTEXT.md): the lab starts from
the batch regime carried over from a bigger machine, `TOTAL_BATCH_SIZE = 2**13` tokens per
optimizer step (4 micro-batches of gradient accumulation here), and the demo finds out what
suits this one. It prepares the offline `demo` dataset, measures the carried-over baseline
three times (the noise floor), runs one wave of the smaller batches on the local fleet, settles a
close call with repeats, adopts the best variant only if it beats the baseline beyond the
noise (the verdict rule of every other wave: z raised for the wave's size), writes the report
and tells the story: each variant's mean ± sd, the winner's margin in noise sd's, the adopted
diff, and where to look next. Every step goes through the same API as the CLI commands (`init`,
`prepare`, `noise`, `sweep`, `adopt`, `report`), so the demo is also a recipe.

Why this question: under a 30 s wall-clock budget the optimizer steps are what a small model
learns from. 2**13 tokens per step leaves 4x fewer steps than the profile's 2**11 (on a quiet
2-core machine 2**11 runs about 270 steps in 30 s). Over 5 fresh demos under a load of 14-22 the
carried-over regime lost to 2**11 by 4.6-25 noise sd's in 4 runs and the winner was adopted; in
the fifth the load doubled between the rounds and the gain was within the noise
(bench/RESULTS.md). 2**14 loses by more, but its steps are long: on a starved CPU a step ran
past the budget's allowance (budget + 5 s) and most baseline runs ended `invalid`. The wave
has two variants so that it fits one round of the demo's two CPU slots.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nightlab.errors import NightlabError, UsageError
from nightlab.reruns import Reruns

DEMO_DIR = Path("nightlab-demo")
MARKER = "demo"  # a file in .nightlab/ that says the lab was made by `nightlab demo`
# The starting point: the batch regime of a bigger machine (see the module docstring).
CARRIED_OVER = {"TOTAL_BATCH_SIZE": "2**13"}
CARRIED_OVER_MESSAGE = "settings carried over from a bigger machine: TOTAL_BATCH_SIZE = 2**13"
# The wave: the smaller total batches this machine's profile would choose, one round of 2 slots.
DEFAULT_SPACES = ("TOTAL_BATCH_SIZE=2**11,2**12",)
QUESTION = (
    "the lab starts from the batch regime of a bigger machine (TOTAL_BATCH_SIZE = 2**13 tokens "
    "per step); does a smaller total batch suit this CPU better?"
)
# Three rounds of the demo's two CPU slots: on a loaded 2-core box the noise floor of a 10 s run
# reached sd 0.07-0.09 (gain 0.23): one round of repeats left it within the noise (t with 4 dof),
# two rounds once too (z 2.8 against 3.24).
MAX_SETTLE_REPEATS = 6
# The baseline's runs: the noise floor. Three, not two: the verdict's threshold is a t quantile for
# the floor's degrees of freedom, 27.8 at 1 dof for a wave of 2 and 6.5 at 2 (search/decide.py).
BASELINE_RUNS = 3
MAX_BASELINE_RETRIES = 2  # rounds of extra baseline runs when some gave no result


@dataclass(frozen=True)
class Variant:
    """One configuration the demo measured: its knobs, figure over its runs and verdict."""

    id: str
    knobs: dict[str, str]
    mean: float
    sd: float | None
    runs: int
    verdict: str | None


@dataclass(frozen=True)
class DemoResult:
    """What the demo asked and found (`nightlab demo --json` prints it)."""

    lab: Path
    baseline: float  # mean of the baseline's runs
    best_id: str | None
    best: float | None  # mean of the best variant's runs
    best_runs: int
    verdict: str | None
    adopted: bool
    files: list[Path]
    seconds: float
    question: str = QUESTION
    baseline_sd: float | None = None
    baseline_runs: int = 0
    variants: list[Variant] = field(default_factory=list)
    noise_sd: float | None = None  # the tier's noise floor (pooled sd of repeated runs)
    margin_sd: float | None = None  # the winner's gain over the baseline, in noise sd's
    z: float | None = None  # the winner's gain over the standard error of the difference
    z_needed: float | None = None  # what the verdict rule asked of a wave this size (its t threshold)
    diff: str = ""  # the adopted change, as `git diff`
    unsandboxed: str | None = None  # why runs went without the sandbox, with the fix (None: sandboxed)
    story: list[str] = field(default_factory=list)  # the lines printed at the end


def _fresh_dir(directory: Path, *, force: bool) -> None:
    if not directory.exists():
        return
    if (directory / ".nightlab" / MARKER).exists() or force:
        from nightlab.fleet import daemon

        if (directory / ".nightlab").is_dir():
            daemon.stop(directory)
        shutil.rmtree(directory)
        return
    raise UsageError(
        f"`{directory}` exists and was not made by `nightlab demo`; move it away or pass `--dir` another path"
    )


def run_demo(
    directory: Path = DEMO_DIR,
    *,
    slots: int = 2,
    spaces: Sequence[str] = DEFAULT_SPACES,
    budget: float | None = None,
    force: bool = False,
    say=print,
) -> DemoResult:
    """Run the demo in `directory` and return what it found (see the module docstring).

    Args:
        slots: CPU slots of the local fleet (each gets cores / slots threads).
        spaces: the wave's search spaces (`nightlab sweep` syntax).
        budget: training seconds per run (default: the `cpu` profile's).
        force: replace `directory` even if `nightlab demo` did not create it.
        say: where progress lines go.
    """
    from nightlab.lab import InitOptions, init_lab

    started = time.time()
    directory = directory.resolve()
    _fresh_dir(directory, force=force)

    say(f"[1/6] creating the lab {directory} (built-in GPT target, cpu profile, {slots} CPU slots)")
    init_lab(directory, InitOptions(profile="cpu", cpu_slots=slots, budget=budget))
    (directory / ".nightlab" / MARKER).write_text("made by nightlab demo; the next demo replaces this lab\n")
    _carry_over(directory)
    say(f"      the question: {QUESTION}")
    from nightlab.harness.sandbox import available

    unsandboxed = available()
    if unsandboxed is not None:  # said before the first run, and again in the story
        say(f"      runs will be unsandboxed: {unsandboxed}")

    try:
        return _run(directory, spaces=spaces, say=say, started=started, unsandboxed=unsandboxed)
    finally:
        # the demo leaves no fleet behind, also when interrupted (running runs are requeued)
        from nightlab.fleet import daemon

        daemon.stop(directory)


def _carry_over(directory: Path) -> None:
    """Commit the carried-over settings on the lab's branch: they are the baseline the demo measures."""
    from nightlab import snapshots
    from nightlab.search.knobs import set_knobs

    train = directory / "train.py"
    train.write_text(set_knobs(train.read_text(), CARRIED_OVER))
    snapshots.git(
        directory,
        *snapshots.identity_args(directory),
        "commit",
        "--quiet",
        "-m",
        CARRIED_OVER_MESSAGE,
        "train.py",
    )


def _run(
    directory: Path, *, spaces: Sequence[str], say, started: float, unsandboxed: str | None
) -> DemoResult:
    from nightlab import waves
    from nightlab.harness.data import prepare
    from nightlab.harness.profiles import Profile
    from nightlab.lab import Lab
    from nightlab.report import write_report

    with Lab(directory) as lab:
        profile = Profile.from_dict(lab.config.profile or {})
        say(f"[2/6] preparing the offline `{profile.dataset}` dataset (tokenizer + token cache)")
        prepare(profile, progress=True)
        tier = lab.config.fleet.default_tier
        metric = lab.config.metric.name
        base_identity = lab.head_identity()
        say(
            f"[3/6] measuring the carried-over baseline {BASELINE_RUNS} times: the noise floor "
            f"({profile.budget_seconds:.0f} s of training each)"
        )
        base = _baseline(lab, tier, metric, say=say, directory=directory)
        baseline = sum(base) / len(base)
        say(f"      baseline {metric} {baseline:.4f} (runs: {', '.join(f'{v:.4f}' for v in base)})")

        say(f"[4/6] one wave: full factorial over {', '.join(spaces)}")
        sweep = waves.submit_sweep(lab, list(spaces), design="full", description="demo wave", tier=tier)
        _wait(lab, f"wave {sweep.wave.id}", [e.id for e in sweep.experiments], say=say)

        say("[5/6] deciding: keep only a gain beyond the noise")
        best = _settle(lab, waves.wave_status(lab, sweep.wave.id).best, tier, sweep.wave.id, say=say)
        adopted = best is not None and best.verdict == "keep"
        if adopted:
            lab.adopt(best.id)
            say(f"      adopted {best.id}: {best.description}")
        elif best is not None:
            say(f"      best variant {best.id} is `{best.verdict}`: nothing adopted, the baseline stays")
        else:
            say("      every variant crashed: nothing adopted")

        say("[6/6] writing the report")
        files = write_report(lab.ledger, lab.config, lab.path, wide=True)
        found = _findings(lab, sweep.wave.id, base_identity, best, tier, adopted=adopted)
        result = DemoResult(
            lab=directory,
            baseline=baseline,
            best_id=best.id if best else None,
            best=found["best_mean"],
            best_runs=found["best_runs"],
            verdict=best.verdict if best else None,
            adopted=adopted,
            files=files,
            seconds=time.time() - started,
            baseline_sd=found["baseline_sd"],
            baseline_runs=len(base),
            variants=found["variants"],
            noise_sd=found["noise_sd"],
            margin_sd=found["margin_sd"],
            z=found["z"],
            z_needed=found["z_needed"],
            diff=found["diff"],
            unsandboxed=unsandboxed,
        )
        return _with_story(result, metric=metric)


def _wait(lab, label: str, ids: list[str], *, say) -> list[Any]:
    """Wait for `ids` and the re-runs of those that end degraded; say when runs were degraded."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    ids = list(ids)
    events = Reruns(lab.ledger)
    with Progress(
        TextColumn("      {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} done"),
        TextColumn("{task.fields[running]} running"),
        TimeElapsedColumn(),
        transient=False,
        console=Console(stderr=True),  # stdout carries data (--json)
    ) as bar:
        task = bar.add_task(label, total=len(ids), running=0)

        def tick(exps) -> None:
            done = sum(1 for e in exps if e.status.is_finished())
            running = sum(1 for e in exps if e.status.label == "running")
            bar.update(task, completed=done, running=running)

        while True:
            final = lab.wait(ids, timeout=3600, on_tick=tick, poll=0.5)
            more = events.of(final)
            if not more:
                break
            ids += more
            bar.update(task, total=len(ids))
        tick(final)
    degraded = [e for e in final if e.degraded]
    if degraded:
        say(
            f"      {len(degraded)} of {len(final)} runs degraded ({degraded[-1].id}: {degraded[-1].detail}): "
            "not judged; another program is using this machine's cores"
        )
    return final


def _baseline(lab, tier: str, metric: str, *, say, directory: Path) -> list[float]:
    """The incumbent's figures from the noise wave, with as many more runs as two results need."""
    from nightlab import waves
    from nightlab.fleet.daemon import ensure_running

    noise = waves.noise(lab, repeats=BASELINE_RUNS, tier=tier)
    _wait(lab, f"baseline x{BASELINE_RUNS}", [e.id for e in noise.experiments], say=say)
    runs = lab.ledger.experiments(wave=noise.wave.id)
    for _ in range(MAX_BASELINE_RETRIES):
        lost = [e for e in runs if not e.ok]
        if not lost or len(runs) - len(lost) >= 2:
            break
        # A run without a result (on a starved CPU a long step can end past the budget's
        # allowance: `invalid`): the noise floor needs two, so as many more as are missing.
        need = 2 - (len(runs) - len(lost))
        say(
            f"      {lost[-1].id} gave no result ({lost[-1].outcome}: {lost[-1].detail}); {need} more baseline run(s)"
        )
        more = waves.submit_incumbent(lab, tier, noise.wave.id, need)
        ensure_running(lab.path)
        _wait(lab, "baseline, again", [e.id for e in more], say=say)
        runs = lab.ledger.experiments(wave=noise.wave.id)
    base = [e.metric(metric) for e in runs if e.ok]
    if not base:
        first = runs[0]
        raise NightlabError(
            f"the baseline runs failed ({first.id}: {first.outcome}: {first.detail}); "
            f"see `nightlab show {first.id} --lab {directory}`"
        )
    return base


def _settle(lab, best, tier: str, wave_id: str, *, say):
    """Repeat a within-noise best variant while the demo's repeats allow; the best as it stands then."""
    from nightlab import waves
    from nightlab.search_loop import tier_slots

    left = MAX_SETTLE_REPEATS
    while best is not None and best.verdict == "within-noise" and left > 0:
        decision = lab.judge().decision(best.identity, best.tier)
        wanted = decision.repeats_to_settle.candidate if decision and decision.repeats_to_settle else None
        if wanted is None or wanted > left:
            break  # out of the demo's reach: the story says so
        # a round of the demo's slots costs the same wall time as one run of it
        n = min(left, max(wanted, tier_slots(lab, tier)))
        say(f"      {best.id} is within the noise: {n} more runs to settle it")
        more = waves.submit_repeats(lab, best.id, tier=tier, n=n, wave=wave_id)
        _wait(lab, f"repeats of {best.id}", [e.id for e in more], say=say)
        best = lab.ledger.get(best.id)
        left -= n
    return best


def _findings(lab, wave_id: str, base_identity: str, best, tier: str, *, adopted: bool) -> dict[str, Any]:
    """The figures of the story: every variant of the wave, the noise, the winner's margin, the diff."""
    from nightlab import snapshots
    from nightlab.analysis import figure, noise_sigma, ok_values
    from nightlab.waves import wave_points

    metric = lab.config.metric.name
    by_identity: dict[str, tuple[Any, dict[str, str]]] = {}
    for e, knobs in wave_points(lab, lab.ledger.wave(wave_id)):
        if e.identity != base_identity:  # the baseline's own repeats are not a variant
            by_identity.setdefault(e.identity, (e, knobs))
    variants = []
    for ident, (e, knobs) in by_identity.items():
        runs = lab.ledger.experiments(identity=ident, tier=tier)
        fig = figure(ok_values(runs, metric))
        if fig is not None:
            verdicts = {r.verdict for r in runs if r.ok}
            variants.append(
                Variant(
                    e.id, knobs, fig.mean, fig.std, fig.n, verdicts.pop() if len(verdicts) == 1 else e.verdict
                )
            )
    base_fig = figure(ok_values(lab.ledger.experiments(identity=base_identity, tier=tier), metric))
    sigma, _ = noise_sigma(lab.ledger, metric, tier)
    out: dict[str, Any] = {
        "variants": variants,
        "baseline_sd": base_fig.std if base_fig else None,
        "noise_sd": sigma,
        "best_mean": None,
        "best_runs": 0,
        "margin_sd": None,
        "z": None,
        "z_needed": None,
        "diff": "",
    }
    if best is None or base_fig is None:
        return out
    best_fig = figure(ok_values(lab.ledger.experiments(identity=best.identity, tier=tier), metric))
    if best_fig is None:
        return out
    from nightlab.identity import Incumbent

    # judged against the baseline, which an adoption has just replaced as the incumbent
    judge, baseline = lab.judge(), Incumbent(lab.ledger.wave(wave_id).base_snapshot, base_identity)
    decision = judge.decision(best.identity, tier, inc=baseline)
    # what the rule asked: the t threshold for the floor's dof at the wave's Sidak level
    z_needed = decision.threshold if decision is not None else judge.z_for(best.identity, tier, base_identity)
    out.update(
        best_mean=best_fig.mean,
        best_runs=best_fig.n,
        margin_sd=abs(best_fig.mean - base_fig.mean) / sigma if sigma else None,
        z=decision.z_score,
        z_needed=z_needed,
    )
    if adopted:
        out["diff"] = snapshots.diff(lab.path, "HEAD~1", "HEAD").strip()
    return out


def _with_story(result: DemoResult, *, metric: str) -> DemoResult:
    """The result with the lines that tell what was asked, measured, decided and where to look."""
    from dataclasses import replace

    from nightlab.web import DEFAULT_PORT

    def fig(mean: float, sd: float | None, n: int) -> str:
        return f"{mean:.4f}" + (f" ± {sd:.4f}" if sd is not None else "       ") + f" (n={n})"

    lines = [
        "what was asked: " + result.question,
        f"what each configuration scored ({metric}, mean ± sd over its runs):",
    ]
    lines.append(
        f"  baseline  {'TOTAL_BATCH_SIZE=2**13':<28} {fig(result.baseline, result.baseline_sd, result.baseline_runs)}"
    )
    for v in sorted(result.variants, key=lambda v: v.mean):
        knobs = " ".join(f"{k}={x}" for k, x in v.knobs.items())
        mark = "  <- best" if v.id == result.best_id else ""
        lines.append(f"  {v.id:<9} {knobs:<28} {fig(v.mean, v.sd, v.runs)}  {v.verdict or '-'}{mark}")
    if result.best_id is None:
        lines.append("what won: nothing: every variant crashed (see `nightlab results --all`)")
    else:
        gain = result.best - result.baseline
        noise = f"{result.noise_sd:.4f}" if result.noise_sd is not None else "unmeasured"
        margin = (
            f"{result.margin_sd:.1f} noise sd"
            if result.margin_sd is not None
            else "an unknown number of noise sd"
        )
        z = (
            f"; z {result.z:.1f} against the {result.z_needed:.2f} a wave of {len(result.variants)} "
            "needs on this noise floor"
            if result.z is not None and result.z_needed is not None
            else ""
        )
        lines.append(
            f"what won: {result.best_id} by {gain:+.4f} = {margin} (noise sd {noise}){z}: `{result.verdict}`"
        )
    if result.adopted:
        lines.append(f"what was adopted: {result.best_id}, committed on the lab's branch:")
        lines += [
            "  " + line
            for line in result.diff.splitlines()
            if line.startswith(("-", "+")) and not line.startswith(("---", "+++"))
        ]
    else:
        lines.append("what was adopted: nothing: no variant beat the noise, the baseline stays")
    if result.unsandboxed is not None:
        lines.append(
            f"how it was protected: not at all: runs were unsandboxed ({result.unsandboxed}); "
            "a run could have read the validation data"
        )
    png = result.lab / "progress.png"
    lines += [
        "where to look next:",
        f"  cd {result.lab} && nightlab results      every run, sorted, with its verdict",
        f"  nightlab dashboard                     then open http://127.0.0.1:{DEFAULT_PORT}/",
        f"  {png}   every run, the kept change labelled",
    ]
    return replace(result, story=lines)
