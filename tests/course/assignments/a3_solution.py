"""Assignment 3, solved from scratch (no dspark.drafters.parallel): the base of the a3_* bugs."""

from __future__ import annotations

import torch

from dspark.sampling import sample_from_probs


def anchor_block(anchors, context_lens, gamma, mask_id):
    tokens = torch.full((len(anchors), gamma), mask_id, dtype=torch.long)
    tokens[:, 0] = anchors
    positions = context_lens[:, None] + torch.arange(gamma)[None, :]
    return tokens, positions


def block_visibility(context_lens, gamma):
    L = int(context_lens.max())
    sees_context = torch.arange(L)[None, :] < context_lens[:, None]  # (R, L)
    context = sees_context[:, None, :].expand(-1, gamma, -1)
    block = torch.ones(len(context_lens), gamma, gamma, dtype=torch.bool)
    return torch.cat([context, block], dim=-1)


def draft_probs(logits, temperature):
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)


def markov_step(u_k, h_k, prev, w1, w2, conf_weight, conf_bias):
    e = w1[prev]  # (R, r)
    logits = u_k + e @ w2.T
    conf = torch.sigmoid(torch.cat([h_k, e], dim=-1) @ conf_weight + conf_bias)
    return logits, conf


def markov_block(base_logits, hidden, anchors, w1, w2, conf_weight, conf_bias, temperature, uniforms):
    prev, tokens, qs, confs = anchors, [], [], []
    for k in range(base_logits.shape[1]):
        logits, conf = markov_step(base_logits[:, k], hidden[:, k], prev, w1, w2, conf_weight, conf_bias)
        q = draft_probs(logits, temperature)
        prev = sample_from_probs(q, uniforms[:, k])
        tokens.append(prev)
        qs.append(q)
        confs.append(conf)
    return torch.stack(tokens, 1), torch.stack(qs, 1), torch.stack(confs, 1)
