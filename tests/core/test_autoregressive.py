"""dspark/drafters/autoregressive.py (MTP, EAGLE): the unrolled training forward equals inference, and
speculative sampling with them follows the target law exactly (chi-square)."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import MICRO, MICRO_LENGTH, MICRO_PROMPT, TINY, make_drafter, micro_target_and_law
from stats_helpers import assert_matches

from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.base import TargetFeatures
from dspark.engine import speculative_generate
from dspark.lab.training.drafters import new_drafter, unrolled_log_probs
from dspark.sampling import SamplingParams
from dspark.training import FeatureBatch


@pytest.mark.parametrize("kind, gamma", [("eagle", 3), ("mtp", 1), ("eagle-copy", 2)])
def test_sampled_output_follows_the_target_exactly(kind, gamma):
    target, joint = micro_target_and_law()
    params, prompt, length = SamplingParams(temperature=1.0), MICRO_PROMPT, MICRO_LENGTH
    drafter = make_drafter(kind, target, gamma)
    g = torch.Generator().manual_seed(42)
    counts = torch.zeros(MICRO.vocab_size**length)
    accepted_any = 0
    for _ in range(12):
        result = speculative_generate(target, drafter, [prompt] * 1000, length, params, gamma, generator=g)
        for toks in result.tokens:
            counts[toks[0] * 25 + toks[1] * 5 + toks[2]] += 1
        accepted_any += sum(itertools.chain(*result.from_draft))
    assert accepted_any > 500  # drafts were really accepted, so the test exercises verification
    assert_matches(counts, joint.flatten())


def test_eagle3_layer_unrolled_training_equals_inference(tiny_model):
    torch.manual_seed(0)
    drafter = new_drafter(tiny_model, "eagle", 4, ffn_hidden=64, eagle3_layer=True).eval()
    assert not hasattr(drafter, "w_in") and drafter.layers[0].attn.wq.in_features == 2 * TINY.dim
    tokens = torch.randint(0, 97, (1, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = tiny_model(tokens, return_taps=True)
        batch = FeatureBatch(tokens, torch.tensor([16]), torch.tensor([0]), out.taps, out.last_hidden)
        steps = unrolled_log_probs(drafter, tiny_model, batch, 3)
        i = 6  # chain i: committed positions 0..i, then the true tokens fed back with the drafter's own output
        drafter.reset(1)
        slot = torch.tensor([0])
        feats = TargetFeatures(out.taps[0, : i + 1], out.last_hidden[0, : i + 1])
        g = drafter._run(
            drafter.entries(tokens[0, 1 : i + 2], drafter.features_of(feats)), slot, torch.tensor([i + 1])
        )
        for k, (log_q, _, valid) in enumerate(steps):
            row = int(valid.flatten()[:i].sum())
            torch.testing.assert_close(log_q[row], torch.log_softmax(drafter.logits(g[-1:]).float(), -1)[0],
                                       atol=1e-4, rtol=0)  # fmt: skip
            g = drafter._run(
                drafter.entries(tokens[0, i + k + 2 : i + k + 3], g[-1:]), slot, torch.tensor([1])
            )


@pytest.mark.parametrize("kind, unroll, layers", [("mtp", 1, 1), ("eagle", 4, 1), ("eagle", 3, 2)])
def test_unrolled_training_forward_matches_inference(tiny_model, kind, unroll, layers):
    torch.manual_seed(0)
    config = AutoregressiveDrafterConfig(kind, 1 if kind == "mtp" else 4, n_layers=layers, ffn_hidden=64)
    drafter = AutoregressiveDrafter(tiny_model, config).eval()
    tokens = torch.randint(0, 97, (2, 20))
    lengths = torch.tensor([20, 14])
    with torch.no_grad():
        out = tiny_model(tokens, return_taps=True)
        batch = FeatureBatch(tokens, lengths, torch.tensor([0, 0]), out.taps, out.last_hidden)
        steps = unrolled_log_probs(drafter, tiny_model, batch, unroll)
        other = FeatureBatch(
            tokens, lengths, torch.tensor([0, 0]), out.taps, torch.randn_like(out.last_hidden)
        )
        assert torch.equal(steps[0][0], unrolled_log_probs(drafter, tiny_model, other, unroll)[0][0]) != (
            kind == "mtp"
        )  # the final hidden state is read by MTP-1 only (EAGLE fuses the tap layers)
        for b, i in [(0, 0), (0, 7), (1, 5), (0, 15)]:
            # inference: entries for committed positions 0..i (the token after i is the anchor) ...
            drafter.reset(1)
            slot = torch.tensor([0])
            feats = TargetFeatures(out.taps[b, : i + 1], out.last_hidden[b, : i + 1])
            x = drafter.entries(tokens[b, 1 : i + 2], drafter.features_of(feats))
            g = drafter._run(x, slot, torch.tensor([i + 1]))[-1:]
            for k in range(unroll):
                if i + k + 2 >= lengths[b]:  # the token it predicts does not exist: not supervised
                    assert not steps[k][2][b, i] if k < len(steps) else True
                    break
                log_q, _, valid = steps[k]
                assert valid[b, i]
                row = int(valid.flatten()[: b * valid.shape[1] + i].sum())  # rows: supervised chains only
                ref = torch.log_softmax(drafter.logits(g).float(), -1)[0]
                torch.testing.assert_close(log_q[row], ref, atol=1e-4, rtol=0)
                if i + k + 2 >= lengths[b]:
                    break
                # ... then feed the true next token with the drafter's own output as feature
                g = drafter._run(
                    drafter.entries(tokens[b, i + k + 2 : i + k + 3], g), slot, torch.tensor([1])
                )
