"""The `[agent]` table of nightlab.toml."""

from __future__ import annotations

import pytest

from nightlab.config import AgentConfig, parse_config
from nightlab.errors import ConfigError

BASE = {
    "target": {"command": "python train.py", "editable": ["train.py"]},
    "fleet": {"pool": [{"backend": "local", "tier": "cpu"}]},
}


def test_no_agent_table_means_the_defaults():
    assert parse_config(dict(BASE)).agent == AgentConfig()


def test_agent_table_is_parsed():
    doc = {
        **BASE,
        "agent": {
            "default": "codex",
            "stall_seconds": 120,
            "max_restarts_per_hour": 3,
            "api_backoff_seconds": 5,
            "api_backoff_max_seconds": 60,
            "token_prices": {"input": 2, "output": 8},
            "commands": {"claude": "claude -p --max-turns 200", "mine": "python bot.py"},
        },
    }
    agent = parse_config(doc).agent
    assert agent.default == "codex"
    assert agent.stall_seconds == 120.0
    assert agent.max_restarts_per_hour == 3
    assert (agent.api_backoff_seconds, agent.api_backoff_max_seconds) == (5.0, 60.0)
    assert agent.token_prices == (2.0, 0.125, 8.0)  # cached input keeps its default
    assert agent.commands == {"claude": "claude -p --max-turns 200", "mine": "python bot.py"}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"stall": 3}, "unknown key `agent.stall`"),
        ({"stall_seconds": 0}, "`agent.stall_seconds` must be positive"),
        ({"max_restarts_per_hour": 0}, "at least 1"),
        ({"commands": {"x": ""}}, "`agent.commands.x` must be a non-empty command line"),
        ({"commands": "claude"}, "`agent.commands` must be"),
        ({"default": 3}, "`agent.default` must be a string"),
        ({"api_backoff_seconds": 0}, "`agent.api_backoff_seconds` must be positive"),
        (
            {"api_backoff_seconds": 100, "api_backoff_max_seconds": 10},
            "at most `agent.api_backoff_max_seconds`",
        ),
        ({"token_prices": {"input": -1}}, "`agent.token_prices.input` must be >= 0"),
        ({"token_prices": {"inputs": 1}}, "unknown key `agent.token_prices.inputs`"),
    ],
)
def test_bad_agent_tables_are_refused_with_the_key(table, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_config({**BASE, "agent": table})
