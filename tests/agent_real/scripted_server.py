"""A scripted model server on 127.0.0.1 for the real Claude Code and Codex CLIs.

It speaks just enough of two APIs, both streamed as server-sent events:

- the Anthropic Messages API (`POST /v1/messages`), which Claude Code uses: a reply is
  `message_start`, one `tool_use` (the `Bash` tool) or `text` block, `message_delta` with
  `stop_reason`, `message_stop`;
- the OpenAI Responses API (`POST /v1/responses`), which Codex uses: a reply is one
  `response.output_item.done` (a `function_call` of `exec_command`, or a `message`) and the
  mandatory `response.completed`.

Instead of a model it plays a *researcher policy* (`ResearchPolicy`) through the CLI's real
shell tool: read `nightlab results --json`, submit ideas with `--set`, `nightlab wait --any`,
adopt a `keep`, write a note, end the turn. The policy is a function of the conversation the
CLI sends (every request carries the whole history), so a restarted CLI simply starts over
with the state the ledger has.

Failures are played on demand (`fail`): an HTTP status (429 / 529 / 500) for the next N
requests, "prompt too long" / `context_length_exceeded`, a stream that stalls after its
headers, or no answer at all (the request is read, nothing is ever sent back).

The first request of every conversation is checked: its prompt must hold the lab's state
(`REQUIRED_STATE`, and what a test adds with `required=`); a prompt without it is answered with HTTP 400 and recorded in `problems`,
which the tests assert empty. Every request's prompt size is recorded for the budget checks.

Usage:
    with ScriptedServer(ResearchPolicy(ideas=["0.02", "0.04"])) as server:
        env = claude_env(server.url, home)      # or codex_home(server.url, home)
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# What every session's prompt must show the agent (nightlab.agent.prompt's sections).
REQUIRED_STATE = (
    "# The lab now",
    "- incumbent: ",
    "## In flight",
    "## Best results per tier",
    "# Research journal",
)
CHARS_PER_TOKEN = 4  # the usual estimate for English and code; the budget checks use it


# ---------------------------------------------------------------------------- the policy


@dataclass(frozen=True)
class Step:
    """One assistant turn: a shell command to run, or (command None) the final text."""

    command: str | None
    text: str = ""


def _json_in(output: str) -> Any:
    """The first JSON value in a tool's output (Codex prefixes exit code and wall time)."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", output):
        try:
            return decoder.raw_decode(output[m.start() :])[0]
        except json.JSONDecodeError:
            continue
    return None


