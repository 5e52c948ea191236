"""Plain autoregressive decoding: the tokens every speculative path must reproduce at temperature 0.

It is the serving engine with no drafter (γ = 0): one ragged prefill pass, then one token per unfinished
request per step, drawn from the target's distribution, until EOS (kept), `max_new_tokens` or a full
context. So plain and speculative decoding share the stop rule, the target sampling and the bookkeeping,
and the identity check compares the two algorithms: one target token per pass, or drafted blocks verified.
"""

from __future__ import annotations

import torch

from dspark.drafters.base import NoDrafter
from dspark.engine import Engine, Request, Run, check_inputs
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
    check_inputs(prompts, max_new_tokens, model.config)
    engine = Engine(
        model, NoDrafter(model.config.vocab_size), params, 0, len(prompts), eos_id, context=context
    )
    return engine.run([Request(p, max_new_tokens) for p in prompts], generator)
