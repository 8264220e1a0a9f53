"""`nightlab prepare`: download a profile's dataset, train its tokenizer, build its token cache.

Steps, each skipped when its output already exists (so an interrupted prepare resumes
where it stopped, and a finished one returns at once):

1. fetch the source (`sources.open_source`): parallel, retried, atomic downloads into
   `<data root>/downloads/`, shared by every profile that uses the same files;
2. train the BPE tokenizer on the training split only -> `tokenizer.tiktoken`;
3. tokenize each split once into the token cache (`cache.py` describes the layout), each
   document led by BOS, written to `.tmp` files and renamed when complete;
4. check the result: both splits non-empty, the validation split large enough to pack the
   profile's eval tokens;
5. write `manifest.json` last, atomically: from then on the directory counts as prepared.

The validation split never reaches training: the tokenizer and the training cache read
only `Corpus.train()`, and every source's split is fixed by the source itself. The `demo`
validation stories are drawn from `val.secret`, made here on first use (`os.urandom`) and kept
in the data folder, which the sandbox hides: package code alone cannot regenerate them. A
worker's set-up passes the lab's (`val_secret`), so all of a lab's machines share one set.

Usage:
    from nightlab.harness import data, profiles
    path = data.prepare(profiles.get_profile("cpu"))
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np

from nightlab.atomic import atomic_write_bytes
from nightlab.harness.cache import (
    MANIFEST_NAME,
    TOKENIZER_NAME,
    VAL_SECRET_NAME,
    DataError,
    DataMismatchError,
    DataNotPreparedError,
    folder_val_secret,
    load_manifest,
    open_split,
    split_paths,
)
from nightlab.harness.download import _file_lock
from nightlab.harness.loader import DEFAULT_BUFFER_SIZE, BestFitPacker, _cache_docs
from nightlab.harness.profiles import (
    DATA_FORMAT_VERSION,
    SPECIAL_TOKENS,
    SPLIT_PATTERN,
    TOKENIZER_VERSION,
    Profile,
    fingerprint,
    parse_dataset,
)
from nightlab.harness.profiles import data_dir as default_data_dir
from nightlab.harness.sources import Reporter, open_source
from nightlab.harness.tokenizer import Tokenizer, read_ranks, train_tokenizer

__all__ = ["DataError", "DataMismatchError", "DataNotPreparedError", "load_manifest", "prepare"]

_ENCODE_BATCH = 1024  # documents per tiktoken batch call


class _RichReporter(Reporter):
    """Progress on stderr with rich: downloaded files and megabytes, then one line per step."""

    def __init__(self, progress: Any):
        self.progress = progress
        self.download = None
        self.mb: dict[Any, float] = {}

    def files(self, total: int) -> None:
        self.download = self.progress.add_task("download", total=total, mb=0.0)
        self.mb[self.download] = 0.0

    def file_done(self, path: Path) -> None:
        self.progress.advance(self.download)

    def received(self, n: int) -> None:
        self.mb[self.download] += n / 1e6  # a race between download threads only blurs the display
        self.progress.update(self.download, mb=self.mb[self.download])

    def step(self, name: str) -> Any:
        task = self.progress.add_task(name, total=None, mb=0.0)
        self.mb[task] = 0.0
        return task

    def advance(self, step: Any, n: int = 1, *, text_bytes: int = 0) -> None:
        self.mb[step] += text_bytes / 1e6
        self.progress.update(step, advance=n, mb=self.mb[step])

    def finish(self, step: Any) -> None:
        done = next(t.completed for t in self.progress.tasks if t.id == step)
        self.progress.update(step, total=done)


@contextlib.contextmanager
def _reporter(show: bool) -> Iterator[Reporter]:
    if not show:
        yield Reporter()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description:<16}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[mb]:.1f} MB"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        yield _RichReporter(progress)


# ---------------------------------------------------------------------------


def _batched(texts: Iterator[str], n: int) -> Iterator[list[str]]:
    while batch := list(islice(texts, n)):
        yield batch


def _tokenize_split(
    tok: Tokenizer, texts: Iterator[str], out: Path, split: str, workers: int, reporter: Reporter
) -> dict[str, Any]:
    """Tokenize one split into `<split>.tokens.bin` / `.offsets.bin`; returns its manifest entry."""
    dtype = np.dtype("<u2") if tok.vocab_size <= 1 << 16 else np.dtype("<u4")
    tok_path, off_path = split_paths(out, split)
    tok_tmp, off_tmp = (p.with_name(p.name + ".tmp") for p in (tok_path, off_path))
    n_docs = n_tokens = n_bytes = 0
    task = reporter.step(f"tokenize {split}")
    with open(tok_tmp, "wb") as ft, open(off_tmp, "wb") as fo:
        fo.write(np.zeros(1, dtype="<i8").tobytes())
        for batch in _batched(texts, _ENCODE_BATCH):
            ids = tok.encode_batch(batch, prepend_bos=True, num_threads=workers)
            lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
            ft.write(np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum())).tobytes())
            fo.write((n_tokens + np.cumsum(lengths)).astype("<i8").tobytes())
            n_docs += len(ids)
            n_tokens += int(lengths.sum())
            text_bytes = sum(len(t.encode("utf-8")) for t in batch)
            n_bytes += text_bytes
            reporter.advance(task, len(batch), text_bytes=text_bytes)
        for f in (ft, fo):
            f.flush()
            os.fsync(f.fileno())
    reporter.finish(task)
    if n_docs == 0:
        for p in (tok_tmp, off_tmp):
            p.unlink()
        raise DataError(f"the `{split}` split of this dataset is empty: no documents with any text")
    os.replace(tok_tmp, tok_path)
    os.replace(off_tmp, off_path)
    return {"docs": n_docs, "tokens": n_tokens, "text_bytes": n_bytes, "dtype": dtype.str}


def _check_val_size(out: Path, manifest: dict[str, Any], profile: Profile) -> None:
    """Fail now, not in every run, when the validation split cannot fill the profile's eval rows."""
    split = open_split(out, "val", manifest)
    need = math.ceil(profile.eval_tokens / profile.seq_len)
    packer = BestFitPacker(
        _cache_docs(split.tokens, split.offsets, None), profile.seq_len + 1, DEFAULT_BUFFER_SIZE
    )
    try:
        for done in range(0, need, 256):
            packer.next_batch(min(256, need - done), dtype=np.uint32)
    except EOFError:
        raise DataError(
            f"the validation split ({split.n_tokens} tokens) is too small for eval_tokens "
            f"`{profile.eval_tokens}` at seq_len {profile.seq_len} ({need} packed rows); use more data "
            "or a profile with fewer eval tokens"
        ) from None


