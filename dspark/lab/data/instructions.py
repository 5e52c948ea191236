"""Self-written instructions (Magpie): which of the user turns a chat model wrote for itself to keep.

A chat model given its template only up to the user's turn writes a plausible user request (Xu et al. 2024,
"Magpie"; SmolLM2's own SFT data was made this way). Many samples are noise: this file holds the text-only
half of the method, with no model in it:

* `PREFIXES` steer a share of the samples towards code and math: the user turn starts with the prefix and
  the model continues it (measured: a system prompt asking for code barely moves the mix; a prefix does);
* `drop_reason` says why one sample is dropped (too short or long, cut off, another script, repetition,
  leaked template text, off its domain), None to keep it;
* `NearDuplicates` drops a sample that shares most of its word trigrams with one kept before;
* `split_of` puts each kept prompt in train / val / eval by a hash of its text: the same text always lands
  in the same split, and eval is never trained on.

The sampling itself is `dspark/lab/training/instructions.py`.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict

INSTRUCTION_DOMAINS = ("chat", "code", "math")

# user-turn openings per domain: "" lets the model write the whole turn (its own everyday mix)
# fmt: off
PREFIXES: dict[str, tuple[str, ...]] = {
    "chat": ("", "", "", "", "What", "How", "Tell me", "Explain", "Write a short", "Give me", "I need",
             "What's a good way to", "Can you help me", "Translate", "Summarize", "Why"),
    "code": ("Write a Python function", "Write a Python script", "In Python, how", "How do I",
             "Write a JavaScript function", "Write a SQL query", "Write a function", "Can you explain what",
             "What is the difference between", "I'm getting an error", "How can I use", "Implement",
             "Fix the bug in", "Write a bash", "Write a class", "How do I read"),
    "math": ("Solve", "Calculate", "What is", "A store sells", "If a train", "John has", "Find the value of",
             "How many", "A rectangle has", "Sarah bought", "What is the probability", "Simplify",
             "A recipe calls for", "Compute", "If x", "A car travels"),
}
# fmt: on

CODE_WORDS = re.compile(
    r"\b(python|javascript|java|sql|c\+\+|bash|html|css|rust|code|function|script|program|class|method|"
    r"variable|list|array|string|dictionary|loop|error|exception|regex|api|json|file|algorithm|compile|"
    r"debug|module|library|query|database|integer|return|def|import)\b|```|\(\)",
    re.I,
)
MATH_WORDS = re.compile(
    r"\d|\b(solve|calculate|compute|equation|sum|product|how many|how much|percent|probability|average|"
    r"area|volume|fraction|simplify|integral|derivative|value of|total|cost|ratio)\b",
    re.I,
)
TEMPLATE_TEXT = re.compile(r"<\|[a-z_]+\|>|\b(user|assistant)\s*:\s*$", re.I | re.M)
WORD = re.compile(r"[a-z0-9']+")

MIN_CHARS, MAX_CHARS = 12, 700
MIN_WORDS = 4


def words(text: str) -> list[str]:
    """Lower-case words and numbers of `text` (what repetition and near-duplicates are judged on)."""
    return WORD.findall(text.lower())


def latin_share(text: str) -> float:
    """Share of the letters of `text` that are ASCII (1.0 for a text without letters)."""
    letters = [c for c in text if c.isalpha()]
    return sum(c.isascii() for c in letters) / len(letters) if letters else 1.0


def repetitive(ws: list[str]) -> bool:
    """True for a run of words that repeats itself: few distinct words, or one trigram three or more times."""
    if len(ws) >= 12 and len(set(ws)) / len(ws) < 0.4:
        return True
    counts: dict[tuple[str, ...], int] = defaultdict(int)
    for g in zip(ws, ws[1:], ws[2:]):
        counts[g] += 1
        if counts[g] >= 3:
            return True
    return False


def drop_reason(text: str, domain: str, ended: bool = True) -> str | None:
    """Why the sampled user turn `text` of `domain` is dropped (a short phrase), or None to keep it. `ended`:
    the model closed its turn itself (a turn cut off at the length cap is dropped)."""
    if domain not in INSTRUCTION_DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; expected one of {INSTRUCTION_DOMAINS}")
    stripped = text.strip()
    ws = words(stripped)
    if not ended:
        return "cut off"
    if latin_share(stripped) < 0.95:
        return "other script"
    if len(stripped) < MIN_CHARS or len(ws) < MIN_WORDS:
        return "too short"
    if len(stripped) > MAX_CHARS:
        return "too long"
    if TEMPLATE_TEXT.search(stripped):
        return "template text"
    if repetitive(ws):
        return "repetition"
    if domain == "code" and not CODE_WORDS.search(stripped):
        return "not code"
    if domain == "math" and not MATH_WORDS.search(stripped):
        return "not math"
    if domain != "code" and stripped.count("\n") > 6:
        return "too many lines"
    return None


class NearDuplicates:
    """Remembers kept texts; `seen(text)` is True when `text` shares at least `threshold` (Jaccard) of its word
    trigrams with one of them, or has the same words. Trigrams met more than `common` times are not indexed
    (they say nothing about a pair and would make the lookup quadratic)."""

    def __init__(self, threshold: float = 0.7, common: int = 200) -> None:
        self.threshold, self.common = threshold, common
        self.exact: set[str] = set()
        self.shingles: list[frozenset[tuple[str, ...]]] = []
        self.index: dict[tuple[str, ...], list[int]] = defaultdict(list)

    @staticmethod
    def trigrams(ws: list[str]) -> frozenset[tuple[str, ...]]:
        return frozenset(zip(ws, ws[1:], ws[2:])) if len(ws) >= 3 else frozenset([tuple(ws)])

    def seen(self, text: str) -> bool:
        ws = words(text)
        if " ".join(ws) in self.exact:
            return True
        mine = self.trigrams(ws)
        shared: dict[int, int] = defaultdict(int)
        for g in mine:
            postings = self.index.get(g, ())
            if len(postings) <= self.common:
                for j in postings:
                    shared[j] += 1
        return any(n / len(mine | self.shingles[j]) >= self.threshold for j, n in shared.items())

    def add(self, text: str) -> None:
        ws = words(text)
        self.exact.add(" ".join(ws))
        mine = self.trigrams(ws)
        for g in mine:
            self.index[g].append(len(self.shingles))
        self.shingles.append(mine)


def split_of(text: str, eval_share: float = 0.03, val_share: float = 0.02) -> str:
    """The split of a kept prompt ("eval", "val" or "train") from a hash of its words: stable across runs."""
    h = int.from_bytes(hashlib.sha256(" ".join(words(text)).encode()).digest()[:8], "big") / 2**64
    return "eval" if h < eval_share else "val" if h < eval_share + val_share else "train"
