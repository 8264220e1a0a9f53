"""Creating a lab (`nightlab init`): the configuration, the target's files, git and the ledger.

Everything is built in a staging folder beside the destination and renamed into place at the
end, so a failed init leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightlab import snapshots
from nightlab.config import CONFIG_NAME, FOREIGN_TIMEOUT
from nightlab.errors import UsageError
from nightlab.ledger import open_ledger

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
    oversubscribe: bool = False  # accept CPU slots whose threads exceed the usable cores


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
    oversubscribe: bool = False,
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
        *(["oversubscribe = true"] if oversubscribe else []),
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
        UsageError: the directory is not empty, the target is missing, flags conflict, or the CPU
            slots oversubscribe this machine (`fleet/capacity.py`) without `oversubscribe`.
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
        oversubscribe=options.oversubscribe,
    )
    from nightlab.config import parse_config, tomllib
    from nightlab.fleet.capacity import check_capacity

    config = parse_config(tomllib.loads(config_text))  # a bug in rendering must not leave a broken lab
    check_capacity(config, init=True)  # the rule `submit` applies, said before anything is written

    staging = directory.parent / f".{directory.name}.nightlab-init-{os.getpid()}"
    try:
        if builtin:
            staging.mkdir(parents=True)
            _write_builtin_target(staging, profile_dict or {})
        else:
            shutil.copytree(options.target.resolve(), staging, ignore=_COPY_IGNORE)
        (staging / CONFIG_NAME).write_text(config_text)
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
