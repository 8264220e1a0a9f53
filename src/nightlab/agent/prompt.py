"""The prompt a (re)started agent receives: the lab's instructions plus its state right now.

A restarted agent has lost its context, so everything it needs to continue without redoing
work is in the prompt: the fleet program (and the target's own notes), the incumbent and
its figures, the noise floor, what runs and waits in the queue, the best results, recent
crashes, edits left in the working tree and the journal of every idea already tried.
The journal is condensed to fit `max_journal_chars` (default 40k characters, about 10k
tokens) and to keep the whole prompt under `PROMPT_TOKEN_BUDGET` tokens, so a long night does
not crowd out the agent's working context. Measured with the real CLIs (tests/agent_real):
Claude Code 2.1.332 adds ~12k tokens of its own (system prompt and 12 tools), Codex 0.171.0
~10k, so a first request stays under ~28k tokens: a seventh of a 200k context window. Tokens
are estimated as characters / 4 (`CHARS_PER_TOKEN`), the usual figure for English and code.

Usage:
    text = build_prompt(lab, session=3, reason="stalled: no activity for 900 s")
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from nightlab.ledger import ExperimentStatus

MAX_JOURNAL_CHARS = 40_000
PROMPT_TOKEN_BUDGET = 16_000
CHARS_PER_TOKEN = 4
TOP_RESULTS = 5
RECENT_CRASHES = 5


@dataclass(frozen=True)
class Budget:
    """What is left of the supervisor's limits, for the prompt (None: no limit)."""

    hours_left: float | None = None
    experiments_left: int | None = None


def _instructions(lab) -> list[str]:
    from nightlab.agent.instructions import program_files

    own, target = program_files(lab.path)
    out = ["# Instructions", ""]
    if own is not None:
        out.append(own.read_text(encoding="utf-8").strip())
    else:
        out.append(
            "(This lab has no nightlab program file; run `nightlab journal`, `nightlab results` and "
            "`nightlab submit --help` to learn the workflow.)"
        )
    if target is not None:
        out += [
            "",
            f"# The target's own notes ({target.name})",
            "",
            target.read_text(encoding="utf-8").strip(),
        ]
    return out


def _state(lab, budget: Budget) -> list[str]:
    from nightlab.analysis import ranking

    out = ["# The lab now", "", *_fleet_lines(lab.config)]
    # ranked from a few columns per experiment; only the crashes listed below are decoded
    ranked, incumbents = ranking(lab.ledger, lab.config, lab.path)
    out += _incumbent_lines(lab, incumbents)
    out += _budget_lines(budget)
    keys = [r.key for r in ranked]
    out += _in_flight_lines(keys)
    out += _best_lines(ranked)
    out += _kept_lines(lab, keys)
    out += _crash_lines(lab, keys)
    out += _working_tree_lines(lab)
    return out


def _fleet_lines(config) -> list[str]:
    """The metric, the time limit and the slots of each tier."""
    from nightlab.config import pool_slots

    out = [
        f"- metric `{config.metric.name}`, {config.metric.direction} is better; "
        f"time limit {config.target.timeout:g} s per run"
    ]
    slots: dict[str, int] = {}
    for pool in config.fleet.pools:
        slots[pool.tier] = slots.get(pool.tier, 0) + pool_slots(pool)
    out.append(
        "- fleet: "
        + ", ".join(f"tier `{t}` {n} slot{'s' if n != 1 else ''}" for t, n in sorted(slots.items()))
        + f" (default tier `{config.fleet.default_tier}`)"
    )
    return out


def _incumbent_lines(lab, incumbents: dict) -> list[str]:
    """The incumbent commit, then its figure and the noise floor on each tier."""
    from nightlab import snapshots
    from nightlab.analysis import noise_sigma
    from nightlab.identity import epoch_key

    head = lab.head()
    subject = snapshots.git_text(lab.path, "log", "-1", "--format=%s", head)
    out = [f'- incumbent: {head[:10]} "{subject}"']
    for tier in sorted(set(lab.config.fleet.tiers) | set(incumbents)):
        f = incumbents.get(tier)
        sigma, dof = noise_sigma(lab.ledger, lab.config.metric.name, tier, epoch=epoch_key(lab.config))
        noise = (
            f"noise floor σ {sigma:.6f} ({dof} dof)"
            if sigma is not None
            else "no noise floor yet (`nightlab noise`)"
        )
        if f is None:
            out.append(f"  - {tier}: not measured; submit it (`nightlab submit -m baseline`); {noise}")
        else:
            spread = f" ± {f.std:.6f}" if f.std is not None else ""
            out.append(f"  - {tier}: {f.mean:.6f}{spread} (n={f.n}); {noise}")
    return out


def _budget_lines(budget: Budget) -> list[str]:
    """What is left of this run's budget, when it has one."""
    if budget.hours_left is None and budget.experiments_left is None:
        return []
    parts = []
    if budget.hours_left is not None:
        parts.append(f"{budget.hours_left:.1f} h left")
    if budget.experiments_left is not None:
        parts.append(f"{budget.experiments_left} more experiments")
    return [f"- this run's budget: {', '.join(parts)}; spend it on the most promising ideas"]


def _in_flight_lines(keys: list) -> list[str]:
    """The queued and running experiments, oldest first."""
    flying = sorted(
        (k for k in keys if k.status in (ExperimentStatus.QUEUED, ExperimentStatus.RUNNING)),
        key=lambda k: k.seq,
    )
    out = ["", "## In flight (do not resubmit; `nightlab wait --any` for them)"]
    if flying:
        out += [f"- {k.id} {k.status.label} on {k.tier}: {k.description}" for k in flying]
    else:
        out.append("- nothing: every slot is free, submit a wave now")
    return out


