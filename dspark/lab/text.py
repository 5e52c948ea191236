"""Text as `generate` prints it: a reply cut by a token limit inside a character ends there, not in U+FFFD.

`decode_complete` rebuilds the bytes a byte-level BPE tokenizer's ids stand for and reads them with Python's
incremental UTF-8 decoder, which holds back an unfinished sequence at the end instead of replacing it.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from dspark.tokenizer import Tokenizer, index_of


def decode_complete(tokenizer: Tokenizer, ids: Iterable[int], skip_special: bool = True) -> str:
    """`tokenizer.decode(ids)` without a character cut off at the end: when the ids stop inside a character's
    UTF-8 bytes (a reply cut by a token limit), `decode` ends in one U+FFFD for those bytes; this leaves it out.
    A U+FFFD the ids spell in full (bytes EF BF BD) stays, and so does one for bytes that are invalid wherever
    the text stops (a stray continuation byte, say).

    The bytes are rebuilt from the byte-level BPE alphabet; a backend whose decode is not those bytes read as
    UTF-8 (another decoder) gets `decode(ids)` back unchanged."""
    ids = [index_of(i) for i in ids]
    text = tokenizer.decode(ids, skip_special)
    if not text.endswith("\ufffd"):
        return text
    if skip_special:
        ids = [i for i in ids if i not in tokenizer.special_ids]
    data = b"".join(token_bytes(tokenizer, i) for i in ids)
    if data.decode("utf-8", errors="replace") != text:  # not a plain byte-level decoder: cannot tell
        return text
    # the incremental decoder holds back an incomplete sequence at the end instead of replacing it
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=False)


def token_bytes(tokenizer: Tokenizer, token_id: int) -> bytes:
    """The bytes a byte-level decoder gives for one token: each character of the token's string mapped back
    through the byte alphabet, or, when one is not in it (an added token holding an emoji, say), the string's
    own UTF-8, as the `tokenizers` ByteLevel decoder does."""
    token = tokenizer.backend.id_to_token(token_id) or ""
    try:
        return bytes(BYTE_OF_CHAR[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


def byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's character for each byte (GPT-2's table), read backwards: character -> byte. Printable
    Latin-1 bytes are their own character; the others are U+0100 onwards, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}


BYTE_OF_CHAR = byte_alphabet()
