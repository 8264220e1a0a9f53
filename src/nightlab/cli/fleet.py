from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, lab_option, say


@click.group("fleet")
def command() -> None:
    """Start, stop and inspect the lab's fleet controller."""


@command.command("start")
@click.option(
    "--cpu-slots",
    type=click.IntRange(min=1),
    default=None,
    help="Number of CPU slots (overrides nightlab.toml).",
)
@click.option(
    "--foreground",
    is_flag=True,
    help="Whether or not to run the controller in this process (Ctrl-C stops it).",
)
@lab_option
def start(cpu_slots, foreground, lab_dir) -> None:
    """Start the controller in the background (refused when one runs)."""
    from nightlab.fleet import daemon
    from nightlab.lab import find_lab

    path = find_lab(lab_dir)
    if foreground:
        code = daemon.serve(path, cpu_slots=cpu_slots)
        if code == 3:
            from nightlab.errors import ControllerError

            raise ControllerError(
                "a controller is already running for this lab; stop it with `nightlab fleet stop`"
            )
        return
    pid = daemon.start_background(path, cpu_slots=cpu_slots)
    click.echo(pid)
    say(f"controller started (pid {pid}); log: {path / '.nightlab' / 'controller.log'}")


@command.command("stop")
@lab_option
def stop(lab_dir) -> None:
    """Stop the controller; its running experiments go back to the queue."""
    from nightlab.fleet import daemon
    from nightlab.lab import find_lab

    pid = daemon.stop(find_lab(lab_dir))
    say("no controller was running" if pid is None else f"controller (pid {pid}) stopped")


@command.command("status")
@json_option
@lab_option
def status(as_json, lab_dir) -> None:
    """The controller's pid and each worker's state."""
    from nightlab.cli.status import fleet_state, print_state
    from nightlab.lab import Lab

    with Lab.open(lab_dir) as lab:
        state = fleet_state(lab)
    if as_json:
        emit_json(state)
        return
    print_state(state)
