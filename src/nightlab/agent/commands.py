"""Which agent CLI runs: the built-in headless command lines and `--agent` resolved to an argv.

The built-in lines are measured against the pinned CLI versions in docs/agents.md (Claude
Code 2.1.332, Codex 0.171.0); `[agent.commands]` in nightlab.toml adds or overrides names.

Usage:
    command = resolve_agent("claude", lab.config.agent)   # AgentCommand(name, argv)
"""

from __future__ import annotations

import os
import shlex
import shutil
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
