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
    """Start the controller in the background; when one runs, print its pid and do nothing.

    \b
    Example:
      nightlab fleet start && nightlab status
    """
    from nightlab.fleet import daemon
    from nightlab.lab import find_lab

    path = find_lab(lab_dir)
    if foreground:
        from nightlab.config import load_lab_config
        from nightlab.fleet.health import check_capacity
        from nightlab.judge import Judge

        check_capacity(load_lab_config(path).config, cpu_slots=cpu_slots)
        code = daemon.serve(path, policy=Judge, cpu_slots=cpu_slots)
        if code == 3:
            from nightlab.errors import ControllerError

            raise ControllerError(
                "a controller is already running for this lab; stop it with `nightlab fleet stop`"
            )
        if code:
            from nightlab.errors import ControllerError

            raise ControllerError(
                f"the controller stopped with code {code}; see {path / '.nightlab' / 'controller.log'}"
            )
        return
    started = daemon.start_background(path, cpu_slots=cpu_slots)
    click.echo(started.pid)
    if started.new:
        say(f"controller started (pid {started.pid}); log: {path / '.nightlab' / 'controller.log'}")
        return
    slots = " with its own slots (`--cpu-slots` applies from the next start)" if cpu_slots else ""
    say(
        f"controller already running (pid {started.pid}){slots}; nothing to do "
        "(restart it with `nightlab fleet stop && nightlab fleet start`)"
    )


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
    """The controller's pid, each worker's state, and each SkyPilot cluster's state and cost so far."""
    from nightlab.cli.status import print_state
    from nightlab.lab import Lab
    from nightlab.views import fleet_state

    with Lab.open(lab_dir) as lab:
        state = fleet_state(lab)
    if as_json:
        emit_json(state)
        return
    print_state(state)


@command.command("up", short_help="Launch and set up the SkyPilot clusters (one per remote worker).")
@click.option(
    "--relaunch",
    is_flag=True,
    help="Whether or not to launch clusters that are already up again (reruns set-up after editing "
    "fleet/skypilot.yaml).",
)
@json_option
@lab_option
def up(relaunch, as_json, lab_dir) -> None:
    """Launch one SkyPilot cluster per remote worker and wait until each is set up.

    Set-up (fleet/skypilot.yaml) installs nightlab and the target's dependencies and prepares
    the lab's data. Clusters stop themselves after `autostop` idle minutes.

    \b
    Example:
      nightlab fleet up --json | jq -r '.[] | select(.state != "up") | .worker'
    """
    from nightlab.errors import NightlabError
    from nightlab.fleet.skypilot import fleet_up
    from nightlab.lab import find_lab

    path = find_lab(lab_dir)

    def progress(worker: str, state: str, detail: str | None) -> None:
        say(f"{worker}: {state}" + (f" ({detail})" if detail else ""))

    results = fleet_up(path, relaunch=relaunch, on_change=progress)
    if as_json:
        emit_json(results)
    else:
        for r in results:
            price = "-" if r["hourly_price"] is None else f"${r['hourly_price']:.2f}/h"
            slots = r.get("slots") or 1
            click.echo(
                f"{r['worker']}\t{r['cluster']}\t{r['state']}\t{r['gpu_name'] or '-'}\t{price}\t"
                f"{slots} slot{'s' if slots != 1 else ''}"
            )
    failed = [r for r in results if r["state"] != "up"]
    if failed:
        first = failed[0]
        log = path / ".nightlab" / "fleet" / first["cluster"] / "launch.log"
        raise NightlabError(
            f"{len(failed)} of {len(results)} clusters are not up; `{first['worker']}`: {first['detail']}; "
            f"see {log}, fix fleet/skypilot.yaml or nightlab.toml, then rerun `nightlab fleet up`"
        )


@command.command("down", short_help="Stop the controller and tear down the SkyPilot clusters.")
@lab_option
def down(lab_dir) -> None:
    """Stop the controller (its runs go back to the queue) and tear down every cluster of the lab."""
    from nightlab.fleet import daemon
    from nightlab.fleet.skypilot import fleet_down
    from nightlab.lab import find_lab

    path = find_lab(lab_dir)
    pid = daemon.stop(path)
    if pid is not None:
        say(f"controller (pid {pid}) stopped; its running experiments are queued again")
    names = fleet_down(path)
    for name in names:
        click.echo(name)
    say(f"{len(names)} cluster(s) torn down")
