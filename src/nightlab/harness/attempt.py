"""The attempt supervisor: runs a built-in-target train.py, serves its data, then scores what it handed in.

The fleet runs every built-in-target attempt as

    python -P -m nightlab.harness.attempt --run-dir RUN --lab LAB -- <target command>

in the snapshot's folder (`RUN/work`). The supervisor:

1. starts the command in the sandbox (`sandbox.py`; unsandboxed where bwrap cannot start), in its
   own session, with `NIGHTLAB_HANDOFF_DIR=RUN/handoff`, and times it with its own clock; when the
   command exits, every process it started is ended (this process is their subreaper), and its
   first process dies with this one (`nightlab/procs.py`);
2. serves the training batches itself (`serve.BatchServer`, on a thread, over a socket pair whose
   other end train.py inherits): it alone reads the training data, and its clock decides the
   warm-up (one batch, repeated), the budget, and when serving stops. When train.py says it handed
   its model in, the hand-in is copied to `RUN/handed-in/`, out of the run's reach, at once;
3. when the command exits 0, checks its wall time against the run's budget plus `wall_allowance(budget)`
   (start-up, the capped warm-up, the hand-in grace), that the model was handed in within
   `serve.grace_seconds(budget)` of the last batch served and not rewritten afterwards, and the
   harness's own files (`integrity.py`);
4. scores the copied hand-in (`scorer.score`), in this process, which imports none of the lab's
   Python, with the validation data the sandbox hid;
5. writes `RUN/score.json` (outside every folder the run can write) and exits with the command's
   exit code. The controller takes the harness-owned keys from that file only (`owned.py`); the
   timing keys are the server's.

The lab's profile comes from `LAB/nightlab.toml`, never from the snapshot's copy, which the
experiment could have edited. The run's budget is the profile's, or its tier's own when the
controller gives one (`NIGHTLAB_TIER_BUDGET`, a screening rung: `nightlab.rungs`); the batch
server's clock runs on it, whatever the run's own environment says.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightlab.atomic import atomic_write_text
from nightlab.harness.names import (
    HANDOFF_ENV,
    HANDOFF_FOLDER,
    HANDOFF_META,
    ISOLATED,
    MODEL_FILE,
    RECEIVED_FOLDER,
    SCORE_FILE,
    exit_now,
)

if TYPE_CHECKING:
    from nightlab.harness.profiles import Profile
    from nightlab.harness.serve import BatchServer

__all__ = [
    "HARNESS_DIGESTS_ENV",
    "supervise",
    "wall_allowance",
    "wrap_command",
]

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
    """Seconds a run may take beyond its budget: start-up, the capped warm-up, the hand-in grace.

    45 s + the warm-up cap + `serve.grace_seconds(budget)`: cpu (30 s budget) 63 s, h100 (300 s)
    120 s (it was 60 s + budget / 2: 75 s and 210 s). Start-up before the first batch (imports, data
    checks, model build) took ~10 s on the loaded 2-core box (red-team runs); on a GPU box (CUDA init) it is not
    measured yet (bench/gpu_check.sh's protected step records it). Compilation happens in the
    warm-up, after the first batch. The wall check is a backstop now: the
    server's clock and the hand-in deadline already bound what a run can train. Past it a run is
    `invalid`. `NIGHTLAB_WALL_ALLOWANCE` (seconds) replaces it, for tests; the supervisor reads it
    from its own environment, which the training process cannot change.
    """
    from nightlab.harness.serve import WARMUP_FRACTION_CAP, WARMUP_SECONDS_CAP, grace_seconds

    override = os.environ.get("NIGHTLAB_WALL_ALLOWANCE")
    if override:
        return float(override)
    return 45.0 + min(WARMUP_SECONDS_CAP, WARMUP_FRACTION_CAP * budget) + grace_seconds(budget)


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
    atomic_write_text(path, integrity.dumps(integrity.expected_digests()))
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


def _copy_regular(src: Path, dst: Path) -> str:
    """Copy a file the run wrote, refusing links and anything but a regular file (a FIFO would hang
    us); returns the SHA-256 of what was copied."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    digest = hashlib.sha256()
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"`{src.name}` is not a regular file")
        with open(fd, "rb", closefd=False) as f, open(dst, "wb") as out:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def _digest(path: Path) -> str | None:
    """SHA-256 of a regular file (links not followed), None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    digest = hashlib.sha256()
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with open(fd, "rb", closefd=False) as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def _fresh_folders(run_dir: Path) -> tuple[Path, Path, Path]:
    """Remove the last score and empty the hand-off and hand-in folders; returns (score, handoff, received)."""
    out = run_dir / SCORE_FILE
    out.unlink(missing_ok=True)
    handoff, received = run_dir / HANDOFF_FOLDER, run_dir / RECEIVED_FOLDER
    for folder in (handoff, received):
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
    return out, handoff, received


class _HandIn:
    """What was taken at the hand-in: each file's SHA-256, kept in this process's memory, and any
    file that could not be taken."""

    def __init__(self, handoff: Path, received: Path) -> None:
        self.handoff, self.received = handoff, received
        self.taken: dict[str, str] = {}
        self.problems: list[str] = []

    def take(self) -> None:
        """The moment train.py says it handed in: copy it out of its reach."""
        for name in (MODEL_FILE, HANDOFF_META):
            try:
                self.taken[name] = _copy_regular(self.handoff / name, self.received / name)
            except OSError as e:
                self.problems.append(f"`{name}` could not be taken at hand-in ({e.strerror or e})")

    def problem(self) -> str | None:
        """Why the hand-in cannot be scored (not taken, or changed since), None when it can."""
        if self.problems:
            return self.problems[0]
        for name in (MODEL_FILE, HANDOFF_META):
            # the run's folder (a later write) and the copy (unsandboxed, the run can reach it too)
            if not _digest(self.handoff / name) == _digest(self.received / name) == self.taken[name]:
                return f"the hand-in was rewritten after it was handed in (`{name}` changed)"
        return None


def _run_train(
    argv: list[str],
    env: dict[str, str],
    mine: socket.socket,
    theirs: socket.socket,
    serving: threading.Thread,
) -> tuple[int, float]:
    """Run the wrapped command to its end, then end all it started and stop the batch server;
    returns (exit code, wall seconds)."""
    from nightlab import procs

    # As the subreaper of everything train.py starts, this process keeps even a daemon that
    # double-forked into a session of its own in its tree (the sweep below finds it); the parent-death
    # signal ends train.py's first process when this one is killed (the fleet's kill sweeps the rest
    # by the attempt's environment mark: nightlab/procs.py).
    procs.become_subreaper()
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, env=env, start_new_session=True, preexec_fn=procs.die_with_parent(), pass_fds=(theirs.fileno(),)
    )
    theirs.close()
    # import the scorer's torch while train.py starts up (imports, data, model): the 2-5 s it costs
    # here would otherwise come after the run, on every run
    threading.Thread(target=_preload, daemon=True).start()
    try:
        code = proc.wait()
    finally:
        # whatever it left running must not outlive it, nor rewrite the hand-in while it is scored
        procs.end_run(os.getpid(), None)
        try:
            mine.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        serving.join(timeout=10)
        mine.close()
    return code, time.monotonic() - start


def _timing_problem(
    result: dict[str, Any],
    server: BatchServer,
    *,
    wall: float,
    budget: float,
    grace: float,
    figures: dict[str, Any],
    handoff: Path,
    old: bool,
) -> str | None:
    """Why a run that exited 0 is invalid by the clock or the protocol, None when it is not; records
    the hand-in delay in `result` once there is one."""
    limit = budget + wall_allowance(budget)
    if wall > limit:
        return (
            f"the training process ran {wall:.1f} s, more than the budget {budget:g} s + allowance "
            f"{wall_allowance(budget):g} s = {limit:g} s"
        )
    if server.error:
        return f"train.py broke the batch server's protocol ({server.error})"
    if server.clock.handed_in is None:
        if (handoff / MODEL_FILE).exists() and not old:
            return "train.py wrote a model but never handed it in (call `hand_in(model, batches)`)"
        return MIGRATE_HINT if old else "train.py never handed its model to the harness (`hand_in`)"
    last = figures["last_served_at"] if figures["last_served_at"] is not None else 0.0
    delay = figures["handed_in_at"] - last
    result.update(handin_delay_seconds=round(delay, 3), handin_grace_seconds=round(grace, 3))
    if delay > grace:
        return (
            f"the model was handed in at {figures['handed_in_at']:.1f} s, {delay:.1f} s after the last batch "
            f"was served at {last:.1f} s; the harness allows {grace:g} s for the last step, export and save: "
            "it trained past the budget"
        )
    return None


def _wrap(command: str, profile: Profile, *, lab_dir: Path, handoff: Path) -> tuple[list[str], str]:
    """The command wrapped in the sandbox, and the sandbox's mode ("none" where it cannot start)."""
    from nightlab.harness import sandbox
    from nightlab.harness.profiles import data_dir, data_root
    from nightlab.harness.sources import source_paths

    plan = sandbox.SandboxPlan(
        data_dir=data_dir(profile),
        data_root=data_root(),
        lab_dir=lab_dir,
        writable=(Path.cwd().resolve(), handoff),
        caches=sandbox.default_caches(),
        hidden=source_paths(profile.dataset),
    )
    return sandbox.wrap(["/bin/sh", "-c", command], plan=plan)


