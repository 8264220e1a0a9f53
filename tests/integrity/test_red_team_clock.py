"""Red team, clock and data classes (issue 30): edits of train.py that try to buy training time or data.

Each attack is run as the fleet runs it (the real supervisor, sandboxed when bwrap works here) and
passes only when the run is `invalid` with the reason naming what was caught, or got no more time
or data than an honest run: the supervisor's own figures (`training_seconds`, the batches it served,
the hand-in delay) show it. Most attacks run on a 2 s budget (`redteam.TIMED`: no step limit, a
2 s rung, the hand-in grace set to 12 s; an attack that trains past the budget trains 20 s). Before issue 30 the first three were recorded `ok` and better
than honest (the clock ran inside train.py).
Run: .venv/bin/python -m pytest -q tests/integrity/test_red_team_clock.py
"""

from __future__ import annotations

from redteam import BUDGET, OVERTIME, SANDBOXED, TIMED, edit, needs_sandbox, template

BATCHES = "batches = training_batches(profile, DEVICE_BATCH_SIZE, accel.device, seed=seed)"
HAND_IN = "score = hand_in(model, batches).score"
AFTER_LOOP = "clock = batches.figures()"
IN_LOOP = "        x, y = batch\n"
# one training step on (x, y), as the template's loop makes it (grad_accum is 1 in the tiny profile)
STEP = (
    "    with accel.autocast():\n"
    "        loss = train_model(x, y)\n"
    "    loss.backward()\n"
    "    for opt in optimizers:\n"
    "        opt.step()\n"
    "    model.zero_grad(set_to_none=True)\n"
)


def indent(text: str, n: int) -> str:
    return "".join(" " * n + line + "\n" for line in text.splitlines())


def no_more_time(run) -> None:
    """Ok, but timed by the supervisor's clock: no more training time than the budget (plus one tiny step)."""
    assert run.outcome == "ok", (run.outcome, run.detail, run.log[-2000:])
    assert run.metrics["training_seconds"] < BUDGET + 1.0, run.metrics
    assert run.metrics["handin_delay_seconds"] <= run.metrics["handin_grace_seconds"]


def test_slowing_the_time_source_buys_no_time(attack, honest):
    """Protection: the clock is the supervisor's `time.monotonic`; train.py's time functions are its own.

    Was `ok` at 2.255 vs honest 2.485 (cpu profile): the in-process clock served 2.5x the budget.
    """
    slow = (
        "import time as _time, nightlab.harness.serve as _serve, nightlab.harness.clock as _clock\n"
        "def _slowed(real, t0=[None]):\n"
        "    def now():\n"
        "        t0[0] = t0[0] if t0[0] is not None else real()\n"
        "        return t0[0] + 0.4 * (real() - t0[0])\n"
        "    return now\n"
        "_time.perf_counter, _time.monotonic, _time.time = (\n"
        "    _slowed(_time.perf_counter), _slowed(_time.monotonic), _slowed(_time.time))\n" + BATCHES
    )
    run = attack(edit(template(), BATCHES, slow), env=TIMED)
    no_more_time(run)


def test_replacing_the_stop_rule_and_training_on_is_invalid(attack, honest):
    """Protection: the server stops serving; replaying its batches past the budget makes the hand-in late.

    (Before issue 30 this was caught only when the forged figure exceeded the wall allowance.)
    """
    replay = BATCHES + (
        "\nimport itertools\n"
        "from nightlab.harness.clock import TrainingClock\n"
        "_next, _cache, _until = TrainingClock.__next__, [], []\n"
        "def _forever(self):\n"
        "    try:\n"
        "        batch = _next(self)\n"
        "        _cache.append(batch)\n"
        "        return batch\n"
        "    except StopIteration:\n"
        "        if not _until:\n"
        f"            _until.append(time.time() + {OVERTIME})\n"
        "        if time.time() < _until[0]:\n"
        "            return _cache[int(time.time() * 1000) % len(_cache)]\n"
        "        raise\n"
        "TrainingClock.__next__ = _forever"
    )
    run = attack(edit(template(), BATCHES, replay), env=TIMED)
    assert run.outcome == "invalid", run.log[-2000:]
    assert "after the last batch was served" in run.detail and "allows 12 s" in run.detail


def test_a_second_clock_after_the_first_runs_out_serves_nothing(attack, honest):
    """Protection: every clock of a run is one served stream under one budget.

    Was `ok` at 2.245 vs honest 2.485: the second in-process clock started a new budget.
    """
    second = (
        "extra = 0\n"
        "batches2 = training_batches(profile, DEVICE_BATCH_SIZE, accel.device, seed=seed)\n"
        "for x, y in batches2:\n"
        "    extra += 1\n" + STEP + "open('extra.txt', 'w').write(str(extra))\n" + AFTER_LOOP
    )
    run = attack(edit(template(), AFTER_LOOP, second), env=TIMED)
    assert (run.work / "extra.txt").read_text() == "0", run.log[-2000:]
    no_more_time(run)


def test_training_on_cached_batches_past_the_budget_then_handing_in_late_is_invalid(attack, honest):
    """Protection: the hand-in deadline (grace after the last batch served), named with both times."""
    cache = edit(template(), IN_LOOP, IN_LOOP + "        _cached.append(batch)\n")
    cache = edit(cache, BATCHES, "_cached = []\n" + BATCHES)
    late = (
        "import itertools\n"
        f"_end = time.time() + {OVERTIME}\n"
        "for x, y in itertools.cycle(_cached):\n"
        "    if time.time() > _end:\n"
        "        break\n" + STEP + AFTER_LOOP
    )
    run = attack(edit(cache, AFTER_LOOP, late), env=TIMED)
    assert run.outcome == "invalid", run.log[-2000:]
    assert "the model was handed in at" in run.detail and "after the last batch was served at" in run.detail


