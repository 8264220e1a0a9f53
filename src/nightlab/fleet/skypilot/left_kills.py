"""Killed jobs a closing backend could not see end, left in the lab for the next backend to cancel.

A stopping controller kills its runs, finishes their attempts as `infra` and requeues them, so no
later controller re-attaches those attempts (`Jobs.reattach` only takes over attempts still in
flight). On Slurm a job still INIT ignores a cancel; when one stays INIT past the close's grace
(`core.CLOSE_GRACE`), it would run on to its own limit, holding its cluster while the requeued
experiment waits behind it. The closing backend writes one record per such job under
`.nightlab/fleet/unsettled-kills/`, and every monitor turn of the next backend in the lab cancels
each recorded job again until SkyPilot shows it ended (or its cluster gone), then drops the record.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from nightlab.atomic import atomic_write_json
from nightlab.fleet.sky_task import job_name
from nightlab.fleet.skypilot import core
from nightlab.fleet.skypilot.core import TERMINAL, Shared, field_of, is_gone, log, one_line, status_name

if TYPE_CHECKING:
    from nightlab.fleet.skypilot.jobs import Run

FOLDER = Path(".nightlab") / "fleet" / "unsettled-kills"


class LeftKills:
    """The lab's records of killed jobs that no backend has seen end yet (module docstring)."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self._cancelling: set[str] = set()  # records whose cancel is in flight
        self._lock = threading.Lock()

    def _folder(self) -> Path | None:
        return None if self.shared.lab_dir is None else self.shared.lab_dir / FOLDER

    def leave(self, runs: Iterable[Run]) -> None:
        """Record these killed runs' jobs (an exec still in flight is recorded by its job name)."""
        folder = self._folder()
        if folder is None:  # no run was launched: nothing was killed
            return
        for run in runs:
            name = job_name(run.spec)
            record = {
                "cluster": run.cluster.name,
                "job_id": run.job_id,
                "job_name": name,
                "left_at": time.time(),
            }
            try:
                folder.mkdir(parents=True, exist_ok=True)
                atomic_write_json(folder / f"{name}.json", record, unique=True)
            except OSError as e:  # a full disk: this job runs to its own limit, as before
                log.warning(
                    "could not leave the unsettled kill of job `%s` for the next controller: %s", name, e
                )

    def settle(self) -> None:
        """Cancel each recorded job again unless SkyPilot shows it ended; drop the records of ended ones."""
        folder = self._folder()
        if folder is None or not folder.is_dir():
            return
        for path in sorted(folder.glob("*.json")):
            if path.name.startswith("."):  # a record being written (`atomic_path`'s temporary)
                continue
            try:
                record = json.loads(path.read_text())
                cluster = str(record["cluster"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                # damaged (records are written whole, so not by a crash): nothing to act on
                log.warning("dropped an unreadable unsettled-kill record %s: %s", path.name, e)
                path.unlink(missing_ok=True)
                continue
            try:
                ended = self._check(path, record, cluster)
            except Exception as e:
                if not is_gone(e):  # the API server hiccuped: ask again next turn
                    log.info("unsettled kill %s: %s", path.name, one_line(e))
                    continue
                ended = True  # its cluster is gone, and the job with it
            if ended:
                path.unlink(missing_ok=True)
                log.info("the job of unsettled kill %s has ended", path.stem)

    def _check(self, path: Path, record: dict, cluster: str) -> bool:
        """Whether the recorded job has ended; cancels it (on a thread) when it has not."""
        sdk = self.shared.sdk
        job_id = record.get("job_id")
        if job_id is None:  # the exec was in flight at close: find its job by name
            jobs = sdk.get(sdk.queue(cluster, skip_finished=False))
            ids = [field_of(j, "job_id") for j in jobs if field_of(j, "job_name") == record.get("job_name")]
            if not ids:  # the API server may still land the exec; after FIND_PATIENCE it never will
                return time.time() - float(record.get("left_at", 0)) > core.FIND_PATIENCE
            job_id = int(max(ids))
            atomic_write_json(path, {**record, "job_id": job_id}, unique=True)
        status = status_name(sdk.get(sdk.job_status(cluster, [job_id])).get(job_id))
        if status is None or status in TERMINAL:
            return True
        with self._lock:
            if path.name in self._cancelling:
                return False
            self._cancelling.add(path.name)
        self.shared.thread(self._cancel, path.name, cluster, int(job_id))
        return False

    def _cancel(self, key: str, cluster: str, job_id: int) -> None:
        sdk = self.shared.sdk
        try:
            sdk.get(sdk.cancel(cluster, job_ids=[job_id]))
        except Exception as e:  # ended or gone meanwhile: the next status read settles it
            log.info("cancel of left job %s on %s: %s", job_id, cluster, one_line(e))
        finally:
            with self._lock:
                self._cancelling.discard(key)
