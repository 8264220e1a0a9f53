"""The resident runner and its helper on their own: one runner process, one helper, files in a tmp dir.

No SkyPilot here: the runner runs as a plain process (as its job would), and the controller's
`Channel` talks to a local helper. Each test names the failure it guards against.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit import wait_until
from nightlab.fleet.skypilot import resident
from nightlab.fleet.skypilot.channel import Channel, ChannelError, local_argv
from nightlab.fleet.skypilot.runner_job import SOURCE

EPOCH = "20261202000000-abc123"


@pytest.fixture
def node(tmp_path):
    """A runner process with HOME in tmp_path, and a channel to a helper beside it."""
    home = tmp_path / "home"
    home.mkdir()
    base = home / ".nightlab" / "resident"
    env = {**os.environ, "HOME": str(home)}
    runner = subprocess.Popen(
        [sys.executable, "-u", "-c", SOURCE, "runner", str(base), EPOCH, "600"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    first = runner.stdout.readline()
    assert first.startswith(resident.PREFIX)
    info = json.loads(first[len(resident.PREFIX) :])
    channel = Channel(local_argv(info, str(base)), SOURCE)
    yield channel, Path(info["dir"]), runner
    channel.close()
    try:
        os.killpg(runner.pid, 9)
    except ProcessLookupError:
        pass
    runner.wait()


def put(channel: Channel, name: str, command: str) -> dict:
    return channel.ask("put", epoch=EPOCH, name=name, request={"script": command, "env": {"X_RUN": name}})


def state(channel: Channel, name: str) -> dict:
    return channel.ask("poll", epoch=EPOCH, runs=[{"name": name, "offset": 0}])["runs"][name]


def wait_state(channel: Channel, name: str, want: str, timeout: float = 20) -> dict:
    return wait_until(lambda: (s := state(channel, name))["state"] == want and s, timeout=timeout)


def test_runs_go_one_at_a_time_in_the_order_they_were_put(node):
    channel, epoch_dir, _ = node
    for name in ("r1", "r2", "r3"):
        put(channel, name, f"echo start-{name} $(date +%s.%N); sleep 0.3; echo end-{name} $(date +%s.%N)")
    spans = []
    for name in ("r1", "r2", "r3"):
        done = wait_state(channel, name, "done")
        assert done["status"]["exit"] == 0
        text = base64.b64decode(done["log"]).decode()
        words = text.split()
        spans.append((float(words[1]), float(words[3])))
    assert spans == sorted(spans)
    assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:], strict=False))  # never two at once


def test_a_put_repeated_after_a_lost_answer_does_not_run_twice(node):
    # the controller retries a put whose answer it never got: the run must stay one run
    channel, epoch_dir, _ = node
    put(channel, "once", 'echo ran >> "$HOME/count"')
    wait_state(channel, "once", "done")
    again = put(channel, "once", 'echo ran >> "$HOME/count"')
    assert again["state"] == "done"
    time.sleep(0.5)
    assert (epoch_dir.parents[2] / "count").read_text() == "ran\n"


def test_a_tombed_queued_run_never_starts(node):
    channel, _, _ = node
    put(channel, "long", "sleep 30")
    wait_state(channel, "long", "running")
    put(channel, "queued", "echo should-not-run")
    assert channel.ask("tomb", epoch=EPOCH, name="queued")["state"] == "dropped"
    channel.ask("tomb", epoch=EPOCH, name="long")
    done = wait_state(channel, "long", "done")
    assert done["status"]["killed"] is True
    later = wait_state(channel, "queued", "done")  # the runner claimed it, saw the tomb, skipped it
    assert later["status"]["skipped"] is True and later["status"]["why"] == "kill"
    assert base64.b64decode(later.get("log", "")) == b""


def test_a_put_after_its_tomb_is_dropped(node):
    # a re-attaching controller tombs a run it cannot find; the dead controller's put lands later
    channel, _, _ = node
    channel.ask("tomb", epoch=EPOCH, name="late", why="void")
    assert put(channel, "late", "echo should-not-run")["state"] == "dropped"
    assert state(channel, "late") == {"state": "dropped", "why": "void"}  # never queued: nothing to claim


def test_a_kill_takes_every_process_of_the_run_even_one_that_left_its_session(node, tmp_path):
    channel, _, _ = node
    pidfile = tmp_path / "escaped.pid"
    put(channel, "tree", f"setsid sleep 300 & echo $! > {pidfile}; sleep 300")
    wait_state(channel, "tree", "running")
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=10)
    escaped = int(pidfile.read_text())
    channel.ask("tomb", epoch=EPOCH, name="tree")
    wait_state(channel, "tree", "done")
    assert not _alive(escaped)


def test_what_a_run_leaves_behind_is_killed_when_it_ends(node, tmp_path):
    channel, _, _ = node
    pidfile = tmp_path / "left.pid"
    put(channel, "leaves", f"(sleep 300 & echo $! > {pidfile}); echo done")
    assert wait_state(channel, "leaves", "done")["status"]["exit"] == 0
    assert not _alive(int(pidfile.read_text()))


def test_a_long_log_is_read_to_its_end(node):
    # 3 MiB of output, one line of it without a newline for 1 MiB: the summary after it must come back
    channel, _, _ = node
    script = (
        "python3 -c \"import sys; sys.stdout.write('x' * 2**20); print(); "
        "[print('line', i, 'y' * 200) for i in range(10000)]; print('---'); print('val_bpb: 1.5')\""
    )
    put(channel, "big", script)
    wait_state(channel, "big", "done", timeout=60)
    offset, data = 0, b""
    while True:
        got = channel.ask("poll", epoch=EPOCH, runs=[{"name": "big", "offset": offset}])["runs"]["big"]
        chunk = base64.b64decode(got["log"])
        data, offset = data + chunk, offset + len(chunk)
        if got["eof"]:
            break
    assert len(data) > 3 * 2**20 and data.endswith(b"---\nval_bpb: 1.5\n")


def test_a_helper_that_does_not_answer_is_given_up_in_time(monkeypatch):
    # a hung ssh or srun must not hold the controller: the request fails, and close does not block
    from nightlab.fleet.skypilot import channel as channel_module

    monkeypatch.setattr(channel_module, "START_TIMEOUT", 1.0)
    channel = Channel(["sleep", "600"], "")
    started = time.time()
    with pytest.raises(ChannelError, match="did not answer"):
        channel.ask("hello", timeout=1.0, epoch=EPOCH)
    with pytest.raises(ChannelError):  # a big request to a helper that reads nothing: the write times out too
        channel.ask("put", timeout=1.0, epoch=EPOCH, name="x", request={"script": "x" * 2**21})
    channel.close()
    assert time.time() - started < 60  # bounded by the two 1 s timeouts, not by the helper's 600 s


def test_a_missing_helper_command_is_a_channel_error():
    with pytest.raises(ChannelError, match="could not start"):
        Channel(["/nonexistent/ssh"], "").ask("hello", epoch=EPOCH)


def test_an_idle_runner_with_no_controller_exits_and_says_so(tmp_path):
    home = tmp_path / "home"
    base = home / ".nightlab" / "resident"
    proc = subprocess.run(
        [sys.executable, "-c", SOURCE, "runner", str(base), EPOCH, "0.5"],
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0
    assert (base / EPOCH / "exited").exists()


def test_the_runner_source_runs_on_the_oldest_python_it_claims(tmp_path):
    # shipped as text to clusters whose python3 may be old: no syntax newer than 3.8
    import ast

    tree = ast.parse(SOURCE, feature_version=(3, 8))
    # and it needs no nightlab there: the shared process rules travel inside it (nightlab/procs.py)
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.split(".")[0] == "nightlab"], imported
    assert "def run_processes(" in SOURCE and "def end_run(" in SOURCE


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
