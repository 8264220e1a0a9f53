from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, say, with_lab


@click.command("tune")
@click.option(
    "--steps", type=click.IntRange(min=1), default=30, show_default=True, help="Training steps per candidate."
)
@click.option(
    "--batch-size",
    "batch_sizes",
    type=int,
    multiple=True,
    help="DEVICE_BATCH_SIZE candidates (repeatable; default half, same and double the current).",
)
@click.option(
    "--compile",
    "compiles",
    multiple=True,
    help="COMPILE candidates, on and/or off (repeatable; default both). On CPU, `--compile off` skips "
    "the ~40 s compile that every run would pay at start-up.",
)
@click.option(
    "--attention",
    "attentions",
    multiple=True,
    help="ATTENTION candidates, fa3 and/or sdpa (repeatable; default every backend that works here).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Runs per candidate; their spread decides whether the winner really beats the current setting.",
)
@click.option("--no-commit", is_flag=True, help="Whether or not to leave train.py unchanged (measure only).")
@click.option(
    "--no-measure",
    is_flag=True,
    help="Whether or not to skip queuing runs of the tuned incumbent after a tuning commit.",
)
@json_option
@with_lab
def command(lab, steps, batch_sizes, compiles, attentions, repeats, no_commit, no_measure, as_json) -> None:
    """Measure compile on/off, each attention backend and several batch sizes on this
    machine's device `--repeats` times each, print steady-state tokens/s with its 95 %
    interval and peak memory, and commit the fastest choice into train.py's knobs only
    when it beats the current setting beyond the spread. After a tuning commit the new
    incumbent (other files, so other research identity) is queued for measurement, as
    many runs as the old one had (at least 2), so the lab never sits on an unmeasured one.

    \b
    Example:
      nightlab tune --steps 20 --json | jq .best
    """
    from dataclasses import asdict

    from nightlab import snapshots
    from nightlab.cli.prepare import lab_profile
    from nightlab.harness.tune import tune

    lab_profile(lab)  # tune needs the built-in target
    dirty = snapshots.is_dirty(lab.path, ("train.py",))
    if dirty and not no_commit:
        from nightlab.errors import UsageError

        raise UsageError("train.py has uncommitted edits; commit or restore them before `nightlab tune`")
    result = tune(
        lab.path,
        steps=steps,
        batch_sizes=batch_sizes or None,
        compiles=compiles or None,
        attentions=attentions or None,
        write=not no_commit,
        progress=not as_json,
        repeats=repeats,
    )
    commit = None
    measured: list[str] = []
    if result.written and snapshots.is_dirty(lab.path, ("train.py",)):
        settings = " ".join(f"{k}={v}" for k, v in result.written.items())
        before = lab.head_identity()
        commit = snapshots.commit_files(lab.path, ["train.py"], f"tune: {settings}")
        if not no_measure:
            tier = lab.config.fleet.default_tier
            old = [e for e in lab.ledger.experiments(identity=before, tier=tier) if e.ok]
            exps = lab.submit(
                f"tune: measure the tuned incumbent ({settings})",
                tier=tier,
                repeats=max(2, len(old)),
                fresh_seeds=True,
                source="noise",
            )
            measured = [e.id for e in exps]
    if as_json:
        emit_json(
            {
                "rows": [asdict(r) for r in result.rows],
                "best": asdict(result.best),
                "written": result.written,
                "commit": commit,
                "current": asdict(result.current) if result.current else None,
                "beats_current": result.beats_current,
                "reason": result.reason,
                "measuring": measured,
            }
        )
        return
    if commit:
        follow = (
            f"; measuring the new incumbent: {', '.join(measured)}"
            if measured
            else "; measure it with `nightlab noise`"
        )
        say(
            f"committed the fastest settings ({', '.join(f'{k}={v}' for k, v in result.written.items())}): "
            f"{result.reason}{follow}"
        )
    elif no_commit:
        say(f"measured only; train.py unchanged ({result.reason})")
    else:
        say(f"train.py unchanged: {result.reason}")
