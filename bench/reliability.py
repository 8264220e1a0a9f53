"""Reliability: faults survived, bad inputs refused, load held, a 20,000-experiment ledger.

The long variants of `tests/reliability/` (the same scenarios, `nightlab.testing.reliability`),
run bigger, with the figures printed as one table:

    kills        the controller SIGKILLed at random moments during 200-experiment waves on 8
                 slots (restarted each time by the next `nightlab status`): lost experiments,
                 duplicated completions, wrong results, leases and locks left (goal 0 each)
    reboot       every process of the lab killed at once mid-wave, then `nightlab status`
    bad input    random hostile inputs per class (log tails, experiment ids, --set values,
                 --space specs, nightlab.toml values, dashboard URLs) and how each ended
    load         50 concurrent CLI clients while a wave runs: p95 latency per command,
                 "database is locked" errors and lost submissions (goal 0)
    20k ledger   a ledger grown through the real API (Ledger.add_experiments / lease_next /
                 finish_attempt, not raw SQL) to 1k, 5k and 20k experiments: `results`,
                 `status`, `show` (in-process and as a CLI process), the dashboard overview,
                 one controller dispatch turn, a backup and a full integrity check

Usage: .venv/bin/python bench/reliability.py [--kill-waves 2] [--kills 30] [--clients 50]
       [--rounds 3] [--sizes 1000,5000,20000] [--fuzz 300] [--skip kills,load,...]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from nightlab.testing import reliability as rel

HOSTILE_ATOMS = [
    "../",
    "..",
    "/etc/passwd",
    "\0",
    "\n",
    "\r",
    "\x1b[31m",
    "\u202e",
    "é",
    "中",
    "'",
    '"',
    ";",
    "%",
    "*",
    "e0001",
    "w001",
    "1e309",
    "nan",
    "inf",
    "-",
    "(",
    "[",
    "LR",
    "=",
    ",",
    " ",
    "x" * 3000,
]


def hostile(rng: random.Random, *, max_atoms: int = 4) -> str:
    return "".join(rng.choice(HOSTILE_ATOMS) for _ in range(rng.randint(0, max_atoms)))


def timed(fn, *args, repeat: int = 3, **kwargs) -> float:
    """Median wall seconds of `fn(*args)` over `repeat` calls."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed_cpu(fn, *args, repeat: int = 3) -> str:
    """Median wall and CPU seconds of `fn(*args)`, as `wall (CPU)`: on a loaded box the CPU is the cost."""
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn(*args)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return f"{statistics.median(walls):.2f} ({statistics.median(cpus):.2f})"


def run_cli(*args: str) -> tuple[int, str]:
    from nightlab.cli import main

    err = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, err.getvalue()


# ---------------------------------------------------------------------------- sections


def bench_kills(root: Path, waves: int, kills: int, rows: list) -> None:
    totals = Counter()
    for seed in range(1, waves + 1):
        r = rel.controller_kill_wave(root, experiments=200, slots=8, kills=kills, seed=seed)
        totals.update(
            kills=r["kills"],
            experiments=r["experiments"],
            lost=len(r["lost"]) + len(r["unrecorded"]),
            duplicated=len(r["duplicated"]),
            wrong=len(r["wrong_metric"]) + sum(1 for e in r["by_id"].values() if e["outcome"] != "ok"),
            leases=r["open_attempts"],
            locks=0 if r["lock_free"] else 1,
            procs=len(r["leftover_processes"]),
            infra=r["infra_attempts"],
            reattached=r["reattached"],
        )
        print(
            f"  kill wave {seed}: {r['kills']} kills in {r['wall_seconds']:.0f} s, outcomes {r['outcomes']}",
            file=sys.stderr,
        )
    rows.append(
        ("kills", "controller SIGKILLs survived", f"{totals['kills']} over {waves} waves of 200 on 8 slots")
    )
    rows.append(
        (
            "kills",
            "experiments lost / duplicated completions",
            f"{totals['lost']} / {totals['duplicated']} (goal 0 / 0)",
        )
    )
    rows.append(
        (
            "kills",
            "wrong class or another run's result",
            f"{totals['wrong']} of {totals['experiments']} (goal 0)",
        )
    )
    rows.append(
        (
            "kills",
            "leases / locks / processes left",
            f"{totals['leases']} / {totals['locks']} / {totals['procs']}",
        )
    )
    rows.append(
        (
            "kills",
            "runs re-attached / attempts lost to a kill (infra, retried)",
            f"{totals['reattached']} / {totals['infra']}",
        )
    )


