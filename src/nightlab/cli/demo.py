from __future__ import annotations

from pathlib import Path

import click

from nightlab.cli._common import emit_json, json_option, say


@click.command("demo")
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default=Path("nightlab-demo"),
    show_default=True,
    help="Where to create the demo lab (a previous demo lab there is replaced).",
)
@click.option(
    "--slots", type=click.IntRange(min=1), default=2, show_default=True, help="CPU slots of the local fleet."
)
@click.option(
    "--space",
    "spaces",
    multiple=True,
    help="A search space for the wave (repeatable; `nightlab sweep` syntax).",
)
@click.option(
    "--budget", type=float, default=None, help="Training seconds per run (default: the cpu profile's 30)."
)
@click.option(
    "--force", is_flag=True, help="Whether or not to replace DIR even if the demo did not create it."
)
@json_option
def command(directory, slots, spaces, budget, force, as_json) -> None:
    """Run the offline demo: a lab of the built-in GPT target on the cpu profile that starts
    from the batch regime of a bigger machine, the baseline three times, one wave of smaller batches,
    a noise-aware verdict, the adoption of a real winner, the report and the story.

    \b
    Example:
      nightlab demo --json | jq .verdict
    """
    from dataclasses import asdict

    from nightlab.demo import DEFAULT_SPACES, run_demo

    result = run_demo(
        directory, slots=slots, spaces=spaces or DEFAULT_SPACES, budget=budget, force=force, say=say
    )
    say("")  # the story is for people: stderr, with or without --json
    for line in result.story:
        say(line)
    say(f"done in {result.seconds / 60:.1f} min" + ("" if as_json else "; the files it wrote:"))
    if as_json:
        emit_json(
            {k: str(v) if k == "lab" else v for k, v in asdict(result).items()}
            | {"files": [str(f) for f in result.files]}
        )
        return
    for f in result.files:
        click.echo(f)
