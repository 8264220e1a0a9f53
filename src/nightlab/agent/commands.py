"""Which agent CLI runs: the built-in headless command lines and `--agent` resolved to an argv.

The built-in lines are measured against the pinned CLI versions in docs/agents.md (Claude
Code 2.1.332, Codex 0.171.0); `[agent.commands]` in nightlab.toml adds or overrides names.

Also how one session runs it: its argv (`session_argv`), its environment (`session_env`: the
prompt file, `IS_SANDBOX=1` for Claude's unattended line as root) and the one line for a CLI
that exits at start (`start_failure`).

Usage:
    command = resolve_agent("claude", lab.config.agent)   # AgentCommand(name, argv)
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from nightlab.config import AgentConfig, LabConfig
from nightlab.errors import UsageError

# Headless invocations, prompt on stdin. Both agents edit files and run commands without
# asking: nobody is there to approve. Run the lab in a container or VM you can afford to let
# an agent loose in. Claude Code: `-p` prints and exits, stream-json (needs --verbose) makes
# every tool call a transcript line, which is what stall detection watches. Codex: `exec -`
# reads the prompt from stdin, `--json` streams events as JSON lines; its shell tool runs
# `bash -lc` by default, and a login shell resets PATH from /etc/profile (measured on Codex
# 0.171.0: `nightlab: command not found`), so login shells are off.
BUILTIN_AGENTS: dict[str, str] = {
    "claude": "claude -p --output-format stream-json --verbose --dangerously-skip-permissions",
    "codex": "codex exec --json --dangerously-bypass-approvals-and-sandbox -c allow_login_shell=false -",
}
# Claude Code refuses --dangerously-skip-permissions as root (exit 1 in 0.5 s) unless this
# documented variable says the machine is a sandbox. Choosing the unattended line on a box
# where you are root (rented GPU machines, containers) is that statement; it is set only then.
CLAUDE_SANDBOX_ENV = "IS_SANDBOX"
CLAUDE_UNATTENDED_FLAG = "--dangerously-skip-permissions"
KNOWN_CLIS = ("claude", "codex")


@dataclass(frozen=True)
class AgentCommand:
    """A resolved agent: its name (`claude`, `codex`, a `[agent.commands]` key, or `custom`) and argv."""

    name: str
    argv: tuple[str, ...]

    @property
    def cli(self) -> str | None:
        """`claude` or `codex` when the command runs one of them (also behind `env` or a path)."""
        return next((Path(a).name for a in self.argv[:4] if Path(a).name in KNOWN_CLIS), None)


def default_stall_seconds(config: LabConfig) -> float:
    """`agent.stall_seconds`, or long enough for one `nightlab wait` on a run at the time limit."""
    if config.agent.stall_seconds is not None:
        return config.agent.stall_seconds
    return max(900.0, config.target.timeout + 300.0)


def resolve_agent(agent: str | None, config: AgentConfig) -> AgentCommand:
    """Turn `--agent` (a known name or a command line) into the command to run.

    Raises:
        UsageError: an unknown name, an unparsable command line, or an executable not on PATH.
    """
    agent = agent or config.default
    commands = {**BUILTIN_AGENTS, **config.commands}
    if agent in commands:
        name, line = agent, commands[agent]
    elif any(c.isspace() for c in agent) or os.sep in agent or shutil.which(agent):
        name, line = "custom", agent
    else:
        raise UsageError(
            f"unknown agent `{agent}`; use {', '.join(sorted(commands))}, or a command line "
            "(e.g. `--agent 'opencode run'`)"
        )
    try:
        argv = tuple(shlex.split(line))
    except ValueError as e:
        raise UsageError(f"agent command `{line}` does not parse: {e}") from e
    if not argv:
        raise UsageError(
            f"agent `{agent}` has an empty command line; fix `[agent.commands]` in nightlab.toml"
        )
    if shutil.which(argv[0]) is None:
        raise UsageError(
            f"`{argv[0]}` (agent `{name}`) is not on PATH; install it, or pass the full command with "
            "`--agent 'COMMAND'`"
        )
    return AgentCommand(name, argv)


# ---------------------------------------------------------------------------- one session's command


def session_argv(command: AgentCommand, prompt_path: Path, *, cost_left: float | None) -> list[str]:
    """The argv of one session: `{prompt_file}` filled in; Claude Code gets what is left of the cap."""
    argv = [a.replace("{prompt_file}", str(prompt_path)) for a in command.argv]
    if Path(argv[0]).name == "claude" and cost_left is not None and "--max-budget-usd" not in argv:
        # Claude Code stops itself at what is left of the cap, so a long session cannot overrun it
        argv[1:1] = ["--max-budget-usd", f"{max(0.0, cost_left):.4f}"]
    return argv


def session_env(command: AgentCommand, prompt_path: Path, *, session: int, lab_dir: Path) -> dict[str, str]:
    """The environment of one session: the prompt file, the lab, this nightlab first on PATH."""
    # the agent's `nightlab` must be this nightlab, whatever PATH the user's shell had
    bindir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "NIGHTLAB_PROMPT_FILE": str(prompt_path),
        "NIGHTLAB_DIR": str(lab_dir),
        "NIGHTLAB_AGENT_SESSION": str(session),
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
    }
    if command.cli == "claude" and CLAUDE_UNATTENDED_FLAG in command.argv and os.geteuid() == 0:
        # only "1" counts: measured, `IS_SANDBOX=yes` (set on some hosted machines) is refused
        env[CLAUDE_SANDBOX_ENV] = "1"
    return env


def start_failure(command: AgentCommand, code: int, tail: str) -> str:
    """The one line for a built-in CLI that exited at start without a transcript, with the fix."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    last = lines[-1] if lines else "(no output)"
    hint = "run it by hand in the lab to see why"
    if "root" in last and command.cli == "claude":
        hint = (
            f"run as a normal user, or use the built-in `--agent claude` line (it sets {CLAUDE_SANDBOX_ENV}=1 "
            "as root)"
        )
    return f"`{command.cli}` exited at start (code {code}) without a transcript: {last}; {hint}"