def bench_reboot(root: Path, rows: list) -> None:
    r = rel.reboot_wave(root, experiments=24, slots=8, sleep=2.0)
    requeued_once = sum(
        1 for e in r["in_flight"] if [a[0] for a in r["by_id"][e]["attempts"]] == ["infra", "ok"]
    )
    rows.append(
        (
            "reboot",
            "in-flight runs requeued exactly once",
            f"{requeued_once} of {len(r['in_flight'])} ({r['killed_processes']} processes killed); "
            f"lost {len(r['lost'])}, duplicated {len(r['duplicated'])}",
        )
    )


def bench_bad_input(root: Path, n: int, rows: list) -> None:
    from fastapi.testclient import TestClient

    from nightlab.config import parse_config
    from nightlab.errors import ConfigError
    from nightlab.fleet.runner import classify, parse_summary
    from nightlab.web import create_app

    rng = random.Random(0)
    # log tails: junk, blocks and binary; the outcome must never raise
    ended = Counter()
    for _ in range(n * 10):
        parts = []
        for _ in range(rng.randint(0, 12)):
            kind = rng.random()
            if kind < 0.3:
                parts.append("---")
                parts += [
                    f"{rng.choice(['val_bpb', 'loss', 'x.y', 'val_bpb'])}: {hostile(rng, max_atoms=2)}"
                    for _ in range(rng.randint(0, 4))
                ]
            elif kind < 0.5:
                parts.append(
                    bytes(rng.randrange(256) for _ in range(rng.randint(0, 200))).decode("utf-8", "replace")
                )
            else:
                parts.append(hostile(rng))
        text = rng.choice(["\n", "\r\n", "\r"]).join(parts)
        try:
            parse_summary(text)
            ended[classify(rng.choice([0, 1, 137, None]), text, metric="val_bpb").outcome] += 1
        except Exception as e:  # noqa: BLE001 - the figure is how many raised
            ended[f"RAISED {type(e).__name__}"] += 1
    rows.append(("bad input", f"log tails ({n * 10})", ", ".join(f"{k} {v}" for k, v in ended.most_common())))

    lab = rel.make_fast_lab(root, name="badinput", slots=1)
    try:
        os.environ["NIGHTLAB_DIR"] = str(lab)
        rel.submit_many(lab, 1)
        classes = {
            "experiment ids": lambda v: ("show", v),
            "--set values": lambda v: ("submit", "-m", "x", "--set", f"LR={v}", "--no-start"),
            "--set names": lambda v: ("submit", "-m", "x", "--set", f"{v}=1", "--no-start"),
            "--space specs": lambda v: ("sweep", f"LR={v}", "-m", "x"),
        }
        for name, make in classes.items():
            codes = Counter()
            for _ in range(n):
                value = hostile(rng)
                if value == "e0001":
                    continue
                code, err = run_cli(*make(value))
                one = len([x for x in err.splitlines() if x.strip()]) == 1
                codes[f"exit {code}" + ("" if one or code == 0 else " (not one line)")] += 1
            rows.append(
                ("bad input", f"{name} ({n})", ", ".join(f"{k}: {v}" for k, v in sorted(codes.items())))
            )
        # nightlab.toml values, straight into the parser
        base = {
            "target": {"command": "sh train.sh", "editable": ["train.sh"], "timeout": 60},
            "fleet": {"pool": [{"backend": "local", "tier": "cpu", "slots": 1}]},
        }
        keys = [
            ("target", "timeout"),
            ("target", "command"),
            ("target", "editable"),
            ("fleet", "retries"),
            ("fleet", "idle_shutdown"),
            ("fleet", "backup_interval"),
        ]
        values = [float("nan"), float("inf"), -1, 0, "", "../x", ["../../etc/passwd"], True, "1e309", [], {}]
        toml = Counter()
        for _ in range(n):
            doc = json.loads(json.dumps(base))
            table, key = rng.choice(keys)
            doc[table][key] = rng.choice(values)
            try:
                parse_config(doc)
                toml["accepted (a valid value)"] += 1
            except ConfigError:
                toml["ConfigError, exit 2"] += 1
            except Exception as e:  # noqa: BLE001
                toml[f"RAISED {type(e).__name__}"] += 1
        rows.append(
            ("bad input", f"nightlab.toml values ({n})", ", ".join(f"{k}: {v}" for k, v in toml.items()))
        )
        from urllib.parse import quote

        statuses = Counter()
        with TestClient(create_app(lab), raise_server_exceptions=False) as client:
            for _ in range(n):
                route = rng.choice(
                    ["/api/experiments/", "/experiments/", "/api/waves/", "/waves/", "/static/"]
                )
                response = client.get(route + quote(hostile(rng), safe="/%"), params={"since": hostile(rng)})
                statuses[response.status_code] += 1
        rows.append(
            (
                "bad input",
                f"dashboard URLs ({n})",
                ", ".join(f"HTTP {k}: {v}" for k, v in sorted(statuses.items())),
            )
        )
    finally:
        os.environ.pop("NIGHTLAB_DIR", None)
        rel.stop_lab(lab)


