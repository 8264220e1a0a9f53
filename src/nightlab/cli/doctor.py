from __future__ import annotations

from pathlib import Path

import click

from nightlab.cli._common import emit_json, json_option, lab_option, say


@click.command("doctor")
@click.option(
    "--restore",
    "restore_",
    is_flag=True,
    help="Whether or not to put the newest good ledger backup back and recover what the snapshot refs, "
    "run folders and damaged ledger still prove (the controller must be stopped).",
)
@click.option(
    "--from",
    "backup_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="With --restore: this backup instead of the newest (see `doctor --json` for the list).",
)
@click.option(
    "--repair-wal",
    is_flag=True,
    help="Whether or not to keep what a cut write-ahead log committed before the cut.",
)
@json_option
@lab_option
def command(restore_, backup_path, repair_wal, as_json, lab_dir) -> None:
    """Check the lab and the machine: git, Python, torch and its device, free disk, the data
    fingerprint, ledger integrity, a controller that claims to run but does not, leases
    whose holder is gone, snapshots whose refs are missing, the share of recent runs that
    were degraded, the machine's load against the CPU slots, backups.

    One line per check; each problem names the command that fixes it. Exits 1 when
    something is wrong (a WARN line alone does not).

    `--restore` keeps the damaged ledger aside, brings back every later experiment its
    snapshot ref, run folder or readable rows prove, never requeues a finished run nor
    restarts a stopped controller, reserves every id in use, and lists what is lost.

    \b
    Example:
      nightlab doctor --json | jq -r '.checks[] | select(.ok | not) | .fix'
    """
    from nightlab import doctor
    from nightlab.errors import UsageError
    from nightlab.lab import find_lab

    lab = find_lab(lab_dir)
    if backup_path is not None and not restore_:
        raise UsageError("`--from FILE` goes with `--restore`")
    if restore_ and repair_wal:
        raise UsageError("use `--restore` or `--repair-wal`, not both")
    if restore_ or repair_wal:
        done = doctor.restore(lab, backup_path) if restore_ else doctor.repair_wal(lab)
        if as_json:
            emit_json(done)
            return
        if restore_:
            _say_restored(done)
        else:
            say(
                f"ledger repaired ({done['experiments']} experiments); the damaged copy is `{done['kept_copy']}`"
            )
        say("check again with `nightlab doctor`")
        return
    report = doctor.run_checks(lab)
    if as_json:
        emit_json(report.to_dict())
    else:
        for check in report.checks:
            click.echo(check.line())
    if report.problems:
        from nightlab.errors import NightlabError

        raise NightlabError(f"{len(report.problems)} problem(s) found; run the command after each `fix:`")


def _say_restored(done: dict) -> None:
    """The account of a restore, on stderr: nothing recovered or lost goes unsaid."""
    kept = f"; the damaged ledger is kept at `{done['replaced']}`" if done["replaced"] else ""
    say(f"restored `{done['restored']}` ({done['experiments']} experiments now){kept}")
    for item in done["recovered"]:
        say(f"  recovered {item['id']} ({item['status']}, {item['outcome']}) from its {item['from']}")
    if done["finished"]:
        say(f"  finished from their run folders (ended after the backup): {', '.join(done['finished'])}")
    if done["requeued"]:
        say(
            f"  queued again (had not ended; start with `nightlab fleet start`): {', '.join(done['requeued'])}"
        )
    if done["reserved"]:
        say(f"  ids kept reserved (never reused): {', '.join(done['reserved'])}")
    say("lost:")
    for line in done["lost"]:
        say(f"  - {line}")
