"""The lab: a git repository where research happens, and the API the CLI is a thin layer over.

    lab = Lab.open()                                   # the lab containing the cwd
    [e] = lab.submit("lr 0.02", sets={"MATRIX_LR": "0.02"})
    lab.wait([e.id], timeout=900)
    lab.adopt(e.id)

`submit` snapshots the editable files (uncommitted edits included) as a commit on
`refs/nightlab/<id>`, records the experiment in the ledger and makes sure a controller
runs. `adopt` makes a snapshot the incumbent: its files are committed on the lab's branch.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightlab import identity, snapshots
from nightlab.config import CONFIG_NAME, FOREIGN_TIMEOUT, LabConfig, load_lab_config
from nightlab.errors import (
    DuplicateExperimentError,
    NightlabError,
    NotALabError,
    UsageError,
    WaitTimeoutError,
    closest_first,
    did_you_mean,
)
from nightlab.ledger import Experiment, ExperimentStatus, Ledger, NewExperiment, open_ledger

STATE_DIR = ".nightlab"
_COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "venv", "__pycache__", ".nightlab", "*.pyc", ".DS_Store"
)


@dataclass(frozen=True)
class InitOptions:
    """What `nightlab init` was asked for; None means 'choose the default'."""

    target: Path | None = None
    command: str | None = None
    metric: str = "val_bpb"
    lower_is_better: bool = True
    cpu_slots: int | None = None
    editable: tuple[str, ...] | None = None
    timeout: float | None = None
    profile: str | None = None
    budget: float | None = None
    dataset: str | None = None


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _render_config(
    *,
    command: str,
    editable: tuple[str, ...],
    timeout: float,
    metric: str,
    lower_is_better: bool,
    builtin: bool,
    tier: str,
    pool_lines: list[str],
    profile: dict[str, Any] | None,
) -> str:
    lines = [
        "# nightlab lab configuration. See the README, section 'Configuration'.",
        "",
        "[target]",
        f"command = {_toml_str(command)}  # run inside each materialised snapshot",
        f"editable = [{', '.join(_toml_str(e) for e in editable)}]  # files a snapshot takes from the working tree",
        f"timeout = {timeout:g}  # hard limit in seconds: the run's process group is killed",
        f"builtin = {'true' if builtin else 'false'}",
        "",
        "[metric]",
        f"name = {_toml_str(metric)}",
        f'direction = "{"lower" if lower_is_better else "higher"}"  # lower | higher is better',
        "",
        "[fleet]",
        f"default_tier = {_toml_str(tier)}",
        "idle_shutdown = 900  # the controller exits after this many idle seconds",
        "retries = 2  # extra attempts after an infrastructure failure",
        "",
        "[[fleet.pool]]",
        *pool_lines,
        "",
        "[search]",
        "z = 2.0  # keep a change only when it beats the incumbent by z standard errors",
        "incumbent_max_age_waves = 3  # re-measure the incumbent when older than this many waves",
        "promote_top_k = 3",
    ]
    if profile is not None:
        lines += ["", "# Fixed at init: changing it makes results incomparable.", "[profile]"]
        for key, value in profile.items():
            if isinstance(value, dict):
                continue
            lines.append(f"{key} = {json.dumps(value)}")
        for key, value in profile.items():
            if isinstance(value, dict):
                lines += ["", f"[profile.{key}]"]
                lines += [f"{k} = {json.dumps(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"


def _gpu_indices() -> list[int]:
    """Local CUDA devices, without importing torch when there is no driver."""
    if shutil.which("nvidia-smi") is None:
        return []
    import subprocess

    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [int(x) for x in out.stdout.split() if x.strip().isdigit()] if out.returncode == 0 else []


def init_lab(directory: Path, options: InitOptions) -> Path:
    """Create a lab in `directory` (new or empty) and return its absolute path.

    Raises:
        UsageError: the directory is not empty, the target is missing, or flags conflict.
    """
    directory = directory.resolve()
    if directory.exists() and any(directory.iterdir()):
        raise UsageError(f"`{directory}` is not empty; choose a new or empty directory for the lab")
    gpus = _gpu_indices()
    builtin = options.target is None
    profile_dict = None
    if builtin:
        if options.command or options.editable:
            raise UsageError("`--command` and `--editable` need `--target`; the built-in target has its own")
        from nightlab.harness.profiles import get_profile

        profile_name = options.profile or ("h100" if gpus else "cpu")
        profile = get_profile(profile_name, budget=options.budget, dataset=options.dataset)
        profile_dict = profile.to_dict()
        command = "python train.py"
        editable = ("train.py",)
        # autoresearch's rule for the built-in budget: 2x the training budget + 2 minutes
        timeout = options.timeout or 2 * profile.budget_seconds + 120
        tier = "gpu" if gpus else "cpu"
    else:
        if options.profile or options.budget or options.dataset:
            raise UsageError("`--profile`, `--budget` and `--dataset` apply to the built-in target only")
        source = options.target.resolve()
        if not source.is_dir():
            raise UsageError(f"target `{options.target}` is not a directory; pass the repository to copy")
        editable = options.editable or (("train.py",) if (source / "train.py").is_file() else ())
        if not editable:
            raise UsageError(
                f"target `{source}` has no train.py; name the files agents edit with `--editable`"
            )
        for name in editable:
            if not (source / name).is_file():
                raise UsageError(f"editable file `{name}` is not in `{source}`")
        command = options.command or f"python {editable[0]}"
        timeout = options.timeout or FOREIGN_TIMEOUT
        tier = "gpu" if gpus else "cpu"
    if gpus:
        pool = ['backend = "local"', f'tier = "{tier}"', f"gpus = {gpus}  # one slot per GPU"]
    else:
        slots = options.cpu_slots or 1
        pool = [
            'backend = "local"',
            f'tier = "{tier}"',
            f"slots = {slots}  # CPU slots, each running one experiment",
        ]
    config_text = _render_config(
        command=command,
        editable=editable,
        timeout=timeout,
        metric=options.metric,
        lower_is_better=options.lower_is_better,
        builtin=builtin,
        tier=tier,
        pool_lines=pool,
        profile=profile_dict,
    )

    staging = directory.parent / f".{directory.name}.nightlab-init-{os.getpid()}"
    try:
        if builtin:
            staging.mkdir(parents=True)
            _write_builtin_target(staging, profile_dict or {})
        else:
            shutil.copytree(options.target.resolve(), staging, ignore=_COPY_IGNORE)
        (staging / CONFIG_NAME).write_text(config_text)
        from nightlab.config import parse_config, tomllib

        config = parse_config(tomllib.loads(config_text))  # a bug in rendering must not leave a broken lab
        from nightlab.agent.instructions import write_agent_files

        write_agent_files(staging, config)  # program.md (or program.nightlab.md) and the SKILL.md
        _ignore_generated(staging / ".gitignore")
        snapshots.git(staging, "init", "--quiet")
        snapshots.git(staging, "checkout", "--quiet", "-b", "research")
        snapshots.git(staging, "add", "--all")
        snapshots.git(staging, *snapshots.identity_args(staging), "commit", "--quiet", "-m", "nightlab init")
        open_ledger(staging, create=True).close()
        if directory.exists():
            directory.rmdir()
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


# What nightlab writes into the lab besides its files: the ledger and caches, and what `nightlab
# report` (and the demo) regenerate from the ledger. Ignored, so the user's `git status` stays clean.
GENERATED = (".nightlab/", "results.tsv", "results-*.tsv", "progress.png", "costs.md")


def _ignore_generated(gitignore: Path) -> None:
    """Add the generated names to the lab's .gitignore, keeping what a copied target had there."""
    existing = gitignore.read_text() if gitignore.exists() else ""
    missing = [name for name in GENERATED if name not in existing.split()]
    if missing:
        sep = "" if existing.endswith("\n") or not existing else "\n"
        gitignore.write_text(existing + sep + "\n".join(missing) + "\n")