def _split_entry(out: Path, split: str) -> dict[str, Any] | None:
    """The recorded entry of an already tokenized split, if its files are complete."""
    marker = out / f"{split}.json"
    if not marker.exists():
        return None
    entry = json.loads(marker.read_text())
    tok_path, off_path = split_paths(out, split)
    sizes_ok = (
        tok_path.exists()
        and off_path.exists()
        and tok_path.stat().st_size == entry["tokens"] * np.dtype(entry["dtype"]).itemsize
        and off_path.stat().st_size == (entry["docs"] + 1) * 8
    )
    return entry if sizes_ok else None


def _take_val_secret(out: Path, dataset: str, secret: bytes | None) -> None:
    """Make the data folder hold `secret` (the lab's, handed to a worker by its set-up).

    A folder prepared with another secret keeps its tokenizer and training split; its validation
    split and manifest go, so this prepare tokenizes the lab's validation stories.
    """
    if secret is None or parse_dataset(dataset)[0] != "demo":
        return
    if len(secret) < 16:
        raise DataError(f"the validation secret needs 16 bytes or more, got {len(secret)}")
    if folder_val_secret(out, make=False) == secret:
        return
    for name in (MANIFEST_NAME, "val.json", *(p.name for p in split_paths(out, "val"))):
        (out / name).unlink(missing_ok=True)
    atomic_write_bytes(out / VAL_SECRET_NAME, secret, durable=True)


