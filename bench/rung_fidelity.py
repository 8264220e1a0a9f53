"""Rank transfer between budgets on the built-in GPT target: what a short screening rung tells (issue 34.3).

Runs the real template on the `cpu` profile for a grid of configurations (learning rate: every LR
knob of the template scaled together; total batch; depth) at fractions of the profile's budget
(default 1/10, 1/3 and the whole 30 s), several seeds each, exactly as the fleet runs a run on a
screening rung: the harness's supervisor (`python -P -m nightlab.harness.attempt ... -- python
train.py`, the line `attempt.wrap_command` gives the controller) with the rung's budget in
`NIGHTLAB_TIER_BUDGET` (what `rungs.tier_budget_env` hands every run of a tier with its own
`budget_seconds`), the slot's thread variables (one thread, as a CPU pool with `threads = 1`), the
attempt mark, and the measurement overrides stripped as `fleet/local.py` does. The supervisor's
batch server owns the clock, the warm-up is capped at a quarter of the budget, the scorer scores the
hand-in in its own process: the figures are the product's.

Each finished run is appended as one JSON line to `--results` (config, budget, seed, val_bpb, the
server's steps and seconds, the supervisor's wall time, the load average, and the machine health
the fleet would record: `fleet/health.py`'s CPU sampler over every process of the run, judged by
its rule, so a starved run is `degraded`); a rerun skips every (config, budget, seed) with a
usable row there, so an interrupted grid resumes, and a run that failed (e.g. `invalid`: handed in
past the grace on an overloaded box) or was degraded runs again, once (`--retries`), as the fleet
re-runs a degraded run once. The analysis counts scored, healthy runs only.
`--parallel 2` runs two at once (each with one thread). The runs go seed by seed (a grid stopped early holds whole seeds), each seed's runs in an order
shuffled with a fixed seed, so the box's load, which drifts, spreads over configurations and budgets
instead of biasing one.

The report (`--report` alone reads the file and runs nothing):
- per budget pair, Spearman's rho between the configurations' mean val_bpb with its 95 % Fisher
  interval (`nightlab.rungs.rank_transfer`, the function behind `nightlab rungs`);
- the short-horizon bias: per configuration its rank at each budget against the full one (which a
  short run ranks higher), and per knob level the mean rank shift (do high learning rates look
  better short?); the fitted LR optimum per budget (a parabola in log LR through the LR levels);
- noise: the pooled within-configuration sd per budget, against the spread of the configurations;
- cost: a short run's wall time against a full one's (start-up, warm-up and scoring do not shrink);
- the `Fidelity` parameters for bench/search_family.py that these figures give (`fidelity_fit`).

Usage:
    .venv/bin/python bench/rung_fidelity.py --results /tmp/rf.jsonl                      # the full grid
    .venv/bin/python bench/rung_fidelity.py --results /tmp/rf.jsonl --configs 2 --budgets 0.1,1 --seeds 0
    .venv/bin/python bench/rung_fidelity.py --results /tmp/rf.jsonl --report [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any

from nightlab.rungs import BUDGET_ENV, rank_transfer

# --- the grid ------------------------------------------------------------------------------------

# Every LR knob of the template, scaled together by one factor (the template's values are the
# h100-tuned defaults; AdamW's are scaled by width inside train.py as well).
LR_KNOBS = {"MATRIX_LR": 0.04, "EMBEDDING_LR": 0.6, "UNEMBEDDING_LR": 0.004, "SCALAR_LR": 0.5}
LR_SCALES = (1 / 3, 1.0, 3.0)
DEPTHS = (2, 3)  # the cpu profile's 2 (width 128) and 3 (width 256: ~3.5x the FLOPs per token)
BATCHES = (2**11, 2**13)  # tokens per step: the cpu profile's one row-batch of 8 x 256, and 4 of them
FRACTIONS = (0.1, 1 / 3, 1.0)
SEEDS = (0, 1, 2)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


@dataclass(frozen=True)
class Config:
    """One configuration of the grid: its LR scale, depth and total batch."""

    lr: float
    depth: int
    batch: int

    @property
    def name(self) -> str:
        return f"lr{self.lr:.3g}-d{self.depth}-b{int(math.log2(self.batch))}"

    def knobs(self) -> dict[str, str]:
        out = {k: repr(round(v * self.lr, 6)) for k, v in LR_KNOBS.items()}
        out.update(DEPTH=str(self.depth), TOTAL_BATCH_SIZE=f"2**{int(math.log2(self.batch))}")
        return out


GRID = [Config(lr, d, b) for d, b, lr in itertools.product(DEPTHS, BATCHES, LR_SCALES)]


def plan(configs: Sequence[Config], fractions: Sequence[float], seeds: Sequence[int]) -> list[tuple]:
    """Every (config, fraction, seed): seed by seed, so a grid stopped early holds whole seeds, each
    seed's runs shuffled with a fixed seed (load drift becomes noise, not a bias of a config or budget)."""
    todo = []
    for seed in seeds:
        block = list(itertools.product(configs, fractions, [seed]))
        random.Random(34 + seed).shuffle(block)
        todo += block
    return todo


