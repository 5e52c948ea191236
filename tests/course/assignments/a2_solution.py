"""Assignment 2, solved without dspark.engine: the base of the a2_* planted bugs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.drafters.base import Drafter, TargetFeatures
from dspark.kv_cache import KVCache
from dspark.model import Transformer
from dspark.sampling import SamplingParams, probabilities, sample
from dspark.verify import draw_uniforms, verify


@dataclass
class Stream:
    slot: int
    anchor: int
    tokens: list[int]
    pending: list[int]
    pending_features: TargetFeatures
    done: bool = False


def emit(emitted, new_tokens, max_new_tokens, eos_id):
    for token in new_tokens:
        emitted.append(token)
        if token == eos_id or len(emitted) >= max_new_tokens:
            return True
    return False


def draft(drafter, streams, gamma, params, generator):
    """The drafter's proposal after every anchor, given what each stream committed since."""
    slots = torch.tensor([s.slot for s in streams])
    committed = torch.tensor([t for s in streams for t in s.pending])
    lens = torch.tensor([len(s.pending) for s in streams])
    features = TargetFeatures(
        torch.cat([s.pending_features.taps for s in streams]),
        torch.cat([s.pending_features.last_hidden for s in streams]),
    )
    anchors = torch.tensor([s.anchor for s in streams])
    return drafter.propose(slots, committed, features, lens, anchors, gamma, params, generator)


def speculative_round(
    target, drafter, cache, streams, gamma, verify_len, params, generator, max_new_tokens, eos_id
):
    R, V = len(streams), target.config.vocab_size
    proposal = draft(drafter, streams, gamma, params, generator)
    slots = torch.tensor([s.slot for s in streams])
    blocks = torch.cat([torch.tensor([[s.anchor] for s in streams]), proposal.tokens[:, :verify_len]], dim=1)
    start = cache.lengths[slots].clone()
    out = target.forward_cached(
        blocks.flatten(), slots, torch.full((R,), verify_len + 1), cache, return_taps=True
    )
    p = torch.zeros(R, gamma + 1, V)
    p[:, : verify_len + 1] = probabilities(out.logits, params).view(R, verify_len + 1, V)
    result = verify(
        proposal.tokens, proposal.probs, p, torch.full((R,), verify_len), *draw_uniforms(R, gamma, generator)
    )
    features = TargetFeatures(out.taps, out.last_hidden).split([verify_len + 1] * R)
    for r, stream in enumerate(streams):
        a = int(result.accepted[r])
        cache.rollback(stream.slot, int(start[r]) + a + 1)
        stream.pending, stream.pending_features = blocks[r, : a + 1].tolist(), features[r].take(a + 1)
        stream.anchor = int(result.next_token[r])
        stream.done = emit(
            stream.tokens, proposal.tokens[r, :a].tolist() + [stream.anchor], max_new_tokens, eos_id
        )


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
