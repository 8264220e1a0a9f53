"""Tokenizer: byte-level BPE trained with rustbpe, run with tiktoken.

rustbpe trains the merges (fast, parallel, GPT-4-style split pattern from
`profiles.SPLIT_PATTERN`); tiktoken encodes with them (much faster than rustbpe's own
encoder, multi-threaded for batches). The special tokens of `profiles.SPECIAL_TOKENS` take
the last ids; only BOS is used, at the start of every document.

Saved as `tokenizer.tiktoken` in the data directory: one `base64(token bytes) rank` line
per merge, the format tiktoken's own encodings use. `token_bytes` (the UTF-8 byte length of
every token, 0 for special tokens) is what makes val_bpb independent of the vocab: the
metric divides summed nats by summed target bytes.

Usage:
    tok = Tokenizer.load(data_dir)
    ids = [tok.bos_id] + tok.encode("Once upon a time")
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from nightlab.atomic import atomic_write_bytes
from nightlab.harness.cache import (
    TOKENIZER_NAME,
    DataError,
    DataMismatchError,
    load_manifest,
)
from nightlab.harness.profiles import BOS_TOKEN, SPECIAL_TOKENS, SPLIT_PATTERN

__all__ = ["Tokenizer", "train_tokenizer"]

# autoresearch's limits on tokenizer training text: ~2 B characters is plenty for an 8k vocab,
# and cropping documents at 10k characters keeps one huge document from dominating the counts.
MAX_TRAIN_CHARS = 2_000_000_000
DOC_CAP_CHARS = 10_000


class Tokenizer:
    """A trained BPE tokenizer (a tiktoken encoding plus its special tokens)."""

    def __init__(self, mergeable_ranks: dict[bytes, int]):
        import tiktoken

        n = len(mergeable_ranks)
        self._ranks = mergeable_ranks
        self.special_tokens = {name: n + i for i, name in enumerate(SPECIAL_TOKENS)}
        self.vocab_size = n + len(SPECIAL_TOKENS)
        self.bos_id = self.special_tokens[BOS_TOKEN]
        self.encoding = tiktoken.Encoding(
            "nightlab",
            pat_str=SPLIT_PATTERN,
            mergeable_ranks=mergeable_ranks,
            special_tokens=self.special_tokens,
            explicit_n_vocab=self.vocab_size,
        )
        lengths = np.zeros(self.vocab_size, dtype=np.int32)
        for token, rank in mergeable_ranks.items():
            lengths[rank] = len(token)
        self.token_bytes = lengths  # special tokens stay 0: they carry no text

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def load(cls, data_dir: Path) -> Tokenizer:
        """The tokenizer `nightlab prepare` trained for this data directory.

        Raises:
            DataNotPreparedError: the directory was never prepared.
            DataMismatchError: it was prepared with other tokenizer settings.
            DataError: the tokenizer file is damaged.
        """
        data_dir = Path(data_dir)
        manifest = load_manifest(data_dir)
        info = manifest["tokenizer"]
        if info.get("pattern") != SPLIT_PATTERN or info.get("special_tokens") != list(SPECIAL_TOKENS):
            raise DataMismatchError(
                f"the tokenizer in `{data_dir}` was made with another split pattern or special tokens; "
                "delete that directory and run `nightlab prepare` again"
            )
        tok = cls(read_ranks(data_dir / TOKENIZER_NAME))
        if tok.vocab_size != info["vocab_size"]:
            raise DataError(
                f"`{data_dir / TOKENIZER_NAME}` has {tok.vocab_size} tokens but the manifest says "
                f"{info['vocab_size']}; delete `{data_dir}` and run `nightlab prepare` again"
            )
        return tok

    def save(self, path: Path) -> None:
        """Write the merges in tiktoken's `base64 rank` format, atomically."""
        lines = (
            f"{base64.b64encode(t).decode()} {r}\n"
            for t, r in sorted(self._ranks.items(), key=lambda x: x[1])
        )
        atomic_write_bytes(Path(path), "".join(lines).encode(), durable=True)

    # -- use ----------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token text is encoded as plain text, never as a special id."""
        return self.encoding.encode_ordinary(text)

    def encode_batch(
        self, texts: list[str], *, prepend_bos: bool = True, num_threads: int = 8
    ) -> list[list[int]]:
        """Encode many documents at once (tiktoken's threads), each led by BOS by default."""
        batch = self.encoding.encode_ordinary_batch(texts, num_threads=num_threads)
        if prepend_bos:
            batch = [[self.bos_id, *ids] for ids in batch]
        return batch

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids` (special tokens appear as their names, invalid UTF-8 as U+FFFD)."""
        return self.encoding.decode([int(i) for i in ids])


def read_ranks(path: Path) -> dict[bytes, int]:
    """Read a `base64 rank` merges file, checking that ranks are exactly 0..n-1.

    Raises:
        DataError: when the file is missing or damaged.
    """
    try:
        ranks = {}
        for line in Path(path).read_bytes().splitlines():
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
    except FileNotFoundError:
        raise DataError(f"tokenizer file `{path}` is missing; run `nightlab prepare` again") from None
    except ValueError as e:
        raise DataError(f"tokenizer file `{path}` is damaged ({e}); run `nightlab prepare` again") from e
    if sorted(ranks.values()) != list(range(len(ranks))) or len(ranks) < 256:
        raise DataError(
            f"tokenizer file `{path}` is damaged (ranks are not 0..n-1); run `nightlab prepare` again"
        )
    return ranks


def _training_text(texts: Iterable[str], max_chars: int) -> Iterator[str]:
    seen = 0
    for text in texts:
        text = text[:DOC_CAP_CHARS]
        yield text
        seen += len(text)
        if seen >= max_chars:
            return


def train_tokenizer(texts: Iterable[str], vocab_size: int, *, max_chars: int = MAX_TRAIN_CHARS) -> Tokenizer:
    """Train BPE merges on `texts` (training documents only) for a vocab of `vocab_size`, specials included.

    Raises:
        DataError: when the text is too small to learn that many merges.
    """
    import rustbpe

    n_merged = vocab_size - len(SPECIAL_TOKENS)
    if n_merged < 256:
        raise DataError(
            f"vocab size `{vocab_size}` is too small: byte-level BPE needs at least {256 + len(SPECIAL_TOKENS)}"
        )
    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(_training_text(texts, max_chars), n_merged, pattern=SPLIT_PATTERN)
    ranks = dict(bpe.get_mergeable_ranks())
    if len(ranks) != n_merged:
        raise DataError(
            f"the training text only supports {len(ranks) + len(SPECIAL_TOKENS)} tokens, not vocab size "
            f"`{vocab_size}`; add more text or use a smaller vocab"
        )
    return Tokenizer(ranks)
