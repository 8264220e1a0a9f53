"""`nightlab dashboard`: serve the live web dashboard of a lab."""

from __future__ import annotations

import ipaddress

import click

from nightlab.cli._common import lab_option, say
from nightlab.web import DEFAULT_PORT


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("dashboard")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True, help="TCP port."
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind. Anything but loopback exposes the lab to the network and needs `--token`.",
)
@click.option(
    "--token",
    default=None,
    envvar="NIGHTLAB_DASHBOARD_TOKEN",
    help="Secret every request must carry (open /?token=...) [env: NIGHTLAB_DASHBOARD_TOKEN].",
)
@lab_option
def command(port, host, token, lab_dir) -> None:
    """Serve a read-only live dashboard: overview, fleet, experiments, waves, agent.

    Nothing on the page can start, stop or change anything; it reads the ledger only.

    \b
    Example:
      nightlab dashboard --port 8350 &
      curl -s localhost:8350/api/overview | jq .counts
    """
    from nightlab.errors import UsageError
    from nightlab.lab import find_lab

    lab = find_lab(lab_dir)
    if not is_loopback(host):
        say(f"warning: `--host {host}` serves the lab to every machine that can reach this one")
        if not token:
            raise UsageError(
                f"`--host {host}` is not loopback: pass `--token SECRET` (or NIGHTLAB_DASHBOARD_TOKEN) "
                "so only people with the token can read the lab"
            )
    if token is not None and len(token) < 8:
        raise UsageError("`--token` is too short: use at least 8 characters, e.g. `openssl rand -hex 16`")
    import uvicorn

    from nightlab.web.app import create_app

    hosts = sorted({"127.0.0.1", "localhost", "::1", host}) if is_loopback(host) else ["*"]
    app = create_app(lab, token=token, allowed_hosts=hosts)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else shown}:{port}/"
    say(f"dashboard of {lab} on {url}{'?token=' + token if token else ''} (Ctrl-C to stop)")
    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False)
