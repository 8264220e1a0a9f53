"""Red team, data: edits of train.py that go after the text the validation split is made of.

Each attack reads what a run could rebuild the validation split from (a `local:` corpus, the raw
downloads, the data root, the demo corpus's secret, the demo generator) and writes what it got
into its work folder. It passes only when the attack got nothing and the run is not better than
the honest one. The corpora and the data root lie inside the lab here, which the sandbox shows
the run, so only the hiding under test stands between the attack and the text (pytest's tmp
folders are under /tmp, which the sandbox replaces anyway).
Run: .venv/bin/python -m pytest -q tests/integrity/test_red_team_data.py (a run each, ~10-30 s).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from redteam import PROFILE, edit, needs_sandbox, template
from test_red_team import BATCHES, not_better

from nightlab.harness.demo import demo_validation
from nightlab.harness.profiles import fingerprint

# the harness's own reader and split rule, applied to the dataset nightlab.toml names
STEAL_LOCAL_SPLIT = BATCHES + (
    "\nimport pathlib, tomllib\n"
    "from nightlab.harness.sources import open_source\n"
    "dataset = tomllib.loads(pathlib.Path('nightlab.toml').read_text())['profile']['dataset']\n"
    "try:\n"
    "    stolen = list(open_source(dataset, pathlib.Path('no-downloads')).val())\n"
    "except Exception as e:\n"
    "    print('could not steal:', type(e).__name__, e)\n"
    "    stolen = []\n"
    "open('stolen.txt', 'w').write(str(len(stolen)))"
)


def _data_root_in_lab(lab: Path, data_root: Path) -> dict[str, str]:
    """Put a (hard-linked) copy of the data root inside `lab`, named through a symlink; returns the env."""
    shutil.copytree(data_root, lab / "nl-data", copy_function=os.link)
    (lab / "data-link").symlink_to(lab / "nl-data")
    return {"NIGHTLAB_DATA_DIR": str(lab / "data-link")}


@needs_sandbox
def test_reading_the_local_corpus_file_named_in_nightlab_toml_gets_nothing(attack, local_labs, honest_local):
    """Protection: the sandbox hides every file a `local:` source names (`sources.source_paths`)."""
    run = attack(edit(template(), BATCHES, STEAL_LOCAL_SPLIT), local=local_labs["file"])
    assert (run.work / "stolen.txt").read_text() == "0", run.log[-2000:]
    assert "could not steal" in run.log
    not_better(run, honest_local("file"))


@needs_sandbox
def test_reading_the_local_corpus_folder_named_in_nightlab_toml_gets_nothing(
    attack, local_labs, honest_local
):
    """Protection: a `local:` folder becomes an empty tmpfs, where it really is (the name is a symlink)."""
    run = attack(edit(template(), BATCHES, STEAL_LOCAL_SPLIT), local=local_labs["folder"])
    assert (run.work / "stolen.txt").read_text() == "0", run.log[-2000:]
    not_better(run, honest_local("folder"))


@needs_sandbox
def test_following_symlinks_to_the_local_corpus_gets_nothing(attack, local_labs, honest_local):
    """Protection: hidden paths are resolved, so a corpus file linked from elsewhere is hidden where it lies."""
    walk = BATCHES + (
        "\nimport pathlib\n"
        "from nightlab.harness.sources import _file_documents, is_local_val\n"
        "seen, stolen = set(), 0\n"
        "for root, dirs, files in os.walk(os.environ['NIGHTLAB_LAB'], followlinks=True):\n"
        "    dirs[:] = [d for d in dirs if d != '.nightlab']\n"
        "    for name in files:\n"
        "        real = pathlib.Path(root, name).resolve()\n"
        "        if real.suffix in ('.txt', '.jsonl') and real not in seen:\n"
        "            seen.add(real)\n"
        "            try:\n"
        "                stolen += sum(is_local_val(d) for d in _file_documents(real))\n"
        "            except OSError as e:\n"
        "                print('could not read', real, type(e).__name__)\n"
        "open('stolen.txt', 'w').write(str(stolen))"
    )
    run = attack(edit(template(), BATCHES, walk), local=local_labs["folder"])
    assert (run.work / "stolen.txt").read_text() == "0", run.log[-2000:]
    assert "extra/part2.jsonl PermissionError" in run.log  # found through the symlink, and unreadable
    not_better(run, honest_local("folder"))


@needs_sandbox
def test_reading_the_raw_download_cache_gets_nothing(attack, honest, data_root, tmp_path):
    """Protection: the data root, raw downloads included, is a tmpfs where it really is (here: in the lab)."""
    env = _data_root_in_lab(tmp_path / "lab0", data_root)
    steal = BATCHES + (
        "\nimport pathlib\n"
        "from nightlab.harness.sources import TINYSTORIES_FILES\n"
        "stolen = 0\n"
        "for downloads in (data.parent / 'downloads', pathlib.Path(os.path.realpath(data.parent)) / 'downloads'):\n"
        "    for path in [downloads / 'tinystories' / TINYSTORIES_FILES['val'], *downloads.rglob('*')]:\n"
        "        try:\n"
        "            stolen += len(path.read_bytes()) if path.is_file() else 0\n"
        "        except OSError:\n"
        "            pass\n"
        "open('stolen.txt', 'w').write(str(stolen))"
    )
    run = attack(edit(template(), BATCHES, steal), env=env)
    assert (run.work / "stolen.txt").read_text() == "0", run.log[-2000:]
    not_better(run, honest)


@needs_sandbox
def test_reading_the_hidden_data_root_and_the_demo_secret_gets_nothing(attack, honest, data_root, tmp_path):
    """Protection: only the profile's manifest and tokenizer are bound back into the data root; no token file, no secret."""
    env = _data_root_in_lab(tmp_path / "lab0", data_root)
    steal = BATCHES + (
        "\nimport pathlib\n"
        "from nightlab.harness.demo import demo_validation\n"
        "mine = {'manifest.json', 'tokenizer.tiktoken'}\n"
        "stolen = regenerated = 0\n"
        "for path in pathlib.Path(os.path.realpath(data.parent)).rglob('*'):\n"
        "    try:\n"
        "        if path.is_file() and not (path.parent.name == data.name and path.name in mine):\n"
        "            stolen += len(path.read_bytes())\n"
        "    except OSError:\n"
        "        pass\n"
        "try:\n"
        "    regenerated = len(demo_validation((data / 'val.secret').read_bytes()))\n"
        "except (OSError, ValueError) as e:\n"
        "    print('no secret:', type(e).__name__)\n"
        "open('stolen.txt', 'w').write(f'{stolen} {regenerated}')"
    )
    run = attack(edit(template(), BATCHES, steal), env=env)
    assert (run.work / "stolen.txt").read_text() == "0 0", run.log[-2000:]
    not_better(run, honest)


def test_regenerating_the_demo_corpus_from_package_code_misses_every_validation_story(
    attack, honest, data_root
):
    """Protection: demo validation stories are drawn from the data folder's secret, not from code.

    Holds with or without bubblewrap: the package can regenerate every story it trains on, and none
    it is scored on (unsandboxed, the secret itself is readable: see docs/integrity.md).
    """
    regenerate = BATCHES + (
        "\nimport hashlib\n"
        "from nightlab.harness.demo import demo_documents\n"
        "open('regenerated.txt', 'w').write('\\n'.join(hashlib.sha256(d.encode()).hexdigest() "
        "for d in demo_documents()))"
    )
    run = attack(edit(template(), BATCHES, regenerate))
    regenerated = set((run.work / "regenerated.txt").read_text().split())
    assert len(regenerated) > 5000, run.log[-2000:]
    secret = (data_root / fingerprint(PROFILE) / "val.secret").read_bytes()
    validation = {hashlib.sha256(d.encode()).hexdigest() for d in demo_validation(secret)}
    assert not regenerated & validation
    not_better(run, honest)
