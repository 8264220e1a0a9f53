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
    """Run the offline demo: a lab of the built-in GPT target on the cpu profile, the
    baseline twice, one wave of variants, a noise-aware verdict, the report.

    \b
    Example:
      nightlab demo --json | jq .verdict
    """
    from dataclasses import asdict

    from nightlab.demo import DEFAULT_SPACES, run_demo

    result = run_demo(
        directory, slots=slots, spaces=spaces or DEFAULT_SPACES, budget=budget, force=force, say=say
    )
    if as_json:
        emit_json(
            {k: str(v) if k == "lab" else v for k, v in asdict(result).items()}
            | {"files": [str(f) for f in result.files]}
        )
        return
    say("")
    if result.adopted:
        say(
            f"found a real improvement: {result.best_id} averaged {result.best:.4f} over {result.best_runs} run(s) "
            f"vs baseline {result.baseline:.4f} ({result.best - result.baseline:+.4f}); adopted as the incumbent"
        )
    elif result.best_id:
        say(
            f"no variant beat the noise: the best, {result.best_id}, averaged {result.best:.4f} over "
            f"{result.best_runs} run(s) (`{result.verdict}`) vs baseline {result.baseline:.4f}; the baseline stays"
        )
    say(f"done in {result.seconds / 60:.1f} min. The lab: {result.lab}")
    for f in result.files:
        click.echo(f)
    say(f"next: cd {result.lab} && nightlab results   (or: nightlab dashboard)")