def bench_load(root: Path, clients: int, rounds: int, rows: list) -> None:
    r = rel.load_wave(root, clients=clients, rounds=rounds, experiments=40, slots=4)
    rows.append(
        (
            "load",
            f"{clients} concurrent CLI clients x {rounds} calls",
            f"{r['calls']} calls, 'database is locked' {r['locked']}, other errors {len(r['errors']) - r['locked']}, "
            f"submissions lost {len(r['submits_lost'])} of {r['submits_ok']}",
        )
    )
    for kind in ("submit", *rel.READ_COMMANDS):
        if kind in r["p95"]:
            rows.append(
                ("load", f"`{kind}` latency p50 / p95", f"{r['p50'][kind]:.2f} s / {r['p95'][kind]:.2f} s")
            )


def _grow(lab: Path, ledger, target: int, snapshot: str, ident: str) -> None:
    """Add experiments through the ledger API and run each through a lease and a finish."""
    from nightlab.ledger import NewExperiment

    have = len(ledger.experiments(with_metrics=False))
    while have < target:
        batch = min(500, target - have)
        new = [
            NewExperiment(
                snapshot=snapshot,
                identity=ident,
                parent=None,
                description=f"bench {have + i}",
                tier="cpu",
                seed=have + i,
                params={"LR": f"{0.001 * (1 + (have + i) % 50):g}"},
            )
            for i in range(batch)
        ]
        ledger.add_experiments(new)
        for i in range(batch):
            attempt = ledger.lease_next("cpu-0", "cpu")
            ledger.finish_attempt(
                attempt.id,
                outcome="ok" if i % 10 else "crash:exception",
                exit_code=0 if i % 10 else 1,
                metrics={
                    "val_bpb": 1.0 + ((have + i) % 97) / 1000,
                    "training_seconds": 300.0,
                    "peak_vram_mb": 2048.0,
                },
                verdict="discard",
            )
        have += batch


