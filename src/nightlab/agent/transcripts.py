"""Reading an agent CLI's JSON-lines transcript: what the session did, what it cost, why it ended.

Both built-in CLIs stream one JSON event per line (stdout, with stderr mixed in by the
supervisor; lines that are not JSON are skipped):

| CLI | events read | end of session |
| --- | --- | --- |
| Claude Code (`-p --output-format stream-json --verbose`) | `assistant` (its `tool_use` blocks are commands, `text` blocks messages), `system/api_retry`, `result` | `result`: `is_error`, `terminal_reason` (`completed`, `api_error`, `prompt_too_long`, `max_turns`), `api_error_status`, `total_cost_usd`, `usage` |
| Codex (`exec --json`) | `item.completed` (`command_execution`, `agent_message`), `turn.completed` (`usage`), `error` | `turn.failed` with `error.message`; or `turn.completed` |

Footgun measured on Claude Code 2.1.332: `result.subtype` says `success` even when the API
failed; only `is_error` and `terminal_reason` tell. Codex names no HTTP status when it gives
up ("exceeded retry limit, last status: 429", or "We're currently experiencing high demand"
after 5xx): every `turn.failed` that is not a full context is an API failure.

Codex's running token count: its `--json` transcript has tokens only at the end of a turn
(`turn.completed`), and one `codex exec` is one turn, so a cost cap checked there could be
overrun by a whole session. Its rollout file (`$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl`)
has an `event_msg` of type `token_count` after every model reply with the running
`info.total_token_usage` (measured on Codex 0.171.0), so `codex_rollout` + `rollout_tokens` read
it while the session runs. The rollout names none of the ids the transcript shows
(`thread.started` has another), so a session's file is the newest one whose `session_meta` has
the lab as `cwd`, written since the session started (one supervisor per lab).

`failure` is one of `FAILURES`: `api` (the model API was unreachable or refused: back off),
`context` (the context window is full: restart fresh), `max-turns`, or None (the turn ended
normally, or the transcript does not say).

Usage:
    report = read_transcript(Path(".nightlab/agent/transcript-3.log"))
    report.failure, report.cost_usd, report.commands
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FAILURES = ("api", "context", "max-turns")
_CONTEXT = re.compile(
    r"prompt is too long|context[_ ]length[_ ]exceeded|maximum context length|out of room in the model's "
    r"context window|context window (?:is )?(?:full|exceeded)",
    re.IGNORECASE,
)
_STATUS = re.compile(r"\b(?:status:?|API Error:)\s*(\d{3})\b")
MESSAGE_CHARS = 300


@dataclass(frozen=True)
class TokenPrices:
    """USD per million tokens, for CLIs that report tokens but no cost (Codex)."""

    input: float
    cached_input: float
    output: float

    def cost(self, input_tokens: int, cached_input_tokens: int, output_tokens: int) -> float:
        fresh = max(0, input_tokens - cached_input_tokens)
        return (
            fresh * self.input + cached_input_tokens * self.cached_input + output_tokens * self.output
        ) / 1e6


@dataclass(frozen=True)
class SessionReport:
    """What one transcript says (see the module docstring)."""

    cli: str | None  # claude | codex | None (not a transcript either CLI writes)
    turns: int  # model replies
    commands: int  # shell commands the agent ran
    last_command: str | None
    last_message: str | None  # the agent's last text, cut to MESSAGE_CHARS
    api_retries: int  # retries the CLI itself made (Claude's `api_retry` events)
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    reported_cost_usd: float | None  # what the CLI said it cost (Claude's `total_cost_usd`)
    finished: bool  # the CLI reported the end of its turn (result / turn.completed / turn.failed)
    failure: str | None  # api | context | max-turns | None
    api_status: int | None  # the HTTP status of an API failure, when the CLI names one
    error: str | None  # the CLI's one-line account of the failure

    def cost_usd(self, prices: TokenPrices | None) -> float | None:
        """The reported cost, else tokens × `prices`, else None."""
        if self.reported_cost_usd is not None:
            return self.reported_cost_usd
        if prices is None or not (self.input_tokens or self.output_tokens):
            return None
        return prices.cost(self.input_tokens, self.cached_input_tokens, self.output_tokens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cut(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 1] + "…"


class _Reader:
    def __init__(self) -> None:
        self.cli: str | None = None
        self.turns = self.commands = self.api_retries = 0
        self.last_command: str | None = None
        self.last_message: str | None = None
        self.tokens = [0, 0, 0]  # input, cached input, output
        self.cost: float | None = None
        self.finished = False
        self.failure: str | None = None
        self.status: int | None = None
        self.error: str | None = None

    def event(self, e: dict[str, Any]) -> None:
        kind = e.get("type")
        if kind in ("system", "assistant", "user", "result"):
            self.cli = "claude"
            self._claude(kind, e)
        elif isinstance(kind, str) and kind.split(".")[0] in ("thread", "turn", "item", "error"):
            self.cli = self.cli or "codex"
            self._codex(kind, e)

    def _claude(self, kind: str, e: dict[str, Any]) -> None:
        if kind == "system" and e.get("subtype") == "api_retry":
            self.api_retries += 1
        elif kind == "assistant":
            message = e.get("message") or {}
            if e.get("is_api_error_message"):
                return  # Claude's own text about a failed request, not a model turn
            self.turns += 1
            for block in message.get("content") or []:
                if block.get("type") == "tool_use":
                    self.commands += 1
                    command = (block.get("input") or {}).get("command")
                    self.last_command = _cut(str(command)) if command else block.get("name")
                elif block.get("type") == "text" and block.get("text"):
                    self.last_message = _cut(block["text"])
        elif kind == "result":
            self.finished = True
            usage = e.get("usage") or {}
            cached = int(usage.get("cache_read_input_tokens") or 0)
            fresh = int(usage.get("input_tokens") or 0) + int(usage.get("cache_creation_input_tokens") or 0)
            self.tokens = [fresh + cached, cached, int(usage.get("output_tokens") or 0)]
            if e.get("total_cost_usd") is not None:
                self.cost = float(e["total_cost_usd"])
            if e.get("result"):
                self.last_message = _cut(str(e["result"]))
            if not e.get("is_error"):
                return
            reason = e.get("terminal_reason") or e.get("subtype") or ""
            text = str(e.get("result") or reason)
            self.error = _cut(text)
            if reason == "prompt_too_long" or _CONTEXT.search(text):
                self.failure = "context"
            elif reason == "api_error" or e.get("api_error_status"):
                self.failure = "api"
                self.status = e.get("api_error_status")
            elif "max_turns" in reason:
                self.failure = "max-turns"

    def _codex(self, kind: str, e: dict[str, Any]) -> None:
        if kind == "item.completed":
            item = e.get("item") or {}
            # Codex logs no event per model reply; each command or message is one in practice
            if item.get("type") == "command_execution":
                self.turns += 1
                self.commands += 1
                self.last_command = _cut(str(item.get("command", "")))
            elif item.get("type") == "agent_message" and item.get("text"):
                self.turns += 1
                self.last_message = _cut(item["text"])
        elif kind == "turn.completed":
            self.finished = True
            usage = e.get("usage") or {}
            self.tokens[0] += int(usage.get("input_tokens") or 0)
            self.tokens[1] += int(usage.get("cached_input_tokens") or 0)
            self.tokens[2] += int(usage.get("output_tokens") or 0)
        elif kind == "turn.failed":
            self.finished = True
            message = str((e.get("error") or {}).get("message") or "turn failed")
            self.error = _cut(message)
            self.failure = "context" if _CONTEXT.search(message) else "api"
            if self.failure == "api" and (m := _STATUS.search(message)):
                self.status = int(m.group(1))

    def report(self) -> SessionReport:
        return SessionReport(
            cli=self.cli,
            turns=self.turns,
            commands=self.commands,
            last_command=self.last_command,
            last_message=self.last_message,
            api_retries=self.api_retries,
            input_tokens=self.tokens[0],
            cached_input_tokens=self.tokens[1],
            output_tokens=self.tokens[2],
            reported_cost_usd=self.cost,
            finished=self.finished,
            failure=self.failure,
            api_status=self.status,
            error=self.error,
        )


def parse_transcript(text: str) -> SessionReport:
    """The report of a transcript's text (JSON lines; other lines are skipped)."""
    reader = _Reader()
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            reader.event(event)
    return reader.report()


