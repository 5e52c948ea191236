"""Prompt lookup: drafts copied from the request's own text, with no training (the free alternative).

The rule, for each request each round (as `transformers`' prompt-lookup decoding and vLLM's n-gram proposer
do it): take the last n tokens of its text so far (prompt, output, and the anchor), for n = max_ngram down to
min_ngram; find the most recent earlier place where those n tokens occur; draft the up to γ tokens that
followed them there. No match for any n: nothing to copy.

The drafts are chosen without randomness, so q_k is one-hot on each of them: verification accepts x_k with
probability p(x_k) and otherwise resamples from (p - δ_{x_k})⁺ — the target's distribution at every
temperature, through the same `verify` as every drafter (greedy: accepted exactly when it is the argmax).

Every row of a `Proposal` is γ wide. Where the match ran out, the block is filled with the last token and
confidence 0 (copied drafts have confidence 1), so a policy that reads confidences (`--policy threshold`, or
DSpark's prefix scheduler) verifies only what was copied; `fixed` verifies the filler too, which costs target
work but stays exact.
"""

from __future__ import annotations

import torch

from dspark.drafters.base import Drafter, Proposal


def lookup(text: list[int], gamma: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to γ tokens that followed the most recent earlier occurrence of `text`'s last n tokens, for the largest
    n in max_ngram..min_ngram that occurs earlier; [] if none does."""
    for n in range(min(max_ngram, len(text) - 1), min_ngram - 1, -1):
        tail = text[-n:]
        for start in range(len(text) - n - 1, -1, -1):  # most recent first; the tail itself is not a match
            if text[start : start + n] == tail:
                return text[start + n : start + n + gamma]
    return []


class PromptLookupDrafter(Drafter):
    """Drafts by `lookup` over each request's text; keeps that text per cache slot."""

    name = "prompt-lookup"
    has_confidence = True  # 1 on copied drafts, 0 on filler: not a trained head, a flag a policy can read

    def __init__(self, vocab_size: int, max_gamma: int = 8, max_ngram: int = 3, min_ngram: int = 1) -> None:
        super().__init__()
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.vocab_size, self.max_gamma = vocab_size, max_gamma
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.texts: list[list[int]] = []

    def reset(self, n_slots: int) -> None:
        self.texts = [[] for _ in range(n_slots)]

    def release(self, slot: int) -> None:
        self.texts[slot] = []

    def propose(self, slots, committed_tokens, features, committed_lens, anchors, gamma, params, generator):
        if gamma > self.max_gamma:
            raise ValueError(f"prompt lookup drafts at most {self.max_gamma} tokens, asked for {gamma}")
        R, device = slots.shape[0], slots.device
        # one host read: the search runs over Python lists
        flat = torch.cat([slots, committed_lens, anchors, committed_tokens]).long().tolist()
        rows, confs, start = [], [], 3 * R
        for slot, n, anchor in zip(flat[:R], flat[R : 2 * R], flat[2 * R : 3 * R]):
            text = self.texts[slot]
            text += flat[start : start + n]  # what the request committed since the last call
            start += n
            drafts = lookup(text + [anchor], gamma, self.max_ngram, self.min_ngram)
            fill = gamma - len(drafts)
            rows.append(drafts + [drafts[-1] if drafts else anchor] * fill)
            confs.append([1.0] * len(drafts) + [0.0] * fill)
        tokens = torch.tensor(rows, dtype=torch.long, device=device).view(R, gamma)  # (R, γ)
        q = torch.nn.functional.one_hot(tokens, self.vocab_size).float()  # (R, γ, V): each draft for certain
        return Proposal(tokens, q, torch.tensor(confs, device=device).view(R, gamma))
