"""Dataset sources: where documents come from, and which are training and which validation.

- `climbmix[:N]`: autoresearch's parquet shards (`text` column) of
  karpathy/climbmix-400b-shuffle; training = shards 0..N-1 (N = 10 by default), validation
  = the pinned last shard, 6542, never used for training.
- `tinystories`: roneneldan/TinyStories, TinyStoriesV2-GPT4-{train,valid}.txt, documents
  separated by `<|endoftext|>`; the dataset's own train / valid files are the split.
- `local:PATH`: a file or a directory of `.txt`, `.jsonl` (a `text` field per line) and
  `.parquet` (a `text` column) files. A `.txt` file holds documents separated by
  `<|endoftext|>` lines, or, without any, by blank lines. A document goes to validation
  when the sha256 of its text falls in the lowest 10% (`LOCAL_VAL_PERCENT`): the split
  depends on nothing but the text, so it is the same on every machine and file order, and
  duplicates never straddle it.
- `demo`: the generated corpus of `harness.demo`; every tenth story is left out of training,
  and validation is as many stories drawn from a secret that `prepare` keeps in the data
  folder (`demo.demo_validation`): package code cannot regenerate them.

A `local:` dataset's files lie outside the data root, so `source_paths` names them for the
sandbox to hide: from them a run could rebuild the validation split with `is_local_val`.

Each source gives `Corpus.train()` / `Corpus.val()`: fresh iterators over document texts
(prepare reads the training split twice: once to train the tokenizer, once to tokenize).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nightlab.harness.cache import DataError, val_set_digest
from nightlab.harness.download import download_all, hub_url
from nightlab.harness.profiles import CLIMBMIX_MAX_TRAIN_SHARDS, parse_dataset

__all__ = ["Corpus", "open_source", "source_paths"]

CLIMBMIX_REPO = "datasets/karpathy/climbmix-400b-shuffle/resolve/main"
CLIMBMIX_VAL_SHARD = CLIMBMIX_MAX_TRAIN_SHARDS  # 6542, the last shard: pinned for validation
TINYSTORIES_REPO = "datasets/roneneldan/TinyStories/resolve/main"
TINYSTORIES_FILES = {"train": "TinyStoriesV2-GPT4-train.txt", "val": "TinyStoriesV2-GPT4-valid.txt"}
EOT = "<|endoftext|>"
LOCAL_VAL_PERCENT = 10
LOCAL_SUFFIXES = (".txt", ".jsonl", ".parquet")


@dataclass(frozen=True)
class Corpus:
    """A dataset's two splits as re-iterable streams of document texts, plus what to record about it."""

    train: Callable[[], Iterator[str]]
    val: Callable[[], Iterator[str]]
    info: dict[str, Any] = field(default_factory=dict)


class Reporter:
    """What `prepare` tells the progress display; this base class shows nothing (a null object)."""

    def files(self, total: int) -> None:
        """`total` files are about to be fetched."""

    def file_done(self, path: Path) -> None:
        """One file is complete."""

    def received(self, n: int) -> None:
        """`n` more bytes arrived."""

    def step(self, name: str) -> Any:
        """A step of unknown length begins; returns its handle."""

    def advance(self, step: Any, n: int = 1, *, text_bytes: int = 0) -> None:
        """`n` more items (documents) of `step` are done, covering `text_bytes` more bytes."""

    def finish(self, step: Any) -> None:
        """`step` is complete."""


def open_source(
    spec: str,
    downloads: Path,
    *,
    workers: int = 8,
    report: Reporter | None = None,
    val_secret: bytes | None = None,
) -> Corpus:
    """Fetch what `spec` needs into `downloads` and return its corpus.

    Args:
        val_secret: what the `demo` validation stories are drawn from (`prepare` keeps it in the
            data folder); None draws a fresh one, so nothing can reproduce them.

    Raises:
        DataError: a download failed, a file is corrupt, or local files are missing.
    """
    report = report or Reporter()
    source, arg = parse_dataset(spec)
    if source == "demo":
        return _demo(val_secret if val_secret is not None else os.urandom(32))
    if source == "local":
        return _local(Path(str(arg)))
    if source == "climbmix":
        return _climbmix(int(arg), downloads / "climbmix", workers, report)
    return _tinystories(downloads / "tinystories", workers, report)


# ---------------------------------------------------------------------------


def source_paths(spec: str) -> tuple[Path, ...]:
    """The files and folders outside the data root that `spec`'s documents are read from.

    A `local:` dataset's path and every file prepare reads under it (the sandbox resolves them, so
    a symlinked file is hidden where it points); nothing for the others, whose raw files live in
    the data root's `downloads/` or, for `demo`, are generated.
    """
    source, arg = parse_dataset(spec)
    if source != "local":
        return ()
    root = Path(str(arg))
    try:
        return (root, *_local_files(root))
    except DataError:  # gone since prepare: nothing left there to hide
        return ()


def _demo(secret: bytes) -> Corpus:
    from nightlab.harness.demo import DEMO_VAL_EVERY, demo_documents, demo_validation

    docs = demo_documents()
    val = demo_validation(secret)
    return Corpus(
        train=lambda: (d for i, d in enumerate(docs) if i % DEMO_VAL_EVERY != DEMO_VAL_EVERY - 1),
        val=lambda: iter(val),
        # a digest, not the secret: says which validation set a data folder holds (the manifest is readable)
        info={"documents": len(docs), "val_set": val_set_digest(secret)},
    )


