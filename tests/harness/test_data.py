"""`prepare` for the downloaded and local sources, and every bad-input path.

climbmix and TinyStories are served by the `hub` fixture on 127.0.0.1 (tiny fake shards
with the real names and URL layout); nothing reaches the internet.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nightlab.harness import download
from nightlab.harness.cache import DataError, DataNotPreparedError, load_manifest, open_split
from nightlab.harness.data import prepare
from nightlab.harness.demo import demo_documents
from nightlab.harness.loader import train_batches
from nightlab.harness.profiles import PROFILES, Profile, get_profile
from nightlab.harness.sources import CLIMBMIX_REPO, TINYSTORIES_REPO, is_local_val, open_source, source_paths
from nightlab.harness.tokenizer import Tokenizer

DOCS = demo_documents()[:600]


def tiny(dataset: str, **changes) -> Profile:
    """A profile small enough to prepare in well under a second."""
    base = Profile("tiny", dataset, vocab_size=300, seq_len=64, budget_seconds=1.0, eval_tokens=256)
    return dataclasses.replace(base, **changes)


def parquet_bytes(texts: list[str], tmp_path: Path) -> bytes:
    path = tmp_path / "tmp.parquet"
    pq.write_table(pa.table({"text": texts}), path)
    return path.read_bytes()


def decoded_docs(data: Path, split: str) -> list[str]:
    tok, cache = Tokenizer.load(data), open_split(data, split)
    return [tok.decode(cache.doc(i)[1:]) for i in range(cache.n_docs)]


# ---------------------------------------------------------------------------
# local:PATH


def write_local(root: Path) -> None:
    root.mkdir()
    (root / "a.txt").write_text("<|endoftext|>".join(DOCS[:200]))
    (root / "b.jsonl").write_text(
        "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS[200:400]))
    )
    pq.write_table(pa.table({"text": DOCS[400:600]}), root / "c.parquet")
    (root / "notes.md").write_text("ignored: not .txt/.jsonl/.parquet")


def test_local_sources_and_split(tmp_path: Path):
    write_local(tmp_path / "texts")
    data = prepare(tiny(f"local:{tmp_path / 'texts'}"), data_dir=tmp_path / "d", progress=False, workers=2)
    train, val = decoded_docs(data, "train"), decoded_docs(data, "val")
    expected = [d.strip() for d in DOCS[:200]] + DOCS[200:]  # .txt documents are stripped, others verbatim
    assert sorted(train + val) == sorted(expected)
    assert val == [d for d in expected if is_local_val(d)] and 30 < len(val) < 100
    files = load_manifest(data)["source"]["files"]
    assert [Path(f).name for f, _ in files] == ["a.txt", "b.jsonl", "c.parquet"]


def test_source_paths_name_every_file_a_local_split_is_read_from(tmp_path: Path):
    """What the sandbox hides (`SandboxPlan.hidden`): the named path and each file prepare reads."""
    write_local(tmp_path / "texts")
    (tmp_path / "outside.txt").write_text(DOCS[0])
    (tmp_path / "texts" / "linked.txt").symlink_to(tmp_path / "outside.txt")
    root = tmp_path / "texts"
    assert source_paths(f"local:{root}") == (
        root,
        *(root / n for n in ("a.txt", "b.jsonl", "c.parquet", "linked.txt")),
    )
    assert source_paths(f"local:{root / 'a.txt'}") == (root / "a.txt", root / "a.txt")
    assert source_paths(f"local:{tmp_path / 'gone'}") == ()  # removed since prepare: nothing to hide
    assert source_paths("demo") == source_paths("tinystories") == ()  # in the data root, or generated


def test_local_split_depends_on_text_only(tmp_path: Path):
    (tmp_path / "one.txt").write_text("\n<|endoftext|>\n".join(reversed(DOCS[:100])))
    val = list(open_source(f"local:{tmp_path / 'one.txt'}", tmp_path).val())
    assert set(val) == {d.strip() for d in DOCS[:100] if is_local_val(d.strip())}


def test_local_plain_text_splits_on_blank_lines(tmp_path: Path):
    (tmp_path / "p.txt").write_text("First para\nstill first.\n\n\nSecond.\n  \nThird\n")
    corpus = open_source(f"local:{tmp_path / 'p.txt'}", tmp_path)
    assert sorted([*corpus.train(), *corpus.val()]) == ["First para\nstill first.", "Second.", "Third"]


def test_local_files_changed_after_prepare(tmp_path: Path):
    write_local(tmp_path / "texts")
    profile = tiny(f"local:{tmp_path / 'texts'}")
    prepare(profile, data_dir=tmp_path / "d", progress=False, workers=2)
    (tmp_path / "texts" / "a.txt").write_text("something else entirely")
    with pytest.raises(DataError, match="changed since `nightlab prepare`"):
        prepare(profile, data_dir=tmp_path / "d", progress=False)


def test_corrupt_local_parquet(tmp_path: Path):
    (tmp_path / "texts").mkdir()
    good = parquet_bytes(DOCS[:50], tmp_path)
    (tmp_path / "texts" / "bad.parquet").write_bytes(good[: len(good) // 2])
    with pytest.raises(DataError, match=r"bad\.parquet` is not a valid parquet file"):
        prepare(tiny(f"local:{tmp_path / 'texts'}"), data_dir=tmp_path / "d", progress=False)
    assert not (tmp_path / "d" / "manifest.json").exists()


def test_bad_jsonl_line(tmp_path: Path):
    (tmp_path / "x.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match=r"x\.jsonl` line 2"):
        prepare(tiny(f"local:{tmp_path / 'x.jsonl'}"), data_dir=tmp_path / "d", progress=False)


def test_missing_and_empty_datasets(tmp_path: Path):
    with pytest.raises(DataError, match="does not exist"):
        prepare(tiny(f"local:{tmp_path / 'nowhere'}"), data_dir=tmp_path / "d", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no .txt, .jsonl, .parquet files"):
        prepare(tiny(f"local:{tmp_path / 'empty'}"), data_dir=tmp_path / "d", progress=False)
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.txt").write_text("\n\n   \n")
    with pytest.raises(DataError, match="empty|only supports"):
        prepare(tiny(f"local:{tmp_path / 'blank'}"), data_dir=tmp_path / "d", progress=False)


def test_validation_split_too_small_for_eval(tmp_path: Path):
    write_local(tmp_path / "texts")
    profile = tiny(f"local:{tmp_path / 'texts'}", eval_tokens=10**7)
    with pytest.raises(DataError, match="too small for eval_tokens `10000000`"):
        prepare(profile, data_dir=tmp_path / "d", progress=False)
    with pytest.raises(DataNotPreparedError):
        load_manifest(tmp_path / "d")


def test_never_prepared(tmp_path: Path):
    with pytest.raises(DataNotPreparedError, match=r"no prepared data in .*run `nightlab prepare`"):
        load_manifest(tmp_path)


def test_damaged_manifest(tmp_path: Path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="damaged"):
        load_manifest(tmp_path)


def test_truncated_token_cache(cpu_data: Path, tmp_path: Path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in cpu_data.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    tokens = (copy / "train.tokens.bin").read_bytes()
    (copy / "train.tokens.bin").write_bytes(tokens[:-100])
    with pytest.raises(DataError, match=r"train\.tokens\.bin` is .* bytes, expected"):
        next(train_batches(copy, 2, 256, "cpu"))
    (copy / "train.tokens.bin").write_bytes(tokens[2:] + tokens[:2])  # right size, shifted content
    with pytest.raises(DataError, match="does not start with BOS"):
        open_split(copy, "train")


# ---------------------------------------------------------------------------
# climbmix and TinyStories from the local hub


def test_climbmix(hub, tmp_path: Path):
    hub.add(f"{CLIMBMIX_REPO}/shard_00000.parquet", parquet_bytes(DOCS[:500], tmp_path))
    hub.add(f"{CLIMBMIX_REPO}/shard_00001.parquet", parquet_bytes(DOCS[500:550], tmp_path))
    hub.add(f"{CLIMBMIX_REPO}/shard_06542.parquet", parquet_bytes(DOCS[550:], tmp_path))
    data = prepare(tiny("climbmix:1"), data_dir=tmp_path / "root" / "fp", progress=False, workers=2)
    assert decoded_docs(data, "val") == DOCS[550:]  # the pinned last shard
    assert decoded_docs(data, "train") == DOCS[:500]
    downloaded = sorted(p.name for p in (tmp_path / "root" / "downloads" / "climbmix").glob("*.parquet"))
    assert downloaded == ["shard_00000.parquet", "shard_06542.parquet"]
    # a second profile on the same source reuses the downloads
    n = len(hub.requests)
    prepare(tiny("climbmix:1", vocab_size=320), data_dir=tmp_path / "root" / "fp2", progress=False)
    assert len(hub.requests) == n


def test_corrupt_climbmix_shard(hub, tmp_path: Path):
    hub.add(f"{CLIMBMIX_REPO}/shard_00000.parquet", parquet_bytes(DOCS[:500], tmp_path))
    hub.add(f"{CLIMBMIX_REPO}/shard_06542.parquet", parquet_bytes(DOCS[550:], tmp_path))
    hub.faults[f"{CLIMBMIX_REPO}/shard_06542.parquet"] = ["garbage"] * 10
    with pytest.raises(DataError, match=r"shard_06542\.parquet.*not a valid parquet file"):
        prepare(tiny("climbmix:1"), data_dir=tmp_path / "root" / "fp", progress=False)
    assert not (tmp_path / "root" / "downloads" / "climbmix" / "shard_06542.parquet").exists()


def test_damaged_shard_on_disk(hub, tmp_path: Path):
    shards = tmp_path / "root" / "downloads" / "climbmix"
    shards.mkdir(parents=True)
    (shards / "shard_00000.parquet").write_bytes(b"PAR1 not really")
    (shards / "shard_06542.parquet").write_bytes(parquet_bytes(DOCS[550:], tmp_path))
    with pytest.raises(DataError, match=r"shard_00000\.parquet` is not a valid parquet"):
        prepare(tiny("climbmix:1"), data_dir=tmp_path / "root" / "fp", progress=False)


def test_tinystories(hub, tmp_path: Path):
    hub.add(f"{TINYSTORIES_REPO}/TinyStoriesV2-GPT4-train.txt", "\n<|endoftext|>\n".join(DOCS[:500]).encode())
    hub.add(f"{TINYSTORIES_REPO}/TinyStoriesV2-GPT4-valid.txt", "\n<|endoftext|>\n".join(DOCS[500:]).encode())
    data = prepare(tiny("tinystories"), data_dir=tmp_path / "fp", progress=False, workers=2)
    assert decoded_docs(data, "val") == [d.strip() for d in DOCS[500:]]
    assert load_manifest(data)["splits"]["train"]["docs"] == 500


def test_offline_prepare_names_the_offline_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("NIGHTLAB_HUB_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(download, "BACKOFF", 0.001)
    monkeypatch.setattr(download, "RETRIES", 1)
    with pytest.raises(DataError, match=r"--dataset demo.*--dataset local:PATH"):
        prepare(PROFILES["small-gpu"], data_dir=tmp_path / "fp", progress=False)


def test_budget_does_not_move_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_data: Path):
    from nightlab.harness.profiles import data_dir

    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(cpu_data.parent))
    assert data_dir(get_profile("cpu", budget=600)) == cpu_data


def test_parquet_without_text_column(tmp_path: Path):
    pq.write_table(pa.table({"body": DOCS[:20]}), tmp_path / "x.parquet")
    with pytest.raises(DataError, match="has no string column `text`; columns: body"):
        prepare(tiny(f"local:{tmp_path / 'x.parquet'}"), data_dir=tmp_path / "d", progress=False)
