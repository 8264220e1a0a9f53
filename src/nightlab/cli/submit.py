from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, say, with_lab


def parse_sets(values: tuple[str, ...]) -> dict[str, str]:
    from nightlab.errors import UsageError

    out = {}
    for item in values:
        name, eq, value = item.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise UsageError(f"`--set {item}` must look like NAME=VALUE, e.g. `--set MATRIX_LR=0.02`")
        name = name.strip()
        if name in out:  # the last one silently winning would measure something nobody meant
            raise UsageError(
                f"`--set {name}` is given twice (`{out[name]}` and `{value.strip()}`); give each knob once"
            )
        out[name] = value.strip()
    return out


@click.command("submit")
@click.option("-m", "--message", "description", required=True, help="What this experiment tries.")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="NAME=VALUE",
    help="Rewrite an UPPERCASE constant in the snapshot only (repeatable).",
)
@click.option("--tier", default=None, help="Run on workers of this tier (default: fleet.default_tier).")
@click.option(
    "--seed", type=int, default=None, help="Seed (default 0); a different seed is a new measurement."
)
@click.option(
    "--repeats", type=click.IntRange(min=1), default=1, help="Queue N runs with distinct unused seeds."
)
@click.option(
    "--from",
    "from_id",
    default=None,
    metavar="ID",
    help="Take the files of experiment ID's snapshot instead of the working tree (to repeat it).",
)
@click.option("--priority", type=int, default=0, help="Higher runs first (default 0).")
@click.option("--force", is_flag=True, help="Whether or not to queue an already measured snapshot/tier/seed.")
@click.option("--no-start", is_flag=True, help="Whether or not to leave the controller stopped.")
@click.option(
    "--screen",
    is_flag=True,
    help="Run it short first, on the screening rung below --tier; promoted by itself when it ranks "
    "in the rung's top 1/eta (docs/search.md, 'Screening').",
)
@json_option
@with_lab
def command(
    lab, description, sets, tier, seed, repeats, from_id, priority, force, no_start, screen, as_json
) -> None:
    """Snapshot the editable files (uncommitted edits included) and queue the experiment.

    The working tree is never changed. Starts the fleet controller if none runs.

    \b
    Example:
      nightlab submit -m "lr 0.02" --set MATRIX_LR=0.02 --json | jq -r '.[0].id'
    """
    overrides, base = None, "HEAD"
    if from_id:
        overrides, base = lab.files_of(from_id)
    how = {
        "sets": parse_sets(sets),
        "overrides": overrides,
        "base": base,
        "tier": tier,
        "seed": seed,
        "repeats": repeats,
        # `--from ID` repeats a measurement: even one run needs a seed not used yet (the settle
        # hint of a one-run gain is `--from ID --repeats 1`)
        "fresh_seeds": bool(from_id) and seed is None,
        "priority": priority,
        "force": force,
        "start_controller": not no_start,
    }
    if screen:
        from nightlab.rungs import submit_screened

        exps = submit_screened(lab, description, **how)
    else:
        exps = lab.submit(description, **how)
    if as_json:
        emit_json([{"id": e.id, "snapshot": e.snapshot, "tier": e.tier, "seed": e.seed} for e in exps])
        return
    for e in exps:
        click.echo(e.id)
    say(f"queued {len(exps)} on tier {exps[0].tier}; follow with `nightlab wait {exps[-1].id}`")
    if screen:
        say(f"screening on {exps[0].tier}: `nightlab show {exps[0].id}` says whether it was promoted and why")
