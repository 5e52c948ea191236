"""What the engine serves and records: a `Request`, its `RequestRecord` (its output, and its state while
served), one `RoundRecord` per step it took part in, and the statistics of many rounds (`RoundStats`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dspark.drafters.base import TargetFeatures


@dataclass
class RoundRecord:  # one request's share of one step
    verify_len: int  # ℓ, the drafts it verified
    accepted: int  # a ≤ ℓ, the drafts accepted
    emitted: int  # tokens committed: a + 1, fewer where a stop cut the round
    confidences: list[float] | None  # c_1..c_γ ([] in a round without drafts; None: the drafter has no head)


@dataclass
class RoundStats:
    """Every request-round of some runs, grouped by request (DESIGN.md section 7). A request-round verified
    ℓ drafts, accepted a ≤ ℓ and committed a + 1 tokens, fewer where a stop cut it; only committed tokens
    count, in τ as in the position-wise acceptance."""

    requests: list[list[RoundRecord]] = field(default_factory=list)  # per request, its rounds in order

    @classmethod
    def from_lists(
        cls,
        verify_lens: list[list[int]],
        accepted: list[list[int]],
        confidences: list[list[list[float]]] | None = None,
        emitted: list[list[int]] | None = None,
    ) -> RoundStats:
        """From per-request, per-round lists: ℓ, a, c_1..c_γ (a request's [] or None: no confidence head) and
        the tokens committed (default a + 1: no stop cut a round)."""
        requests = []
        for r, (lens, accs) in enumerate(zip(verify_lens, accepted, strict=True)):
            emits = emitted[r] if emitted else [a + 1 for a in accs]
            confs = confidences[r] if confidences and confidences[r] else [None] * len(accs)
            if not len(lens) == len(accs) == len(emits) == len(confs):
                raise ValueError(f"request {r}: ℓ, a, emitted and confidences need one entry per round")
            requests.append([RoundRecord(*round_) for round_ in zip(lens, accs, emits, confs)])
        return cls(requests)

    # per request, per round: ℓ; a ≤ ℓ; tokens committed; c_1..c_γ ([] in a round without drafts; a request
    # of a drafter without a confidence head has [])
    @property
    def verify_lens(self) -> list[list[int]]:
        return [[r.verify_len for r in rounds] for rounds in self.requests]

    @property
    def accepted(self) -> list[list[int]]:
        return [[r.accepted for r in rounds] for rounds in self.requests]

    @property
    def emitted(self) -> list[list[int]]:
        return [[r.emitted for r in rounds] for rounds in self.requests]

    @property
    def confidences(self) -> list[list[list[float]]]:
        return [[r.confidences for r in rounds if r.confidences is not None] for rounds in self.requests]

    def all_rounds(self) -> list[RoundRecord]:
        return [r for rounds in self.requests for r in rounds]

    @property
    def rounds(self) -> int:
        """Number of request-rounds."""
        return sum(map(len, self.requests))

    @property
    def tau(self) -> float:
        """τ: committed tokens per request-round, the bonus/correction token included."""
        return sum(r.emitted for r in self.all_rounds()) / max(1, self.rounds)

    @property
    def mean_verify_len(self) -> float:
        """Mean ℓ over request-rounds."""
        return sum(r.verify_len for r in self.all_rounds()) / max(1, self.rounds)

    def acceptance_by_position(self, gamma: int) -> list[float | None]:
        """Per position k = 1..γ: of the rounds that verified k and accepted 1..k−1, the fraction that
        accepted k (None where none reached k)."""
        hits, tries = self.acceptance_counts(gamma)
        return [h / t if t else None for h, t in zip(hits, tries)]

    def acceptance_counts(self, gamma: int) -> tuple[list[int], list[int]]:
        """(hits, tries) per draft position, over committed tokens only."""
        hits, tries = [0] * gamma, [0] * gamma
        for r in self.all_rounds():
            for k in range(min(r.verify_len, r.accepted + 1, r.emitted)):  # positions reached and output
                tries[k] += 1
                hits[k] += k < r.accepted
        return hits, tries

    def extend(self, other: RoundStats) -> None:
        """Append another run's requests."""
        self.requests += other.requests

    def calibration_arrays(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(N, γ) confidences, events "drafts 1..k accepted" and verified masks of the N rounds with
        confidences (what STS fits on)."""
        conf, events, mask = [], [], []
        for r in self.all_rounds():
            if not r.confidences:  # no confidence head, or a round in which the request did not draft
                continue
            k = torch.arange(1, len(r.confidences) + 1)
            conf.append(torch.tensor(r.confidences, dtype=torch.float64))
            events.append((k <= r.accepted).double())
            mask.append(k <= r.verify_len)
        if not conf:
            raise ValueError("no rounds with confidences (does the drafter have a confidence head?)")
        return torch.stack(conf), torch.stack(events), torch.stack(mask)


@dataclass
class Request:
    prompt: list[int]  # token ids
    max_new_tokens: int  # generation budget
    arrival: float = 0.0  # seconds after the start (Poisson mode; 0 = already waiting)


@dataclass
class RequestRecord:
    """One request in the engine, from admission to its last token (one object per request): what it emitted
    and when, and while it holds a KV-cache slot the host-side state of its decoding."""

    request: Request | None = None
    tokens: list[int] = field(default_factory=list)  # emitted tokens (EOS included when it ended it)
    from_draft: list[bool] = field(default_factory=list)  # per token: an accepted draft?
    rounds: list[RoundRecord] = field(default_factory=list)  # one per step it took part in
    stop_reason: str = ""  # "eos", "length", "context", or "rejected"
    error: str = ""  # why a request was rejected
    submitted: float = 0.0  # seconds after the start: admitted to the queue's head (closed loop) or arrived
    first_token: float = 0.0  # when the first token was emitted
    finished: float = 0.0  # when the last token was emitted
    # while served
    slot: int = -1  # its KV-cache slot (and the drafter's)
    limit: int = 0  # tokens it may emit: its budget, or fewer if the context ends first
    anchor: int = 0  # the last committed token: emitted, not yet in the target cache
    length: int = 0  # its target-cache length
    unseen_tokens: torch.Tensor | None = None  # (n,) committed tokens the drafter has not seen yet
    unseen_features: TargetFeatures | None = None  # the target's features of those n positions

    @property
    def ttft(self) -> float:
        return self.first_token - self.submitted

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, (E2E - TTFT) / (n - 1)."""
        n = len(self.tokens)
        return (self.finished - self.first_token) / (n - 1) if n > 1 else None

    def emit(self, tokens: list[int], drafted: list[bool], eos_id: int | None, now: float) -> bool:
        """Append tokens until a stop rule fires (EOS, the budget, the context); True if it finished."""
        for token, is_draft in zip(tokens, drafted):
            self.tokens.append(token)
            self.from_draft.append(is_draft)
            if eos_id is not None and token == eos_id:
                self.stop_reason = "eos"
            elif len(self.tokens) >= self.limit:
                full = len(self.tokens) >= self.request.max_new_tokens
                self.stop_reason = "length" if full else "context"
            if self.stop_reason:
                self.finished = now
                return True
        return False