@dataclass
class ResearchPolicy:
    """A researcher that tries learning rates through the shell, `per_session` ideas a session.

    Each session: `results --json`; submit the next untried ideas (`--set LR=...`); `wait --any`
    until they are done (at most `max_waits`); adopt the best `keep` not yet adopted; append a
    note to `notes.md`; end the turn saying it is done (the supervisor must restart it).
    """

    ideas: list[str] = field(default_factory=lambda: ["0.02", "0.04", "0.005", "0.03", "0.015", "0.01"])
    per_session: int = 2
    repeats: int = 1  # runs per idea (a keep needs two: search/decide.py MIN_RUNS_TO_KEEP)
    max_waits: int = 6
    final_text: str = "I am done: the ideas are measured and the best one is adopted."

    def next_step(self, history: list[tuple[str, str]]) -> Step:
        """The next turn given the (command, output) pairs of this conversation so far."""
        if not history:
            return Step("nightlab results --json")
        commands = [c for c, _ in history]
        last_cmd, last_out = history[-1]
        submitted = [c for c in commands if c.startswith("nightlab submit")]
        if len(submitted) < self._planned(history):
            value = self._untried(history)[0]
            many = f" --repeats {self.repeats}" if self.repeats > 1 else ""
            return Step(f"nightlab submit -m 'lr {value}' --set LR={value}{many} --json")
        mine = self._my_ids(history)
        rows = _json_in(last_out) if last_cmd.startswith("nightlab results") else None
        waits = sum(c.startswith("nightlab wait") for c in commands)
        if mine and rows is None and not last_cmd.startswith(("nightlab adopt", "echo")):
            if last_cmd.startswith("nightlab wait"):
                return Step("nightlab results --json")
            return Step("nightlab wait --any --timeout 60")
        if rows is not None and mine and waits < self.max_waits:
            pending = [r for r in rows.get("experiments", []) if r["id"] in mine and r.get("verdict") is None]
            if pending:
                return Step("nightlab wait --any --timeout 60")
        if rows is not None and mine:
            keeps = [r for r in rows.get("experiments", []) if r["id"] in mine and r.get("verdict") == "keep"]
            if keeps and not any(c.startswith("nightlab adopt") for c in commands):
                best = min(keeps, key=lambda r: r.get("value") if r.get("value") is not None else 1e9)
                return Step(f"nightlab adopt {best['id']}")
        if not any(c.startswith("echo") for c in commands):
            ids = ", ".join(mine) or "nothing"
            return Step(f"echo '- session tried {ids}' >> notes.md")
        return Step(None, self.final_text)

    def _first_results(self, history: list[tuple[str, str]]) -> dict:
        return _json_in(history[0][1]) or {}

    def _untried(self, history: list[tuple[str, str]]) -> list[str]:
        seen = {r.get("description") for r in self._first_results(history).get("experiments", [])}
        done = {c for c, _ in history}
        return [v for v in self.ideas if f"lr {v}" not in seen and not any(f"LR={v} " in c for c in done)]

    def _planned(self, history: list[tuple[str, str]]) -> int:
        submitted = sum(c.startswith("nightlab submit") for c, _ in history)
        return min(self.per_session, submitted + len(self._untried(history)))

    @staticmethod
    def _my_ids(history: list[tuple[str, str]]) -> list[str]:
        ids = []
        for command, output in history:
            if command.startswith("nightlab submit"):
                data = _json_in(output)
                if isinstance(data, list):
                    ids += [e["id"] for e in data if isinstance(e, dict) and "id" in e]
        return ids


# ---------------------------------------------------------------------------- failures


@dataclass
class Failure:
    """What the next `count` requests get instead of the policy's answer.

    kind: an HTTP status as a string ("429", "529", "500"), "too-long", "stall" (headers, then
    nothing) or "silent" (no answer at all).
    """

    kind: str
    count: int


# ---------------------------------------------------------------------------- the server


@dataclass
class Request:
    """One request as the server saw it."""

    api: str  # anthropic | openai
    path: str
    prompt: str  # the first user message: nightlab's prompt
    prompt_chars: int  # the whole request's text the model reads: system, tools, messages
    turn: int  # assistant turns already in the conversation
    answered: str  # what the server did: a command, "text", a failure kind
    at: float


