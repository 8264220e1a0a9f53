from __future__ import annotations

from pathlib import Path

import click

from nightlab.cli._common import emit_json, json_option, say


@click.command("init")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option(
    "--target",
    type=click.Path(path_type=Path),
    default=None,
    help="An autoresearch-style repository to copy and run unchanged (default: the built-in GPT target).",
)
@click.option(
    "--command", "command", default=None, help="How to run the target (default: `python train.py`)."
)
@click.option("--editable", multiple=True, help="A file agents may edit (repeatable; default: train.py).")
@click.option("--metric", default="val_bpb", show_default=True, help="The summary key to optimise.")
@click.option(
    "--lower-is-better/--higher-is-better",
    default=True,
    show_default=True,
    help="Whether or not a lower metric is better.",
)
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="Hard limit per run in seconds (default: 600 for a foreign target, 2x budget + 120 built-in).",
)
@click.option(
    "--cpu-slots",
    type=click.IntRange(min=1),
    default=None,
    help="Number of CPU slots when the machine has no GPU (default: 1).",
)
@click.option(
    "--oversubscribe",
    is_flag=True,
    help="Whether or not to accept CPU slots that need more threads than the usable cores (most runs end `degraded`).",
)
@click.option(
    "--profile",
    default=None,
    help="Built-in target profile: h100, small-gpu, cpu (default: h100 when nvidia-smi lists a GPU, else cpu).",
)
@click.option("--budget", type=float, default=None, help="Override the profile's training budget in seconds.")
@click.option(
    "--dataset", default=None, help="Override the profile's dataset: climbmix, tinystories, demo, local:PATH."
)
@json_option
def command(
    directory: Path,
    target,
    command,
    editable,
    metric,
    lower_is_better,
    timeout,
    cpu_slots,
    oversubscribe,
    profile,
    budget,
    dataset,
    as_json: bool,
) -> None:
    """Create a lab in DIRECTORY: a git repository with the target's files, nightlab.toml and .nightlab/.

    \b
    Example:
      nightlab init mylab --target ~/autoresearch --cpu-slots 2 --json | jq .path
    """
    from nightlab.lab import InitOptions, init_lab

    path = init_lab(
        directory,
        InitOptions(
            target=target,
            command=command,
            metric=metric,
            lower_is_better=lower_is_better,
            cpu_slots=cpu_slots,
            oversubscribe=oversubscribe,
            editable=tuple(editable) or None,
            timeout=timeout,
            profile=profile,
            budget=budget,
            dataset=dataset,
        ),
    )
    if as_json:
        emit_json({"path": str(path)})
        return
    say(f"created lab {path}")
    from nightlab.config import CONFIG_NAME, load_config

    if load_config(path / CONFIG_NAME).target.builtin:  # the built-in target trains on data `prepare` makes
        say(f'next: cd {directory} && nightlab prepare && nightlab submit -m "baseline"')
    else:
        say(f'next: cd {directory} && nightlab submit -m "baseline"')
