"""The demo corpus (byte-stable, structured, learnable) and `prepare` on the cpu profile.

The pinned sha256 guards "identical bytes on every machine and Python version": the
generator uses only integer arithmetic and its own PCG32. If you change the generator on
purpose, bump `profiles.SOURCE_VERSIONS["demo"]` and update the hash. The validation stories
are drawn from the data folder's secret, so they are not pinned: that the package cannot
regenerate them is what is tested.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from nightlab.harness.cache import DataMismatchError, load_manifest, open_split
from nightlab.harness.data import prepare
from nightlab.harness.demo import DEMO_DOCS, DEMO_VAL_EVERY, demo_documents, demo_validation
from nightlab.harness.profiles import fingerprint, get_profile
from nightlab.harness.sources import open_source
from nightlab.harness.tokenizer import Tokenizer

DEMO_SHA256 = "61ee3c56bec014cc662b6c446de33bbbd23ff67a24cbc90f8ccc52649ff8e66b"
# The cpu profile's prepared files: the same on every machine (rustbpe's merges do not depend
# on thread count or process). A change here means rustbpe or tiktoken changed behaviour:
# bump `profiles.TOKENIZER_VERSION` so old and new results stop sharing a fingerprint.
CPU_CACHE_SHA256 = {
    "tokenizer.tiktoken": "510f94f7dc7f9191849f13a34a0aee4faabb9f5747ae68bf941d0dafa2d0ed4a",
    "train.tokens.bin": "a561850ff32d4b27dd23c87e29cf1e33c0a08ee09f1d6954f26ab677adfb6956",
}


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return demo_documents()


def test_bytes_are_pinned(docs: list[str]):
    blob = "\x00".join(docs).encode("utf-8")
    assert hashlib.sha256(blob).hexdigest() == DEMO_SHA256
    assert 2_000_000 < len(blob) < 10_000_000 and len(docs) == DEMO_DOCS


def test_prepared_bytes_are_pinned(cpu_data: Path):
    for name, digest in CPU_CACHE_SHA256.items():
        assert hashlib.sha256((cpu_data / name).read_bytes()).hexdigest() == digest, name


def test_document_structure(docs: list[str]):
    for i, doc in enumerate(docs[:200]):
        title = re.match(r"Story (\d+): The (\w+) (\w+)\n\n", doc)
        assert title and int(title.group(1)) == i
        hero = doc.split("\n\n")[1].split()[0]
        assert doc.count(hero) >= 2  # the hero recurs
        thing = title.group(3).lower()
        assert (
            doc.rstrip().endswith("The end.") and f" {thing} again" in doc
        )  # the ending returns to the title


def test_counting_sentences_agree(docs: list[str]):
    numbers = [
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
    ]
    counts = re.findall(
        r"There were (\w+) \w+ in the \w+, and \w+ counted them: ([a-z, ]+)\.", "".join(docs[:500])
    )
    assert len(counts) > 100
    for word, listed in counts:
        assert listed.split(", ") == numbers[1 : numbers.index(word) + 1]


def test_validation_stories_come_from_the_secret_and_not_from_the_package(tmp_path: Path, docs: list[str]):
    """Training is the generated stream minus every tenth story; validation cannot be regenerated from code."""
    corpus = open_source("demo", tmp_path, val_secret=b"s" * 32)
    train, val = list(corpus.train()), list(corpus.val())
    assert len(val) == DEMO_DOCS // 10 and len(train) + len(val) == DEMO_DOCS
    assert train == [d for i, d in enumerate(docs) if i % DEMO_VAL_EVERY != DEMO_VAL_EVERY - 1]
    assert not set(val) & set(docs)  # not one validation story is among those the package generates
    assert val == demo_validation(b"s" * 32) != demo_validation(b"t" * 32)
    assert re.match(r"Story 9: The \w+ \w+\n\n", val[0])  # numbered like the stories they replace
    fresh = open_source("demo", tmp_path)  # no secret given: a fresh one, never the same stories
    assert not set(fresh.val()) & set(val)


def test_prepared_cache(cpu_data: Path, docs: list[str]):
    manifest = load_manifest(cpu_data, profile=get_profile("cpu"))
    assert manifest["fingerprint"] == fingerprint(get_profile("cpu")) == cpu_data.name
    tok = Tokenizer.load(cpu_data)
    val_first = demo_validation((cpu_data / "val.secret").read_bytes())[0]
    for split, first in (("train", docs[0]), ("val", val_first)):
        cache = open_split(cpu_data, split)
        assert cache.tokens.dtype == np.uint16
        assert cache.n_docs == manifest["splits"][split]["docs"]
        assert cache.doc(0).tolist() == [tok.bos_id, *tok.encode(first)]


def test_validation_never_reaches_training(cpu_data: Path):
    def doc_hashes(split: str) -> set[bytes]:
        cache = open_split(cpu_data, split)
        return {hashlib.sha256(cache.doc(i).tobytes()).digest() for i in range(cache.n_docs)}

    assert not doc_hashes("train") & doc_hashes("val")


def test_demo_is_learnable(cpu_data: Path):
    """A bigram model fitted on train beats a unigram one on val by a wide margin (bits per byte)."""
    tok = Tokenizer.load(cpu_data)
    train, val = open_split(cpu_data, "train").tokens, open_split(cpu_data, "val").tokens
    V = tok.vocab_size
    uni = np.bincount(train, minlength=V) + 1.0
    pairs = train[:-1].astype(np.int64) * V + train[1:]
    bi = np.bincount(pairs, minlength=V * V).reshape(V, V) + 1.0
    val_bytes = tok.token_bytes[val[1:]].sum()
    uni_bits = -np.log2(uni[val[1:]] / uni.sum()).sum() / val_bytes
    bi_bits = -np.log2(bi[val[:-1], val[1:]] / bi[val[:-1]].sum(1)).sum() / val_bytes
    print(f"unigram {uni_bits:.3f} bpb, bigram {bi_bits:.3f} bpb")
    assert bi_bits < 0.6 * uni_bits, (uni_bits, bi_bits)


def test_prepare_is_idempotent(tmp_path: Path, cpu_data: Path):
    profile = get_profile("cpu")
    out = tmp_path / "d"
    t0 = time.perf_counter()
    prepare(profile, data_dir=out, progress=False, workers=2)
    assert time.perf_counter() - t0 < 60
    # a folder of its own, a secret of its own: the same training data, other validation stories
    assert (out / "val.secret").read_bytes() != (cpu_data / "val.secret").read_bytes()
    assert (out / "val.tokens.bin").read_bytes() != (cpu_data / "val.tokens.bin").read_bytes()
    assert (out / "train.tokens.bin").read_bytes() == (cpu_data / "train.tokens.bin").read_bytes()
    stamp = (out / "manifest.json").stat().st_mtime_ns
    t0 = time.perf_counter()
    assert prepare(profile, data_dir=out, progress=False) == out
    assert time.perf_counter() - t0 < 0.5 and (out / "manifest.json").stat().st_mtime_ns == stamp


def test_prepare_resumes_after_interruption(cpu_data: Path, tmp_path: Path):
    out = tmp_path / "d"
    out.mkdir()
    for f in ("tokenizer.tiktoken", "train.tokens.bin", "train.offsets.bin", "train.json", "val.secret"):
        (out / f).write_bytes((cpu_data / f).read_bytes())
    (out / "val.tokens.bin.tmp").write_bytes(b"half a file")  # where an interrupted run stopped
    stamp = (out / "train.tokens.bin").stat().st_mtime_ns
    prepare(get_profile("cpu"), data_dir=out, progress=False, workers=2)
    assert (out / "train.tokens.bin").stat().st_mtime_ns == stamp  # finished steps are not redone
    for f in ("val.tokens.bin", "val.offsets.bin"):
        assert (out / f).read_bytes() == (cpu_data / f).read_bytes()
    assert not (out / "val.tokens.bin.tmp").exists()


def test_default_location_and_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(tmp_path))
    out = prepare(get_profile("cpu"), progress=True, workers=2)
    assert out == tmp_path / fingerprint(get_profile("cpu"))
    err = capsys.readouterr().err
    assert "tokenize train" in err and "train tokenizer" in err


def test_data_of_another_profile_is_refused(cpu_data: Path):
    other = get_profile("cpu", dataset="tinystories")
    with pytest.raises(DataMismatchError, match=f"prepared for fingerprint `{cpu_data.name}`"):
        prepare(other, data_dir=cpu_data, progress=False)
    with pytest.raises(DataMismatchError, match="run `nightlab prepare`"):
        load_manifest(cpu_data, profile=other)


def test_no_stray_files(cpu_data: Path):
    names = sorted(os.listdir(cpu_data))
    assert not [n for n in names if n.endswith((".tmp", ".part"))]
    assert "manifest.json" in names
