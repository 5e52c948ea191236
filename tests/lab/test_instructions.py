"""Self-written instructions (Magpie) and prompts files: the filter on hand-written examples, near-duplicates,
the stable split, both `--prompts` formats, and a resumed sampling run."""

from __future__ import annotations

import gzip
import json

import pytest

from dspark.checkpoint import load_target
from dspark.lab.data.instructions import NearDuplicates, drop_reason, split_of
from dspark.lab.data.prompt_files import held_out, prompt_ids_by_domain, read_prompts
from dspark.lab.training import instructions
from dspark.lab.training.responses import pick_from_file

KEPT = [
    ("chat", "Tell me a fun fact about octopuses."),
    ("chat", "What's a good way to learn a new language?"),
    ("chat", "Translate 'good morning' into French and Spanish."),
    ("code", "Write a Python function that reverses a linked list."),
    ("code", "How do I read a CSV file with pandas and skip the first row?"),
    ("math", "A store sells pencils at 3 for $1. How much do 12 pencils cost?"),
    ("math", "Solve the equation 2x + 5 = 17."),
]
DROPPED = [
    ("chat", "Hi there", True, "too short"),
    ("chat", "Can you tell me what the weather is like in Paris today please?", False, "cut off"),
    ("chat", "x" * 20 + " word " * 200, True, "too long"),
    ("chat", "Explain this.<|im_end|> and then <|im_start|>assistant say hello", True, "template text"),
    ("chat", "Расскажи мне интересный факт про осьминогов, пожалуйста", True, "other script"),
    ("chat", "I like it and I like it and I like it and so on", True, "repetition"),
    ("code", "How do I make my garden look nicer in the spring?", True, "not code"),
    ("math", "Tell me about the history of the Roman empire please.", True, "not math"),
    ("chat", "Write a poem\n1\n2\n3\n4\n5\n6\n7\nabout the sea and the sky", True, "too many lines"),
]


@pytest.mark.parametrize("domain, text", KEPT)
def test_the_filter_keeps_real_requests(domain, text):
    assert drop_reason(text, domain) is None


@pytest.mark.parametrize("domain, text, ended, reason", DROPPED)
def test_the_filter_drops_noise_with_its_reason(domain, text, ended, reason):
    assert drop_reason(text, domain, ended=ended) == reason


def test_unknown_domain_is_refused():
    with pytest.raises(ValueError, match="unknown domain"):
        drop_reason("Write a poem about the sea.", "poetry")


def test_near_duplicates():
    seen = NearDuplicates()
    seen.add("Can you give me a list of the ten best hiking trails in Colorado for beginners?")
    assert seen.seen(
        "can you give me a list of the ten best hiking trails in colorado for beginners"
    )  # same words
    assert seen.seen("Can you give me a list of the ten best hiking trails in Colorado for families?")
    assert not seen.seen("Can you give me a list of good vegetarian recipes for a dinner party?")
    assert not seen.seen("Write a Python function that merges two sorted lists.")


def test_the_split_is_stable_and_mostly_train():
    texts = [f"Question number {i}: what is {i} plus {i + 1}?" for i in range(2000)]
    splits = [split_of(t) for t in texts]
    assert splits == [split_of(t) for t in texts]
    assert split_of("What is 2 + 2?") == split_of("what is 2 2")  # judged on the words only
    share = {s: splits.count(s) / len(splits) for s in ("train", "val", "eval")}
    assert 0.01 < share["eval"] < 0.06 and 0.005 < share["val"] < 0.05 and share["train"] > 0.9


def test_both_formats_and_gzip(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    rows = [{"prompt": "a b c", "domain": "code"}, {"prompt": "d e f"}, {"prompt": "g", "domain": "code"}]
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    records = read_prompts(jsonl)
    assert [(r.prompt, r.domain, r.line) for r in records] == [("a b c", "code", 1), ("d e f", "prompts", 2),
                                                              ("g", "code", 3)]  # fmt: skip
    text = tmp_path / "p.txt"
    text.write_text("first prompt\n\n  second prompt  \n")
    assert [(r.prompt, r.line) for r in read_prompts(text)] == [("first prompt", 1), ("second prompt", 3)]
    gz = tmp_path / "p.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(jsonl.read_text())
    assert read_prompts(gz) == records


@pytest.mark.parametrize(
    "content, message",
    [("", "is empty"), ('{"prompt": 3}\n', "line 1: \"prompt\" must be"), ('{"prompt": "a"}\n[1, 2]\n', "line 2: expected a JSON"),
     ('{"prompt": "a"}\n{"prompt": "b", "split": "test"}\n', "line 2: \"split\""), ("{oops\n", "line 1: not JSON")],
)  # fmt: skip
def test_bad_files_are_one_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_prompts(path)


def test_held_out_and_context(tmp_path, tokenizer):
    path = tmp_path / "split.jsonl"
    rows = [{"prompt": "train me", "domain": "chat", "split": "train"},
            {"prompt": "measure me", "domain": "chat", "split": "eval"},
            {"prompt": "word " * 200, "domain": "code", "split": "eval"}]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r.prompt for r in held_out(read_prompts(path), path)] == ["measure me", "word " * 200]
    assert read_prompts(path, "train")[0].prompt == "train me"
    with pytest.raises(ValueError, match="line 3: the prompt is"):
        prompt_ids_by_domain(path, tokenizer, context=64)
    ids = prompt_ids_by_domain(path, tokenizer, context=512)
    assert ids["chat"] == [tokenizer.chat_prompt("measure me")]


def test_responses_pick_train_and_val_interleaved(tmp_path, tokenizer):
    path = tmp_path / "p.jsonl"
    rows = [{"prompt": f"{d} {i}", "domain": d, "split": s}
            for d in ("code", "chat") for i, s in enumerate(["train", "train", "val", "eval", "train"])]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chosen = pick_from_file(read_prompts(path), {"train": 2, "val": 5}, 100, tokenizer)
    texts = [(d, s, tokenizer.decode(ids[len(tokenizer.chat_prompt("")) - 1 :])) for d, s, ids in chosen]
    assert [(d, s) for d, s, _ in texts] == [("chat", "train"), ("chat", "val"), ("code", "train"), ("code", "val"),
                                             ("chat", "train"), ("code", "train")]  # fmt: skip
    assert not any("3" in t or "4" in t for _, _, t in texts)  # eval never answered, train capped at 2


def test_a_resumed_sampling_run_writes_what_an_uninterrupted_one_does(small_checkpoint, tokenizer, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    target = load_target(small_checkpoint)[0].eval()
    monkeypatch.setattr(
        instructions, "drop_reason", lambda text, domain, ended=True: None if text else "empty"
    )
    counts = {"chat": 5, "code": 3}
    whole = tmp_path / "whole.jsonl"
    instructions.sample_instructions(target, tokenizer, whole, counts, batch_size=2, max_tokens=6, seed=3)
    assert sum(1 for _ in open(whole)) >= 8

    real_generate, calls = instructions.generate, []

    def interrupted(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return real_generate(*args, **kwargs)

    part = tmp_path / "part.jsonl"
    monkeypatch.setattr(instructions, "generate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        instructions.sample_instructions(target, tokenizer, part, counts, batch_size=2, max_tokens=6, seed=3)
    monkeypatch.setattr(instructions, "generate", real_generate)
    instructions.sample_instructions(target, tokenizer, part, counts, batch_size=2, max_tokens=6, seed=3)
    assert part.read_text() == whole.read_text()
    assert instructions.state_path(part).read_text() == instructions.state_path(whole).read_text()
