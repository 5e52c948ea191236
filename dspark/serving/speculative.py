"""Speculative generation for a batch of prompts: the engine with every prompt admitted at once.

At T = 0 the output is token-identical to `decoding.generate` for every drafter and policy; at T > 0 it
follows the target's distribution exactly. Tokens stop at EOS and at exactly `max_new_tokens`.
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
    """Generate for every prompt, `drafter` proposing `gamma` tokens per round; `scheduler` (default: verify
    all γ) must depend only on the proposal and earlier rounds, or losslessness is lost."""
    check_max_new_tokens(max_new_tokens)
    check_prompts(prompts, target.config.max_seq_len, target.config.vocab_size)
    engine = Engine(target, drafter, params, gamma, len(prompts), eos_id, scheduler)
    run = engine.run([Request(p, max_new_tokens) for p in prompts], generator)
    recs = run.records
    return SpeculativeResult(
        [r.tokens for r in recs], [r.stop_reason for r in recs], run.prefill_seconds,
        run.seconds - run.prefill_seconds, run.steps, [r.from_draft for r in recs], run.stats,
    )  # fmt: skip