def _write_builtin_target(dest: Path, profile: dict[str, Any]) -> None:
    from importlib import resources

    from nightlab.search.knobs import set_knobs

    template = resources.files("nightlab.targets.gpt")
    train = template.joinpath("train.py").read_text()
    defaults = profile.get("train_defaults") or {}
    if defaults:
        train = set_knobs(train, dict(defaults))
    (dest / "train.py").write_text(train)
    (dest / "program.md").write_text(template.joinpath("program.md").read_text())


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


class Lab:
    """An open lab: its config, its ledger and the operations on both."""

    def __init__(self, path: Path) -> None:
        self.path = path
        loaded = load_lab_config(path)
        self.config: LabConfig = loaded.config
        self.config_uncommitted = loaded.uncommitted
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

    def head(self) -> str:
        return snapshots.head(self.path)

    def head_tree(self) -> str:
        """The incumbent's research identity (`nightlab.identity`): what its runs are keyed on."""
        return identity.of(self.path, "HEAD")

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
        source: str = "cli",
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
            UsageError: bad knob or value, unknown tier, empty description.
            DuplicateExperimentError: the measurement exists (names it and the way out).
        """
        if not description.strip():
            raise UsageError(
                'describe the experiment with `-m "..."`: the description is what the journal shows'
            )
        if repeats < 1:
            raise UsageError(f"`--repeats` must be at least 1, got `{repeats}`")
        if seed is not None and repeats > 1:
            raise UsageError("use either `--seed` or `--repeats`: repeats choose their own distinct seeds")
        tier = self.check_tier(tier or self.config.fleet.default_tier)
        self.check_running_tier(tier)
        if start_controller:
            from nightlab.fleet.daemon import running_pid
            from nightlab.fleet.health import check_capacity

            if running_pid(self.path) is None:
                check_capacity(self.config)  # refused before anything is queued
        files = dict(overrides or {})
        if sets:
            files.update(self._apply_sets(sets, files))
        self._check_prepared(tier)
        commit, _, parent = snapshots.create_snapshot(
            self.path, self.config.target.editable, overrides=files, message=description, base=base
        )
        # keyed on the files it runs under the configuration in force, not on the whole tree
        tree, epoch = identity.of(self.path, commit, config=self.config), identity.epoch_key(self.config)
        if seed is not None:
            seeds = [seed]
        elif repeats == 1 and not fresh_seeds:
            seeds = [0]
        else:
            used = self.ledger.seeds_used(tree, tier)
            seeds = [s for s in range(len(used) + repeats) if s not in used][:repeats]
        if not force:
            for s in seeds:
                prior = self.ledger.find_measured(tree, tier, s)
                if prior is not None:
                    done = prior.status.is_finished()
                    where = f"measured by {prior.id}" if done else f"{prior.status.label} as {prior.id}"
                    then = "" if done else f"wait for it with `nightlab wait {prior.id}`, or "
                    raise DuplicateExperimentError(
                        f"these files on tier `{tier}` with seed {s} are already {where} "
                        f"(`{prior.description}`); {then}use `--seed N` or `--repeats N` for a new "
                        "measurement, or `--force`"
                    )
        new = [
            NewExperiment(
                snapshot=commit,
                tree=tree,
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

        experiments = self.ledger.add_experiments(new, before_commit=make_refs)
        if start_controller:
            from nightlab.fleet.daemon import ensure_running

            ensure_running(self.path)
        return experiments

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

    def files_of(self, experiment_id: str) -> tuple[dict[str, bytes], str]:
        """The editable files of an experiment's snapshot, and the commit it was derived from."""
        exp = self.ledger.get(experiment_id)
        files = {}
        for name in self.config.target.editable:
            try:
                files[name] = snapshots.read_file(self.path, exp.snapshot, name)
            except NightlabError:
                continue
        return files, exp.parent or "HEAD"

    def _apply_sets(self, sets: dict[str, str], files: dict[str, bytes]) -> dict[str, bytes]:
        from nightlab.search.knobs import list_knobs, set_knobs

        remaining = dict(sets)
        out: dict[str, bytes] = {}
        sources: dict[str, str] = {}
        for name in self.config.target.editable:
            if name in files:
                text = files[name].decode()
            elif (self.path / name).is_file():
                text = (self.path / name).read_text()
            else:
                continue
            sources[name] = text
            mine = {k: v for k, v in remaining.items() if any(kn.name == k for kn in list_knobs(text))}
            if mine:
                out[name] = set_knobs(text, mine).encode()
                for k in mine:
                    del remaining[k]
        if remaining:
            first = next(iter(sources.values()), "")
            # set_knobs raises the helpful "unknown knob" error, with the closest names
            set_knobs(first, remaining)
        return out

    # ------------------------------------------------------------------ waiting

    def wait(
        self,
        ids: Iterable[str] | None = None,
        *,
        mode: str = "all",
        timeout: float | None = None,
        poll: float = 0.2,
        on_tick: Any = None,
    ) -> list[Experiment]:
        """Block until the experiments end (`mode` all) or one of them ends (`any`).

        With `ids` None: every experiment that is queued or running now.
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
        while True:
            exps = self.ledger.experiments(ids=watch) if watch else []
            done = [e for e in exps if e.status.is_finished()]
            if (mode == "any" and done) or len(done) == len(exps):
                return done if mode == "any" else exps
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

    def adopt(self, experiment_id: str, *, force: bool = False) -> str:
        """Make the experiment's snapshot the incumbent: commit its files on the lab's branch.

        Raises:
            UsageError: the experiment did not finish ok, or editable files have uncommitted edits.
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
        if exp.verdict not in (None, "keep", "baseline") and not force:
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
        self.ledger.mark_adopted(exp.id)
        return commit