def supervise(command: str, *, run_dir: Path, lab_dir: Path, digests: dict[str, str] | None) -> int:
    """Run, serve, check and score one attempt (see the module docstring). Returns the command's exit code."""
    from nightlab.harness import integrity, sandbox, serve
    from nightlab.harness.profiles import data_dir, load_lab_profile
    from nightlab.harness.scorer import UnscorableModelError, score, write_json

    run_dir = run_dir.resolve()
    lab_dir = lab_dir.resolve()
    out, handoff, received = _fresh_folders(run_dir)
    profile = load_lab_profile(lab_dir)
    budget = tier_budget(profile.budget_seconds)
    grace = serve.grace_seconds(budget)
    # the digests the files must keep: the controller's, else this process's view before the run
    expected = digests if digests is not None else integrity.expected_digests()
    argv, mode = _wrap(command, profile, lab_dir=lab_dir, handoff=handoff)
    env = {k: v for k, v in os.environ.items() if k not in (HARNESS_DIGESTS_ENV, "NIGHTLAB_BUDGET")}
    env[HANDOFF_ENV] = str(handoff)
    result: dict[str, Any] = {"sandbox": mode, "budget_seconds": budget}
    if mode == "none":
        result["unsandboxed"] = sandbox.available()
        print(f"nightlab harness: running unsandboxed ({sandbox.available()})", file=sys.stderr, flush=True)

    # The batch server: train.py gets one end of a socket pair; the lab's profile (never the run's
    # environment) sets the budget. NIGHTLAB_MAX_STEPS makes runs step-based in tests; the fleet strips it.
    hand_in = _HandIn(handoff, received)
    mine, theirs = socket.socketpair()
    server = serve.BatchServer(
        mine,
        serve.ServerConfig(
            data_dir(profile), profile.seq_len, budget, int(os.environ.get("NIGHTLAB_MAX_STEPS", "0") or 0)
        ),
        on_handin=hand_in.take,
    )
    serving = threading.Thread(target=server.serve, name="nightlab-batch-server", daemon=True)
    serving.start()
    env[serve.FD_ENV] = str(theirs.fileno())

    code, wall = _run_train(argv, env, mine, theirs, serving)
    limit = budget + wall_allowance(budget)
    figures = server.figures()
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

    problem = _timing_problem(
        result, server, wall=wall, budget=budget, grace=grace, figures=figures, handoff=handoff, old=old
    )
    problem = problem or hand_in.problem() or integrity.verify(expected)
    if problem:
        return invalid(problem)
    seed = os.environ.get("NIGHTLAB_SEED")
    if seed is not None and str(server.seed) != seed:
        result["seed_warning"] = f"the run trained with seed {server.seed}, not NIGHTLAB_SEED={seed}"
    try:
        scored = score(received, lab_dir)
    except UnscorableModelError as e:
        return invalid(str(e))
    result.update(scored)
    # the timing keys are the server's, whatever the hand-in record says
    result.update({k: figures[k] for k in ("training_seconds", "warmup_seconds", "warmup_steps", "steps")})
    result.update(batches_served=figures["batches"], warmup_batches=figures["warmup_batches"])
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
