"""Reference solution of assignment 2 (the speculative round), built on dspark/engine.py.

`speculative_generate` is the project's serving engine with every prompt admitted at once
(`dspark.engine.speculative_generate`) and a fixed verify length; `emit`
is the stop rule the engine applies inside `Engine.run`. The engine's round is not a
separate function, so this adapter has no `speculative_round`: the checks grade a
round only through `speculative_generate` (DESIGN §6).
What this file does not do: anything beyond adapting signatures.
"""

from __future__ import annotations

import torch

from dspark import engine
from dspark.drafters.base import Drafter
from dspark.model import Transformer
from dspark.sampling import SamplingParams
from dspark.scheduler import FixedPolicy, Scheduler, ThroughputProfile


def emit(emitted: list[int], new_tokens: list[int], max_new_tokens: int, eos_id: int | None) -> bool:
    for token in new_tokens:
        emitted.append(token)
        if (eos_id is not None and token == eos_id) or len(emitted) >= max_new_tokens:
            return True
    return False


def speculative_generate(
    target: Transformer,
    drafter: Drafter,
    prompts: list[list[int]],
    max_new_tokens: int,
    gamma: int,
    params: SamplingParams,
    generator: torch.Generator,
    eos_id: int | None = None,
    verify_len: int | None = None,
) -> list[list[int]]:
    fixed = Scheduler(FixedPolicy("fixed", verify_len), ThroughputProfile([1.0]))  # None: all γ
    result = engine.speculative_generate(
        target, drafter, prompts, max_new_tokens, params, gamma, generator, eos_id, fixed
    )
    return result.tokens