def _best_lines(ranked: list) -> list[str]:
    """The best `TOP_RESULTS` snapshots of each tier."""
    out = ["", "## Best results per tier"]
    best = [r for r in ranked if r.value is not None]
    if not best:
        out.append("- none yet")
    for tier in sorted({r.key.tier for r in best}):
        seen: set[str] = set()  # one row per snapshot: repeats of it add nothing here
        for r in [r for r in best if r.key.tier == tier]:
            k = r.key
            if k.identity in seen:
                continue
            seen.add(k.identity)
            delta = "" if r.delta is None else f" ({r.delta:+.6f} vs incumbent)"
            out.append(f"- {k.id} {tier} {r.value:.6f}{delta} {k.verdict or 'undecided'}: {k.description}")
            if len(seen) == TOP_RESULTS:
                break
    return out


def _kept_lines(lab, keys: list) -> list[str]:
    """The keeps not adopted (not the incumbent's own files)."""
    head_identity = lab.head_identity()
    pending_keeps = {
        k.identity: k
        for k in keys
        if k.verdict == "keep" and k.adopted_at is None and k.identity != head_identity
    }
    if not pending_keeps:
        return []
    out = ["", "## Kept but not adopted (adopt the best of them: `nightlab adopt ID`)"]
    return out + [f"- {k.id} {k.tier}: {k.description}" for k in pending_keeps.values()]


def _crash_lines(lab, keys: list) -> list[str]:
    """The `RECENT_CRASHES` latest crashes, the only experiments decoded in full."""
    crashed_ids = [
        k.id for k in sorted(keys, key=lambda k: -k.seq) if k.status == ExperimentStatus.FINISHED and not k.ok
    ][:RECENT_CRASHES]
    if not crashed_ids:
        return []
    crashed = sorted(lab.ledger.experiments(ids=crashed_ids), key=lambda e: -e.seq)
    out = ["", "## Recent crashes (`nightlab show ID` for the log tail)"]
    return out + [f"- {e.id} {e.outcome}: {e.detail or '-'} | {e.description}" for e in crashed]


def _working_tree_lines(lab) -> list[str]:
    """Uncommitted edits an earlier session left, and how to put them right."""
    dirty = _dirty(lab)
    if not (dirty["editable"] or dirty["other"]):
        return []
    out = ["", "## The working tree"]
    if dirty["editable"]:
        out.append(
            f"- uncommitted edits in {', '.join(dirty['editable'])} (left by an earlier session?): "
            "read `git diff`, submit them if they are an idea not yet measured, then restore with "
            f"`git checkout HEAD -- {' '.join(dirty['editable'])}`"
        )
    if dirty["other"]:
        out.append(
            f"- files outside the editable set were changed: {', '.join(dirty['other'])}. That breaks the "
            f"rules: restore them with `git checkout HEAD -- {' '.join(dirty['other'])}`"
        )
    return out


def _dirty(lab) -> dict[str, list[str]]:
    """Tracked files that differ from HEAD, split into editable ones and the rest."""
    from nightlab import snapshots

    text = snapshots.git(lab.path, "status", "--porcelain", "--untracked-files=no").decode(errors="replace")
    names = [line[3:] for line in text.splitlines() if line.strip()]
    editable = set(lab.config.target.editable)
    return {
        "editable": [n for n in names if n in editable],
        "other": [n for n in names if n not in editable],
    }


def build_prompt(
    lab,
    *,
    session: int,
    reason: str | None = None,
    budget: Budget | None = None,
    max_journal_chars: int = MAX_JOURNAL_CHARS,
    token_budget: int = PROMPT_TOKEN_BUDGET,
) -> str:
    """The full prompt for agent session `session` of an open lab.

    Args:
        reason: why the previous session ended (None for the first session of a run).
        budget: what is left of the supervisor's limits.
        token_budget: the journal is condensed so the whole prompt stays under this many tokens.
    """
    from nightlab.agent.journal import build_journal

    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    lines = [f"# nightlab research session {session} ({stamp})", ""]
    if reason:
        lines.append(
            f"You are continuing a research run. The previous session ended ({reason}); you start with a "
            "fresh context, and the state below is current. Do not redo what the journal lists."
        )
    else:
        lines.append("You are starting a research run in this lab.")
    lines += [
        f"You run headless in the lab at `{lab.path}`: no person reads your messages or answers questions. "
        "Use the `nightlab` command line from that directory, follow the instructions below, and keep "
        "working until you are stopped.",
        "",
        *_instructions(lab),
        "",
        *_state(lab, budget or Budget()),
        "",
        "# Research journal (every idea tried so far)",
        "",
    ]
    tail = [
        "",
        "# Now",
        "",
        "Read the editable file, pick the most promising ideas the journal does not list, and keep every "
        "fleet slot busy: submit, restore the file, prepare the next idea, `nightlab wait --any`, adopt "
        "only `keep` verdicts.",
    ]
    rest = sum(len(line) + 1 for line in lines + tail)
    room = min(max_journal_chars, max(0, token_budget * CHARS_PER_TOKEN - rest - 1))
    journal = build_journal(lab).to_text(max_chars=room).strip()
    return "\n".join([*lines, journal, *tail]) + "\n"
