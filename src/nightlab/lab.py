"""The lab: a git repository where research happens, and the API the CLI is a thin layer over.

Creating one (`init_lab`, `InitOptions`) lives in `nightlab.lab_init`; it is re-exported here.

    lab = Lab.open()                                   # the lab containing the cwd
    [e] = lab.submit("lr 0.02", sets={"MATRIX_LR": "0.02"})
    lab.wait([e.id], timeout=900)
    lab.adopt(e.id)

`submit` snapshots the editable files (uncommitted edits included) as a commit on
`refs/nightlab/<id>`, records the experiment in the ledger and makes sure a controller
runs. `adopt` makes a snapshot the incumbent: its files are committed on the lab's branch.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightlab import evidence, identity, snapshots
from nightlab.config import CONFIG_NAME, LabConfig, load_lab_config
from nightlab.errors import (
    DuplicateExperimentError,
    NightlabError,
    NotALabError,
    UsageError,
    WaitTimeoutError,
    closest_first,
    did_you_mean,
)
from nightlab.lab_init import GENERATED, STATE_DIR, InitOptions, init_lab
from nightlab.ledger import Experiment, ExperimentStatus, Ledger, NewExperiment, Source, Verdict, open_ledger
from nightlab.reruns import RERUN_DECISION_WAIT, Reruns

if TYPE_CHECKING:
    from nightlab.judge import Judge

__all__ = ["GENERATED", "InitOptions", "Lab", "apply_sets", "find_lab", "init_lab", "read_editable"]


def find_lab(start: Path | None = None) -> Path:
    """The lab directory containing `start` (default: cwd)."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / CONFIG_NAME).is_file() and (candidate / STATE_DIR).is_dir():
            return candidate
    raise NotALabError(
        f"`{here}` is not inside a nightlab lab (no {CONFIG_NAME} and {STATE_DIR}/); "
        "create one with `nightlab init DIR` or cd into a lab"
    )


def read_editable(lab_dir: Path, editable: Iterable[str], rev: str) -> dict[str, bytes]:
    """The editable files of commit `rev` that it has, by name (a snapshot may lack one)."""
    files = {}
    for name in editable:
        try:
            files[name] = snapshots.read_file(lab_dir, rev, name)
        except NightlabError:
            continue
    return files


def apply_sets(files: Mapping[str, bytes], sets: Mapping[str, str]) -> dict[str, bytes]:
    """The files with each knob's value (source text) written into the file that defines it.

    `Lab.submit` (`--set`) and every wave (`waves.submit_wave`) apply knobs with this one rule.
    Files that are not Python text (a shell script, a config) have no knobs and are left as they are.

    Raises:
        UsageError: a knob no file defines (the known ones listed, closest first), a bad value.
    """
    from nightlab.search.knobs import list_knobs, set_knobs

    out = dict(files)
    left = dict(sets)
    texts = []
    for name, content in files.items():
        try:
            text = content.decode()
            names = {k.name for k in list_knobs(text)}
        except (UnicodeDecodeError, UsageError):
            continue
        texts.append(text)
        mine = {k: v for k, v in left.items() if k in names}
        if mine:
            out[name] = set_knobs(text, mine).encode()
            left = {k: v for k, v in left.items() if k not in mine}
    if left:
        set_knobs(texts[0] if texts else "", left)  # raises the "unknown knob" error, closest names first
    return out


