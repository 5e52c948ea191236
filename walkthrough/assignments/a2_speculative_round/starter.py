"""Assignment 2 — the speculative round: draft, ONE ragged target pass, verify, roll back, emit.

Fill in `emit` and `speculative_round`; `prefill` and the loop `speculative_generate` are
given. Then grade your work with

    python -m dspark.grade 2 walkthrough/assignments/a2_speculative_round/starter.py

handout.md, next to this file, explains the round and names the check that proves each step.

The pieces you use (read their docstrings): `Transformer.forward_cached` (dspark/model.py)
appends a ragged block per KV-cache slot and advances the cache; `KVCache.rollback`
(dspark/kv_cache.py) forgets positions; `drafter.propose` (dspark/drafters/base.py) returns
a `Proposal` (tokens, q and `probs`, confidence); `verify` and `draw_uniforms` (dspark/verify.py) are
assignment 1's answer; `probabilities` (dspark/sampling.py) turns logits into p. Do not
import dspark.engine: it is the answer.

Simplifications: every request verifies the same number of drafts ℓ each round
(`verify_len`, default γ), and the prompts leave room in the context, so you need not cap ℓ.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.drafters.base import Drafter, TargetFeatures
from dspark.kv_cache import KVCache
from dspark.model import Transformer
from dspark.sampling import SamplingParams, probabilities, sample
from dspark.verify import draw_uniforms, verify  # noqa: F401  (you will need them)


@dataclass
class Stream:
    """One request being decoded."""

    slot: int  # its KV-cache slot (the drafter indexes its own state by the same slot)
    anchor: int  # the newest emitted token: emitted, but not yet fed to the target
    tokens: list[int]  # every token emitted so far (the prompt not included)
    pending: list[int]  # tokens fed to the target and kept since the drafter's last call
    pending_features: TargetFeatures  # the target's features at exactly those positions
    done: bool = False


def emit(emitted: list[int], new_tokens: list[int], max_new_tokens: int, eos_id: int | None) -> bool:
    """Append `new_tokens` to `emitted` one by one until a stop rule fires; return True if it did.

    A request stops right after EOS (EOS is kept as its last token) or as soon as it holds
    `max_new_tokens` tokens; the tokens after the stop are dropped, even inside a block.
    """
    raise NotImplementedError


def speculative_round(
    target: Transformer,
    drafter: Drafter,
    cache: KVCache,
    streams: list[Stream],
    gamma: int,
    verify_len: int,
    params: SamplingParams,
    generator: torch.Generator,
    max_new_tokens: int,
    eos_id: int | None,
) -> None:
    """One speculative round for every stream in `streams` (all unfinished); updates them in place.

    1. the drafter proposes γ drafts after every anchor, given each stream's pending tokens
       and features (what was committed since its last call);
    2. ONE `target.forward_cached` pass over every stream's anchor + first `verify_len`
       drafts (return_taps=True: the drafter needs the features next round);
    3. `verify` with the target's distributions p (row k for draft position k + 1; pad rows
       beyond ℓ, they are never read) and fresh `draw_uniforms(R, γ, generator)`;
    4. roll every stream's cache back to its anchor + the accepted drafts; those become its
       pending tokens and features; the correction/bonus token becomes the new anchor;
    5. `emit` the accepted drafts and the new anchor, which may finish the stream.
    """
    raise NotImplementedError


# ---- given ----------------------------------------------------------------------------------------
def prefill(
    target: Transformer,
    cache: KVCache,
    prompts: list[list[int]],
    params: SamplingParams,
    generator: torch.Generator,
    max_new_tokens: int,
    eos_id: int | None,
) -> list[Stream]:
    """ONE ragged pass over every prompt; each request's first token is emitted and becomes its anchor."""
    slots = [cache.allocate() for _ in prompts]
    lens = torch.tensor([len(p) for p in prompts])
    flat = torch.tensor([t for p in prompts for t in p])
    out = target.forward_cached(flat, torch.tensor(slots), lens, cache, return_taps=True)
    first = sample(probabilities(out.logits[lens.cumsum(0) - 1], params), generator)
    features = TargetFeatures(out.taps, out.last_hidden).split(lens.tolist())
    streams = []
    for i, prompt in enumerate(prompts):
        stream = Stream(slots[i], int(first[i]), [], list(prompt), features[i])
        stream.done = emit(stream.tokens, [stream.anchor], max_new_tokens, eos_id)
        streams.append(stream)
    return streams


@torch.no_grad()
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
    """New tokens per prompt (EOS included where it ended the request): prefill, then rounds."""
    cache = target.new_cache(len(prompts))
    drafter.reset(cache.n_slots)
    streams = prefill(target, cache, prompts, params, generator, max_new_tokens, eos_id)
    while not all(s.done for s in streams):
        active = [s for s in streams if not s.done]
        speculative_round(
            target,
            drafter,
            cache,
            active,
            gamma,
            gamma if verify_len is None else verify_len,
            params,
            generator,
            max_new_tokens,
            eos_id,
        )
    return [s.tokens for s in streams]
