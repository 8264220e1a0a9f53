"""The agent's API cost per night, from the ledger's `agent-session` events, for costs.md."""

from __future__ import annotations

from nightlab.agent.costs import agent_cost_markdown, agent_cost_summary
from nightlab.ledger import open_ledger


def session(ledger, night: float, cost: float | None, tokens: tuple[int, int] = (1000, 10)) -> None:
    ledger.log_event(
        "agent-session",
        run_started_at=night,
        agent="claude",
        n=1,
        cost_usd=cost,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
    )


def test_costs_per_night_next_to_the_gpu(tmp_path):
    ledger = open_ledger(tmp_path, create=True)
    assert agent_cost_summary(ledger) is None
    first, second = 1_764_547_200.0, 1_764_633_600.0  # 2025-12-01 and -02, 00:00 UTC
    session(ledger, first, 0.5)
    session(ledger, first, 1.25, (2000, 20))
    session(ledger, second, None)  # a custom agent whose transcript reports nothing
    session(ledger, second, 2.0)
    summary = agent_cost_summary(ledger)
    ledger.close()
    assert summary["total_cost"] == 3.75
    a, b = summary["nights"]
    assert (a["sessions"], a["cost_usd"], a["input_tokens"], a["output_tokens"]) == (2, 1.75, 3000, 30)
    assert (b["sessions"], b["unpriced_sessions"], b["cost_usd"]) == (2, 1, 2.0)
    text = agent_cost_markdown(summary, gpu_cost=312.4)
    assert text.startswith("# Agent API cost\n")
    assert "- API: $3.75 over 2 nights (runs of `nightlab agent run`); GPU: $312.40" in text
    assert "| 2025-12-01 00:00 | claude | 2 | 3,000 | 30 | $1.75 |" in text
    assert "| 2025-12-02 00:00 | claude | 2 (1 unpriced) | 2,000 | 20 | $2.00 |" in text
    assert "GPU: no priced (remote) workers" in agent_cost_markdown(summary, gpu_cost=None)
