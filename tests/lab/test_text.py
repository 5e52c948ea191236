"""dspark/lab/text.py and tokenizer training: a reply cut inside a multi-byte character (issue #69)."""

from __future__ import annotations

import json

import pytest
from pretrained_helpers import chatml_tokenizer, tiny_llama, write_gguf
from tokenizers import AddedToken

from dspark.checkpoint import TOKENIZER_PATH
from dspark.lab.pretrained.gguf_file import load_gguf
from dspark.lab.pretrained.hf_dir import read_tokenizer
from dspark.lab.text import BYTE_OF_CHAR, decode_complete
from dspark.lab.training.target import train_tokenizer
from dspark.tokenizer import Tokenizer

# ---- a reply cut inside a multi-byte character (issue #69) ------------------------------------------------------
CUT_TEXTS = ["café 😀", "naïve 東京 — ok", "😀😀", "é"]


_CHAR_OF_BYTE = {b: c for c, b in BYTE_OF_CHAR.items()}


@pytest.fixture(scope="module", params=["shipped", "hf_dir", "gguf"])
def any_tokenizer(request, tokenizer, tmp_path_factory) -> Tokenizer:
    """The shipped tokenizer, and a pretrained model's as `hf_dir.py` and `gguf_file.py` each build it."""
    if request.param == "shipped":
        return tokenizer
    folder = tmp_path_factory.mktemp(request.param)
    hf = chatml_tokenizer()
    if request.param == "gguf":
        _, tok = load_gguf(
            write_gguf(folder / "m.gguf", tiny_llama(hf.get_vocab_size()), hf, quantized=False)
        )
        return tok
    hf.save(str(folder / "tokenizer.json"))
    settings = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return read_tokenizer(folder)


def byte_ids(tok: Tokenizer, data: bytes) -> list[int]:
    """One token per byte: the ids a model that spelled `data` byte by byte produced."""
    return [tok.backend.token_to_id(_CHAR_OF_BYTE[b]) for b in data]


def test_train_tiny_tokenizer_and_reload(tmp_path):
    tok = train_tokenizer(["hello world " * 50, "def f(): pass\n" * 50], vocab_size=300)
    tok.save(tmp_path / "t.json")
    again = Tokenizer.load(tmp_path / "t.json")
    assert again.encode("hello world") == tok.encode("hello world")
    assert again.eos_id == 2


@pytest.mark.parametrize("text", CUT_TEXTS)
def test_a_cut_character_is_left_out_not_replaced(any_tokenizer, text):
    tok, data = any_tokenizer, text.encode("utf-8")
    assert decode_complete(tok, tok.encode(text)) == text  # uncut: unchanged
    for k in range(len(data) + 1):  # cut at every byte, spelled byte by byte and after merged tokens
        whole = data[:k].decode("utf-8", errors="ignore")  # the characters complete before the cut
        partial = data[len(whole.encode("utf-8")) : k]
        for ids in (byte_ids(tok, data[:k]), tok.encode(whole) + byte_ids(tok, partial)):
            assert decode_complete(tok, ids) == whole, (text, k)
            assert tok.decode(ids) == whole + ("\ufffd" if partial else "")  # what `decode` alone prints
    ids = tok.encode(text)
    for k in range(len(ids) + 1):  # cut at every token of the ordinary encoding
        assert decode_complete(tok, ids[:k]) == tok.decode(ids[:k]).rstrip("\ufffd")
        assert text.startswith(decode_complete(tok, ids[:k]))


@pytest.mark.parametrize("text", ["ok \ufffd", "\ufffd", "a\ufffd\ufffd", "\ufffdé"])
def test_a_real_replacement_character_stays(any_tokenizer, text):
    """U+FFFD spelled in full (EF BF BD) is text the model wrote, merged or byte by byte; cut, it goes."""
    tok, data = any_tokenizer, text.encode("utf-8")
    assert decode_complete(tok, tok.encode(text)) == text
    assert decode_complete(tok, byte_ids(tok, data)) == text
    assert decode_complete(tok, byte_ids(tok, data[:-1])) == data[:-1].decode("utf-8", errors="ignore")


@pytest.mark.parametrize("junk", [b"\x80", b"\xbf\xbf", b"\xe0\x80", b"\xff", b"\xf0\x9f\x98\xc3"])
def test_bytes_invalid_wherever_the_text_stops_stay_replaced(any_tokenizer, junk):
    """Only an incomplete character at the very end is the cut's doing; other bad bytes stay U+FFFD."""
    tok = any_tokenizer
    ids = tok.encode("x") + byte_ids(tok, junk)
    want = tok.decode(ids)
    if junk.endswith(b"\xc3"):  # a lead byte at the end: that one is a cut
        want = want.removesuffix("\ufffd")
    assert decode_complete(tok, ids) == want and want.endswith("\ufffd")


def test_decode_complete_skips_specials_and_checks_ids(tokenizer):
    ids = [tokenizer.bos_id, *tokenizer.encode("é")[:1], tokenizer.eos_id]
    assert decode_complete(tokenizer, ids) == decode_complete(tokenizer, ids[1:2]) == ""
    assert decode_complete(tokenizer, [tokenizer.eos_id], skip_special=False) == "<|eos|>"
    with pytest.raises(ValueError, match="outside the tokenizer's vocabulary"):
        decode_complete(tokenizer, [tokenizer.vocab_size])


def test_an_added_token_outside_the_byte_alphabet_counts_as_its_text():
    """An added token with a character the byte alphabet lacks decodes as its own text, before or after a cut."""
    backend = Tokenizer.load(TOKENIZER_PATH).backend
    backend.add_tokens([AddedToken("wave👋", special=False, normalized=False)])
    tok = Tokenizer(backend)
    word = backend.token_to_id("wave👋")
    cut = tok.encode("é")[:1]
    assert decode_complete(tok, [word, *cut]) == "wave👋"
    assert decode_complete(tok, [*tok.encode("\ufffd"), word, *cut]) == "\ufffdwave👋"