def _check_local_unchanged(manifest: dict[str, Any], profile: Profile) -> None:
    source, arg = parse_dataset(profile.dataset)
    if source != "local":
        return
    from nightlab.harness.sources import _local_files

    now = [[str(p), p.stat().st_size] for p in _local_files(Path(str(arg)))]
    if now != manifest["source"].get("files"):
        raise DataError(
            f"the files under `{arg}` changed since `nightlab prepare`; results would not be comparable: "
            "restore them, or make a new lab for the new data"
        )


def prepare(
    profile: Profile,
    *,
    data_dir: Path | None = None,
    progress: bool = True,
    workers: int = 8,
    val_secret: bytes | None = None,
) -> Path:
    """Download, tokenize and cache the profile's dataset; idempotent and resumable.

    Args:
        profile: the lab's profile.
        data_dir: where to put the result (default `profiles.data_dir(profile)`); downloads
            go to `downloads/` beside it.
        progress: whether or not to show a rich progress display on stderr.
        workers: parallel downloads and tokenizer threads.
        val_secret: `demo` only: the lab's validation secret (a worker's set-up passes the
            controller's); a folder holding another one has its validation split made again.
            None keeps the folder's own, made on first use.

    Returns:
        The prepared data directory.

    Raises:
        DataMismatchError: `data_dir` holds data prepared for another profile.
        DataError: a download failed (offline: the message names `--dataset demo` and
            `local:`), a file is corrupt, the dataset is empty or too small.
    """
    out = Path(data_dir) if data_dir is not None else default_data_dir(profile)
    if val_secret is None or folder_val_secret(out, make=False) == val_secret:
        with contextlib.suppress(DataNotPreparedError):
            _check_local_unchanged(load_manifest(out, profile=profile), profile)
            return out
    out.mkdir(parents=True, exist_ok=True)
    with _file_lock(out / ".lock"):
        _take_val_secret(out, profile.dataset, val_secret)
        with contextlib.suppress(DataNotPreparedError):  # another process finished while we waited
            load_manifest(out, profile=profile)
            return out
        started = time.time()
        with _reporter(progress) as reporter:
            corpus = open_source(
                profile.dataset,
                out.parent / "downloads",
                workers=workers,
                report=reporter,
                val_secret=folder_val_secret(out) if parse_dataset(profile.dataset)[0] == "demo" else None,
            )

            if (out / TOKENIZER_NAME).exists():
                tok = Tokenizer(read_ranks(out / TOKENIZER_NAME))
            else:
                task = reporter.step("train tokenizer")
                tok = train_tokenizer(corpus.train(), profile.vocab_size)
                tok.save(out / TOKENIZER_NAME)
                reporter.advance(task)
                reporter.finish(task)
            if tok.vocab_size != profile.vocab_size:
                raise DataError(
                    f"`{out / TOKENIZER_NAME}` has {tok.vocab_size} tokens, the profile wants "
                    f"{profile.vocab_size}; delete `{out}` and run `nightlab prepare` again"
                )
            splits = {}
            for split, texts in (("train", corpus.train), ("val", corpus.val)):
                entry = _split_entry(out, split)
                if entry is None:
                    entry = _tokenize_split(tok, texts(), out, split, workers, reporter)
                    atomic_write_bytes(out / f"{split}.json", json.dumps(entry).encode(), durable=True)
                splits[split] = entry
        manifest = {
            "fingerprint": fingerprint(profile),
            "format": DATA_FORMAT_VERSION,
            "profile": profile.to_dict(),
            "dataset": profile.dataset,
            "source": corpus.info,
            "tokenizer": {
                "file": TOKENIZER_NAME,
                "version": TOKENIZER_VERSION,
                "vocab_size": tok.vocab_size,
                "bos_id": tok.bos_id,
                "pattern": SPLIT_PATTERN,
                "special_tokens": list(SPECIAL_TOKENS),
            },
            "splits": splits,
            "prepare_seconds": round(time.time() - started, 1),
        }
        _check_val_size(out, manifest, profile)
        atomic_write_bytes(out / MANIFEST_NAME, json.dumps(manifest, indent=2).encode())
    return out