class Lab:
    """An open lab: its config, its ledger and the operations on both."""

    def __init__(self, path: Path) -> None:
        self.path = path
        loaded = load_lab_config(path)
        self.config: LabConfig = loaded.config
        self.config_uncommitted = loaded.uncommitted
        self.config_warning = loaded.warning  # the one line commands print about the working copy
        self.ledger: Ledger = open_ledger(path)
        identity.rekey(path, self.ledger)  # once per ledger from before research identities

    @classmethod
    def open(cls, start: Path | None = None) -> Lab:
        return cls(find_lab(start))

    def close(self) -> None:
        self.ledger.close()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ incumbent

    def incumbent(self) -> identity.Incumbent:
        """The incumbent now: HEAD and its research identity, with one git process."""
        return identity.incumbent(self.path)

    def head(self) -> str:
        return self.incumbent().commit

    def head_identity(self) -> str:
        """The incumbent's research identity (`nightlab.identity`): what its runs are keyed on."""
        return self.incumbent().identity

    def judge(self) -> Judge:
        """The lab's verdict policy (`nightlab.judge`), the only writer of verdicts."""
        from nightlab.judge import Judge

        return Judge(self.ledger, self.config, self.path)

    def check_tier(self, tier: str) -> str:
        if tier not in self.config.fleet.tiers:
            known = list(self.config.fleet.tiers)
            hint = (
                f"; nightlab.toml has uncommitted edits: `git commit {CONFIG_NAME}` to use them"
                if self.config_uncommitted
                else f'; add a [[fleet.pool]] with tier = "{tier}" and commit {CONFIG_NAME}'
            )
            raise UsageError(
                f"no workers of tier `{tier}`; {did_you_mean(tier, known)}"
                f"tiers in nightlab.toml: {', '.join(closest_first(tier, known))}{hint}"
            )
        return tier

    def check_running_tier(self, tier: str, *, patience: float = 3.0) -> None:
        """Refuse a tier the running controller has no worker of (it takes up a committed pool
        within a heartbeat; `patience` seconds allow for that).

        Raises:
            UsageError: naming the controller and the fix.
        """
        from nightlab.fleet.daemon import running_pid

        deadline = time.time() + patience
        while True:
            pid = running_pid(self.path)
            if pid is None or pid < 0 or any(w.tier == tier for w in self.ledger.workers()):
                return
            if time.time() >= deadline:
                break
            time.sleep(0.2)
        refused = self.ledger.events(kinds=["config-refused"])
        why = f" ({refused[-1].data.get('error')})" if refused else ""
        raise UsageError(
            f"the running controller (pid {pid}) has no worker of tier `{tier}`: it did not take up the "
            f"committed pool{why}; fix {CONFIG_NAME} and commit it, or restart the fleet with "
            "`nightlab fleet stop && nightlab fleet start`"
        )

    # ------------------------------------------------------------------ submit

    def submit(
        self,
        description: str,
        *,
        sets: dict[str, str] | None = None,
        overrides: dict[str, bytes] | None = None,
        tier: str | None = None,
        seed: int | None = None,
        repeats: int = 1,
        fresh_seeds: bool = False,
        wave: str | None = None,
        priority: int = 0,
        force: bool = False,
        base: str = "HEAD",
        source: Source = Source.CLI,
        start_controller: bool = True,
    ) -> list[Experiment]:
        """Snapshot the editable files and queue `repeats` experiments of that snapshot.

        Args:
            sets: knob -> new value source text, applied to the snapshot only.
            overrides: file name -> full content, instead of the working-tree file.
            seed: the seed of a single experiment (default 0); with `repeats`, unused seeds are chosen.
            fresh_seeds: choose unused seeds for a single experiment too (a re-measurement).
            force: queue even when the same snapshot, tier and seed was already measured.

        Raises:
            UsageError: bad knob or value, unknown tier, empty description, a missing file the
                target's command runs (`TargetConfig.entry_files`).
            DuplicateExperimentError: the measurement exists (names it and the way out).
        """
        _check_submit_args(description, seed=seed, repeats=repeats)
        tier = self.check_tier(tier or self.config.fleet.default_tier)
        self.check_running_tier(tier)
        if start_controller:
            from nightlab.fleet.daemon import running_pid
            from nightlab.fleet.health import check_capacity

            if running_pid(self.path) is None:
                check_capacity(self.config)  # refused before anything is queued
        files = self._snapshot_files(overrides, sets)
        self._check_prepared(tier)
        commit, _, parent = snapshots.create_snapshot(
            self.path, self.config.target.editable, overrides=files, message=description, base=base
        )
        # keyed on the files it runs under the configuration in force, not on the whole tree
        ident, epoch = identity.of(self.path, commit, config=self.config), identity.epoch_key(self.config)
        seeds = self._seeds(ident, tier, seed=seed, repeats=repeats, fresh_seeds=fresh_seeds)
        if not force:
            self._refuse_measured(ident, tier, seeds)
        new = [
            NewExperiment(
                snapshot=commit,
                identity=ident,
                parent=parent,
                description=description,
                tier=tier,
                seed=s,
                wave=wave,
                priority=priority,
                params=dict(sets or {}),
                source=source,
                epoch=epoch,
            )
            for s in seeds
        ]

        def make_refs(experiments: list[Experiment]) -> None:
            for e in experiments:
                snapshots.set_ref(self.path, e.id, commit)

        experiments = self.ledger.add_experiments(
            new, before_commit=make_refs, taken=evidence.highest_seq(self.path)
        )
        if start_controller:
            from nightlab.fleet.daemon import ensure_running

            ensure_running(self.path)
        return experiments

    def _snapshot_files(
        self, overrides: dict[str, bytes] | None, sets: dict[str, str] | None
    ) -> dict[str, bytes]:
        """The files the snapshot takes instead of the working tree's: the overrides, then the knob values set."""
        files = dict(overrides or {})
        # the snapshot takes an editable file from the overrides, else from the working tree
        # (`snapshots.create_snapshot`): without the one the command runs, the run can only crash
        for name in self.config.target.entry_files:
            if name not in files and not (self.path / name).is_file():
                raise UsageError(
                    f"`{name}` is missing from the working tree and the target's command "
                    f"`{self.config.target.command}` runs it; restore it with `git checkout -- {name}`"
                )
        if sets:
            # the working tree's editable files, under the overrides, take the knob values
            current = {
                name: files[name] if name in files else (self.path / name).read_bytes()
                for name in self.config.target.editable
                if name in files or (self.path / name).is_file()
            }
            applied = apply_sets(current, sets)
            files.update({name: content for name, content in applied.items() if content != current[name]})
        return files

    def _seeds(
        self, ident: str, tier: str, *, seed: int | None, repeats: int, fresh_seeds: bool
    ) -> list[int]:
        """The seeds to queue: the one asked for, else 0, else the lowest this identity has not used on the tier."""
        if seed is not None:
            return [seed]
        if repeats == 1 and not fresh_seeds:
            return [0]
        used = self.ledger.seeds_used(ident, tier)
        return [s for s in range(len(used) + repeats) if s not in used][:repeats]

    def _refuse_measured(self, ident: str, tier: str, seeds: list[int]) -> None:
        """Raise DuplicateExperimentError when one of these measurements exists or is under way."""
        for s in seeds:
            prior = self.ledger.find_measured(ident, tier, s)
            if prior is not None:
                done = prior.status.is_finished()
                where = f"measured by {prior.id}" if done else f"{prior.status.label} as {prior.id}"
                then = "" if done else f"wait for it with `nightlab wait {prior.id}`, or "
                raise DuplicateExperimentError(
                    f"these files on tier `{tier}` with seed {s} are already {where} "
                    f"(`{prior.description}`); {then}use `--seed N` or `--repeats N` for a new "
                    "measurement, or `--force`"
                )

    def _check_prepared(self, tier: str) -> None:
        """Refuse a built-in-target run on local workers before `nightlab prepare`: it would only
        crash with DataNotPreparedError and burn a slot. Remote pools prepare on their clusters."""
        if not self.config.target.builtin or self.config.profile is None:
            return
        if any(p.backend != "local" for p in self.config.fleet.pools if p.tier == tier):
            return
        from nightlab.harness.cache import DataNotPreparedError, load_manifest
        from nightlab.harness.profiles import Profile, data_dir

        profile = Profile.from_dict(self.config.profile)
        try:
            load_manifest(data_dir(profile), profile=profile)
        except DataNotPreparedError:
            raise UsageError(
                f"the `{profile.dataset}` data of this lab's `{profile.name}` profile is not prepared "
                f"(looked in `{data_dir(profile)}`); run `nightlab prepare` in the lab first"
            ) from None

    def files_at(self, rev: str = "HEAD") -> dict[str, bytes]:
        """The editable files of a commit (the incumbent by default, a snapshot's hash), by name."""
        return read_editable(self.path, self.config.target.editable, rev)

    def files_of(self, experiment_id: str) -> tuple[dict[str, bytes], str]:
        """The editable files of an experiment's snapshot, and the commit it was derived from."""
        exp = self.ledger.get(experiment_id)
        return self.files_at(exp.snapshot), exp.parent or "HEAD"

    # ------------------------------------------------------------------ waiting

    def wait(
        self,
        ids: Iterable[str] | None = None,
        *,
        mode: str = "all",
        timeout: float | None = None,
        poll: float = 0.2,
        on_tick: Any = None,
        reruns: bool = False,
    ) -> list[Experiment]:
        """Block until the experiments end (`mode` all) or one of them ends (`any`).

        With `ids` None: every experiment that is queued or running now. With `reruns` (mode all),
        the re-run the controller queues for each that ends degraded is waited for too and returned
        after them (`nightlab.reruns`): a degraded run is never judged, its re-run's figure counts.

        Raises:
            WaitTimeoutError: the timeout passed first (exit 1); it carries the experiments' state.
        """
        if ids is None:
            watch = [
                e.id
                for e in self.ledger.experiments(
                    status=(ExperimentStatus.QUEUED, ExperimentStatus.RUNNING), with_metrics=False
                )
            ]
        else:
            watch = list(ids)
            for i in watch:
                self.ledger.get(i)  # unknown ids fail now, not after the timeout
        deadline = None if timeout is None else time.time() + timeout
        follow = Reruns(self.ledger) if reruns and mode == "all" else None
        while True:
            exps = self.ledger.experiments(ids=watch) if watch else []
            done = [e for e in exps if e.status.is_finished()]
            if mode == "any" and done:
                return done
            if len(done) == len(exps):
                left = RERUN_DECISION_WAIT if deadline is None else max(0.0, deadline - time.time())
                more = follow.of(done, timeout=min(left, RERUN_DECISION_WAIT)) if follow else []
                if not more:
                    return exps
                watch += more
                continue
            if on_tick is not None:
                on_tick(exps)
            if deadline is not None and time.time() >= deadline:
                pending = [e.id for e in exps if not e.status.is_finished()]
                raise WaitTimeoutError(
                    f"timed out after {timeout:g} s; still pending: {', '.join(pending)}; "
                    "wait again or check `nightlab status`",
                    exps,
                )
            time.sleep(poll)

    # ------------------------------------------------------------------ adopt

    def adopt(self, experiment_id: str, *, force: bool = False, decided_on: str | None = None) -> str:
        """Make the experiment's snapshot the incumbent: commit its files on the lab's branch.

        `decided_on`: the tier a search judged it on (`Judge.adopted` says what that changes).

        Raises:
            UsageError: the experiment did not finish ok, its verdict is not `keep` (none counts as
                not `keep`) and `force` is off, or editable files have uncommitted edits.
        """
        exp = self.ledger.get(experiment_id)
        editable = self.config.target.editable
        dirty = snapshots.is_dirty(self.path, editable)
        if dirty:  # never overwritten, even with force: they may be the only copy of an idea
            raise UsageError(
                f"uncommitted edits in `{', '.join(dirty)}` would be overwritten; commit or restore them "
                f"(`git checkout -- {' '.join(dirty)}`), then adopt again"
            )
        if not exp.ok and not force:
            raise UsageError(
                f"{exp.id} ended `{exp.outcome or exp.status.label}`; only a finished ok run can be adopted "
                "(`--force` to adopt anyway)"
            )
        if exp.verdict is None and not force:
            # no verdict is no keep: its incumbent had no ok run on the tier (degraded, crashed,
            # never run) when it ended; measuring the incumbent judges it (`Judge.refresh_pending`)
            judged_then = "which judges it, " if exp.parent == self.head() else ""
            raise UsageError(
                f"{exp.id} has no verdict: the incumbent had no ok run on tier `{exp.tier}` to judge it "
                f"against; measure the incumbent with `nightlab noise --tier {exp.tier}`, {judged_then}"
                "and adopt it if it is `keep` (`--force` adopts it unjudged)"
            )
        if exp.verdict not in (None, Verdict.KEEP, Verdict.BASELINE) and not force:
            raise UsageError(
                f"{exp.id} has verdict `{exp.verdict}`; adopt only `keep` verdicts (`--force` to override)"
            )
        changed = []
        for name in editable:
            try:
                content = snapshots.read_file(self.path, exp.snapshot, name)
            except NightlabError:
                continue
            if (self.path / name).is_file() and (self.path / name).read_bytes() == content:
                continue
            (self.path / name).write_bytes(content)
            changed.append(name)
        if changed:
            commit = snapshots.commit_files(self.path, changed, f"adopt {exp.id}: {exp.description}")
        else:
            commit = self.head()
        self.judge().adopted(exp, decided_on=decided_on)
        return commit


def _check_submit_args(description: str, *, seed: int | None, repeats: int) -> None:
    """Raise UsageError for an empty description or a bad seed / repeats pair."""
    if not description.strip():
        raise UsageError('describe the experiment with `-m "..."`: the description is what the journal shows')
    if repeats < 1:
        raise UsageError(f"`--repeats` must be at least 1, got `{repeats}`")
    if seed is not None and repeats > 1:
        raise UsageError("use either `--seed` or `--repeats`: repeats choose their own distinct seeds")
