"""The `nightlab` command line: a thin layer over `nightlab.lab` and friends.

Commands live one per module and are imported only when invoked, so `nightlab --help`
and the fast commands agents call in a loop stay quick. Exit codes: 0 ok, 1 the
operation failed, 2 bad usage or bad input (README, "Commands").
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import click

# name -> (module, short help). Modules are imported lazily by LazyGroup.
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("nightlab.cli.init", "Create a lab."),
    "submit": ("nightlab.cli.submit", "Snapshot the editable files and queue an experiment."),
    "status": ("nightlab.cli.status", "Workers, running experiments and the queue."),
    "wait": ("nightlab.cli.wait", "Block until experiments finish."),
    "results": ("nightlab.cli.results", "Results sorted by the metric, with verdicts."),
    "show": ("nightlab.cli.show", "One experiment: metrics, diff, log tail."),
    "adopt": ("nightlab.cli.adopt", "Make an experiment the incumbent."),
    "cancel": ("nightlab.cli.cancel", "Cancel queued or running experiments."),
    "report": ("nightlab.cli.report", "Write results.tsv and progress.png."),
    "export": ("nightlab.cli.export", "Send the lab's runs to Weights & Biases or MLflow."),
    "fleet": ("nightlab.cli.fleet", "Start, stop and inspect the fleet controller."),
    "prepare": ("nightlab.cli.prepare", "Download and tokenize the lab's dataset."),
    "tune": ("nightlab.cli.tune", "Measure device settings and commit the fastest."),
    "demo": ("nightlab.cli.demo", "Run the offline demo end to end."),
    "knobs": ("nightlab.cli.knobs", "List the editable file's UPPERCASE constants."),
    "sweep": ("nightlab.cli.sweep", "Submit a wave over a search space."),
    "noise": ("nightlab.cli.noise", "Re-run the incumbent to measure the noise floor."),
    "effects": ("nightlab.cli.effects", "Main effects and interactions of a wave."),
    "promote": ("nightlab.cli.promote", "Re-run snapshots on another tier."),
    "rungs": ("nightlab.cli.rungs", "Rank transfer between screening rungs."),
    "waves": ("nightlab.cli.waves", "List waves."),
    "search": ("nightlab.cli.search", "Automatic research loop."),
    "agent": ("nightlab.cli.agent", "Supervise a coding agent as the researcher."),
    "journal": ("nightlab.cli.journal", "The lab's research history, compact."),
    "dashboard": ("nightlab.cli.dashboard", "Serve the live web dashboard."),
    "doctor": ("nightlab.cli.doctor", "Check the lab and the machine; restore a ledger backup."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [
            name for name, (module, _) in COMMANDS.items() if importlib.util.find_spec(module) is not None
        ]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, short = COMMANDS[name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:
                return None
            raise
        command = module.command
        command.short_help = command.short_help or short
        return command


@click.group(
    cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(package_name="nightlab")
def cli() -> None:
    """nightlab: an autonomous ML research lab.

    Propose variants of a training script, run them on a fleet under a fixed time budget,
    keep only the changes that beat the incumbent by more than the noise.

    \b
    Quick start:
      nightlab init mylab && cd mylab
      nightlab submit -m "baseline"
      nightlab wait --all && nightlab results
    """


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the command and maps errors to exit codes (1 failed, 2 bad input)."""
    from nightlab.errors import NightlabError, one_line

    try:
        # Without standalone mode click returns the code of a `click.exceptions.Exit` raised in a
        # command (`search` and `agent run` exit 130 after Ctrl-C that way) instead of exiting.
        code = cli.main(args=argv, prog_name="nightlab", standalone_mode=False)
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            sys.exit(code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.UsageError as e:
        # one line, like every other refusal (click's own form is usage + hint + error, 4 lines)
        where = f"; see `{e.ctx.command_path} --help`" if e.ctx is not None else ""
        click.echo(f"error: {one_line(e.format_message())}{where}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except NightlabError as e:
        click.echo(f"error: {one_line(str(e))}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as e:
        if os.environ.get("NIGHTLAB_DEBUG"):
            raise
        click.echo(
            f"internal error: {type(e).__name__}: {e} (set NIGHTLAB_DEBUG=1 for the traceback)", err=True
        )
        sys.exit(1)
