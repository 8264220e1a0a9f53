"""A stand-in for a coding agent, driven by the supervisor in the tests.

Like a real agent it reads its prompt on stdin, works in the lab with the `nightlab` CLI and
prints as it goes; the mode (argv[1]) picks its behaviour:

    work          edit train.py, submit, restore, wait --any, read results, repeat a within-noise
                  one once, adopt a keep, exit 0
    hang          print one line, then hang without output (a stalled agent)
    chatty        print a line every 0.1 s forever (busy, never stalls)
    context       print Claude Code's result event for a full context window, exit 1
    dup           submit the unchanged files twice; the second submit must be refused
    submit-hang   wait 2 s, submit one idea without printing anything, then hang
    fail          exit 3 at once (an agent that keeps failing)

What it saw is written to $STAND_IN_OUT: prompt-<session>.md (stdin) and, per mode, results.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

mode = sys.argv[1]
session = int(os.environ["NIGHTLAB_AGENT_SESSION"])
out = Path(os.environ["STAND_IN_OUT"])
out.mkdir(parents=True, exist_ok=True)
prompt = sys.stdin.read()
(out / f"prompt-{session}.md").write_text(prompt)
(out / f"env-{session}.json").write_text(
    json.dumps(
        {"prompt_file": os.environ.get("NIGHTLAB_PROMPT_FILE"), "cwd": os.getcwd(), "pid": os.getpid()}
    )
)
print(f"stand-in session {session} mode {mode}", flush=True)


def nightlab(*args, check=True, quiet=False):
    proc = subprocess.run(["nightlab", *args], capture_output=True, text=True)
    if not quiet:
        print(f"$ nightlab {' '.join(args)} -> {proc.returncode}", flush=True)
    if check and proc.returncode != 0:
        sys.exit(f"nightlab {args} failed: {proc.stderr}")
    return proc


def submit_lr(value, quiet=False):
    train = Path("train.py")
    train.write_text(re.sub(r"(?m)^LR = [0-9.e-]+", f"LR = {value}", train.read_text()))
    eid = nightlab("submit", "-m", f"lr {value}", quiet=quiet).stdout.split()[0]
    subprocess.run(["git", "checkout", "HEAD", "--", "train.py"], check=True)
    return eid


if mode == "work":
    lrs = ["0.02", "0.04", "0.005", "0.03", "0.015", "0.025"]
    eid = submit_lr(lrs[(session - 1) % len(lrs)])
    nightlab("wait", "--any", "--timeout", "60")
    nightlab("wait", eid, "--timeout", "60")
    rows = json.loads(nightlab("results", "--json").stdout)["experiments"]
    mine = next(r for r in rows if r["id"] == eid)
    if mine["verdict"] == "within-noise":  # one run is never kept: the repeat a keep needs
        again = nightlab("submit", "--from", eid, "--repeats", "1", "-m", f"repeat {eid}").stdout.split()[0]
        nightlab("wait", again, "--timeout", "60")
        rows = json.loads(nightlab("results", "--json").stdout)["experiments"]
        mine = next(r for r in rows if r["id"] == eid)
    if mine["verdict"] == "keep":
        nightlab("adopt", eid)
    (out / f"result-{session}.json").write_text(json.dumps(mine))
    sys.exit(0)
if mode == "hang":
    time.sleep(3600)
if mode == "chatty":
    while True:
        print("tool: still working", flush=True)
        time.sleep(0.1)
if mode == "context":
    print(
        json.dumps(
            {
                "type": "result",
                "subtype": "error_during_execution",
                "is_error": True,
                "result": "Prompt is too long",
            }
        ),
        flush=True,
    )
    sys.exit(1)
if mode == "dup":
    first = nightlab("submit", "-m", "same files", "--no-start")
    second = nightlab("submit", "-m", "same files again", "--no-start", check=False)
    (out / "dup.json").write_text(
        json.dumps({"first": first.stdout.strip(), "code": second.returncode, "stderr": second.stderr})
    )
    sys.exit(0)
if mode == "submit-hang":
    time.sleep(2.0)
    submit_lr("0.02", quiet=True)  # silent: only the submission itself shows the agent is alive
    time.sleep(3600)
if mode == "fail":
    sys.exit(3)
sys.exit(f"unknown mode {mode}")
