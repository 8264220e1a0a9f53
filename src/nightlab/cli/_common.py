"""Helpers shared by the command modules: opening the lab, JSON output, tables."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click

from nightlab.display import ago, duration  # noqa: F401 - the commands' formatters, shared with the dashboard

lab_option = click.option(
    "--lab",
    "lab_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    envvar="NIGHTLAB_DIR",
    help="The lab directory (default: the lab containing the current directory) [env: NIGHTLAB_DIR].",
)
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Whether or not to print compact JSON on stdout."
)


def with_lab(fn: Callable) -> Callable:
    """Open the lab for the command (passed as `lab`) and close it afterwards."""

    @lab_option
    @wraps(fn)
    def wrapper(*args: Any, lab_dir: Path | None, **kwargs: Any) -> Any:
        from nightlab.lab import Lab

        with Lab.open(lab_dir) as lab:
            if lab.config_warning:
                say(lab.config_warning)
            from nightlab.identity import epoch_info, epoch_line

            epoch = epoch_info(lab.path, lab.ledger, lab.config)
            if epoch["since"] is None and epoch["total"] > 1:  # the change was just committed
                say(f"nightlab.toml changed what is measured: {epoch_line(epoch)}")
            return fn(*args, lab=lab, **kwargs)

    return wrapper


def emit_json(data: Any) -> None:
    """`data` as one line of compact JSON on stdout (`views.json_text`: NaN and infinity are null)."""
    from nightlab.views.encode import json_text

    sys.stdout.write(json_text(data) + "\n")


def say(message: str) -> None:
    """Status for people: stderr, so stdout stays data."""
    click.echo(message, err=True)


def console():
    """Tables for stdout. Piped (an agent, a file), rich would cut rows at 80 columns: allow 200."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 200)


def fmt(value: float | None, digits: int = 6) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
