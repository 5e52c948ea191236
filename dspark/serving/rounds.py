"""The statistics of speculative rounds: one type for the engine, the study and calibration.

A *request-round* is one request's share of one speculative step: it verified
ℓ drafts, accepted a of them (a ≤ ℓ) and emitted a + 1 tokens (the accepted
drafts + the correction or bonus token). `RoundStats` keeps, per request, the
list of its rounds' ℓ, a and the drafter's confidences c_1..c_γ, and defines
the numbers every benchmark reports (walkthrough/DESIGN.md section 7):

  * τ (`tau`): committed tokens per request-round (= per target pass of a
    request): a + 1 (the accepted drafts and the bonus/correction token),
    except in a request's last round, where EOS or the token limit may cut
    the round short -- tokens drafted and accepted past the stop are not
    output and do not count;
  * position-wise conditional acceptance (`acceptance_by_position`): at draft
    position k, among the rounds that verified position k and accepted 1..k−1,
    the fraction that accepted k (paper Fig. 2); over committed tokens too: a
    round cut after e tokens counts its positions 1..e only;
  * the arrays STS calibration fits on (`calibration_arrays`).

The engine fills one per run (`EngineResult.stats`), `speculative_generate`
returns it with the tokens (`SpeculativeResult.stats`), the offline study
pools them over prompts (`extend`).

What this file does not do: run rounds (dspark/serving/engine.py) or fit
anything (dspark/scheduling/calibration.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RoundStats:
    """Every request-round of some runs, grouped by request."""

    verify_lens: list[list[int]] = field(default_factory=list)  # per request, per round: ℓ
    accepted: list[list[int]] = field(default_factory=list)  # per request, per round: accepted drafts a ≤ ℓ
    # per request, per round: the drafter's confidences c_1..c_γ (empty lists without a confidence head)
    confidences: list[list[list[float]]] = field(default_factory=list)
    # per request, per round: tokens committed, a + 1 unless a stop cut the round (default: a + 1)
    emitted: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.emitted:  # recorded without stops in mind: every round committed a + 1
            self.emitted = [[a + 1 for a in acc] for acc in self.accepted]
        if [len(e) for e in self.emitted] != [len(a) for a in self.accepted]:
            raise ValueError("emitted must have one entry per round, like accepted")

    @property
    def rounds(self) -> int:
        """Number of request-rounds."""
        return sum(len(a) for a in self.accepted)

    @property
    def tau(self) -> float:
        """τ: committed tokens per request-round, the bonus/correction token included."""
        return sum(map(sum, self.emitted)) / max(1, self.rounds)

    @property
    def mean_verify_len(self) -> float:
        """Mean ℓ over request-rounds."""
        return sum(map(sum, self.verify_lens)) / max(1, self.rounds)

    def acceptance_by_position(self, gamma: int) -> list[float | None]:
        """Per draft position k = 1..γ: among rounds that verified k and accepted 1..k−1,
        the fraction that accepted k (None where no round reached k)."""
        hits, tries = self.acceptance_counts(gamma)
        return [h / t if t else None for h, t in zip(hits, tries)]

    def acceptance_counts(self, gamma: int) -> tuple[list[int], list[int]]:
        """(hits, tries) per draft position: the counts behind `acceptance_by_position`. Like τ they count
        committed tokens: in a round a stop cut after e tokens, drafts past the e-th were never output."""
        hits, tries = [0] * gamma, [0] * gamma
        for lens, accs, emits in zip(self.verify_lens, self.accepted, self.emitted):
            for ell, a, e in zip(lens, accs, emits):
                for k in range(min(ell, a + 1, e)):  # positions 1..min(ℓ, a+1, e) were reached and output
                    tries[k] += 1
                    hits[k] += k < a
        return hits, tries

    def extend(self, other: RoundStats) -> None:
        """Append another run's requests."""
        self.verify_lens += other.verify_lens
        self.accepted += other.accepted
        self.confidences += other.confidences
        self.emitted += other.emitted

    def calibration_arrays(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(N, γ) confidences, (N, γ) event "drafts 1..k accepted", (N, γ) mask of verified
        positions, over the N request-rounds that carry confidences (STS fits on these)."""
        conf, events, mask = [], [], []
        for L, A, C in zip(self.verify_lens, self.accepted, self.confidences):
            for ell, a, c in zip(L, A, C):
                if not c:  # a round in which the request did not draft
                    continue
                k = torch.arange(1, len(c) + 1)
                conf.append(torch.tensor(c, dtype=torch.float64))
                events.append((k <= a).double())
                mask.append(k <= ell)
        if not conf:
            raise ValueError("no rounds with confidences (does the drafter have a confidence head?)")
        return torch.stack(conf), torch.stack(events), torch.stack(mask)
