"""Plain autoregressive decoding: the tokens every speculative path must reproduce at temperature 0.

It is the serving engine with no drafter (γ = 0): one ragged prefill pass, then one token per unfinished
request per step, drawn from the target's distribution, until EOS (kept), `max_new_tokens` or a full
context. So plain and speculative decoding share the stop rule, the target sampling and the bookkeeping,
and the identity check compares the two algorithms: one target token per pass, or drafted blocks verified.
"""

from __future__ import annotations

import torch

from dspark.drafters.base import NoDrafter
from dspark.engine import Run, speculative_generate
from dspark.model import Transformer
from dspark.sampling import SamplingParams


def generate(
    model: Transformer,
    prompts: list[list[int]],
    max_new_tokens: int,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    context: int | None = None,
) -> Run:
    """Generate for every prompt; `eos_id=None` never stops early (benchmarks); `context` < the model's: a
    smaller KV cache. The result's `tokens`, `stop_reasons` ("eos", "length", "context"): see `engine.Run`."""
    drafter = NoDrafter(model.config.vocab_size)
    return speculative_generate(
        model, drafter, prompts, max_new_tokens, params, 0, generator, eos_id, context=context
    )
