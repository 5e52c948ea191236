"""Target-regenerated responses: the prompt selection interleaves domains, and a run answers only what is
not answered yet (resuming after an interruption, or growing a smaller selection) exactly as one
uninterrupted run would."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from dspark.checkpoint import load_target
from dspark.lab.training.responses import answered_prompts, load_responses, pick_prompts, regenerate

DOMAIN_SIZES = {"chat": 3, "code": 5, "math": 6}  # unequal on purpose: chat runs out first


@pytest.fixture()
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for domain, n in DOMAIN_SIZES.items():
            for split, count in (("train", n), ("val", 1), ("test", 2)):
                for i in range(count):
                    record = {"domain": domain, "split": split, "prompt": f"{domain} {split} {i}"}
                    f.write(json.dumps(record) + "\n")
    return path


def test_selection_interleaves_domains_and_grows_by_extension(corpus, tokenizer):
    small = pick_prompts(corpus, {"train": 2, "val": 1}, 1000, tokenizer, seed=0)
    full = pick_prompts(corpus, {"train": 100, "val": 1}, 1000, tokenizer, seed=0)
    assert len(full) == sum(DOMAIN_SIZES.values()) + 3  # every train prompt, one val prompt per domain
    assert all(split != "test" for _, split, _ in full)
    # any prefix has every domain's train prompts within one of each other while all domains have some left
    for k in range(1, len(full) + 1):
        counts = Counter(d for d, s, _ in full[:k] if s == "train")
        left = [d for d in DOMAIN_SIZES if counts[d] < DOMAIN_SIZES[d]]
        assert max(counts[d] for d in left) - min(counts[d] for d in left) <= 1 if left else True
    # the larger selection contains the smaller one, prompt for prompt
    assert {(d, s, tuple(i)) for d, s, i in small} <= {(d, s, tuple(i)) for d, s, i in full}


def test_resumed_and_grown_runs_equal_one_uninterrupted_run(corpus, tokenizer, small_checkpoint, tmp_path):
    target = load_target(small_checkpoint)[0].eval()
    run = dict(target=target, tokenizer=tokenizer, source=corpus, val_per_domain=1, max_new_tokens=6,
               batch_size=4, seed=3)  # fmt: skip
    whole = tmp_path / "whole.jsonl"
    assert regenerate(out_path=whole, train_per_domain=100, **run) == len(pick_prompts(
        corpus, {"train": 100, "val": 1}, 1000, tokenizer, 3))  # fmt: skip
    lines = whole.read_text().splitlines()
    assert len(lines) == len(answered_prompts(whole))  # no prompt answered twice

    resumed = tmp_path / "resumed.jsonl"  # stopped after two batches, then run again
    resumed.write_text("\n".join(lines[:8]) + "\n")
    regenerate(out_path=resumed, train_per_domain=100, **run)
    assert resumed.read_text().splitlines() == lines

    grown = tmp_path / "grown.jsonl"  # a smaller selection first, then every prompt
    regenerate(out_path=grown, train_per_domain=2, **run)
    first = grown.read_text().splitlines()
    regenerate(out_path=grown, train_per_domain=100, **run)
    after = grown.read_text().splitlines()
    assert after[: len(first)] == first  # what was answered stays as it was
    assert answered_prompts(grown) == answered_prompts(whole) and len(after) == len(lines)
    regenerate(out_path=grown, train_per_domain=100, **run)  # nothing left: nothing appended
    assert grown.read_text().splitlines() == after


def test_a_gzipped_responses_file_reads_like_the_file(tmp_path):
    """The committed answers are gzipped JSON lines: loading (and counting what is answered) is the same as
    from the plain file; a damaged .gz is one clear error, and appending to a .gz is refused."""
    records = [{"domain": d, "split": s, "prompt_ids": [1, 2, i], "response_ids": [3, i, 4]}
               for i, (d, s) in enumerate((d, s) for d in ("code", "math", "chat") for s in ("train", "val"))]  # fmt: skip
    text = "".join(json.dumps(r) + "\n" for r in records)
    plain, packed = tmp_path / "r.jsonl", tmp_path / "r.jsonl.gz"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    for split in ("train", "val"):
        assert load_responses(packed, split) == load_responses(plain, split) != []
    assert answered_prompts(packed) == answered_prompts(plain) and len(answered_prompts(plain)) == 6
    damaged = tmp_path / "d.jsonl.gz"
    damaged.write_bytes(gzip.compress(text.encode())[:-20])  # cut short: the gzip stream ends early
    with pytest.raises(ValueError, match=r"d\.jsonl\.gz line \d+ is not a response record"):
        load_responses(damaged, "train")
    with pytest.raises(ValueError, match="plain JSON lines"):
        regenerate(None, None, plain, packed, 1, 1, 4, 2)
