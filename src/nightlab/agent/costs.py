"""What the agent's model API cost, per night, from the ledger's `agent-session` events.

The supervisor logs one `agent-session` event per session with the cost the CLI reported
(Claude Code's `total_cost_usd`) or its tokens priced by `[agent] token_prices` (Codex). A
*night* is one run of `nightlab agent run` (its `run_started_at`). `costs.md` shows these next
to the fleet's GPU cost: the public 16-GPU run spent ~$9 of API against ~$300 of GPU, so the
API is rarely what a night costs, but a runaway agent can make it so (`--max-cost`).

Usage:
    summary = agent_cost_summary(lab.ledger)      # None when no agent ever ran
    text = agent_cost_markdown(summary, gpu_cost=312.5)
"""

from __future__ import annotations

import time
from typing import Any

from nightlab.ledger import Ledger

EVENT = "agent-session"


def agent_cost_summary(ledger: Ledger) -> dict[str, Any] | None:
    """Per-night and total API cost of the lab's agent sessions; None when none ran."""
    nights: dict[float, dict[str, Any]] = {}
    after = 0
    while events := ledger.events(kinds=[EVENT], after=after, limit=5000):
        after = events[-1].id
        for e in events:
            d = e.data
            night = nights.setdefault(
                d["run_started_at"],
                {
                    "started_at": d["run_started_at"],
                    "agent": d.get("agent"),
                    "sessions": 0,
                    "unpriced_sessions": 0,
                    "input_tokens": 0,
                    "output_tokens": 0,
                    "cost_usd": 0.0,
                },
            )
            night["sessions"] += 1
            night["input_tokens"] += d.get("input_tokens") or 0
            night["output_tokens"] += d.get("output_tokens") or 0
            if d.get("cost_usd") is None:
                night["unpriced_sessions"] += 1  # a custom agent whose transcript says nothing
            else:
                night["cost_usd"] += d["cost_usd"]
    if not nights:
        return None
    rows = sorted(nights.values(), key=lambda n: n["started_at"])
    return {"nights": rows, "total_cost": sum(n["cost_usd"] for n in rows)}


def agent_cost_markdown(summary: dict[str, Any], *, gpu_cost: float | None) -> str:
    """The agent section of `costs.md`, with the fleet's GPU cost beside the API cost."""
    gpu = "no priced (remote) workers" if gpu_cost is None else f"${gpu_cost:,.2f}"
    nights = summary["nights"]
    lines = [
        "# Agent API cost",
        "",
        f"- API: ${summary['total_cost']:,.2f} over {len(nights)} night{'s' if len(nights) != 1 else ''} "
        f"(runs of `nightlab agent run`); GPU: {gpu}",
        "",
        "| night (UTC) | agent | sessions | input tokens | output tokens | API cost |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for n in nights:
        unpriced = f" ({n['unpriced_sessions']} unpriced)" if n["unpriced_sessions"] else ""
        lines.append(
            f"| {time.strftime('%Y-%m-%d %H:%M', time.gmtime(n['started_at']))} | {n['agent'] or '-'} | "
            f"{n['sessions']}{unpriced} | {n['input_tokens']:,} | {n['output_tokens']:,} | ${n['cost_usd']:,.2f} |"
        )
    return "\n".join(lines) + "\n"
