"""Speculative generation for a batch of prompts, and the statistics of its rounds.

`speculative_generate` runs the serving engine (dspark/serving/engine.py) with every
prompt admitted at once; each round: the drafter proposes γ tokens after each
request's anchor, a scheduler picks ℓ_r (default: all γ, capped
by the context), ONE ragged target pass scores every request's anchor + ℓ_r
drafts, `verify` accepts a_r of them and samples the correction/bonus token,
and the caches roll back to the accepted prefix. Emitted tokens stop at EOS
and at exactly `max_new_tokens`, even inside a block.

With `NoDrafter` (γ = 0) this is plain decoding. At temperature 0 the output
is token-identical to `decoding.generate` for every drafter and policy (the
tests check it); at T > 0 it follows the target's distribution exactly.

The result carries the rounds' statistics (`RoundStats`, dspark/serving/requests.py:
τ and position-wise acceptance) next to the tokens.

What this file does not do: choose verify lengths (dspark/scheduling/scheduler.py) or
admit requests over time (the engine does, when used directly).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dspark.decoding import GenerationResult, check_max_new_tokens, check_prompts
from dspark.drafters.base import Drafter
from dspark.model import Transformer
from dspark.sampling import SamplingParams
from dspark.scheduling.scheduler import Scheduler
from dspark.serving.engine import Engine, Request
from dspark.serving.requests import RoundStats


@dataclass
class SpeculativeResult(GenerationResult):
    from_draft: list[list[bool]] = field(default_factory=list)  # per emitted token: was it an accepted draft?
    stats: RoundStats = field(default_factory=RoundStats)  # per request, per round: ℓ_r, a_r, confidences


def speculative_generate(
    target: Transformer,
    drafter: Drafter,
    prompts: list[list[int]],
    max_new_tokens: int,
    params: SamplingParams,
    gamma: int,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    scheduler: Scheduler | None = None,
) -> SpeculativeResult:
    """Generate for every prompt with `drafter` proposing `gamma` tokens per round:
    the serving engine (dspark/serving/engine.py) with every prompt admitted at once.

    `scheduler` (dspark/scheduling/scheduler.py; default: every request verifies all γ)
    picks who drafts and how many drafts each request verifies; it must depend on
    nothing but the proposal and earlier rounds, or losslessness is lost."""
    check_max_new_tokens(max_new_tokens)
    check_prompts(prompts, target.config.max_seq_len, target.config.vocab_size)
    engine = Engine(target, drafter, params, gamma, len(prompts), eos_id, scheduler)
    run = engine.run([Request(p, max_new_tokens) for p in prompts], generator)
    recs = run.records
    return SpeculativeResult(
        [r.tokens for r in recs], [r.stop_reason for r in recs], run.prefill_seconds,
        run.seconds - run.prefill_seconds, run.steps, [r.from_draft for r in recs], run.stats,
    )  # fmt: skip
