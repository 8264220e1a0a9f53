from __future__ import annotations

import click

from nightlab.cli._common import ago, duration, emit_json, json_option, lab_option, say


@click.group("agent")
def command() -> None:
    """Supervise a coding agent (Claude Code, Codex, any command) as the lab's researcher."""


@command.command("run")
@click.option(
    "--agent",
    default=None,
    metavar="NAME|COMMAND",
    help="claude, codex, a name from [agent.commands], or a command line (default: agent.default).",
)
@click.option(
    "--max-hours",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop after this many hours.",
)
@click.option(
    "--max-experiments",
    type=click.IntRange(min=1),
    default=None,
    help="Stop once this many experiments were submitted during the run.",
)
@click.option(
    "--max-restarts-per-hour",
    type=click.IntRange(min=1),
    default=None,
    help="Stop when the agent needs more restarts than this in an hour (default: agent.max_restarts_per_hour).",
)
@click.option(
    "--stall-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Restart the agent after this long without output or submission (default: agent.stall_seconds).",
)
@click.option(
    "--max-cost",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="USD",
    help="Stop the agent (not the fleet) once its CLI reports this much API cost in the run.",
)
@click.option("--background", is_flag=True, help="Whether or not to detach and return at once.")
@lab_option
def run(
    agent, max_hours, max_experiments, max_restarts_per_hour, stall_seconds, max_cost, background, lab_dir
) -> None:
    """Run the agent headless in the lab; restart it with a fresh state prompt whenever it exits or stalls.

    Blocks until a limit is reached or Ctrl-C (which stops the agent too); `--background`
    detaches. Transcripts and prompts go to `.nightlab/agent/`.

    \b
    Example:
      nightlab agent run --agent claude --max-hours 8 --background && nightlab agent status --json | jq .session
    """
    from nightlab.agent import supervisor as sup
    from nightlab.agent.commands import default_stall_seconds, resolve_agent
    from nightlab.agent.control import start_background
    from nightlab.agent.transcripts import TokenPrices
    from nightlab.lab import Lab

    with Lab.open(lab_dir) as lab:
        path, config = lab.path, lab.config
    command_ = resolve_agent(agent, config.agent)
    limits = sup.Limits(
        max_hours=max_hours,
        max_experiments=max_experiments,
        max_restarts_per_hour=max_restarts_per_hour or config.agent.max_restarts_per_hour,
        stall_seconds=stall_seconds or default_stall_seconds(config),
        max_cost=max_cost,
        api_backoff=config.agent.api_backoff_seconds,
        api_backoff_max=config.agent.api_backoff_max_seconds,
    )
    if background:
        args = ["--agent", agent or config.agent.default]
        for flag, value in (
            ("--max-hours", max_hours),
            ("--max-experiments", max_experiments),
            ("--max-restarts-per-hour", limits.max_restarts_per_hour),
            ("--stall-seconds", limits.stall_seconds),
            ("--max-cost", max_cost),
        ):
            if value is not None:
                args += [flag, str(value)]
        pid = start_background(path, args)
        click.echo(pid)
        say(
            f"agent supervisor started (pid {pid}); follow with `nightlab agent status`, stop with `nightlab agent stop`"
        )
        return
    prices = TokenPrices(*config.agent.token_prices)
    import faulthandler

    # a fatal signal (a SIGBUS in a ledger read) leaves every thread's stack in the log
    # (`supervisor.log` when in the background), not a supervisor gone without a word
    faulthandler.enable()
    supervisor = sup.Supervisor(path, command_, limits, prices=prices, log=say)
    reason = supervisor.run()
    click.echo(reason)
    if reason in ("failed-at-start", "max-restarts-per-hour"):
        # the agent could not start, or kept failing: the cause was logged; a script must see a failure
        raise SystemExit(1)
    import signal

    if supervisor.stopped_by == signal.SIGINT:  # one rule for Ctrl-C: exit 130 (README, exit codes)
        raise click.exceptions.Exit(130)


@command.command("stop")
@lab_option
def stop(lab_dir) -> None:
    """Stop the supervisor and its agent; experiments already queued keep running."""
    from nightlab.agent.control import stop as stop_supervisor
    from nightlab.lab import find_lab

    pid = stop_supervisor(find_lab(lab_dir))
    say("no agent supervisor was running" if pid is None else f"agent supervisor (pid {pid}) stopped")


@command.command("status")
@json_option
@lab_option
def status(as_json, lab_dir) -> None:
    """Whether the supervisor runs, its agent, session, restarts, limits and last activity.

    \b
    Example:
      nightlab agent status --json | jq '{status, session, experiments_submitted}'
    """
    from nightlab.agent import lines
    from nightlab.agent.control import status as supervisor_status
    from nightlab.lab import find_lab
    from nightlab.ledger import AgentRunStatus

    state = supervisor_status(find_lab(lab_dir))
    if as_json:
        emit_json(state)
        return
    if "pid" not in state:
        click.echo("no agent supervisor has run in this lab; start one with `nightlab agent run`")
        return
    lim = state["limits"]
    click.echo(f"supervisor: {state['status']} (pid {state['pid']}), agent {state['agent']}")
    if state["status"] == AgentRunStatus.STOPPED:
        click.echo(f"  stopped: {state['stop_reason']}, {ago(state['updated_at'])} ago")
    elif state["status"] == AgentRunStatus.DEAD:
        alive = f"; its agent (pid {state['agent_pid']}) still runs" if state["agent_alive"] else ""
        click.echo(f"  the supervisor died without stopping{alive}")
    click.echo(
        f"  started {ago(state['started_at'])} ago; session {state['session']}, restarts {state['restarts_total']}"
    )
    if state["agent_pid"]:
        click.echo(f"  agent pid {state['agent_pid']}, last activity {ago(state['last_activity'])} ago")
    click.echo(f"  experiments submitted: {state['experiments_submitted']}")
    parts = [
        f"max hours {lim['max_hours'] if lim['max_hours'] is not None else '-'}",
        f"max experiments {lim['max_experiments'] if lim['max_experiments'] is not None else '-'}",
        f"max restarts/hour {lim['max_restarts_per_hour']}",
        f"stall after {duration(lim['stall_seconds'])}",
        "max cost " + ("-" if lim.get("max_cost") is None else f"${lim['max_cost']:.2f}"),
    ]
    click.echo(f"  limits: {', '.join(parts)}")
    if state.get("error"):
        click.echo(f"  error: {state['error']}")
    outage = lines.outage_line(state)
    if outage:
        click.echo(f"  {outage}")
    click.echo(f"  cost: {lines.cost_line(state)}")
    for session in (state.get("sessions") or [])[-3:]:
        click.echo(f"  {lines.session_line(session)}")
    if state["transcript"]:
        click.echo(f"  transcript: {state['transcript']}")
