"""dspark/tokenizer.py: round trips of the shipped byte-level BPE tokenizer, special ids, the chat format, and
one-line refusals of bad files and of ids outside the vocabulary."""

from __future__ import annotations

import pytest
import torch

from dspark.tokenizer import SPECIAL_TOKENS, Tokenizer

TEXTS = [
    "",
    "a",
    " ",
    "\n\n\t  ",
    "def f(x):\n    return x * 2  # double\n",
    "Maya buys 3 notebooks at 4 dollars each, so she pays 3 * 4 = 12 dollars.",
    "naïve café — 東京 🚀 Ελληνικά עברית",
    "\x00\x01 control bytes \x7f",
    "<|eos|> and <|mask|> written as plain text",
    "<|bos",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert not set(ids) & tokenizer.special_ids  # user text never yields special ids


def test_empty_text_is_no_tokens(tokenizer):
    assert tokenizer.encode("") == []
    assert tokenizer.decode([]) == ""


def test_long_input_round_trips_and_compresses(tokenizer):
    text = open(__file__, encoding="utf-8").read() * 20
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text) / 2  # BPE merges actually do something on code


def test_vocabulary_and_special_ids(tokenizer):
    assert 4000 <= tokenizer.vocab_size <= 8192
    ids = [tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.user_id, tokenizer.assistant_id]
    assert ids + [tokenizer.mask_id] == list(range(len(SPECIAL_TOKENS)))


def test_chat_format(tokenizer):
    prompt = tokenizer.chat_prompt("hi")
    assert prompt[:2] == [tokenizer.bos_id, tokenizer.user_id] and prompt[-1] == tokenizer.assistant_id
    sample = tokenizer.chat_sample("hi", "hello")
    assert sample[: len(prompt)] == prompt and sample[-1] == tokenizer.eos_id
    assert tokenizer.decode(sample) == "hihello"
    assert "<|assistant|>" in tokenizer.decode(sample, skip_special=False)


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        Tokenizer.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt"):
        Tokenizer.load(tmp_path / "bad.json")


@pytest.mark.parametrize("ids, message", [([4096], "outside the tokenizer's vocabulary 0..4095"),
                                          ([-1], "outside"), ([1.5], "must be integers"), ([True], "integers")])  # fmt: skip
def test_decode_refuses_ids_outside_the_vocabulary(tokenizer, ids, message):
    with pytest.raises(ValueError, match=message):
        tokenizer.decode([100, *ids])
    assert tokenizer.decode(torch.tensor([100, 200])) == tokenizer.decode([100, 200])