def bench_big_ledger(root: Path, sizes: list[int], rows: list) -> None:
    from fastapi.testclient import TestClient

    from nightlab.config import load_lab_config
    from nightlab.fleet.controller import Controller, build_slots
    from nightlab.judge import Judge
    from nightlab.ledger import backup, open_ledger
    from nightlab.web import create_app

    lab = rel.make_fast_lab(root, name="big", slots=8)
    try:
        [first] = rel.submit_many(lab, 1)
        with open_ledger(lab) as ledger:
            e = ledger.get(first)
            snapshot, ident = e.snapshot, e.identity
        table: dict[str, list[str]] = {}
        for size in sizes:
            with open_ledger(lab) as ledger:
                t0 = time.perf_counter()
                _grow(lab, ledger, size, snapshot, ident)
                grow_s = time.perf_counter() - t0
            db_mb = (lab / ".nightlab" / "ledger.db").stat().st_size / 2**20
            figures = {}
            for label, cmd in (
                ("results", ("results",)),  # the table
                ("results --json", ("results", "--json")),  # every experiment
                ("status --json", ("status", "--json")),
                ("show --json", ("show", f"e{size // 2:04d}", "--json")),
            ):
                t0 = time.perf_counter()
                rel.nightlab(*cmd, cwd=lab)
                figures[f"`{label}` CLI process"] = time.perf_counter() - t0
            os.environ["NIGHTLAB_DIR"] = str(lab)
            try:
                for cmd in (
                    ("results",),
                    ("results", "--json"),
                    ("results", "--json", "-n", "25"),
                    ("status", "--json"),
                    ("show", f"e{size // 2:04d}", "--json"),
                ):
                    figures[f"`{' '.join(cmd)}` in-process, wall (CPU)"] = timed_cpu(run_cli, *cmd)
            finally:
                os.environ.pop("NIGHTLAB_DIR", None)
            with TestClient(create_app(lab)) as client:
                client.get("/api/results")
                with open_ledger(lab) as ledger:
                    ledger.log_event("bench")  # a new ledger version: the overview is recomputed (cold)
                w, c = time.perf_counter(), time.process_time()
                assert client.get("/").status_code == 200
                figures["dashboard overview (cold), wall (CPU)"] = (
                    f"{time.perf_counter() - w:.2f} ({time.process_time() - c:.2f})"
                )
                figures["dashboard overview (cached)"] = timed(client.get, "/")
            # one dispatch turn with 8 free slots and 8 queued experiments: 8 leases and 8 launches
            with open_ledger(lab) as ledger:
                from nightlab.ledger import NewExperiment

                queued = ledger.add_experiments(
                    [
                        NewExperiment(
                            snapshot=snapshot,
                            identity=ident,
                            parent=None,
                            description="turn",
                            tier="cpu",
                            seed=10**6 + size + i,
                        )
                        for i in range(8)
                    ]
                )
                config = load_lab_config(lab).config
                slots, backends = build_slots(config, lab_dir=lab)
                controller = Controller(
                    lab, config, ledger, slots=slots, backends=backends, policy=Judge(ledger, config, lab)
                )
                ledger.register_workers([(s.name, s.tier, s.backend, s.info) for s in slots])
                t0 = time.perf_counter()
                controller._poll_active()
                controller._dispatch()
                figures["one dispatch turn (8 leases + launches)"] = time.perf_counter() - t0
                for active in list(controller.active.values()):
                    backends["local"].kill(active.slot, active.spec, active.handle)
                time.sleep(0.5)
                for active in list(controller.active.values()):
                    ledger.finish_attempt(active.attempt.id, outcome="cancelled", detail="bench")
                controller.active.clear()
                assert len(queued) == 8
                t0 = time.perf_counter()
                problems = ledger.check(full=True)
                figures["full integrity check"] = time.perf_counter() - t0
                assert problems == []
            t0 = time.perf_counter()
            backup.take_backup(lab / ".nightlab" / "ledger.db", keep=2)
            figures["online backup"] = time.perf_counter() - t0
            print(f"  {size} experiments: grown in {grow_s:.0f} s, {db_mb:.1f} MiB", file=sys.stderr)
            for k, v in figures.items():
                table.setdefault(k, []).append(v if isinstance(v, str) else f"{v:.2f}")
            table.setdefault("ledger size (MiB)", []).append(f"{db_mb:.1f}")
        head = " → ".join(f"{s:,}" for s in sizes)
        for k, v in table.items():
            unit = "" if "MiB" in k else " s"
            rows.append((f"ledger {head}", k, " → ".join(v) + unit))
    finally:
        rel.stop_lab(lab)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kill-waves", type=int, default=2)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="1000,5000,20000")
    parser.add_argument("--fuzz", type=int, default=300, help="hostile inputs per class")
    parser.add_argument("--skip", default="", help="comma-separated sections to skip")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    rows: list[tuple[str, str, str]] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="nightlab-reliability-") as tmp:
        root = Path(tmp)
        sections = [
            ("kills", lambda: bench_kills(root, args.kill_waves, args.kills, rows)),
            ("reboot", lambda: bench_reboot(root, rows)),
            ("badinput", lambda: bench_bad_input(root, args.fuzz, rows)),
            ("load", lambda: bench_load(root, args.clients, args.rounds, rows)),
            ("ledger", lambda: bench_big_ledger(root, [int(s) for s in args.sizes.split(",")], rows)),
        ]
        for name, fn in sections:
            if name in skip:
                continue
            t0 = time.time()
            print(f"{name} ...", file=sys.stderr)
            fn()
            print(f"{name} done in {time.time() - t0:.0f} s", file=sys.stderr)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {time.time() - started:.0f} s in all\n")
    print("| section | measure | result |")
    print("|---|---|---|")
    for section, measure, result in rows:
        print(f"| {section} | {measure} | {result} |")


if __name__ == "__main__":
    main()
