"""The offline corpus: sources, sample shapes, split hygiene, the shipped eval prompts."""

from __future__ import annotations

import json
import sys
from collections import Counter

import numpy as np
import pytest

from dspark.lab.data.corpus import (
    CORPUS_MANIFEST_PATH,
    DOMAINS,
    EVAL_PER_DOMAIN,
    EVAL_PROMPTS_PATH,
    Sample,
    assign_splits,
    build_samples,
    build_token_arrays,
    corpus_manifest,
    load_eval_prompts,
    load_token_array,
    stable_hash,
    stdlib_files,
)


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads(CORPUS_MANIFEST_PATH.read_text())


@pytest.fixture(scope="module")
def samples(manifest) -> list[Sample]:
    """The full default corpus (about ten seconds to build)."""
    return build_samples(math_count=manifest["math_problems"], seed=manifest["seed"])


def test_stdlib_files_skip_tests_and_are_sorted():
    files = stdlib_files()
    modules = [m for m, _ in files]
    assert "json.decoder" in modules and "collections" in modules
    assert not any(
        m == "test" or m.startswith("test.") or ".tests" in m or "site-packages" in m for m in modules
    )
    assert [str(p) for _, p in files] == sorted(str(p) for _, p in files)


def test_every_domain_has_samples_and_no_duplicates(samples):
    counts = Counter(s.domain for s in samples)
    assert set(counts) == set(DOMAINS) and min(counts.values()) >= 4000
    keys = [(s.domain, s.prompt, s.response) for s in samples]
    assert len(keys) == len(set(keys))
    assert all(s.prompt and s.response.strip() for s in samples)


def test_code_sample_splits_signature_from_body(samples):
    source = "json.decoder:JSONDecoder.decode"
    (sample,) = [s for s in samples if s.domain == "code" and s.source == source]
    assert (
        "def decode(self, s" in sample.prompt and "Return the Python" in sample.prompt
    )  # signature + docstring
    assert "def decode" not in sample.response and "return obj" in sample.response
    assert "(a method of `JSONDecoder`)" in sample.prompt
    (chat,) = [s for s in samples if s.domain == "chat" and s.source == source]
    assert "decode" in chat.prompt and chat.split == sample.split  # same source, same split


def test_splits_hold_out_eval_by_source(samples):
    by_split = {sp: {s.source for s in samples if s.split == sp} for sp in ("train", "val", "eval")}
    assert not by_split["eval"] & by_split["train"] and not by_split["eval"] & by_split["val"]
    for d in DOMAINS:
        assert sum(s.domain == d and s.split == "eval" for s in samples) >= EVAL_PER_DOMAIN
    val_share = sum(s.split == "val" for s in samples) / len(samples)
    assert 0.005 < val_share < 0.05


def test_split_assignment_is_deterministic_and_order_free():
    make = lambda: [Sample("math", f"math:9:{i}", f"q{i}", "a") for i in range(300)]  # noqa: E731
    a, b = make(), make()[::-1]
    assign_splits(a)
    assign_splits(b)
    assert {s.source: s.split for s in a} == {s.source: s.split for s in b}
    assert stable_hash("x") == stable_hash("x") != stable_hash("y")


def test_corpus_matches_the_shipped_manifest(manifest, samples):
    if manifest["python"] != sys.version.split()[0]:
        pytest.skip(f"corpus was built from Python {manifest['python']}'s stdlib")
    assert (
        corpus_manifest(samples, manifest["math_problems"], manifest["seed"])["sha256"] == manifest["sha256"]
    )


def test_token_arrays_round_trip(tmp_path, samples, tokenizer):
    few = [s for s in samples if s.source.startswith(("json:", "math:0:1"))]
    sizes = build_token_arrays(few, tokenizer, tmp_path)
    for d in DOMAINS:
        arr = load_token_array(tmp_path, d, "train")
        assert arr.dtype == np.uint16 and len(arr) == sizes[f"{d}.train"]
    math = load_token_array(tmp_path, "math", "train").tolist()
    if math:
        assert math[0] == tokenizer.bos_id and math[-1] == tokenizer.eos_id
    with pytest.raises(FileNotFoundError, match="train data"):
        load_token_array(tmp_path / "nowhere", "math", "train")


def test_shipped_eval_prompts():
    records = load_eval_prompts(EVAL_PROMPTS_PATH)
    counts = Counter(r["domain"] for r in records)
    assert all(counts[d] >= 64 for d in DOMAINS)
    assert len({r["prompt"] for r in records}) == len(records)


def test_shipped_eval_prompts_are_held_out_of_the_shipped_corpus(manifest, samples):
    if manifest["python"] != sys.version.split()[0]:
        pytest.skip(f"corpus was built from Python {manifest['python']}'s stdlib")
    full = samples
    train_sources = {s.source for s in full if s.split == "train"}
    shipped = load_eval_prompts(EVAL_PROMPTS_PATH)
    assert not {r["source"] for r in shipped} & train_sources
    rebuilt = {(s.domain, s.source, s.prompt) for s in full if s.split == "eval"}
    assert {(r["domain"], r["source"], r["prompt"]) for r in shipped} <= rebuilt