def test_a_warm_up_that_trains_gets_one_batch_again_and_again(attack, honest):
    """Protection: every warm-up batch is the same batch; the cap stays (a quarter of the budget here).

    The edit makes its first steps long by training on many batches before its first `step()`.
    """
    greedy = BATCHES + (
        "\nimport hashlib\n"
        "_warm = []\n"
        "for _ in range(60):\n"
        "    x, y = next(batches)\n"
        "    if batches._timed >= 0:  # the server says the warm-up is over\n"
        "        break\n"
        "    _warm.append(hashlib.sha256(x.numpy().tobytes()).hexdigest())\n"
        + STEP.replace("train_model", "model")
        + "open('warm.txt', 'w').write(' '.join(_warm))"
    )
    run = attack(edit(template(), BATCHES, greedy), env=TIMED)
    warm = (run.work / "warm.txt").read_text().split()
    assert len(warm) >= 2 and len(set(warm)) == 1, run.log[-2000:]
    no_more_time(run)
    assert run.metrics["warmup_seconds"] <= BUDGET / 4 + 1e-6


def test_rewriting_the_handoff_after_the_hand_in_is_invalid(attack, honest):
    """Protection: the supervisor copies the hand-in at once; a later change of the folder is named."""
    more = HAND_IN + "\n    for _ in range(3):\n" + indent(STEP, 4) + "    hand_in(model, batches)"
    run = attack(edit(template(), HAND_IN, more), env=TIMED)
    assert run.outcome == "invalid", run.log[-2000:]
    assert "rewritten after it was handed in" in run.detail


def test_announcing_the_hand_in_before_the_model_exists_is_invalid(attack, honest):
    """Protection: the hand-in is what the folder holds when train.py says so, nothing later."""
    early = "batches.hand_in()  # the deadline is met ... the model follows later\n    " + HAND_IN
    run = attack(edit(template(), HAND_IN, early), env=TIMED)
    assert run.outcome == "invalid", run.log[-2000:]
    assert "could not be taken at hand-in" in run.detail


@needs_sandbox
def test_reading_the_training_token_files_directly_gets_nothing(attack, honest):
    """Protection: the sandbox binds /dev/null over train.* too; the supervisor alone reads them."""
    steal = BATCHES + (
        "\nstolen = 0\n"
        "for name in ('train.tokens.bin', 'train.offsets.bin'):\n"
        "    try:\n"
        "        stolen += len((data / name).read_bytes())\n"
        "    except OSError:\n"
        "        pass\n"
        "open('stolen.txt', 'w').write(str(stolen))"
    )
    run = attack(edit(template(), BATCHES, steal))
    assert (run.work / "stolen.txt").read_text() == "0", run.log[-2000:]
    assert run.outcome == "ok" and run.val_bpb == honest.val_bpb


def test_a_batch_server_of_its_own_is_never_ok(attack, honest):
    """Protection: only a hand-in the supervisor's server heard counts; sandboxed, its own server has no data.

    The edit drops the supervisor's socket so that `training_batches` starts the by-hand server, on a
    clock of the run's own (no budget it cannot stretch).
    """
    own = "os.environ.pop('NIGHTLAB_BATCH_FD', None); os.environ['NIGHTLAB_BUDGET'] = '4'\n" + BATCHES
    run = attack(edit(template(), BATCHES, own), env=TIMED)
    assert run.outcome != "ok", run.log[-2000:]
    if SANDBOXED:
        assert run.outcome.startswith("crash") and "train.tokens.bin" in (run.detail or run.log), run.log[
            -2000:
        ]
    else:
        assert run.outcome == "invalid" and "never handed it in" in run.detail


@needs_sandbox
def test_ptrace_of_the_supervisor_finds_nothing_to_attach_to(attack, honest):
    """Protection: the sandbox's own PID namespace (`--unshare-pid`, a fresh /proc): the supervisor, whose
    clock and hand-in copy a debugger could rewrite, is not there to find, attach to or write into.

    Unsandboxed (root, no Yama here) the same edit finds and attaches to it: docs/integrity.md says so.
    """
    trace = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "seen, attached, writable = 0, 0, 0\n"
        "for pid in (p for p in os.listdir('/proc') if p.isdigit()):\n"
        "    try:\n"
        "        cmdline = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
        "    except OSError:\n"
        "        continue\n"
        "    if b'nightlab.harness.attempt' in cmdline:\n"
        "        seen += 1\n"
        "        if libc.ptrace(16, int(pid), None, None) == 0:  # PTRACE_ATTACH\n"
        "            attached += 1\n"
        "            libc.ptrace(17, int(pid), None, None)  # PTRACE_DETACH\n"
        "        try:\n"
        "            open(f'/proc/{pid}/mem', 'r+b').close()\n"
        "            writable += 1\n"
        "        except OSError:\n"
        "            pass\n"
        "open('traced.txt', 'w').write(f'{seen} {attached} {writable}')\n" + BATCHES
    )
    run = attack(edit(template(), BATCHES, trace), env=TIMED)
    assert (run.work / "traced.txt").read_text() == "0 0 0", run.log[-2000:]
    no_more_time(run)
