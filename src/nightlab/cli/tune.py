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
@click.option("--no-commit", is_flag=True, help="Whether or not to leave train.py unchanged (measure only).")
@json_option
@with_lab
def command(lab, steps, batch_sizes, compiles, attentions, no_commit, as_json) -> None:
    """Measure compile on/off, each attention backend and several batch sizes on this
    machine's device, print steady-state tokens/s and peak memory, and commit the fastest
    choice into train.py's knobs.

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
    )
    commit = None
    if result.written and snapshots.is_dirty(lab.path, ("train.py",)):
        settings = " ".join(f"{k}={v}" for k, v in result.written.items())
        commit = snapshots.commit_files(lab.path, ["train.py"], f"tune: {settings}")
    if as_json:
        emit_json(
            {
                "rows": [asdict(r) for r in result.rows],
                "best": asdict(result.best),
                "written": result.written,
                "commit": commit,
            }
        )
        return
    if commit:
        say(
            f"committed the fastest settings ({', '.join(f'{k}={v}' for k, v in result.written.items())}); "
            "the incumbent changed: measure it with `nightlab submit -m baseline`"
        )
    else:
        say(
            "train.py already had the fastest settings"
            if not no_commit
            else "measured only; train.py unchanged"
        )