class ScriptedServer:
    """The server (see the module docstring); a context manager that stops its thread."""

    def __init__(
        self,
        policy: ResearchPolicy | None = None,
        *,
        required: tuple[str, ...] = REQUIRED_STATE,
        host: str = "127.0.0.1",
    ) -> None:
        self.policy = policy or ResearchPolicy()
        self.required = required
        self.requests: list[Request] = []
        self.problems: list[str] = []
        self._failures: list[Failure] = []
        self._lock = threading.Lock()
        self._release = threading.Event()  # lets stalled / silent handlers go at shutdown
        self._ids = 0
        self.httpd = ThreadingHTTPServer((host, 0), self._handler())
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="scripted-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=10)

    def fail(self, kind: str, count: int = 1) -> None:
        """Answer the next `count` requests with `kind` (see `Failure`) instead of the policy."""
        with self._lock:
            self._failures.append(Failure(kind, count))

    def clear_failures(self) -> None:
        with self._lock:
            self._failures.clear()

    def _next_failure(self) -> str | None:
        with self._lock:
            while self._failures and self._failures[0].count <= 0:
                self._failures.pop(0)
            if not self._failures:
                return None
            self._failures[0].count -= 1
            return self._failures[0].kind

    def _new_id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}_{self._ids:06d}"

    def _check_prompt(self, prompt: str, turn: int) -> str | None:
        if turn > 0:
            return None
        missing = [s for s in self.required if s not in prompt]
        if missing:
            problem = f"prompt without the lab's state: missing {missing}"
            self.problems.append(problem)
            return problem
        return None

    # -------------------------------------------------------------- the handler

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet: the tests read `requests`
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                path = self.path.split("?")[0]
                if path.endswith("/messages"):
                    server._anthropic(self, body, path)
                elif path.endswith("/responses"):
                    server._openai(self, body, path)
                else:
                    server.problems.append(f"unexpected request POST {self.path}")
                    self._send_json(404, {"error": {"message": f"no route {self.path}"}})

            def do_GET(self) -> None:
                server.problems.append(f"unexpected request GET {self.path}")
                self._send_json(404, {"error": {"message": f"no route {self.path}"}})

            def do_HEAD(self) -> None:
                self._send_json(404, {})

            def _send_json(self, status: int, doc: dict) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _sse(self, events: list[tuple[str, dict]]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                for name, data in events:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        return Handler

    def _play_failure(self, handler, kind: str, api: str) -> None:
        if kind == "silent":  # read the request, never answer: only a watchdog ends this
            self._release.wait()
            handler.close_connection = True
            return
        if kind == "stall":
            handler.send_response(200)
            handler.send_header("content-type", "text/event-stream")
            handler.end_headers()
            handler.wfile.flush()
            self._release.wait()
            handler.close_connection = True
            return
        if kind == "too-long":
            if api == "anthropic":
                doc = {
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "message": "prompt is too long: 212345 tokens > 200000 maximum",
                    },
                }
            else:
                doc = {
                    "error": {
                        "message": "Your input exceeds the context window of this model.",
                        "type": "invalid_request_error",
                        "param": "input",
                        "code": "context_length_exceeded",
                    }
                }
            handler._send_json(400, doc)
            return
        status = int(kind)
        if api == "anthropic":
            kinds = {429: "rate_limit_error", 529: "overloaded_error", 500: "api_error"}
            doc = {
                "type": "error",
                "error": {"type": kinds.get(status, "api_error"), "message": f"scripted {status}"},
            }
        else:
            doc = {"error": {"message": f"scripted {status}", "type": "server_error", "code": None}}
        handler._send_json(status, doc)

    def _record(self, api: str, path: str, prompt: str, chars: int, turn: int, answered: str) -> None:
        with self._lock:
            self.requests.append(Request(api, path, prompt, chars, turn, answered, time.time()))

    # -------------------------------------------------------------- Anthropic Messages API

    def _anthropic(self, handler, body: dict, path: str) -> None:
        tools = {t.get("name"): t for t in body.get("tools", [])}
        messages = body.get("messages", [])
        prompt, history, turn = _anthropic_history(messages)
        chars = (
            len(json.dumps(body.get("system", "")))
            + len(json.dumps(body.get("tools", [])))
            + len(json.dumps(messages))
        )
        failure = self._next_failure()
        if failure is not None:
            self._record("anthropic", path, prompt, chars, turn, failure)
            self._play_failure(handler, failure, "anthropic")
            return
        problem = self._check_prompt(prompt, turn)
        if problem is None and "Bash" not in tools:
            problem = f"no `Bash` tool in the request (tools: {sorted(tools)}): the CLI changed"
            self.problems.append(problem)
        if problem is not None:
            self._record("anthropic", path, prompt, chars, turn, "refused")
            handler._send_json(
                400, {"type": "error", "error": {"type": "invalid_request_error", "message": problem}}
            )
            return
        step = self.policy.next_step(history)
        model = body.get("model", "claude-sonnet-4-5")
        usage_in = chars // CHARS_PER_TOKEN
        start = {
            "type": "message_start",
            "message": {
                "id": self._new_id("msg"),
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": usage_in, "output_tokens": 1},
            },
        }
        if step.command is not None:
            block = {"type": "tool_use", "id": self._new_id("toolu"), "name": "Bash", "input": {}}
            args = json.dumps({"command": step.command, "description": "research step"})
            delta = {"type": "input_json_delta", "partial_json": args}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": step.text}
            stop = "end_turn"
        self._record("anthropic", path, prompt, chars, turn, step.command or "text")
        handler._sse(
            [
                ("message_start", start),
                ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                (
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": stop, "stop_sequence": None},
                        "usage": {"output_tokens": 40},
                    },
                ),
                ("message_stop", {"type": "message_stop"}),
            ]
        )

    # -------------------------------------------------------------- OpenAI Responses API

    def _openai(self, handler, body: dict, path: str) -> None:
        items = body.get("input", [])
        tools = {t.get("name"): t for t in body.get("tools", []) if isinstance(t, dict)}
        prompt, history, turn = _openai_history(items)
        chars = (
            len(json.dumps(body.get("instructions", "")))
            + len(json.dumps(body.get("tools", [])))
            + len(json.dumps(items))
        )
        failure = self._next_failure()
        if failure is not None:
            self._record("openai", path, prompt, chars, turn, failure)
            self._play_failure(handler, failure, "openai")
            return
        problem = self._check_prompt(prompt, turn)
        if problem is None and "exec_command" not in tools:
            problem = f"no `exec_command` tool in the request (tools: {sorted(tools)}): the CLI changed"
            self.problems.append(problem)
        if problem is not None:
            self._record("openai", path, prompt, chars, turn, "refused")
            handler._send_json(
                400, {"error": {"message": problem, "type": "invalid_request_error", "code": None}}
            )
            return
        step = self.policy.next_step(history)
        if step.command is not None:
            item = {
                "type": "function_call",
                "id": self._new_id("fc"),
                "call_id": self._new_id("call"),
                "name": "exec_command",
                "arguments": json.dumps({"cmd": step.command, "yield_time_ms": 120000}),
                "status": "completed",
            }
        else:
            item = {
                "type": "message",
                "id": self._new_id("msg"),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": step.text, "annotations": []}],
            }
        self._record("openai", path, prompt, chars, turn, step.command or "text")
        rid = self._new_id("resp")
        usage_in = chars // CHARS_PER_TOKEN
        usage = {
            "input_tokens": usage_in,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 40,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage_in + 40,
        }
        handler._sse(
            [
                (
                    "response.created",
                    {"type": "response.created", "response": {"id": rid, "status": "in_progress"}},
                ),
                (
                    "response.output_item.done",
                    {"type": "response.output_item.done", "output_index": 0, "item": item},
                ),
                (
                    "response.completed",
                    {
                        "type": "response.completed",
                        "response": {"id": rid, "status": "completed", "output": [item], "usage": usage},
                    },
                ),
            ]
        )


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            _text_of(c.get("text", c.get("content", ""))) for c in content if isinstance(c, dict)
        )
    return ""


