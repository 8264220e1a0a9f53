"""Reading Claude Code's and Codex's JSON-lines transcripts (events as the pinned CLIs write them).

The lines are cut from real transcripts of Claude Code 2.1.332 and Codex 0.171.0 run against
the scripted server (tests/agent_real), keeping the keys the reader uses.
"""

from __future__ import annotations

import json

import pytest

from nightlab.agent.transcripts import TokenPrices, context_full, parse_transcript


def lines(*events: dict | str) -> str:
    return "\n".join(e if isinstance(e, str) else json.dumps(e) for e in events) + "\n"


CLAUDE_INIT = {"type": "system", "subtype": "init", "session_id": "a07d", "model": "claude-opus-5-5"}


def claude_tool(command: str) -> dict:
    return {
        "type": "assistant",
        "message": {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": command}}]},
    }


def claude_result(**fields) -> dict:
    return {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "terminal_reason": "completed",
        **fields,
    }


def test_a_claude_session_that_worked():
    report = parse_transcript(
        lines(
            CLAUDE_INIT,
            claude_tool("nightlab results --json"),
            {"type": "user", "message": {"content": [{"type": "tool_result", "content": "{}"}]}},
            claude_tool("nightlab adopt e0003"),
            {"type": "assistant", "message": {"content": [{"type": "text", "text": "I am done."}]}},
            claude_result(
                total_cost_usd=0.510984,
                num_turns=8,
                result="I am done.",
                usage={"input_tokens": 126146, "cache_read_input_tokens": 0, "output_tokens": 320},
            ),
        )
    )
    assert report.cli == "claude" and report.finished and report.failure is None
    assert report.turns == 3 and report.commands == 2 and report.last_command == "nightlab adopt e0003"
    assert report.last_message == "I am done." and report.reported_cost_usd == 0.510984
    assert report.cost_usd(TokenPrices(1, 1, 1)) == 0.510984  # the CLI's own figure wins
    assert (report.input_tokens, report.output_tokens) == (126146, 320)


def test_claude_says_success_when_the_api_failed():
    # the footgun: subtype "success", is_error true, terminal_reason api_error
    api_text = "API Error: 529 scripted 529. This is a server-side issue, usually temporary"
    report = parse_transcript(
        lines(
            CLAUDE_INIT,
            {"type": "system", "subtype": "api_retry", "attempt": 1, "error_status": 529},
            {
                "type": "assistant",
                "is_api_error_message": True,
                "message": {"model": "<synthetic>", "content": [{"type": "text", "text": api_text}]},
            },
            claude_result(
                is_error=True,
                terminal_reason="api_error",
                api_error_status=529,
                result=api_text,
                total_cost_usd=0,
            ),
        )
    )
    assert report.failure == "api" and report.api_status == 529 and report.api_retries == 1
    assert report.turns == 0 and report.error.startswith("API Error: 529")


def test_claude_prompt_too_long():
    text = "Prompt is too long · the request is ~212345 tokens"
    report = parse_transcript(
        lines(CLAUDE_INIT, claude_result(is_error=True, terminal_reason="prompt_too_long", result=text))
    )
    assert report.failure == "context" and report.error == text


def test_a_codex_session_and_its_tokens_priced():
    report = parse_transcript(
        lines(
            {"type": "thread.started", "thread_id": "01a2"},
            {"type": "turn.started"},
            {
                "type": "item.completed",
                "item": {"type": "command_execution", "command": "/bin/bash -c 'nightlab results --json'"},
            },
            {"type": "item.completed", "item": {"type": "agent_message", "text": "I am done."}},
            {
                "type": "turn.completed",
                "usage": {"input_tokens": 62326, "cached_input_tokens": 2000, "output_tokens": 200},
            },
        )
    )
    assert report.cli == "codex" and report.finished and report.failure is None
    assert report.turns == 2 and report.commands == 1 and report.last_message == "I am done."
    assert report.reported_cost_usd is None
    assert report.cost_usd(TokenPrices(1.25, 0.125, 10.0)) == pytest.approx(
        (60326 * 1.25 + 2000 * 0.125 + 200 * 10.0) / 1e6
    )
    assert report.cost_usd(None) is None


@pytest.mark.parametrize(
    ("message", "failure", "status"),
    [
        ("exceeded retry limit, last status: 429 Too Many Requests", "api", 429),
        ("We\u2019re currently experiencing high demand, which may cause temporary errors.", "api", None),
        (
            "Codex ran out of room in the model's context window. Start a new thread or clear earlier history.",
            "context",
            None,
        ),
    ],
)
def test_codex_turn_failed(message, failure, status):
    report = parse_transcript(
        lines(
            {"type": "thread.started"},
            {"type": "error", "message": message},
            {"type": "turn.failed", "error": {"message": message}},
        )
    )
    assert report.failure == failure and report.api_status == status and report.error == message


def test_text_and_broken_lines_are_skipped():
    report = parse_transcript("WARNING: proceeding\n{not json\n[1, 2]\n" + lines({"type": "turn.started"}))
    assert report.cli == "codex" and not report.finished and report.failure is None
    assert parse_transcript("").cli is None
    assert context_full("Error: prompt is too long") and not context_full("all fine")