def read_transcript(path: Path) -> SessionReport:
    """The report of the transcript at `path` (an empty report when it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        text = ""
    return parse_transcript(text)


def context_full(tail: str) -> bool:
    """Whether free text (a custom agent's last output) reports a full context window."""
    return bool(_CONTEXT.search(tail))


ROLLOUT_TAIL = 1 << 20  # bytes read from the end of a rollout: its last `token_count` is near the end


def codex_rollout(codex_home: Path, cwd: Path, since: float) -> Path | None:
    """The rollout file of the Codex session started in `cwd` at or after `since`, or None yet."""
    found: list[tuple[float, Path]] = []
    for path in codex_home.glob("sessions/*/*/*/rollout-*.jsonl"):
        try:
            if path.stat().st_mtime < since - 1.0:
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                meta = json.loads(f.readline())
        except (OSError, json.JSONDecodeError):
            continue
        payload = meta.get("payload") if isinstance(meta, dict) else None
        if (
            meta.get("type") == "session_meta"
            and isinstance(payload, dict)
            and payload.get("cwd") == str(cwd)
        ):
            found.append((path.stat().st_mtime, path))
    return max(found)[1] if found else None


def rollout_tokens(path: Path) -> tuple[int, int, int] | None:
    """(input, cached input, output) tokens so far from a rollout's last `token_count`, or None."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - ROLLOUT_TAIL))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if '"token_count"' not in line:
            continue
        try:
            payload = json.loads(line).get("payload") or {}
        except json.JSONDecodeError:
            continue  # the first line of the tail, cut in half
        usage = (
            (payload.get("info") or {}).get("total_token_usage")
            if payload.get("type") == "token_count"
            else None
        )
        if usage:
            return (
                int(usage.get("input_tokens") or 0),
                int(usage.get("cached_input_tokens") or 0),
                int(usage.get("output_tokens") or 0),
            )
    return None
