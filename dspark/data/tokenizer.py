"""Byte-level BPE tokenizer and the chat format every sample uses.

What this file does:
  * trains a byte-level BPE vocabulary (4k-8k entries) on the training corpus
    with the `tokenizers` library (Rust; hand-written BPE training in Python
    would take many minutes on this corpus) and saves it as `tokenizer.json`;
  * wraps it in `Tokenizer`, which knows the special tokens (BOS, EOS, the two
    chat roles, MASK for parallel drafters, PAD) and builds the token ids of a
    chat turn: `<|bos|><|user|> prompt <|assistant|> response <|eos|>`.

What it does not do: no normalisation, no truncation, no padding. Text is
split into pieces and special tokens are inserted as ids, never parsed out of
user text, so a prompt that happens to contain "<|eos|>" stays plain text.
Byte-level BPE round-trips every UTF-8 string exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

BOS = "<|bos|>"
EOS = "<|eos|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
MASK = "<|mask|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, USER, ASSISTANT, MASK)  # ids 0..5, in this order

DEFAULT_VOCAB_SIZE = 4096


class Tokenizer:
    """Thin wrapper: text <-> ids, plus the special-token ids and chat format."""

    def __init__(self, backend: HFTokenizer) -> None:
        self.backend = backend
        ids = [backend.token_to_id(t) for t in SPECIAL_TOKENS]
        if any(i is None for i in ids):
            missing = [t for t, i in zip(SPECIAL_TOKENS, ids) if i is None]
            raise ValueError(f"tokenizer lacks special tokens {missing}")
        self.pad_id, self.bos_id, self.eos_id, self.user_id, self.assistant_id, self.mask_id = ids
        self.special_ids = frozenset(ids)

    # ---- construction -----------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        try:
            backend = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust error text is not very readable
            raise ValueError(f"tokenizer file {path} is corrupt: {exc}") from None
        return cls(backend)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
        """Learn merges on `texts` (an iterator is fine); special tokens get ids 0..5."""
        if not 256 + len(SPECIAL_TOKENS) < vocab_size <= 65535:
            raise ValueError(f"vocab_size must be in ({256 + len(SPECIAL_TOKENS)}, 65535]")
        backend = HFTokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes
            show_progress=False,
        )
        backend.train_from_iterator(texts, trainer=trainer)
        return cls(backend)

    def save(self, path: str | Path) -> None:
        self.backend.save(str(path))

    # ---- text <-> ids -----------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Plain text to ids; special-token strings in `text` are NOT special."""
        if not text:
            return []
        # The backend would turn a literal "<|eos|>" into the EOS id: text that
        # contains a special-token string takes the slower literal path.
        if any(s in text for s in SPECIAL_TOKENS):
            return self._encode_literal(text)
        return self.backend.encode(text, add_special_tokens=False).ids

    def _encode_literal(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _split_keeping_specials(text):
            enc = self.backend.encode(piece, add_special_tokens=False).ids
            if piece in SPECIAL_TOKENS:  # spell it with ordinary byte tokens
                enc = [i for ch in piece for i in self.backend.encode(ch).ids]
            ids.extend(enc)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        ids = [int(i) for i in ids]
        if skip_special:
            ids = [i for i in ids if i not in self.special_ids]
        return self.backend.decode(ids, skip_special_tokens=False)

    # ---- chat format --------------------------------------------------------
    def chat_prompt(self, prompt: str) -> list[int]:
        """Ids of `<|bos|><|user|>prompt<|assistant|>`: what generation starts from."""
        return [self.bos_id, self.user_id, *self.encode(prompt), self.assistant_id]

    def chat_sample(self, prompt: str, response: str) -> list[int]:
        """Ids of a whole training sample, ending with EOS."""
        return [*self.chat_prompt(prompt), *self.encode(response), self.eos_id]


def _split_keeping_specials(text: str) -> Iterator[str]:
    """Yield `text` in pieces such that every special-token string is its own piece."""
    start = 0
    while start < len(text):
        hits = [(text.find(s, start), s) for s in SPECIAL_TOKENS]
        hits = [(i, s) for i, s in hits if i >= 0]
        if not hits:
            yield text[start:]
            return
        i, s = min(hits)
        if i > start:
            yield text[start:i]
        yield s
        start = i + len(s)