def key(config: str, fraction: float, seed: int) -> str:
    return f"{config}@{fraction:.4f}#{seed}"


# --- one run, as the fleet runs it -------------------------------------------------------------


def _lab(root: Path, threads: int) -> tuple[Path, str, dict[str, str], float]:
    """A lab folder with the cpu profile and the template (train_defaults applied), the data
    prepared; returns (lab, template source, the runs' base environment, the profile's budget)."""
    from nightlab.fleet.local import MEASUREMENT_OVERRIDES
    from nightlab.harness.data import prepare
    from nightlab.harness.profiles import get_profile
    from nightlab.search.knobs import set_knobs

    profile = get_profile("cpu")
    prepare(profile, progress=False)
    lab = root / "lab"
    lab.mkdir(parents=True, exist_ok=True)
    rows = [
        f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v!r}"
        for k, v in profile.to_dict().items()
        if k != "train_defaults"
    ]
    (lab / "nightlab.toml").write_text("[profile]\n" + "\n".join(rows) + "\n")
    template = set_knobs(
        resources.files("nightlab.targets.gpt").joinpath("train.py").read_text(), profile.train_defaults
    )
    env = {k: v for k, v in os.environ.items() if k not in MEASUREMENT_OVERRIDES}
    env = {k: v for k, v in env.items() if not k.startswith("NIGHTLAB_") or k == "NIGHTLAB_DATA_DIR"}
    env.update({var: str(threads) for var in THREAD_VARS})
    env.update(
        CUDA_VISIBLE_DEVICES="",
        PYTHONUNBUFFERED="1",
        PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
    )
    return lab, template, env, float(profile.budget_seconds)


