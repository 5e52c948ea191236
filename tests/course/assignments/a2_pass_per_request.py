"""Bug: every request gets its own target pass each round (right output, R times the passes).
Caught by `one_target_pass_per_round`."""

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
    V = target.config.vocab_size
    proposal = draft(drafter, streams, gamma, params, generator)
    for r, stream in enumerate(streams):  # BUG: one pass per request instead of one ragged pass
        block = torch.tensor([stream.anchor, *proposal.tokens[r, :verify_len].tolist()])
        slot = torch.tensor([stream.slot])
        start = int(cache.lengths[stream.slot])
        out = target.forward_cached(block, slot, torch.tensor([verify_len + 1]), cache, return_taps=True)
        p = torch.zeros(1, gamma + 1, V)
        p[0, : verify_len + 1] = probabilities(out.logits, params)
        result = verify(
            proposal.tokens[r : r + 1],
            proposal.probs[r : r + 1],
            p,
            torch.tensor([verify_len]),
            *draw_uniforms(1, gamma, generator),
        )
        a = int(result.accepted[0])
        cache.rollback(stream.slot, start + a + 1)
        stream.pending = block[: a + 1].tolist()
        stream.pending_features = TargetFeatures(out.taps, out.last_hidden).take(a + 1)
        stream.anchor = int(result.next_token[0])
        stream.done = emit(
            stream.tokens, proposal.tokens[r, :a].tolist() + [stream.anchor], max_new_tokens, eos_id
        )


a2_solution.speculative_round = speculative_round
speculative_generate = a2_solution.speculative_generate
