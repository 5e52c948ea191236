"""Byte-level BPE (`tokenizer.json`, via the `tokenizers` library) and the chat format every sample uses.

The shipped target's `DSPARK_CHAT` is `<|bos|><|user|> prompt <|assistant|> response <|eos|>`. Special
tokens are inserted as ids, never parsed out of user text: a prompt containing "<|eos|>" stays plain text.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

BOS = "<|bos|>"
EOS = "<|eos|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
MASK = "<|mask|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, USER, ASSISTANT, MASK)  # ids 0..5, in this order


@dataclass(frozen=True)
class ChatFormat:
    """How one chat turn becomes text around the prompt and the reply. The three strings are trusted
    template text: special-token strings in them ARE special (the prompt's and the reply's never are)."""

    name: str  # "dspark", "chatml" or "plain": recorded with results
    before_prompt: str  # what precedes the user's prompt (BOS, system turn, user header)
    after_prompt: str  # between the prompt and the reply (end of the user turn, assistant header)
    end_of_reply: str  # the special token that ends a reply: generation stops at its id (EOS)


DSPARK_CHAT = ChatFormat("dspark", BOS + USER, ASSISTANT, EOS)


class Tokenizer:
    """Text <-> ids, the special-token ids and the chat format. `eos_id` ends a reply, `bos_id` starts every
    prompt; `pad_id`, `mask_id`, `user_id`, `assistant_id` are None in a vocabulary that lacks them."""

    def __init__(self, backend: HFTokenizer, chat: ChatFormat = DSPARK_CHAT) -> None:
        self.backend, self.chat = backend, chat
        added = backend.get_added_tokens_decoder()  # id -> AddedToken
        self.special_strings = tuple(t.content for t in added.values() if t.special)
        if chat == DSPARK_CHAT:
            missing = [t for t in SPECIAL_TOKENS if backend.token_to_id(t) is None]
            if missing:
                raise ValueError(f"tokenizer lacks special tokens {missing}")
        ids = [backend.token_to_id(t) for t in SPECIAL_TOKENS]
        self.pad_id, _, _, self.user_id, self.assistant_id, self.mask_id = ids
        self.eos_id = backend.token_to_id(chat.end_of_reply)
        if self.eos_id is None or chat.end_of_reply not in self.special_strings:
            raise ValueError(
                f"the end of a reply {chat.end_of_reply!r} is not a special token of this tokenizer"
            )
        self._before, self._after = self._template(chat.before_prompt), self._template(chat.after_prompt)
        if not self._before:
            raise ValueError(f"chat format {chat.name!r} starts a prompt with no token")
        self.bos_id = self._before[0]
        self.special_ids = frozenset(backend.token_to_id(t) for t in self.special_strings)

    def _template(self, text: str) -> list[int]:
        """Trusted template text to ids: special-token strings in it become their ids."""
        return self.backend.encode(text, add_special_tokens=False).ids if text else []

    @classmethod
    def load(cls, path: str | Path, chat: ChatFormat = DSPARK_CHAT) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        try:
            backend = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust error text is not very readable
            raise ValueError(f"tokenizer file {path} is corrupt: {exc}") from None
        return cls(backend, chat)

    def save(self, path: str | Path) -> None:
        self.backend.save(str(path))

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Plain text to ids; special-token strings in `text` are NOT special."""
        if not text:
            return []
        # the backend would turn a literal "<|eos|>" into the EOS id
        if any(s in text for s in self.special_strings):
            return self._encode_literal(text)
        return self.backend.encode(text, add_special_tokens=False).ids

    def _encode_literal(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _split_keeping_specials(text, self.special_strings):
            enc = self.backend.encode(piece, add_special_tokens=False).ids
            if piece in self.special_strings:  # spell it with ordinary byte tokens
                enc = [i for ch in piece for i in self.backend.encode(ch).ids]
            ids.extend(enc)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Ids to text (special tokens left out with `skip_special`); an id that is not an integer in the
        vocabulary is a ValueError, not a silent ''."""
        ids = [index_of(i) for i in ids]
        vocab = self.vocab_size
        if ids and not (0 <= min(ids) and max(ids) < vocab):
            bad = next(i for i in ids if not 0 <= i < vocab)
            raise ValueError(f"token id {bad} is outside the tokenizer's vocabulary 0..{vocab - 1}")
        if skip_special:
            ids = [i for i in ids if i not in self.special_ids]
        return self.backend.decode(ids, skip_special_tokens=False)

    def chat_prompt(self, prompt: str) -> list[int]:
        """Ids of the turn up to where the reply starts (`<|bos|><|user|>prompt<|assistant|>`)."""
        return [*self._before, *self.encode(prompt), *self._after]

    def user_turn(self, opening: str = "") -> list[int]:
        """Ids of a turn cut inside the user's message: the template, then `opening`."""
        return [*self._before, *self.encode(opening)]

    def chat_sample(self, prompt: str, response: str) -> list[int]:
        """Ids of a whole training sample, ending with EOS."""
        return [*self.chat_prompt(prompt), *self.encode(response), self.eos_id]


def index_of(token: object) -> int:
    """A token id as a Python int: an integer (or an integer 0-d tensor), never a float or a bool."""
    try:
        if not isinstance(token, bool):
            return operator.index(token)
    except TypeError:
        pass
    raise ValueError(f"token ids must be integers, got {token!r}")


def _split_keeping_specials(text: str, specials: Iterable[str]) -> Iterator[str]:
    """Yield `text` in pieces such that every special-token string is its own piece."""
    start = 0
    while start < len(text):
        hits = [(text.find(s, start), s) for s in specials]
        hits = [(i, s) for i, s in hits if i >= 0]
        if not hits:
            yield text[start:]
            return
        i, s = min(hits, key=lambda hit: (hit[0], -len(hit[1])))  # the longest special starting first
        if i > start:
            yield text[start:i]
        yield s
        start = i + len(s)
