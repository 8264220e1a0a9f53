"""The real SkyPilot on a real local Slurm cluster, once per run of this folder (see localsky.py).

Runs in `make test`. When the machine lacks something the fixture cannot install itself
(`localsky.missing`), the run says so before the first test and the tests skip, or fail with
`CI` set (tests/needs.py; `.ci/install-test-deps` installs the Debian packages, `make install`
the pinned `skypilot[slurm]` extra); a cluster that fails to start fails them everywhere. Everything the
fixture starts is stopped by PID when the folder's last test ends, also after a failed test or a
failed start, and when the run is stopped: SIGTERM runs the finalizer like Ctrl-C, and if pytest
dies without it (SIGKILL) the session's watchdog reaps the run (tests/services.py).

The two files' labs (`slurm_lab`, `gpu_lab`) are built here, and each one's `nightlab fleet up`
starts in the background as soon as the local cluster is up, both at once: a launch with its
set-up is minutes of waiting on Slurm, SSH and pip, and the two used to come one after the
other. Each file's first test asserts on its `fleet up` output as before (`Background.result`).
The GPU file runs first (`pytest_collection_modifyitems`): its runs need its launch, and the
2-worker lab's runners idle meanwhile; it tears its cluster down at its end, before
`test_fleet_down_leaves_nothing` looks for leftovers of the whole run.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from localsky import POOL_WORKERS, SLURM_CLUSTER, LocalSky, add_pool, stop_pid, worker_yaml  # noqa: E402

from labkit import GIT_ENV, SYNTHETIC_TRAIN, commit, nightlab  # noqa: E402
from scheduling import in_the_background  # noqa: E402

# the node's CPUs: the 4-GPU cluster (4 per GPU, SkyPilot's default: 16) and the two 2-CPU
# workers are allocated at the same time (their launches overlap); jobs here are sleeps and tiny scripts
NODE_CPUS = 24
SLURM_TIMEOUT = (
    45  # the 2-worker lab's hard limit (s); counts from the job's start, so `sky exec` latency is not in it
)
# the 4-GPU lab: one `H100:4` cluster, 4 slots; each run prints the lane it got
GPU_NODE = f"""
[[fleet.pool]]
backend = "skypilot"
tier = "h100"
accelerators = "H100:4"
workers = 1
infra = "slurm/{SLURM_CLUSTER}"
"""
GPU_SHOW = "echo lane gpu=$CUDA_VISIBLE_DEVICES index=$NIGHTLAB_GPU threads=$OMP_NUM_THREADS; python train.py"
FIRST = "test_gpu_slots_on_slurm.py"  # runs before the other file of this folder
# started in the background as soon as the 2-worker lab's `fleet up` succeeded (`Lab.then`)
CONFORMANCE = "test_the_conformance_suite_on_the_real_sdk"


def pytest_collection_modifyitems(items) -> None:
    """This folder's tests with `FIRST`'s ahead of the rest, in the places the folder's tests had
    (stable: each file keeps its order; tests outside the folder keep theirs)."""
    here = Path(__file__).parent
    places = [i for i, item in enumerate(items) if here in item.path.parents]
    mine = sorted((items[i] for i in places), key=lambda item: item.path.name != FIRST)
    for i, item in zip(places, mine, strict=True):
        items[i] = item


@pytest.fixture(scope="package")
def local_sky(watchdog, pytestconfig):
    """A running LocalSky: `local_sky.environ()` is the environment to run nightlab and sky in.

    Under xdist it and everything the folder starts run as one background group (`scheduling.in_the_background`).
    """
    with in_the_background(pytestconfig):
        local = LocalSky(cpus=NODE_CPUS, watchdog=watchdog)
        try:
            local.up()
        except Exception as e:
            pytest.fail(f"the local Slurm + SkyPilot cluster did not start: {e}", pytrace=False)
        try:
            yield local
        finally:
            local.down()


class Background:
    """A command started now and awaited later (`result`), its output in files.

    Started in a process group of its own, guarded by the session's watchdog; `stop` ends it
    by PID when it is still running (a failed or stopped test run).
    """

    def __init__(self, watchdog, argv: list[str], *, cwd: Path, env: dict[str, str], out: Path) -> None:
        self.argv, self.watchdog = argv, watchdog
        self.stdout, self.stderr = out.with_suffix(".out"), out.with_suffix(".err")
        with open(self.stdout, "w") as o, open(self.stderr, "w") as e:
            self.proc = watchdog.popen(argv, cwd=cwd, env=env, stdout=o, stderr=e)

    def result(self, timeout: float) -> subprocess.CompletedProcess:
        """Wait for it; its output, as `labkit.nightlab` returns it (an AssertionError when it failed)."""
        what = " ".join(self.argv[2:])
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"`{what}` still running after {timeout:.0f} s") from None
        self.watchdog.release(self.proc.pid)
        proc = subprocess.CompletedProcess(self.argv, code, self.stdout.read_text(), self.stderr.read_text())
        if code != 0:
            raise AssertionError(f"`{what}` -> {code}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        if not proc.stdout.strip():  # every command started here prints JSON; seen once under xdist
            raise AssertionError(f"`{what}` exited 0 with no output; stderr:\n{proc.stderr[-3000:]}")
        return proc

    def stop(self) -> None:
        if self.proc.poll() is None:
            stop_pid(self.proc.pid, group=True)
            self.proc.wait()
        self.watchdog.release(self.proc.pid)


class Lab:
    """A lab of this folder's tests: its `fleet up` started in the background at once, and what
    runs on its clusters once they are up (`then`), started by a thread as soon as `fleet up` succeeded."""

    def __init__(self, path: Path, env: dict[str, str], watchdog) -> None:
        self.path, self.env, self.watchdog = path, env, watchdog
        self.up = self._cli(["-m", "nightlab", "fleet", "up", "--json"], "up")
        self._next: dict[str, Background | None] = {}
        self._threads: list[threading.Thread] = []
        self._closing = threading.Event()
        self.down_done = False

    def _cli(self, args: list[str], name: str) -> Background:
        return Background(
            self.watchdog, [sys.executable, *args], cwd=self.path, env=self.env, out=self.path.parent / name
        )

    def then(self, name: str, args: list[str]) -> None:
        """Start `python <args>` in the background once `fleet up` has succeeded (`after(name)`)."""

        def start() -> None:
            self.up.proc.wait()
            self._next[name] = (
                None if self.up.proc.returncode or self._closing.is_set() else self._cli(args, name)
            )

        thread = threading.Thread(target=start, daemon=True)
        thread.start()
        self._threads.append(thread)

    def after(self, name: str) -> Background:
        """What `then(name, ...)` started (an AssertionError when `fleet up` failed, so it never did)."""
        for thread in self._threads:
            thread.join()
        started = self._next.get(name)
        if started is None:
            raise AssertionError(f"`{name}` did not start: `fleet up` failed ({self.up.stderr})")
        return started

    def down(self) -> None:
        """End what runs in the background, then `fleet stop` and `fleet down` (what a test left up); once."""
        if self.down_done:
            return
        self._closing.set()
        self.up.stop()
        for thread in self._threads:
            thread.join()
        for started in self._next.values():
            if started is not None:
                started.stop()
        nightlab("fleet", "stop", cwd=self.path, check=False, env=self.env)
        nightlab("fleet", "down", cwd=self.path, check=False, env=self.env, timeout=600)
        self.down_done = True


def _lab(root: Path, *, timeout: int, files: dict[str, str]) -> Path:
    target = root / "target"
    target.mkdir()
    for name, text in files.items():
        (target / name).write_text(text)
    lab = root / "lab"
    nightlab(
        "init", str(lab), "--target", str(target), "--cpu-slots", "1", "--timeout", str(timeout), cwd=root
    )
    return lab


@pytest.fixture(scope="package")
def slurm_lab(request, tmp_path_factory, local_sky, watchdog):
    """test_fleet_on_slurm.py's lab: 2 workers on the local Slurm cluster, synthetic target.

    The default worker YAML plus the fixture's one staging line (nightlab's dependencies).
    """
    root = tmp_path_factory.mktemp("slurm")
    env = {**local_sky.environ(), **GIT_ENV}
    lab = _lab(
        root,
        timeout=SLURM_TIMEOUT,
        files={
            "train.py": SYNTHETIC_TRAIN,
            "prepare.py": "# fixed data preparation (unused by the synthetic target)\n",
        },
    )
    toml = lab / "nightlab.toml"
    toml.write_text(toml.read_text().replace("idle_shutdown = 900", "idle_shutdown = 600"))
    add_pool(lab, local_sky.base)
    commit(lab, "a slurm pool")
    it = Lab(lab, env, watchdog)
    names = {item.name for item in request.session.items}
    if CONFORMANCE in names:
        # both ways a Slurm pool runs experiments: its resident runner, and one `sky exec` per run
        # (the exec lane's first backend retires the runner `fleet up` started on the second worker)
        it.then(
            "conformance",
            [
                *("-m", "nightlab.testing.skypilot_conformance", str(lab)),
                *("--runner", POOL_WORKERS[0], "--exec", POOL_WORKERS[1]),
            ],
        )
    try:
        yield it
    finally:
        it.down()


@pytest.fixture(scope="package")
def gpu_lab(tmp_path_factory, local_sky, watchdog):
    """test_gpu_slots_on_slurm.py's lab: one `H100:4` cluster (4 slots), each run showing its lane."""
    root = tmp_path_factory.mktemp("gpus")
    env = {**local_sky.environ(), **GIT_ENV}
    lab = _lab(root, timeout=120, files={"train.py": SYNTHETIC_TRAIN})
    toml = lab / "nightlab.toml"
    text = toml.read_text().replace('command = "python train.py"', f'command = "{GPU_SHOW}"', 1)
    toml.write_text(text.replace("[search]", GPU_NODE + "\n[search]"))
    (lab / "fleet").mkdir(exist_ok=True)
    (lab / "fleet" / "skypilot.yaml").write_text(worker_yaml(local_sky.base))
    commit(lab, "one 4-GPU node")
    it = Lab(lab, env, watchdog)
    try:
        yield it
    finally:
        it.down()


@pytest.fixture(scope="package", autouse=True)
def _launches_at_once(request):
    """Start the `fleet up` of every lab this run's tests use, together, before the first test."""
    files = {item.path.name for item in request.session.items}
    if FIRST in files:
        request.getfixturevalue("gpu_lab")
    if "test_fleet_on_slurm.py" in files:
        request.getfixturevalue("slurm_lab")
