"""Bug: the drafter is handed the whole verified block (anchor + every verified draft, rejected
ones included) as committed. Verification keeps the output right, so only
`drafter_gets_exactly_the_committed_tokens` catches it."""

from __future__ import annotations

import a2_solution
import torch
from a2_solution import draft, emit

from dspark.drafters.base import TargetFeatures
from dspark.sampling import probabilities
from dspark.verify import draw_uniforms, verify


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
        stream.pending, stream.pending_features = blocks[r].tolist(), features[r]  # BUG: rejected drafts too
        stream.anchor = int(result.next_token[r])
        stream.done = emit(
            stream.tokens, proposal.tokens[r, :a].tolist() + [stream.anchor], max_new_tokens, eos_id
        )


a2_solution.speculative_round = speculative_round
speculative_generate = a2_solution.speculative_generate
