from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, say, with_lab


def lab_profile(lab):
    """The lab's profile, or a usage error for labs of a foreign target."""
    from nightlab.errors import UsageError
    from nightlab.harness.profiles import Profile

    if not lab.config.profile:
        raise UsageError(
            "this lab runs a foreign target, which prepares its own data (e.g. `python prepare.py`); "
            "`nightlab prepare` is for labs of the built-in target"
        )
    return Profile.from_dict(lab.config.profile)


@click.command("prepare")
@click.option(
    "--workers", type=click.IntRange(min=1), default=8, show_default=True, help="Parallel downloads."
)
@click.option("--quiet", is_flag=True, help="Whether or not to hide the progress display.")
@json_option
@with_lab
def command(lab, workers, quiet, as_json) -> None:
    """Download, tokenize and cache the lab's dataset (idempotent and resumable).

    The data directory is keyed by the profile's fingerprint; every run reports that
    fingerprint and a result from other data is marked invalid.

    \b
    Example:
      nightlab prepare --json | jq -r .data_dir
    """
    from nightlab.harness.data import load_manifest, prepare
    from nightlab.harness.profiles import fingerprint

    profile = lab_profile(lab)
    path = prepare(profile, progress=not quiet and not as_json, workers=workers)
    manifest = load_manifest(path, profile=profile)
    if as_json:
        emit_json({"data_dir": str(path), "fingerprint": fingerprint(profile), "manifest": manifest})
        return
    click.echo(path)
    say(f"data ready for profile `{profile.name}` (fingerprint {fingerprint(profile)})")
