"""Bug: the confidence of slot k reads W1[x_k], the token just drafted, instead of W1[x_{k−1}].
Caught by `confidence_matches_reference` (tokens and q are right)."""

from __future__ import annotations

import torch
from a3_solution import anchor_block, block_visibility, draft_probs, markov_step  # noqa: F401

from dspark.sampling import sample_from_probs


def markov_block(base_logits, hidden, anchors, w1, w2, conf_weight, conf_bias, temperature, uniforms):
    prev, tokens, qs, confs = anchors, [], [], []
    for k in range(base_logits.shape[1]):
        logits, _ = markov_step(base_logits[:, k], hidden[:, k], prev, w1, w2, conf_weight, conf_bias)
        q = draft_probs(logits, temperature)
        prev = sample_from_probs(q, uniforms[:, k])
        _, conf = markov_step(base_logits[:, k], hidden[:, k], prev, w1, w2, conf_weight, conf_bias)  # BUG
        tokens.append(prev)
        qs.append(q)
        confs.append(conf)
    return torch.stack(tokens, 1), torch.stack(qs, 1), torch.stack(confs, 1)
