"""Speculative generation for a batch of prompts, and the statistics of its rounds.

`speculative_generate` runs the serving engine (dspark/serving/engine.py) with every
prompt admitted at once; each round: the drafter proposes γ tokens after each
request's anchor, a verify-length function picks ℓ_r (default: all γ, capped
by the context), ONE ragged target pass scores every request's anchor + ℓ_r
drafts, `verify` accepts a_r of them and samples the correction/bonus token,
and the caches roll back to the accepted prefix. Emitted tokens stop at EOS
and at exactly `max_new_tokens`, even inside a block.

With `NoDrafter` (γ = 0) this is plain decoding. At temperature 0 the output
is token-identical to `generation.generate` for every drafter and policy (the
tests check it); at T > 0 it follows the target's distribution exactly.

`tokens_per_round` (τ) and `acceptance_by_position` (DESIGN section 7) are the
round statistics every benchmark reports.

What this file does not do: choose verify lengths (dspark/scheduling/scheduler.py) or
admit requests over time (the engine does, when used directly).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dspark.drafters.base import Drafter
from dspark.generation import GenerationResult, check_prompts
from dspark.model import Transformer
from dspark.sampling import SamplingParams


@dataclass
class SpeculativeResult(GenerationResult):
    from_draft: list[list[bool]] = field(default_factory=list)  # per emitted token: was it an accepted draft?
    verify_lens: list[list[int]] = field(default_factory=list)  # per request, per round: ℓ_r
    accepted: list[list[int]] = field(default_factory=list)  # per request, per round: a_r
    # per request, per round: the drafter's confidences c_1..c_γ (empty lists if it has no confidence head)
    confidences: list[list[list[float]]] = field(default_factory=list)

    @property
    def rounds(self) -> int:
        return sum(len(a) for a in self.accepted)

    @property
    def tau(self) -> float:
        return tokens_per_round(self.accepted)

    def acceptance_by_position(self, gamma: int) -> list[float | None]:
        return acceptance_by_position(self.verify_lens, self.accepted, gamma)


def tokens_per_round(accepted: list[list[int]]) -> float:
    """τ: mean tokens per request-round, the bonus/correction token included."""
    rounds = [a for acc in accepted for a in acc]
    return sum(a + 1 for a in rounds) / max(1, len(rounds))


def acceptance_by_position(
    verify_lens: list[list[int]], accepted: list[list[int]], gamma: int
) -> list[float | None]:
    """Position-wise conditional acceptance (DESIGN section 7): at position k,
    among rounds that verified k and accepted 1..k-1, the fraction accepting k."""
    hits, tries = [0] * gamma, [0] * gamma
    for lens, accs in zip(verify_lens, accepted):
        for ell, a in zip(lens, accs):
            for k in range(min(ell, a + 1)):  # positions 1..min(ℓ, a+1) were reached
                tries[k] += 1
                hits[k] += k < a
    return [h / t if t else None for h, t in zip(hits, tries)]


def speculative_generate(
    target: Transformer,
    drafter: Drafter,
    prompts: list[list[int]],
    max_new_tokens: int,
    params: SamplingParams,
    gamma: int,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    verify_len_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    observe_fn: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> SpeculativeResult:
    """Generate for every prompt with `drafter` proposing `gamma` tokens per round:
    the serving engine (dspark/serving/engine.py) with every prompt admitted at once.

    `verify_len_fn(draft_tokens (R, γ), draft_probs (R, γ, V)) -> (R,)` picks how
    many drafts each request verifies (default: all γ); it must depend on
    nothing but what the drafter produced, or losslessness is lost.
    `observe_fn(verify_lens (R,), accepted (R,))` hears every round's outcome
    (policies that learn from history, dspark/scheduling/scheduler.py)."""
    from dspark.serving.engine import Engine, Request

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    check_prompts(prompts, target.config.max_seq_len)
    engine = Engine(target, drafter, params, gamma, len(prompts), eos_id, verify_len_fn, observe_fn)
    run = engine.run([Request(p, max_new_tokens) for p in prompts], generator)
    recs = run.records
    return SpeculativeResult(
        [r.tokens for r in recs], [r.stop_reason for r in recs], run.prefill_seconds,
        run.seconds - run.prefill_seconds, run.steps, [r.from_draft for r in recs],
        [r.verify_lens for r in recs], [r.accepted for r in recs], [r.confidences for r in recs],
    )  # fmt: skip
