"""Tokenizer: rustbpe training, the tiktoken encoding, token byte lengths, save/load, bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nightlab.harness.cache import DataError, DataMismatchError, DataNotPreparedError
from nightlab.harness.demo import demo_documents
from nightlab.harness.profiles import SPECIAL_TOKENS
from nightlab.harness.tokenizer import Tokenizer, read_ranks, train_tokenizer

TEXTS = demo_documents()[:300]
SAMPLE = 'Mira counted 12345 shells, then said: "I want to fix the boat!" — ünïcödé 🙂'


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer(iter(TEXTS), 400)


def test_vocab_and_special_tokens(tok: Tokenizer):
    assert tok.vocab_size == 400 and tok.encoding.n_vocab == 400
    assert tok.bos_id == 400 - len(SPECIAL_TOKENS)
    assert tok.decode([tok.bos_id]) == SPECIAL_TOKENS[0]


def test_round_trip_and_compression(tok: Tokenizer):
    ids = tok.encode(SAMPLE)
    assert tok.decode(ids) == SAMPLE
    assert max(ids) < tok.bos_id
    story = TEXTS[0]
    assert len(tok.encode(story)) < len(story.encode()) / 2  # the merges learned the corpus's words


def test_special_token_text_is_plain_text(tok: Tokenizer):
    assert tok.bos_id not in tok.encode(SPECIAL_TOKENS[0])


def test_numbers_split_in_groups_of_at_most_two_digits(tok: Tokenizer):
    pieces = [tok.decode([i]) for i in tok.encode("12345")]
    assert "".join(pieces) == "12345" and all(len(p) <= 2 for p in pieces)


def test_token_bytes_sum_to_text_bytes(tok: Tokenizer):
    assert tok.token_bytes.dtype == np.int32 and tok.token_bytes.shape == (400,)
    assert (tok.token_bytes[tok.bos_id :] == 0).all() and (tok.token_bytes[: tok.bos_id] >= 1).all()
    for text in (SAMPLE, TEXTS[1]):
        assert tok.token_bytes[tok.encode(text)].sum() == len(text.encode("utf-8"))


def test_batch_encoding_prepends_bos(tok: Tokenizer):
    batch = tok.encode_batch(["a cat", "the boat"], num_threads=2)
    assert batch == [[tok.bos_id, *tok.encode("a cat")], [tok.bos_id, *tok.encode("the boat")]]


def test_training_is_deterministic(tok: Tokenizer):
    again = train_tokenizer(iter(TEXTS), 400)
    assert again.encode(TEXTS[5]) == tok.encode(TEXTS[5])


def test_save_and_read(tok: Tokenizer, tmp_path: Path):
    tok.save(tmp_path / "t.tiktoken")
    back = Tokenizer(read_ranks(tmp_path / "t.tiktoken"))
    assert back.encode(SAMPLE) == tok.encode(SAMPLE)
    assert not (tmp_path / "t.tiktoken.tmp").exists()


def test_damaged_file(tmp_path: Path):
    (tmp_path / "t.tiktoken").write_text("not base64 at all\n")
    with pytest.raises(DataError, match="damaged"):
        read_ranks(tmp_path / "t.tiktoken")
    with pytest.raises(DataError, match="missing"):
        read_ranks(tmp_path / "none.tiktoken")


def test_too_little_text():
    with pytest.raises(DataError, match="only supports .* tokens, not vocab size `4000`"):
        train_tokenizer(iter(TEXTS[:3]), 4000)
    with pytest.raises(DataError, match="too small"):
        train_tokenizer(iter(TEXTS), 200)


def test_load_from_prepared_data(cpu_data: Path):
    tok = Tokenizer.load(cpu_data)
    assert tok.vocab_size == 1024 and tok.bos_id == 1019
    assert tok.decode(tok.encode(SAMPLE)) == SAMPLE


def test_load_errors(cpu_data: Path, tmp_path: Path):
    with pytest.raises(DataNotPreparedError, match="nightlab prepare"):
        Tokenizer.load(tmp_path)
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in ("manifest.json", "tokenizer.tiktoken"):
        (copy / f).write_bytes((cpu_data / f).read_bytes())
    manifest = (copy / "manifest.json").read_text()
    (copy / "manifest.json").write_text(manifest.replace("<|bos|>", "<|start|>"))
    with pytest.raises(DataMismatchError, match="split pattern or special tokens"):
        Tokenizer.load(copy)
