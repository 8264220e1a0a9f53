"""`nightlab doctor --restore`: put a ledger backup back without losing what it cannot bring back.

A backup is up to `fleet.backup_interval` old. Putting it back alone forgot every experiment
submitted after it, queued again runs that had finished since, kept the backup's controller
row (so the next `status` restarted a controller stopped on purpose) and handed out the
forgotten ids again, overwriting their snapshot refs and appending to their run folders.
So after the copy, in one ledger transaction (`Ledger.recover`), a restore:

1. keeps the damaged ledger beside it (`ledger.db.replaced-<time>`) and reads from it every
   table that still reads (`ledger.read_damaged`): experiments, metrics, waves, the agent's record;
2. rebuilds each experiment that only the lab's files prove (`nightlab.evidence`): from its
   snapshot ref (files, description, parent, submit time) and its run folders (the result of
   an attempt that ended: `exit`, `log.txt`, `score.json`). One whose run did not end is
   recorded `cancelled` (queued, cancelled and interrupted cannot be told apart): resubmit it;
3. finishes the backup's queued / running experiments whose run folder holds an ended
   attempt, and requeues the others after their last folder (a fresh folder for the next try);
4. drops the backup's controller row and busy slots, reserves every id a ref or run folder
   holds (`meta.id_floor`; the allocator also skips them by itself), and
5. returns an exact account: what was recovered and how, what was requeued, and what is lost.

Recovered results are not judged (verdict empty: their incumbent at the time is not known).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nightlab import evidence, snapshots
from nightlab.errors import NightlabError
from nightlab.ledger import ExperimentStatus, RecoveryPlan, RunEnd, Salvage, backup, open_ledger, read_damaged

_UNFINISHED = (int(ExperimentStatus.QUEUED), int(ExperimentStatus.RUNNING))


def restore(lab: Path, path: Path | None = None) -> dict[str, Any]:
    """Restore a backup (default: the newest good one) and recover what the lab still proves.

    The caller makes sure no controller runs (`doctor.restore`).

    Returns:
        `restored` (backup), `replaced` (the damaged ledger, moved aside), `experiments` (count
        after), `recovered` ({id, status, outcome, from}), `finished` (backup rows finished from
        their run folders), `requeued`, `reserved` (ids only a run folder holds), `lost` (lines).

    Raises:
        UsageError: there is no usable backup.
    """
    ledger_path = lab / ".nightlab" / "ledger.db"
    used, aside = backup.restore_backup(ledger_path, path)
    salvage = read_damaged(aside) if aside is not None else Salvage(unreadable=["ledger.db (missing)"])
    config = _config(lab)
    refs, runs = evidence.refs(lab) or {}, evidence.run_folders(lab)
    account: dict[str, Any] = {
        "restored": str(used),
        "replaced": str(aside) if aside else None,
        "recovered": [],
        "finished": [],
        "requeued": [],
        "reserved": [],
        "lost": [],
    }
    plan = RecoveryPlan()
    with open_ledger(lab) as ledger:
        known = {e.id: e for e in ledger.experiments(with_metrics=False)}
        old_rows = {r["id"]: r for r in salvage.rows.get("experiments", [])}
        old_metrics: dict[str, dict[str, Any]] = {}
        for m in salvage.rows.get("metrics", []):
            old_metrics.setdefault(m["experiment_id"], {})[m["key"]] = (
                m["value"] if m["value"] is not None else m["text"]
            )
        _take_waves(plan, salvage, ledger)
        # the backup's unfinished experiments: what did they do after it was taken?
        for e in known.values():
            if e.status.is_finished():
                continue
            old = old_rows.get(e.id)
            if old is not None and old["status"] == int(ExperimentStatus.FINISHED):
                plan.ends.append(_end_of_row(old, old_metrics.get(e.id, {})))
                account["finished"].append(e.id)
                continue
            traces = runs.get(e.id, [])
            end = _end_of_runs(e.id, traces, config, e.attempts)
            plan.ends.append(end)
            account["finished" if end.outcome else "requeued"].append(e.id)
        # experiments the backup does not know
        seen = set(refs) | set(runs) | set(old_rows)
        for eid in sorted(seen - set(known), key=lambda i: evidence.seq_of(i) or 0):
            if evidence.seq_of(eid) is None:
                continue
            item = _recover_one(lab, eid, refs, runs, old_rows, old_metrics, salvage, config, plan)
            if item is None:
                account["reserved"].append(eid)
                account["lost"].append(
                    f"{eid}: only its run folder is left (no snapshot ref, not in the damaged ledger); "
                    "the id stays reserved"
                )
                continue
            account["recovered"].append({k: item[k] for k in ("id", "status", "outcome", "from")})
            if item["lost"]:
                account["lost"].append(f"{eid}: {'; '.join(item['lost'])}")
        _take_agent(plan, salvage, ledger, account)
        plan.id_floor = max((evidence.seq_of(i) or 0 for i in seen), default=0)
        if salvage.unreadable:
            account["lost"].append(
                f"unreadable in the damaged ledger: {', '.join(salvage.unreadable)} (what they held after "
                "the backup is gone unless a run folder or snapshot ref proves it)"
            )
        account["lost"].append(
            "the event history after the backup (starts, ends, verdict changes), and the verdicts of "
            "recovered results (not judged; compare them with `nightlab results`)"
        )
        plan.summary = {k: v for k, v in account.items() if k != "lost"}
        ledger.recover(plan)
        account["experiments"] = ledger.count()
    return account


def _config(lab: Path) -> Any:
    from nightlab.config import load_lab_config

    try:
        return load_lab_config(lab).config
    except NightlabError:
        return None  # recovery still works from the refs and run folders alone


def _end_of_row(row: dict[str, Any], metrics: dict[str, Any]) -> RunEnd:
    return RunEnd(
        row["id"],
        attempts=row["attempts"],
        outcome=row["outcome"],
        detail=row["detail"],
        metrics=metrics,
        finished_at=row["finished_at"],
        verdict=row.get("verdict"),
    )


def _result(
    traces: list[evidence.AttemptTrace], config: Any
) -> tuple[str, str | None, dict[str, Any]] | None:
    """(outcome, detail, metrics) of the last attempt folder, when that attempt ended."""
    if not traces or traces[-1].exit_code is None:
        return None
    from nightlab.fleet.runner import classify, read_tail

    last = traces[-1]
    metric = config.metric.name if config else "val_bpb"
    tail = read_tail(last.folder / "log.txt")
    result = classify(last.exit_code, tail, metric=metric)
    outcome, detail, metrics = result.outcome, result.detail, result.metrics
    if config is not None and config.target.builtin:
        from nightlab.fleet.runner import expected_val_set
        from nightlab.harness.owned import apply_score, read_score

        outcome, detail, metrics = apply_score(
            outcome,
            detail,
            metrics,
            read_score(last.folder),
            metric=metric,
            expected_val_set=expected_val_set(config),
        )
    return outcome, detail, metrics


def _end_of_runs(eid: str, traces: list[evidence.AttemptTrace], config: Any, attempts: int) -> RunEnd:
    done = _result(traces, config)
    number = max([attempts, *(t.number for t in traces)])
    if done is None:
        return RunEnd(eid, attempts=number)
    outcome, detail, metrics = done
    note = f"recovered from `.nightlab/runs/{eid}/attempt-{traces[-1].number}` by `nightlab doctor --restore`"
    return RunEnd(
        eid,
        attempts=number,
        outcome=outcome,
        detail=f"{detail}; {note}" if detail else note,
        metrics=metrics,
        finished_at=traces[-1].ended_at,
    )


def _recover_one(
    lab: Path,
    eid: str,
    refs: dict[str, str],
    runs: dict[str, list[evidence.AttemptTrace]],
    old_rows: dict[str, dict[str, Any]],
    old_metrics: dict[str, dict[str, Any]],
    salvage: Salvage,
    config: Any,
    plan: RecoveryPlan,
) -> dict[str, Any] | None:
    """Add one experiment the backup lacks to `plan`; returns what was done, None when nothing proves it."""
    traces = runs.get(eid, [])
    old = old_rows.get(eid)
    if old is not None:
        plan.experiments.append(old)
        if old_metrics.get(eid):
            plan.metrics[eid] = old_metrics[eid]
        status = ExperimentStatus(old["status"])
        outcome = old["outcome"]
        if not status.is_finished():
            end = _end_of_runs(eid, traces, config, old["attempts"])
            plan.ends.append(end)
            status = ExperimentStatus.FINISHED if end.outcome else ExperimentStatus.QUEUED
            outcome = end.outcome
        return {"id": eid, "status": status.label, "outcome": outcome, "from": "damaged ledger", "lost": []}
    commit = refs.get(eid)
    if commit is None:
        return None
    lost = ["its wave, source, priority, --set values and attempt history"]
    submit = salvage.submits.get(eid) or {}
    tier = submit.get("tier") or (config.fleet.default_tier if config else "cpu")
    seed = submit.get("seed")
    if seed is None:
        seed = 0
        lost.append("its seed (recorded as 0)")
    if "tier" not in submit:
        lost.append(f"its tier (recorded as the default, `{tier}`)")
    message, parent, when = _commit_info(lab, commit)
    done = _result(traces, config)
    if done is None:
        status, (outcome, detail, metrics) = ExperimentStatus.CANCELLED, ("cancelled", None, {})
        detail = (
            "lost with the ledger and recovered from its snapshot ref by `nightlab doctor --restore`; "
            f"it had not finished (queued, cancelled or interrupted): run it again with `git show "
            f"refs/nightlab/{eid}` and `nightlab submit`"
        )
        lost.append("whether it was queued or cancelled (recorded as cancelled; resubmit it)")
    else:
        status = ExperimentStatus.FINISHED
        outcome, detail, metrics = done
        note = f"recovered from its snapshot ref and `.nightlab/runs/{eid}` by `nightlab doctor --restore`"
        detail = f"{detail}; {note}" if detail else note
        lost.append("its verdict and machine health (not judged)")
    plan.experiments.append(
        {
            "id": eid,
            "seq": evidence.seq_of(eid),
            "snapshot": commit,
            "identity": _identity(lab, commit, config),
            "parent": parent,
            "description": message,
            "tier": tier,
            "seed": int(seed),
            "wave": None,
            "priority": 0,
            "params": "{}",
            "source": "cli",
            "status": int(status),
            "outcome": outcome,
            "detail": detail,
            "attempts": max((t.number for t in traces), default=0),
            "submitted_at": when,
            "started_at": traces[0].started_at if traces else None,
            "finished_at": traces[-1].ended_at if done else when,
            "epoch": _epoch(config),
        }
    )
    if metrics:
        plan.metrics[eid] = metrics
    how = "snapshot ref and run folder" if done else "snapshot ref"
    return {"id": eid, "status": status.label, "outcome": outcome, "from": how, "lost": lost}


def _commit_info(lab: Path, commit: str) -> tuple[str, str | None, float]:
    """(message, first parent, commit time) of a snapshot."""
    text = snapshots.git_text(lab, "log", "-1", "--format=%P%x00%ct%x00%B", commit)
    parents, when, message = text.split("\0", 2)
    return message.strip(), (parents.split() or [None])[0], float(when)


def _identity(lab: Path, commit: str, config: Any) -> str:
    from nightlab import identity

    if config is None:
        return snapshots.tree_of(lab, commit)
    return identity.of(lab, commit, config=config)


def _epoch(config: Any) -> str:
    from nightlab import identity

    return identity.epoch_key(config) if config is not None else ""


def _take_waves(plan: RecoveryPlan, salvage: Salvage, ledger: Any) -> None:
    have = {w.id for w in ledger.waves()}
    plan.waves = [w for w in salvage.rows.get("waves", []) if w["id"] not in have]
    plan.search_waves = [s for s in salvage.rows.get("search_waves", []) if s["wave_id"] not in have]


def _take_agent(plan: RecoveryPlan, salvage: Salvage, ledger: Any, account: dict[str, Any]) -> None:
    """The agent supervisor's record: the damaged ledger's when it reads and is newer than the backup's."""
    rows = salvage.rows.get("agent_run") or []
    current = ledger.agent_run()
    if rows and (current is None or rows[0]["updated_at"] > current.updated_at):
        plan.agent_run = rows[0]
        plan.agent_sessions = salvage.rows.get("agent_sessions")  # None: unreadable, the backup's stay
        if plan.agent_sessions is None:
            account["lost"].append("the agent's sessions after the backup (its record was recovered)")
        account["agent"] = "recovered from the damaged ledger"
    elif "agent_run" in salvage.unreadable:
        account["lost"].append(
            "the agent supervisor's record after the backup (unreadable in the damaged ledger)"
        )
