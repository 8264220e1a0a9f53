"""The attempt supervisor: runs a built-in-target train.py, then scores what it handed in.

The fleet runs every built-in-target attempt as

    python -P -m nightlab.harness.attempt --run-dir RUN --lab LAB -- <target command>

in the snapshot's folder (`RUN/work`). The supervisor:

1. starts the command in the sandbox (`sandbox.py`; unsandboxed where bwrap cannot start), in its
   own session, with `NIGHTLAB_HANDOFF_DIR=RUN/handoff`, and times it with its own clock; when the
   command exits, every process it started is ended (this process is their subreaper), and its
   first process dies with this one (`nightlab/procs.py`);
2. when it exits 0, checks its wall time against the run's budget plus `wall_allowance(budget)`
   (start-up, the capped warm-up, export), the clock's figures against the run's budget, the
   harness's own files (`integrity.py`), and that a model was handed in;
3. scores the handed-in program (`scorer.score`), in this process, which imports none of the
   lab's Python, with the validation data the sandbox hid;
4. writes `RUN/score.json` (outside every folder the run can write) and exits with the command's
   exit code. The controller takes the harness-owned keys from that file only (`owned.py`).

The lab's profile comes from `LAB/nightlab.toml`, never from the snapshot's copy, which the
experiment could have edited. The run's budget is the profile's, or its tier's own when the
controller gives one (`NIGHTLAB_TIER_BUDGET`, a screening rung: `nightlab.rungs`); train.py's
clock gets it as `NIGHTLAB_BUDGET` from this process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = [
    "HARNESS_DIGESTS_ENV",
    "ISOLATED",
    "SCORE_FILE",
    "exit_now",
    "supervise",
    "wall_allowance",
    "wrap_command",
]

# How harness processes start Python so that no file of the lab can shadow a module: `-P` keeps the
# working directory (the snapshot) off sys.path and still honours PYTHONPATH, which comes from the
# user's environment, never from the run.
ISOLATED = ("-P",)

SCORE_FILE = "score.json"
HANDOFF_FOLDER = "handoff"
HARNESS_DIGESTS_ENV = "NIGHTLAB_HARNESS_DIGESTS"  # path of the controller's digests file
MIGRATE_HINT = (
    "this lab's train.py predates harness scoring: replace its evaluation section with "
    "`hand_in(model, batches)` as in the current template (`nightlab init --profile cpu` in an empty "
    "folder shows it; docs/integrity.md#migrating), or set `[target] builtin = false` to keep "
    "self-reported results"
)


def tier_budget(profile_budget: float) -> float:
    """The training budget of this attempt: `NIGHTLAB_TIER_BUDGET` (the controller's, for a tier
    with its own `budget_seconds`, `nightlab.rungs`), else the profile's.

    The supervisor reads it from its own environment, which train.py cannot change; the clock,
    the wall limit and the clock check below all use it. A value that is not a positive number
    at most the profile's budget is refused: a rung screens shorter, never longer.

    Raises:
        UsageError: naming the bad value.
    """
    from nightlab.errors import UsageError
    from nightlab.rungs import BUDGET_ENV

    raw = os.environ.get(BUDGET_ENV)
    if raw is None or raw == "":
        return float(profile_budget)
    try:
        budget = float(raw)
    except ValueError:
        budget = float("nan")
    if not 0 < budget <= profile_budget:
        raise UsageError(
            f"{BUDGET_ENV}={raw!r} must be a number of seconds in (0, {profile_budget:g}] (the profile's "
            "budget); fix the tier's `budget_seconds` in nightlab.toml"
        )
    return budget


def wall_allowance(budget: float) -> float:
    """Seconds a run may take beyond its budget: start-up, the capped warm-up, export.

    60 s + half the budget: the cpu profile (30 s) gets 75 s (an honest run on the loaded 2-core
    dev box takes 15-35 s beyond the budget); h100 (300 s) gets 210 s (compile ~50 s, export
    a few s). Past it a run is `invalid`: it trained, or worked, outside the harness's clock.
    `NIGHTLAB_WALL_ALLOWANCE` (seconds) replaces it, for tests; the supervisor reads it from its own
    environment, which the training process cannot change.
    """
    override = os.environ.get("NIGHTLAB_WALL_ALLOWANCE")
    return float(override) if override else 60.0 + 0.5 * budget


def wrap_command(command: str, *, run_dir: Path, lab_dir: Path, python: str | None = None) -> str:
    """The shell line the fleet runs instead of a built-in target's command."""
    import shlex

    exe = python or sys.executable
    return (
        f"{shlex.quote(exe)} {' '.join(ISOLATED)} -m nightlab.harness.attempt --run-dir {shlex.quote(str(run_dir))} "
        f"--lab {shlex.quote(str(lab_dir))} -- {shlex.quote(command)}"
    )


