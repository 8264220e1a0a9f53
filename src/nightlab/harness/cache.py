"""The prepared-data directory: manifest, token cache files, and the errors for a bad one.

`nightlab prepare` tokenizes every document once; runs only memory-map the result, so no
run spends its budget re-tokenizing text every run shares. Layout of one data directory
(`profiles.data_dir(profile)`):

    manifest.json         written last, atomically: its presence means "prepared and complete"
    tokenizer.tiktoken    BPE merges, one `base64(token bytes) rank` line each (tiktoken's format)
    train.tokens.bin      every training document's token ids, concatenated; each starts with BOS
    train.offsets.bin     int64 [n_docs + 1]: document i is tokens[offsets[i]:offsets[i + 1]]
    val.tokens.bin        the same for the validation split
    val.offsets.bin
    val.secret            `demo` only: 32 random bytes the validation stories are drawn from

The sandbox shows a run only the manifest, the tokenizer and the `train.*` files of this folder.

Token ids are uint16 when the vocab fits (every built-in profile: 2 bytes a token, the
h100 cache of 10 climbmix shards is ~1 GB) and uint32 otherwise; both are little-endian raw
arrays whose dtype and length the manifest records. Raw files instead of `.npy` let prepare
stream tokens to disk without knowing the final length, and the recorded length turns a
truncated file into a clear error instead of a shorter dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightlab.errors import NightlabError
from nightlab.harness.profiles import Profile, fingerprint

if TYPE_CHECKING:  # numpy is imported where a split is opened: the supervisor imports this module
    import numpy as np  # before every run (`sources.source_paths`), and numpy costs it ~0.1 s

__all__ = [
    "MANIFEST_NAME",
    "TOKENIZER_NAME",
    "VAL_SECRET_NAME",
    "DataError",
    "DataMismatchError",
    "DataNotPreparedError",
    "TokenSplit",
    "folder_val_secret",
    "load_manifest",
    "open_split",
    "split_paths",
    "val_set_digest",
]

MANIFEST_NAME = "manifest.json"
TOKENIZER_NAME = "tokenizer.tiktoken"
VAL_SECRET_NAME = "val.secret"
SPLITS = ("train", "val")


class DataError(NightlabError):
    """Data could not be downloaded, read or cached: a corrupt shard, an empty dataset, a bad cache."""


class DataNotPreparedError(DataError):
    """The profile's data directory holds no complete `nightlab prepare` output."""


class DataMismatchError(DataError):
    """The data directory was prepared for another profile (another fingerprint)."""


def val_set_digest(secret: bytes) -> str:
    """Which validation set `secret` draws (the manifest's `source.val_set`): a digest, never the secret."""
    return hashlib.sha256(b"demo-val:" + secret).hexdigest()[:16]


def folder_val_secret(data_dir: Path, *, make: bool = True) -> bytes | None:
    """The data folder's `val.secret` (`demo` only), made on first use when `make`; None when absent.

    The folder on the controller's machine holds the lab's: set-up hands it to every worker
    (`fleet.sky_task`), so all of a lab's machines score on one validation set.
    """
    path = Path(data_dir) / VAL_SECRET_NAME
    if not path.exists():
        if not make:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        # made whole and linked into place: of two processes making it at once (a controller and
        # `nightlab prepare`), the first one's stands and both read it
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(os.urandom(32))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_bytes()


def load_manifest(data_dir: Path, *, profile: Profile | None = None) -> dict[str, Any]:
    """Read a prepared data directory's manifest.

    Args:
        data_dir: the directory `prepare` filled.
        profile: when given, the manifest's fingerprint must be this profile's.

    Returns:
        The manifest: `fingerprint`, `profile`, `tokenizer`, `splits`, `source`, ...

    Raises:
        DataNotPreparedError: no manifest (never prepared, or prepare was interrupted).
        DataMismatchError: the data belongs to another profile.
        DataError: the manifest is unreadable.
    """
    path = Path(data_dir) / MANIFEST_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataNotPreparedError(
            f"no prepared data in `{data_dir}`; run `nightlab prepare` in the lab first"
        ) from None
    try:
        manifest = json.loads(text)
        manifest["fingerprint"]  # noqa: B018 - the one key every reader relies on
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(
            f"`{path}` is damaged ({e}); delete `{data_dir}` and run `nightlab prepare` again"
        ) from e
    if profile is not None and manifest["fingerprint"] != fingerprint(profile):
        raise DataMismatchError(
            f"data in `{data_dir}` was prepared for fingerprint `{manifest['fingerprint']}` "
            f"(profile `{manifest.get('profile', {}).get('name', '?')}`), but profile `{profile.name}` "
            f"needs `{fingerprint(profile)}`; run `nightlab prepare` for this lab"
        )
    return manifest


def split_paths(data_dir: Path, split: str) -> tuple[Path, Path]:
    """(tokens file, offsets file) of one split."""
    return Path(data_dir) / f"{split}.tokens.bin", Path(data_dir) / f"{split}.offsets.bin"


@dataclass(frozen=True)
class TokenSplit:
    """One memory-mapped split of the token cache.

    Attributes:
        tokens: [n_tokens] uint16/uint32, every document concatenated, each starting with BOS.
        offsets: [n_docs + 1] int64; document i is `tokens[offsets[i]:offsets[i + 1]]`.
    """

    tokens: np.ndarray
    offsets: np.ndarray

    @property
    def n_docs(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def doc(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


def open_split(data_dir: Path, split: str, manifest: dict[str, Any] | None = None) -> TokenSplit:
    """Memory-map one split of the token cache and check it against the manifest.

    The checks (sizes, monotonic offsets, BOS at every document start, ids below the
    vocab size) cost well under a second even for the h100 cache and turn a truncated or
    foreign file into an error rather than a silently different dataset.

    Raises:
        DataNotPreparedError: when the data directory was never prepared.
        DataError: when a file is missing, truncated or inconsistent.
    """
    import numpy as np

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    manifest = manifest or load_manifest(data_dir)
    info = manifest["splits"][split]
    tok_path, off_path = split_paths(data_dir, split)
    dtype = np.dtype(info["dtype"]).newbyteorder("<")
    fix = f"delete `{data_dir}` and run `nightlab prepare` again"
    expected = {tok_path: info["tokens"] * dtype.itemsize, off_path: (info["docs"] + 1) * 8}
    for path, size in expected.items():
        actual = path.stat().st_size if path.exists() else None
        if actual != size:
            state = "missing" if actual is None else f"{actual} bytes, expected {size}"
            raise DataError(f"token cache file `{path}` is {state}; {fix}")
    tokens = np.memmap(tok_path, dtype=dtype, mode="r", shape=(info["tokens"],))
    offsets = np.memmap(off_path, dtype="<i8", mode="r", shape=(info["docs"] + 1,))
    if info["docs"] == 0:
        raise DataError(f"the `{split}` split in `{data_dir}` has no documents; {fix}")
    starts = np.asarray(offsets[:-1])
    if offsets[0] != 0 or offsets[-1] != info["tokens"] or np.any(np.diff(offsets) <= 0):
        raise DataError(f"token cache offsets in `{off_path}` are inconsistent; {fix}")
    bos = manifest["tokenizer"]["bos_id"]
    if np.any(tokens[starts] != bos):
        raise DataError(f"token cache `{tok_path}` has a document that does not start with BOS; {fix}")
    if int(tokens.max()) >= manifest["tokenizer"]["vocab_size"]:
        raise DataError(f"token cache `{tok_path}` holds ids beyond the vocab; {fix}")
    return TokenSplit(tokens=tokens, offsets=offsets)
