from __future__ import annotations

import sys

import click

from nightlab.cli._common import duration, emit_json, json_option, say, with_lab


class LiveLine:
    """The search's progress while it waits: one line rewritten in place on a terminal, one line
    per change (a run started or ended) when stderr is piped, so a log reads as a list of events."""

    def __init__(self, metric: str, *, tty: bool) -> None:
        self.metric, self.tty = metric, tty
        self.shown = False
        self.last: tuple | None = None

    def show(self, progress) -> None:
        text = progress.line(self.metric)
        if self.tty:
            sys.stderr.write(f"\r\x1b[K{text}, {duration(progress.elapsed)}")
            sys.stderr.flush()
            self.shown = True
            return
        key = (progress.label, progress.done, progress.running, progress.queued)
        if key != self.last:
            self.last = key
            say(f"{text}, {duration(progress.elapsed)}")

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.shown = False


def interrupted_message(lab) -> str:
    """What Ctrl-C leaves behind: the runs keep going on the fleet; the same command resumes."""
    from nightlab.ledger import ExperimentStatus

    pending = lab.ledger.experiments(
        status=(ExperimentStatus.QUEUED, ExperimentStatus.RUNNING), with_metrics=False
    )
    ids = " ".join(e.id for e in pending)
    left = (
        f"the lab's {len(pending)} queued/running run(s) keep running on the fleet "
        f"(cancel them with `nightlab cancel {ids}`); "
        if pending
        else ""
    )
    return f"search interrupted: {left}run the same command again to resume from the ledger"


@click.command("search")
@click.option(
    "--strategy",
    type=click.Choice(["factorial", "optuna", "greedy", "pattern", "surface"]),
    # pattern: the most robust on bench/search_family.py (docs/search.md, "Picking a strategy")
    default="pattern",
    show_default=True,
    help="factorial designs around the incumbent, Optuna batches, the greedy one-knob hill climb, pattern (parallel stencil + fitted step) or surface (a quadratic model with interactions).",
)
@click.option(
    "--space", "spaces", multiple=True, required=True, metavar="SPEC", help="A search space (repeatable)."
)
@click.option(
    "--waves", type=click.IntRange(min=1), default=None, help="Total waves of this search (resumes count)."
)
@click.option(
    "--hours", type=click.FloatRange(min=0, min_open=True), default=None, help="Start no wave after H hours."
)
@click.option(
    "--wave-size",
    type=click.IntRange(min=1),
    default=None,
    help="Proposals per wave (default: 1 for greedy, else the tier's slots).",
)
@click.option(
    "--tier", default=None, help="Validation tier: winners are judged here (default: fleet.default_tier)."
)
@click.option(
    "--screen-tier",
    default=None,
    help="Run each wave on this screening rung first (a cheaper or shorter tier); its top 1/eta "
    "climb to --tier as their runs end.",
)
@click.option(
    "--top",
    "top_k",
    type=click.IntRange(min=1),
    default=None,
    help="At most k promoted per wave from the screen.",
)
@click.option(
    "--repeats", type=click.IntRange(min=1), default=2, show_default=True, help="Runs per promoted candidate."
)
@click.option(
    "--sampler", type=click.Choice(["tpe", "gp"]), default="tpe", show_default=True, help="Optuna sampler."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the strategy.")
@click.option(
    "--effects-step",
    is_flag=True,
    help="Whether or not to also run, after each factorial wave, the point its main effects predict.",
)
@click.option(
    "--settle/--no-settle",
    default=True,
    show_default=True,
    help="Whether or not to run the repeats that settle a within-noise best, once per wave "
    "(pattern runs them with its next wave instead).",
)
@json_option
@with_lab
def command(
    lab,
    strategy,
    spaces,
    waves,
    hours,
    wave_size,
    tier,
    screen_tier,
    top_k,
    repeats,
    sampler,
    seed,
    effects_step,
    settle,
    as_json,
):
    """Automatic research loop: propose a wave, run it, adopt a significant winner, repeat.

    Each wave is centred on the current incumbent; only a winner that beats it on the
    validation tier by more than the noise (z corrected for the wave's size) is adopted.
    Runs in the foreground and prints one line per wave; while it waits, stderr shows the
    runs done / running / queued and the best so far (a line rewritten on a terminal, one
    line per change when piped). Ctrl-C stops it (exit 130): queued runs keep running on the
    fleet, and the same command resumes from the ledger.

    \b
    Example:
      nightlab search --strategy factorial --space 'MATRIX_LR=log(0.01,0.08)' \\
          --space 'WARMUP_RATIO=uniform(0,0.2)' --waves 5
    """
    from nightlab.search_loop import run_search

    metric = lab.config.metric.name
    lines = []
    live = LiveLine(metric, tty=sys.stderr.isatty())

    def on_wave(summary) -> None:
        live.clear()
        if as_json:
            lines.append(summary)
        else:
            click.echo(summary.line(metric))

    def note(text: str) -> None:
        live.clear()
        say(text)

    try:
        result = run_search(
            lab,
            strategy=strategy,
            spaces=spaces,
            waves=waves,
            hours=hours,
            wave_size=wave_size,
            tier=tier,
            screen_tier=screen_tier,
            top_k=top_k,
            repeats=repeats,
            sampler=sampler,
            seed=seed,
            settle=settle,
            effects_step=effects_step,
            on_wave=on_wave,
            note=note,
            progress=live.show,
        )
    except KeyboardInterrupt:
        live.clear()
        say(interrupted_message(lab))
        raise click.exceptions.Exit(130) from None
    live.clear()
    if as_json:
        emit_json(_json_payload(result, lines, metric))
        return
    why = {"waves": "wave budget spent", "deadline": "time budget spent", "converged": "nothing left to try"}
    say(
        f"search stopped ({why[result.stopped]}); incumbent "
        + " ".join(f"{k}={v}" for k, v in result.incumbent.items())
    )


def _json_payload(result, summaries: list, metric: str) -> dict:
    """`nightlab search --json`'s document: why it stopped, the incumbent's knobs, each wave's summary."""
    return {
        "stopped": result.stopped,
        "incumbent": result.incumbent,
        "waves": [
            {
                "wave": s.wave_id,
                "index": s.index,
                "proposed": s.proposed,
                "finished": s.finished,
                "crashed": s.crashed,
                "degraded": s.degraded,
                "best": None if s.best is None else {"id": s.best.id, metric: s.best.value},
                "adopted": None if s.adopted is None else s.adopted.id,
                "verdict": s.verdict,
            }
            for s in summaries
        ],
    }