def record_digests(lab_dir: Path) -> Path:
    """Write the harness's expected file digests for this lab's supervisors; returns the file.

    Called once by the fleet controller when it starts (`integrity.expected_digests`).
    """
    from nightlab.harness import integrity

    path = Path(lab_dir) / ".nightlab" / "harness-digests.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(integrity.dumps(integrity.expected_digests()))
    os.replace(tmp, path)
    return path


def _preload() -> None:
    """Import what scoring needs while train.py runs (measured on the 2-core box, cpu profile).

    `import torch` is 1.2-1.5 s; `torch.export.load`'s first call is 1.9 s, of which 1.3-1.6 s
    is importing its deserializer (`torch._export.serde.serialize`, sympy), after which a load
    takes 0.26 s. Both would otherwise come after the run, on every run.
    """
    try:
        import torch  # noqa: F401
        import torch._export.serde.serialize  # noqa: F401

        import nightlab.harness.scorer  # noqa: F401
    except ImportError:  # the scorer reports it, with its context, when it runs
        pass


def exit_now(code: int) -> None:
    """Leave at once: flush and `os._exit`, skipping the interpreter's teardown.

    With torch loaded, Python's finalisation took 0.78 s after the last line of `main` (measured,
    2-core box): time every run would wait for. Everything the process writes is complete by
    then (`write_json` renames a closed file), so there is nothing left for the teardown to do.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def supervise(command: str, *, run_dir: Path, lab_dir: Path, digests: dict[str, str] | None) -> int:
    """Run, check and score one attempt (see the module docstring). Returns the command's exit code."""
    from nightlab import procs
    from nightlab.harness import integrity, sandbox
    from nightlab.harness.clock import WARMUP_FRACTION_CAP, WARMUP_SECONDS_CAP
    from nightlab.harness.handoff import HANDOFF_ENV, HANDOFF_META, MODEL_FILE
    from nightlab.harness.profiles import data_dir, data_root, load_lab_profile
    from nightlab.harness.scorer import UnscorableModelError, score, write_json
    from nightlab.harness.sources import source_paths

    run_dir = run_dir.resolve()
    lab_dir = lab_dir.resolve()
    out = run_dir / SCORE_FILE
    out.unlink(missing_ok=True)
    handoff = run_dir / HANDOFF_FOLDER
    if handoff.exists():
        import shutil

        shutil.rmtree(handoff)
    handoff.mkdir(parents=True)
    profile = load_lab_profile(lab_dir)
    budget = tier_budget(profile.budget_seconds)
    # the digests the files must keep: the controller's, else this process's view before the run
    expected = digests if digests is not None else integrity.expected_digests()
    plan = sandbox.SandboxPlan(
        data_dir=data_dir(profile),
        data_root=data_root(),
        lab_dir=lab_dir,
        writable=(Path.cwd().resolve(), handoff),
        caches=sandbox.default_caches(),
        hidden=source_paths(profile.dataset),
    )
    argv, mode = sandbox.wrap(["/bin/sh", "-c", command], plan=plan)
    env = {k: v for k, v in os.environ.items() if k != HARNESS_DIGESTS_ENV}
    env[HANDOFF_ENV] = str(handoff)
    env["NIGHTLAB_BUDGET"] = repr(budget)  # the clock's input: the tier's budget (a screening rung's)
    result: dict[str, Any] = {"sandbox": mode, "budget_seconds": budget}
    if mode == "none":
        result["unsandboxed"] = sandbox.available()
        print(f"nightlab harness: running unsandboxed ({sandbox.available()})", file=sys.stderr, flush=True)

    # As the subreaper of everything train.py starts, this process keeps even a daemon that
    # double-forked into a session of its own in its tree (the sweep below finds it); the parent-death
    # signal ends train.py's first process when this one is killed (the fleet's kill sweeps the rest
    # by the attempt's environment mark: nightlab/procs.py).
    procs.become_subreaper()
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=procs.die_with_parent())
    # import the scorer's torch while train.py starts up (imports, data, model): the 2-5 s it costs
    # here would otherwise come after the run, on every run
    threading.Thread(target=_preload, daemon=True).start()
    try:
        code = proc.wait()
    finally:
        # whatever it left running must not outlive it, nor rewrite the hand-in while it is scored
        procs.end_run(os.getpid(), None)
    wall = time.monotonic() - start
    limit = budget + wall_allowance(budget)
    result.update(train_wall_seconds=round(wall, 3), wall_limit_seconds=round(limit, 3))
    train_py = Path.cwd() / "train.py"
    old = train_py.exists() and "hand_in" not in train_py.read_text(errors="replace")
    if code != 0:
        if old:  # e.g. its own evaluate() found the validation split hidden
            result["hint"] = MIGRATE_HINT
            print(f"nightlab harness: {MIGRATE_HINT}", file=sys.stderr, flush=True)
        write_json(out, {**result, "status": "not-scored", "exit_code": code})
        return code

    def invalid(reason: str) -> int:
        write_json(out, {**result, "status": "invalid", "invalid_reason": reason})
        print(f"nightlab harness: the run is invalid: {reason}", file=sys.stderr, flush=True)
        return 0

    if wall > limit:
        return invalid(
            f"the training process ran {wall:.1f} s, more than the budget {budget:g} s + allowance "
            f"{wall_allowance(budget):g} s = {limit:g} s"
        )
    if not (handoff / MODEL_FILE).exists() or not (handoff / HANDOFF_META).exists():
        return invalid(MIGRATE_HINT if old else "train.py never handed its model to the harness (`hand_in`)")
    try:
        meta = json.loads((handoff / HANDOFF_META).read_text())
        clock = meta["clock"]
        trained, warmup = float(clock["training_seconds"]), float(clock["warmup_seconds"])
        clock_budget = float(clock["budget_seconds"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return invalid(f"the hand-in record `{HANDOFF_META}` is unreadable ({type(e).__name__})")
    if clock_budget != budget:
        return invalid(
            f"the run's clock had a budget of {clock_budget:g} s; its tier's budget is {budget:g} s"
        )
    if trained > wall or warmup > min(WARMUP_SECONDS_CAP, WARMUP_FRACTION_CAP * budget) + 1.0:
        return invalid(
            f"the clock's figures are impossible (training {trained:.1f} s, warm-up {warmup:.1f} s, "
            f"in a process that ran {wall:.1f} s): the clock was tampered with"
        )
    problem = integrity.verify(expected)
    if problem:
        return invalid(problem)
    seed = os.environ.get("NIGHTLAB_SEED")
    if seed is not None and str(meta.get("seed")) != seed:
        result["seed_warning"] = f"the run trained with seed {meta.get('seed')}, not NIGHTLAB_SEED={seed}"
    try:
        scored = score(handoff, lab_dir)
    except UnscorableModelError as e:
        return invalid(str(e))
    result.update(scored)
    write_json(out, result)
    shown = f"val_bpb {scored['val_bpb']:.6f}" if "val_bpb" in scored else "no val_bpb"
    print(f"nightlab harness: scored {shown}, status {scored['status']}, sandbox {mode}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (the fleet's wrapper line; see `wrap_command`)."""
    parser = argparse.ArgumentParser(
        prog="python -m nightlab.harness.attempt", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--run-dir", type=Path, required=True, help="the attempt's folder")
    parser.add_argument("--lab", type=Path, required=True, help="the lab (its nightlab.toml profile applies)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the target's shell command")
    args = parser.parse_args(argv)
    command = " ".join(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if not command:
        parser.error("give the target's command after `--`")
    digests = None
    path = os.environ.get(HARNESS_DIGESTS_ENV)
    if path:
        digests = json.loads(Path(path).read_text())
    from nightlab.errors import UsageError

    try:
        return supervise(command, run_dir=args.run_dir, lab_dir=args.lab, digests=digests)
    except UsageError as e:
        print(f"nightlab harness: error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    exit_now(main())
