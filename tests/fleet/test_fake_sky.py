"""The fake SkyPilot's own rules, where a race inside the fake would make a backend test lie.

ci38b (two workers beside a busy core): a cancel reached a job while its process was starting;
it found the job PENDING with no process yet, marked it CANCELLED, and the start then set it
RUNNING, so `test_a_closing_backend_cancels_a_killed_run_whose_exec_is_in_flight` saw the
backend's cancel undone by the fake. The real SkyPilot keeps a cancelled job cancelled.
"""

from __future__ import annotations

import subprocess

import sky

from labkit import wait_until
from nightlab.testing import fake_cloud
from nightlab.testing.fake_sky import FakeSky


def test_a_cancel_that_lands_while_the_job_starts_its_process_stays_cancelled(tmp_path, monkeypatch):
    fake = FakeSky(tmp_path / "clusters", scale=0.001)
    try:
        fake.get(fake.launch(sky.Task(name="setup", run="true"), cluster_name="c"))
        real_popen = subprocess.Popen
        started: list[subprocess.Popen] = []

        def popen_with_a_cancel_first(args, **kwargs):  # the cancel lands as the process starts
            if args[-1] == "sleep 60":
                fake.get(fake.cancel("c", job_ids=[victim]))
            started.append(real_popen(args, **kwargs))
            return started[-1]

        monkeypatch.setattr(fake_cloud.subprocess, "Popen", popen_with_a_cancel_first)
        victim, _ = fake.get(fake.exec(sky.Task(name="victim", run="sleep 60"), cluster_name="c"))
        job = fake.clusters["c"].jobs[victim]
        wait_until(lambda: job.ended_at is not None, timeout=15, what="the cancelled job's end")
        assert job.status == sky.JobStatus.CANCELLED
        assert started and all(p.poll() is not None for p in started)  # its process was killed
    finally:
        fake.stop_jobs()
