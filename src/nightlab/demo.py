"""`nightlab demo`: the whole loop, offline, on a CPU, in a few minutes.

It creates a lab of the built-in GPT target with the `cpu` profile in `./nightlab-demo`,
prepares the offline `demo` dataset, measures the baseline twice (the noise floor), runs
one wave of variants over a few hyperparameters on the local fleet, settles a close call
with repeats, adopts the best variant only if it beats the baseline beyond the noise, and
writes the report. Every step goes through the same API as the CLI commands (`init`,
`prepare`, `noise`, `sweep`, `adopt`, `report`), so the demo is also a recipe.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nightlab.errors import NightlabError, UsageError

DEMO_DIR = Path("nightlab-demo")
MARKER = "demo"  # a file in .nightlab/ that says the lab was made by `nightlab demo`
# The wave: a 2x2 full factorial. On the cpu profile's 30 s budget a higher matrix learning
# rate and a larger model both change val_bpb by more than the seed noise, in either
# direction, so the verdict machinery has real differences to judge.
DEFAULT_SPACES = ("MATRIX_LR=0.04,0.08", "EMBEDDING_LR=0.6,1.2")
MAX_SETTLE_REPEATS = 2


@dataclass(frozen=True)
class DemoResult:
    lab: Path
    baseline: float
    best_id: str | None
    best: float | None  # mean of the best variant's runs
    best_runs: int
    verdict: str | None
    adopted: bool
    files: list[Path]
    seconds: float


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

    try:
        return _run(directory, spaces=spaces, say=say, started=started)
    finally:
        # the demo leaves no fleet behind, also when interrupted (running runs are requeued)
        from nightlab.fleet import daemon

        daemon.stop(directory)


def _run(directory: Path, *, spaces: Sequence[str], say, started: float) -> DemoResult:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

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

        def wait(label: str, ids: list[str]) -> None:
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

                final = lab.wait(ids, timeout=3600, on_tick=tick, poll=0.5)
                tick(final)

        per_run = profile.budget_seconds
        say(f"[3/6] measuring the baseline twice: the noise floor ({per_run:.0f} s of training each)")
        noise = waves.noise(lab, repeats=2, tier=tier)
        wait("baseline x2", [e.id for e in noise.experiments])
        runs = lab.ledger.experiments(wave=noise.wave.id)
        base = [e.metric(metric) for e in runs if e.ok]
        if not base:
            first = runs[0]
            raise NightlabError(
                f"the baseline runs failed ({first.id}: {first.outcome}: {first.detail}); "
                f"see `nightlab show {first.id} --lab {directory}`"
            )
        baseline = sum(base) / len(base)
        say(f"      baseline {metric} {baseline:.4f} (runs: {', '.join(f'{v:.4f}' for v in base)})")

        say(f"[4/6] one wave: full factorial over {', '.join(spaces)}")
        sweep = waves.submit_sweep(lab, list(spaces), design="full", description="demo wave", tier=tier)
        wait(f"wave {sweep.wave.id}", [e.id for e in sweep.experiments])
        status = waves.wave_status(lab, sweep.wave.id)
        best = status.best

        say("[5/6] deciding: keep only a gain beyond the noise")
        adopted = False
        if best is not None and best.verdict == "within-noise":
            from nightlab.analysis import decide_tree

            decision = decide_tree(lab.ledger, lab.config, lab.path, best.tree, best.tier)
            wanted = decision.repeats_to_settle.candidate if decision and decision.repeats_to_settle else None
            n = min(MAX_SETTLE_REPEATS, wanted or MAX_SETTLE_REPEATS)
            say(f"      {best.id} is within the noise: {n} more runs to settle it")
            more = waves.submit_repeats(lab, best.id, tier=tier, n=n, wave=sweep.wave.id)
            wait(f"repeats of {best.id}", [e.id for e in more])
            best = lab.ledger.get(best.id)
        if best is not None and best.verdict == "keep":
            lab.adopt(best.id)
            adopted = True
            say(f"      adopted {best.id}: {best.description}")
        elif best is not None:
            say(f"      best variant {best.id} is `{best.verdict}`: nothing adopted, the baseline stays")
        else:
            say("      every variant crashed: nothing adopted")

        say("[6/6] writing the report")
        files = write_report(lab.ledger, lab.config, lab.path, wide=True)
        best_fig = None
        if best is not None:
            from nightlab.analysis import figure, ok_values

            best_fig = figure(ok_values(lab.ledger.experiments(tree=best.tree, tier=best.tier), metric))
        return DemoResult(
            lab=directory,
            baseline=baseline,
            best_id=best.id if best else None,
            best=best_fig.mean if best_fig else None,
            best_runs=best_fig.n if best_fig else 0,
            verdict=best.verdict if best else None,
            adopted=adopted,
            files=files,
            seconds=time.time() - started,
        )