def _anthropic_history(messages: list[dict]) -> tuple[str, list[tuple[str, str]], int]:
    """(the first user text, (command, output) per tool call, assistant turns) of a conversation."""
    prompt = ""
    calls: dict[str, str] = {}
    history: list[tuple[str, str]] = []
    turns = 0
    for m in messages:
        content = m.get("content")
        if m.get("role") == "user" and not prompt:
            # the nightlab prompt is the longest text block (Claude Code adds system reminders)
            texts = (
                [content]
                if isinstance(content, str)
                else [c.get("text", "") for c in content or [] if c.get("type") == "text"]
            )
            prompt = max(texts, key=len, default="")
        if m.get("role") == "assistant":
            turns += 1
        for c in content if isinstance(content, list) else []:
            if c.get("type") == "tool_use":
                calls[c["id"]] = (c.get("input") or {}).get("command", "")
            elif c.get("type") == "tool_result":
                history.append((calls.get(c.get("tool_use_id"), ""), _text_of(c.get("content"))))
    return prompt, history, turns


def _openai_history(items: list[dict]) -> tuple[str, list[tuple[str, str]], int]:
    """The same for a Responses API `input` list."""
    prompt = ""
    calls: dict[str, str] = {}
    history: list[tuple[str, str]] = []
    turns = 0
    for item in items:
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "user":
            text = _text_of(item.get("content"))
            if len(text) > len(prompt) and not history:
                prompt = text
        elif kind == "message" and item.get("role") == "assistant":
            turns += 1
        elif kind == "function_call":
            turns += 1
            try:
                args = json.loads(item.get("arguments") or "{}")
            except json.JSONDecodeError:
                args = {}
            command = args.get("cmd") or args.get("command") or ""
            calls[item.get("call_id", "")] = command if isinstance(command, str) else " ".join(command)
        elif kind == "function_call_output":
            output = item.get("output")
            history.append(
                (
                    calls.get(item.get("call_id", ""), ""),
                    _text_of(output) if not isinstance(output, str) else output,
                )
            )
    return prompt, history, turns