def check_parquet(path: Path) -> None:
    """Raise DataError unless `path` is a readable parquet file with a string `text` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.ParquetFile(path).schema_arrow
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"`{path}` is not a valid parquet file (corrupt or truncated: {e})") from e
    kind = schema.field("text").type if "text" in schema.names else None
    if kind is None or not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"`{path}` has no string column `text`; columns: {', '.join(schema.names)}")


def _parquet_texts(path: Path) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_parquet(path)
    try:
        for batch in pq.ParquetFile(path).iter_batches(columns=["text"], batch_size=4096):
            yield from (t for t in batch.column(0).to_pylist() if t)
    except (pa.ArrowException, OSError) as e:
        raise DataError(
            f"`{path}` is corrupt ({e}); delete it and run `nightlab prepare` again to re-fetch it"
        ) from e


def _climbmix(n_shards: int, folder: Path, workers: int, report: Reporter) -> Corpus:
    def shard(i: int) -> Path:
        return folder / f"shard_{i:05d}.parquet"

    train_ids = list(range(n_shards))  # never includes CLIMBMIX_VAL_SHARD: parse_dataset caps N at 6542
    jobs = [
        (f"{hub_url()}/{CLIMBMIX_REPO}/{shard(i).name}", shard(i)) for i in [*train_ids, CLIMBMIX_VAL_SHARD]
    ]
    report.files(len(jobs))
    download_all(
        jobs, workers=workers, check=check_parquet, on_bytes=report.received, on_file=report.file_done
    )

    def texts(ids: Iterable[int]) -> Iterator[str]:
        for i in ids:
            yield from _parquet_texts(shard(i))

    return Corpus(
        train=lambda: texts(train_ids),
        val=lambda: texts([CLIMBMIX_VAL_SHARD]),
        info={"train_shards": n_shards, "val_shard": CLIMBMIX_VAL_SHARD},
    )


def _eot_documents(lines: Iterable[str]) -> Iterator[str]:
    """Documents separated by `<|endoftext|>` (anywhere in a line), stripped, empty ones dropped."""
    parts: list[str] = []
    for line in lines:
        while EOT in line:
            head, line = line.split(EOT, 1)
            parts.append(head)
            doc = "".join(parts).strip()
            if doc:
                yield doc
            parts = []
        parts.append(line)
    doc = "".join(parts).strip()
    if doc:
        yield doc


def _text_lines(path: Path) -> Iterator[str]:
    try:
        with open(path, encoding="utf-8") as f:
            yield from f
    except UnicodeDecodeError as e:
        raise DataError(f"`{path}` is not UTF-8 text ({e}); convert it or remove it") from e


def _tinystories(folder: Path, workers: int, report: Reporter) -> Corpus:
    paths = {split: folder / name for split, name in TINYSTORIES_FILES.items()}
    jobs = [(f"{hub_url()}/{TINYSTORIES_REPO}/{p.name}", p) for p in paths.values()]
    report.files(len(jobs))
    download_all(jobs, workers=workers, on_bytes=report.received, on_file=report.file_done)
    return Corpus(
        train=lambda: _eot_documents(_text_lines(paths["train"])),
        val=lambda: _eot_documents(_text_lines(paths["val"])),
        info={"files": list(TINYSTORIES_FILES.values())},
    )


# ---------------------------------------------------------------------------


def _local_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise DataError(f"dataset path `{root}` does not exist; pass an existing file or folder to `local:`")
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in LOCAL_SUFFIXES)


def _paragraphs(lines: Iterable[str]) -> Iterator[str]:
    para: list[str] = []
    for line in lines:
        if line.strip():
            para.append(line)
        elif para:
            yield "".join(para).strip()
            para = []
    if para:
        yield "".join(para).strip()


def _file_documents(path: Path) -> Iterator[str]:
    if path.suffix == ".parquet":
        yield from _parquet_texts(path)
    elif path.suffix == ".jsonl":
        for n, line in enumerate(_text_lines(path), 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
                if not isinstance(text, str):
                    raise TypeError("`text` is not a string")
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(
                    f"`{path}` line {n}: expected a JSON object with a string `text` ({e})"
                ) from e
            if text.strip():
                yield text
    else:
        has_eot = any(EOT in line for line in _text_lines(path))
        lines = _text_lines(path)
        yield from _eot_documents(lines) if has_eot else _paragraphs(lines)


def is_local_val(text: str) -> bool:
    """Whether a `local:` document belongs to the validation split (a function of its text only)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") % 100 < LOCAL_VAL_PERCENT


def _local(root: Path) -> Corpus:
    files = _local_files(root)
    if not files:
        raise DataError(
            f"no {', '.join(LOCAL_SUFFIXES)} files under `{root}`; add some or pick another dataset"
        )

    def docs(val: bool) -> Iterator[str]:
        for path in files:
            yield from (d for d in _file_documents(path) if is_local_val(d) == val)

    return Corpus(
        train=lambda: docs(False),
        val=lambda: docs(True),
        info={"files": [[str(p), p.stat().st_size] for p in files]},
    )