def run_one(
    cfg: Config,
    fraction: float,
    seed: int,
    *,
    threads: int,
    lab: Path,
    template: str,
    env: dict[str, str],
    full: float,
    root: Path,
) -> dict[str, Any]:
    """One supervised run of `cfg` at `fraction` of the budget; its row for the results file."""
    from nightlab.fleet.health import CpuSampler, judge, scan_runs
    from nightlab.harness.attempt import wrap_command
    from nightlab.procs import MARK
    from nightlab.search.knobs import set_knobs

    budget = round(full * fraction, 3)
    run_dir = root / "runs" / f"{cfg.name}-b{budget:g}-s{seed}" / "attempt-1"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    work = run_dir / "work"
    work.mkdir(parents=True)
    (work / "train.py").write_text(set_knobs(template, cfg.knobs()))
    shutil.copy(lab / "nightlab.toml", work / "nightlab.toml")
    run_env = {
        **env,
        "NIGHTLAB_EXPERIMENT": cfg.name,
        "NIGHTLAB_SEED": str(seed),
        "NIGHTLAB_TIER": f"cpu-{budget:g}s",
        "NIGHTLAB_LAB": str(lab),
        BUDGET_ENV: repr(float(budget)),  # what the controller hands a run on a rung (rungs.tier_budget_env)
        MARK: str(run_dir),
    }
    line = wrap_command("python train.py", run_dir=run_dir, lab_dir=lab)
    load = os.getloadavg()[0]
    start, started_at = time.monotonic(), time.time()
    with open(run_dir / "log.txt", "wb") as log:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", line],
            cwd=work,
            env=run_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # the fleet's machine-health watch (fleet/health.py): every thread of every process of the
        # run, sampled each second; a starved run is `degraded` there, never judged, re-run once
        sampler = CpuSampler(root=proc.pid, mark=str(run_dir), threads=threads, started_at=started_at)
        done = threading.Event()

        def watch() -> None:
            while not done.wait(1.0):
                sampler.add(scan_runs({0: (proc.pid, str(run_dir))})[0])

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            _, status, _ = os.wait4(proc.pid, 0)
        finally:
            done.set()
            watcher.join()
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
    wall = time.monotonic() - start
    health = judge(sampler.health(ended_at=time.time()))
    proc.returncode = os.waitstatus_to_exitcode(status)
    score_file = run_dir / "score.json"
    score = json.loads(score_file.read_text()) if score_file.exists() else {}
    val = score.get("val_bpb") if score.get("status", "ok") == "ok" else None
    row = {
        "key": key(cfg.name, fraction, seed),
        "config": cfg.name,
        "lr": cfg.lr,
        "depth": cfg.depth,
        "batch": cfg.batch,
        "fraction": fraction,
        "budget": budget,
        "seed": seed,
        "exit": proc.returncode,
        "status": score.get("status") or "not-scored",
        "val_bpb": val if isinstance(val, (int, float)) and math.isfinite(val) else None,
        "steps": score.get("steps"),
        "warmup_steps": score.get("warmup_steps"),
        "training_seconds": score.get("training_seconds"),
        "warmup_seconds": score.get("warmup_seconds"),
        "train_wall_seconds": score.get("train_wall_seconds"),
        "eval_seconds": score.get("eval_seconds"),
        "wall": round(wall, 2),
        "steps_per_s": round(score["steps"] / score["training_seconds"], 2)
        if score.get("training_seconds")
        else None,
        "got_share": health.got_share,
        "cpu_share": health.cpu_share,
        "degraded": health.degraded,
        "load_start": round(load, 2),
        "load_end": round(os.getloadavg()[0], 2),
        "invalid_reason": score.get("invalid_reason"),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if row["val_bpb"] is not None:
        shutil.rmtree(run_dir)  # the model and the snapshot: ~1 MB a run; failures are kept to read
    return row


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The results file's rows (a torn last line, from a kill mid-write, is skipped)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def usable(r: Mapping[str, Any]) -> bool:
    """A run the analysis counts: scored, and not starved (`degraded`: the fleet never judges it)."""
    return r.get("val_bpb") is not None and not r.get("degraded")


def remaining(todo: Sequence[tuple], results: Path, *, retries: int = 1) -> list[tuple]:
    """The runs of `todo` with no usable row in the results file and fewer than 1 + `retries` rows
    (a failed or starved run runs again, `retries` times: the fleet re-runs a degraded run once)."""
    rows = read_rows(results)
    done = {r["key"] for r in rows if usable(r)}
    tries: dict[str, int] = {}
    for r in rows:
        tries[r["key"]] = tries.get(r["key"], 0) + 1
    return [t for t in todo if (k := key(t[0].name, t[1], t[2])) not in done and tries.get(k, 0) <= retries]


def run_grid(
    todo: Sequence[tuple], *, results: Path, parallel: int, threads: int, work: Path | None, retries: int = 1
) -> None:
    left = remaining(todo, results, retries=retries)
    print(f"{len(todo) - len(left)} of {len(todo)} runs already in {results}; {len(left)} to run", flush=True)
    if not left:
        return
    root = Path(work or tempfile.mkdtemp(prefix="rung-fidelity-"))
    lab, template, env, full = _lab(root, threads)
    lock = threading.Lock()
    counter = itertools.count(1)

    def one(item: tuple) -> None:
        cfg, fraction, seed = item
        row = run_one(
            cfg, fraction, seed, threads=threads, lab=lab, template=template, env=env, full=full, root=root
        )
        with lock:
            with open(results, "a") as f:  # one whole line per run: a rerun skips it
                f.write(json.dumps(row) + "\n")
                f.flush()
                os.fsync(f.fileno())
            print(
                f"[{next(counter)}/{len(left)}] {row['key']}: val_bpb {row['val_bpb']} | {row['status']} | "
                f"steps {row['steps']} ({row['steps_per_s']}/s) | got {row['got_share']} of the CPU"
                f"{' DEGRADED' if row['degraded'] else ''} | wall {row['wall']:.1f} s | "
                f"load {row['load_start']:.1f}-{row['load_end']:.1f}",
                flush=True,
            )

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for f in [pool.submit(one, item) for item in left]:
            f.result()
    if work is None:
        shutil.rmtree(root, ignore_errors=True)


# --- the analysis (pure: rows in, figures out) -----------------------------------------------------


def means(rows: Iterable[Mapping[str, Any]]) -> dict[float, dict[str, float]]:
    """fraction -> config -> mean val_bpb over its ok runs."""
    vals: dict[float, dict[str, list[float]]] = {}
    for r in rows:
        if usable(r):
            vals.setdefault(round(float(r["fraction"]), 4), {}).setdefault(r["config"], []).append(
                float(r["val_bpb"])
            )
    return {f: {c: statistics.fmean(v) for c, v in by.items()} for f, by in sorted(vals.items())}


def ranks(values: Mapping[str, float]) -> dict[str, float]:
    """Rank of each config, 1 = lowest (best) value; ties share their mean rank."""
    from scipy.stats import rankdata

    names = list(values)
    return dict(zip(names, map(float, rankdata([values[c] for c in names], method="average")), strict=True))


def correlations(m: Mapping[float, Mapping[str, float]]) -> list[dict[str, Any]]:
    """Per budget pair (short, long): `rank_transfer` over the configs measured at both."""
    out = []
    for a, b in itertools.combinations(sorted(m), 2):
        common = sorted(set(m[a]) & set(m[b]))
        out.append({"short": a, "long": b, **rank_transfer([(m[a][c], m[b][c]) for c in common])})
    return out


def rank_shifts(
    m: Mapping[float, Mapping[str, float]], attrs: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The short-horizon bias against the longest budget.

    Returns {"configs": {fraction: {config: rank there - rank at full}}, "levels": {fraction: {knob:
    {level: mean shift}}}}. A negative shift: the short run ranks the config higher (better) than
    the full one does. Configs missing at either budget are left out, and ranks are taken among the
    configs both have.
    """
    full = max(m)
    configs: dict[float, dict[str, float]] = {}
    levels: dict[float, dict[str, dict[str, float]]] = {}
    for f in sorted(m):
        if f == full:
            continue
        common = set(m[f]) & set(m[full])
        rs = ranks({c: m[f][c] for c in common})
        rf = ranks({c: m[full][c] for c in common})
        configs[f] = {c: rs[c] - rf[c] for c in sorted(common)}
        by: dict[str, dict[str, list[float]]] = {}
        for c, shift in configs[f].items():
            for knob, level in attrs[c].items():
                by.setdefault(knob, {}).setdefault(f"{level:g}", []).append(shift)
        levels[f] = {k: {lv: statistics.fmean(s) for lv, s in v.items()} for k, v in by.items()}
    return {"configs": configs, "levels": levels}


def level_means(
    values: Mapping[str, float], attrs: Mapping[str, Mapping[str, Any]], knob: str
) -> dict[float, float]:
    """knob level -> mean value over the configs at that level."""
    by: dict[float, list[float]] = {}
    for c, v in values.items():
        by.setdefault(float(attrs[c][knob]), []).append(v)
    return {lv: statistics.fmean(vs) for lv, vs in sorted(by.items())}


def lr_optimum(values: Mapping[str, float], attrs: Mapping[str, Mapping[str, Any]]) -> float | None:
    """log10 of the LR scale at the vertex of a parabola through the LR levels' mean values (three
    levels or more); None when the parabola opens downwards (no interior optimum to place)."""
    import numpy as np

    lv = level_means(values, attrs, "lr")
    if len(lv) < 3:
        return None
    x = np.log10(list(lv))
    a, b, _ = np.polyfit(x, list(lv.values()), 2)
    if a <= 0:
        return None
    return float(-b / (2 * a))


def noise(rows: Iterable[Mapping[str, Any]]) -> dict[float, float]:
    """fraction -> the pooled within-config sd of val_bpb (configs with 2 ok runs or more)."""
    by: dict[tuple[float, str], list[float]] = {}
    for r in rows:
        if usable(r):
            by.setdefault((round(float(r["fraction"]), 4), r["config"]), []).append(float(r["val_bpb"]))
    ss: dict[float, list[float]] = {}
    for (f, _), v in by.items():
        if len(v) >= 2:
            ss.setdefault(f, [0.0, 0.0])
            mu = statistics.fmean(v)
            ss[f][0] += sum((x - mu) ** 2 for x in v)
            ss[f][1] += len(v) - 1
    return {f: math.sqrt(s / d) for f, (s, d) in sorted(ss.items()) if d > 0}


def spread(values: Mapping[str, float]) -> float:
    """The configs' spread, as the family measures it: median value minus the best."""
    return statistics.median(values.values()) - min(values.values())


def costs(rows: Iterable[Mapping[str, Any]]) -> dict[float, dict[str, float]]:
    """fraction -> mean wall seconds, mean training seconds, and the wall relative to full runs."""
    by: dict[float, list[Mapping[str, Any]]] = {}
    for r in rows:
        if usable(r):
            by.setdefault(round(float(r["fraction"]), 4), []).append(r)
    out = {
        f: {
            "wall": statistics.fmean(float(r["wall"]) for r in rs),
            "training": statistics.fmean(float(r.get("training_seconds") or 0.0) for r in rs),
            "runs": len(rs),
        }
        for f, rs in sorted(by.items())
    }
    if out:
        full = out[max(out)]["wall"]
        for f in out:
            out[f]["relative"] = out[f]["wall"] / full
    return out


def wall_fit(c: Mapping[float, Mapping[str, float]]) -> tuple[float, float] | None:
    """(fixed seconds, wall seconds per training second): the least-squares line through the
    budgets' mean wall against their mean training seconds (two budgets or more)."""
    if len(c) < 2:
        return None
    xs = [v["training"] for v in c.values()]
    ys = [v["wall"] for v in c.values()]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


def fidelity_fit(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The `Fidelity` parameters of bench/search_family.py that the measurements give.

    - lr_shift: the LR optimum's move, in the family's coded units (its LR knob spans 1e-4..1e-1,
      3 decades over 2 coded units: 1.5 decades a unit), per unit of (1 - b), averaged over the
      short budgets: (log10 opt(b) - log10 opt(1)) / 1.5 / (1 - b).
    - size_penalty: how much worse the larger model does short, relative to full, as a share of the
      configs' full-budget spread per doubling of compute per token (the family's WIDTH coded unit
      is one doubling of run time), per unit of (1 - b): ((d_b - d_1) / spread_1) / log2(flops
      ratio) / (1 - b), d = mean(deep) - mean(shallow). The flops ratio comes from the steps the
      two depths made in the full budget.
    - batch_penalty: the same for the total batch, per coded unit of the family's BATCH knob
      (2**14..2**19: 2.5 doublings a unit): ((g_b - g_1) / spread_1) / (doublings / 2.5) / (1 - b),
      g = mean(large batch) - mean(small batch).
    - noise_exp: the noise relative to the configs' spread at b against that at full, as b ** -x:
      x = -log((sd_b / spread_b) / (sd_1 / spread_1)) / log b, averaged over the short budgets.
      What ranks is noise against the differences, so the spread at each budget is its own.
    - overhead: from the wall time of a short run relative to a full one, r = (b + o) / (1 + o):
      o = (r - b) / (1 - r), averaged over the short budgets.
    """
    m = means(rows)
    if len(m) < 2:
        return {}
    attrs = attributes(rows)
    full = max(m)
    out: dict[str, Any] = {}
    shorts = [f for f in m if f != full]
    opt_full = lr_optimum(m[full], attrs)
    shifts = [
        (o - opt_full) / 1.5 / (1 - f)
        for f in shorts
        if opt_full is not None and (o := lr_optimum(m[f], attrs)) is not None
    ]
    if shifts:
        out["lr_shift"] = statistics.fmean(shifts)
    depths = sorted({attrs[c]["depth"] for c in m[full]})
    if len(depths) >= 2:
        lo, hi = depths[0], depths[-1]
        steps = {d: [float(r["steps"]) for r in rows if r.get("steps") and r["depth"] == d and round(float(r["fraction"]), 4) == full and usable(r)] for d in (lo, hi)}  # fmt: skip
        sp = spread(m[full])
        if steps[lo] and steps[hi] and sp > 0:
            doublings = math.log2(statistics.fmean(steps[lo]) / statistics.fmean(steps[hi]))
            d_full = _gap(m[full], attrs, "depth", lo, hi)
            pens = [(_gap(m[f], attrs, "depth", lo, hi) - d_full) / sp / doublings / (1 - f) for f in shorts]
            if doublings > 0 and pens:
                out["size_penalty"] = statistics.fmean(pens)
    batches = sorted({attrs[c]["batch"] for c in m[full]})
    if len(batches) >= 2 and spread(m[full]) > 0:
        lo, hi = batches[0], batches[-1]
        per_unit = (
            math.log2(hi / lo) / 2.5
        )  # the family's BATCH: 2**14..2**19, 5 doublings over 2 coded units
        b_full = _gap(m[full], attrs, "batch", lo, hi)
        pens = [
            (_gap(m[f], attrs, "batch", lo, hi) - b_full) / spread(m[full]) / per_unit / (1 - f)
            for f in shorts
        ]
        if pens:
            out["batch_penalty"] = statistics.fmean(pens)
    sd = noise(rows)
    if full in sd and spread(m[full]) > 0:
        rel_full = sd[full] / spread(m[full])
        exps = [
            -math.log((sd[f] / spread(m[f])) / rel_full) / math.log(f)
            for f in shorts
            if f in sd and spread(m[f]) > 0 and sd[f] > 0
        ]
        if exps:
            out["noise_exp"] = statistics.fmean(exps)
    c = costs(rows)
    overheads = [
        (c[f]["relative"] - f) / (1 - c[f]["relative"]) for f in shorts if f in c and c[f]["relative"] < 1
    ]
    if overheads:
        out["overhead"] = statistics.fmean(overheads)
    return out


def _gap(
    values: Mapping[str, float], attrs: Mapping[str, Mapping[str, Any]], knob: str, lo: float, hi: float
) -> float:
    """Mean value at the knob's high level minus at its low level."""
    lv = level_means(values, attrs, knob)
    return lv[float(hi)] - lv[float(lo)]


def attributes(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["config"]: {"lr": r["lr"], "depth": r["depth"], "batch": r["batch"]} for r in rows}


def analyse(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every figure of the report, from the results file's rows."""
    m = means(rows)
    attrs = attributes(rows)
    sd = noise(rows)
    ok = [r for r in rows if usable(r)]
    return {
        "runs": len(rows),
        "ok": len(ok),
        "failed": [r["key"] for r in rows if r.get("val_bpb") is None],
        "degraded": [r["key"] for r in rows if r.get("val_bpb") is not None and r.get("degraded")],
        "means": {f"{f:g}": v for f, v in m.items()},
        "correlations": correlations(m),
        "bias": {k: {f"{f:g}": v for f, v in by.items()} for k, by in rank_shifts(m, attrs).items()}
        if len(m) >= 2
        else {},
        "lr_optimum_log10": {f"{f:g}": lr_optimum(v, attrs) for f, v in m.items()},
        "knob_means": {
            f"{f:g}": {k: level_means(v, attrs, k) for k in ("lr", "depth", "batch")} for f, v in m.items()
        },
        "noise_sd": {f"{f:g}": s for f, s in sd.items()},
        "spread": {f"{f:g}": spread(v) for f, v in m.items() if v},
        "costs": {f"{f:g}": v for f, v in costs(rows).items()},
        "wall_fit": wall_fit(costs(rows)),
        "load": [
            min((r["load_start"] for r in rows), default=None),
            max((r["load_end"] for r in rows), default=None),
        ],
        "fidelity": fidelity_fit(rows),
    }


def print_report(a: Mapping[str, Any]) -> None:
    print(
        f"runs: {a['runs']} ({a['ok']} counted; failed: {', '.join(a['failed']) or 'none'}; degraded: "
        f"{', '.join(a['degraded']) or 'none'}); load {a['load']}"
    )
    if not a["ok"]:
        print(
            "nothing to report: every run failed or was degraded (--count-degraded shows what the starved runs say)"
        )
        return
    print("\nrank transfer (Spearman rho of the configs' mean val_bpb, 95 % Fisher interval):")
    for c in a["correlations"]:
        iv = f"[{c['interval'][0]:+.2f}, {c['interval'][1]:+.2f}]" if c["interval"] else "n/a"
        rho = f"{c['rho']:+.2f}" if c["rho"] is not None else "n/a"
        print(
            f"  {c['short']:.3g} -> {c['long']:.3g}: rho {rho} {iv} over {c['n']} configs"
            + (f"  ({c['warning']})" if c["warning"] else "")
        )
    print("\nmean val_bpb per config (rank) by budget fraction:")
    fr = list(a["means"])
    configs = sorted(a["means"][fr[-1]], key=a["means"][fr[-1]].get) if fr else []
    print("  " + f"{'config':<18}" + "".join(f"{f:>16}" for f in fr))
    rk = {f: ranks(a["means"][f]) for f in fr}
    for c in configs:
        cells = "".join(
            f"{a['means'][f][c]:>11.4f} ({rk[f][c]:>2.0f})" if c in a["means"][f] else f"{'-':>16}"
            for f in fr
        )
        print(f"  {c:<18}{cells}")
    if a["bias"]:
        print("\nshort-horizon bias: mean rank shift against the full budget (negative: ranked better short)")
        for f, by in a["bias"]["levels"].items():
            print(
                f"  at {f}: "
                + "; ".join(
                    f"{k} " + ", ".join(f"{lv}: {s:+.1f}" for lv, s in v.items()) for k, v in by.items()
                )
            )
    print(
        "\nLR optimum (log10 of the LR scale, parabola through the LR levels): "
        + ", ".join(
            f"{f}: {v:+.2f}" if v is not None else f"{f}: none" for f, v in a["lr_optimum_log10"].items()
        )
    )
    print("knob level means: ")
    for f, by in a["knob_means"].items():
        print(
            f"  at {f}: "
            + "; ".join(
                f"{k} " + ", ".join(f"{lv:g}: {v:.4f}" for lv, v in vs.items()) for k, vs in by.items()
            )
        )
    print(
        "noise sd (pooled within config) / spread (median - best): "
        + ", ".join(
            f"{f}: {a['noise_sd'].get(f, float('nan')):.4f} / {a['spread'][f]:.4f}" for f in a["spread"]
        )
    )
    print(
        "cost: "
        + ", ".join(
            f"{f}: wall {c['wall']:.1f} s (training {c['training']:.1f} s, {100 * c.get('relative', 1):.0f} % of a full run)"
            for f, c in a["costs"].items()
        )
    )
    if a["wall_fit"]:
        print(
            f"wall = {a['wall_fit'][0]:.1f} s fixed (start-up, warm-up, export, scoring) + {a['wall_fit'][1]:.2f} x training seconds"
        )
    if a["fidelity"]:
        print("\nsearch_family --fidelity " + ",".join(f"{k}={v:.3g}" for k, v in a["fidelity"].items()))  # fmt: skip


def _floats(text: str) -> list[float]:
    return [float(Fraction(x)) for x in text.split(",") if x]  # "1/3" allowed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", type=Path, required=True, help="JSONL file: appended to, and read to resume"
    )
    parser.add_argument(
        "--configs",
        default="",
        help="N (the first N of the grid) or names, comma-separated (default: all 12)",
    )
    parser.add_argument(
        "--budgets", default="0.1,1/3,1", help="fractions of the profile's budget (default 0.1,1/3,1)"
    )
    parser.add_argument("--seeds", default="0,1,2", help="NIGHTLAB_SEED values (default 0,1,2)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (default 2)")
    parser.add_argument(
        "--threads", type=int, default=1, help="threads per run (a CPU slot's `threads`; default 1)"
    )
    parser.add_argument(
        "--work", type=Path, help="folder for the lab and the runs (default: a temporary one)"
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=1,
        help="runs again of a failed or degraded run (default 1, as the fleet)",
    )
    parser.add_argument("--report", action="store_true", help="only report on what --results holds")
    parser.add_argument(
        "--count-degraded",
        action="store_true",
        help="count starved (degraded) runs in the report too: figures of an overloaded box, label them so",
    )
    parser.add_argument("--json", dest="as_json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()

    if not args.report:
        if args.configs.isdigit():
            configs = GRID[: int(args.configs)]
        elif args.configs:
            names = {c.name: c for c in GRID}
            unknown = [n for n in args.configs.split(",") if n not in names]
            if unknown:
                sys.exit(f"unknown config `{unknown[0]}`; known: {', '.join(names)}")
            configs = [names[n] for n in args.configs.split(",")]
        else:
            configs = GRID
        fractions = _floats(args.budgets)
        if not fractions or not all(0 < f <= 1 for f in fractions):
            sys.exit(f"--budgets `{args.budgets}`: give fractions in (0, 1], e.g. 0.1,1/3,1")
        seeds = [int(s) for s in args.seeds.split(",") if s]
        run_grid(plan(configs, fractions, seeds), results=args.results, parallel=args.parallel, threads=args.threads, work=args.work, retries=args.retries)  # fmt: skip
    rows = read_rows(args.results)
    if args.count_degraded:  # what the starved runs say: never what the fleet would judge on
        rows = [{**r, "degraded": False} for r in rows]
    report = analyse(rows)
    if args.as_json:
        print(json.dumps(report))
    else:
        print_report(report)


if __name__ == "__main__":
    main()
