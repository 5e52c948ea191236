"""Bug: slot k is conditioned on x_k instead of x_{k−1} -- a first guess of slot k's own token
from the backbone alone is fed to the Markov term of the same slot.
Caught by `block_tokens_and_q_match_reference`."""

from __future__ import annotations

import torch
from a3_solution import anchor_block, block_visibility, draft_probs, markov_step  # noqa: F401

from dspark.sampling import sample_from_probs


def markov_block(base_logits, hidden, anchors, w1, w2, conf_weight, conf_bias, temperature, uniforms):
    tokens, qs, confs = [], [], []
    for k in range(base_logits.shape[1]):
        guess = sample_from_probs(draft_probs(base_logits[:, k], temperature), uniforms[:, k])
        # BUG: B_k reads W1[x_k] (this slot's own guess), not W1[x_{k-1}]
        logits, conf = markov_step(base_logits[:, k], hidden[:, k], guess, w1, w2, conf_weight, conf_bias)
        q = draft_probs(logits, temperature)
        tokens.append(sample_from_probs(q, uniforms[:, k]))
        qs.append(q)
        confs.append(conf)
    return torch.stack(tokens, 1), torch.stack(qs, 1), torch.stack(confs, 1)
