"""dspark/drafters/base.py: a Proposal carries confidences only from a drafter with a trained head."""

from __future__ import annotations

from helpers import make, propose_once

from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig


def test_drafters_without_a_trained_head_propose_no_confidence(tiny_model):
    dflash = make(tiny_model, "dflash")
    eagle = AutoregressiveDrafter(tiny_model, AutoregressiveDrafterConfig("eagle", 4, ffn_hidden=32)).eval()
    for drafter in (dflash, eagle):
        assert not drafter.has_confidence
        assert propose_once(drafter, tiny_model).confidence is None


def test_the_contract_pieces_do_what_the_loop_relies_on(tiny_model):
    """`NoDrafter` proposes an empty block (the loop becomes plain decoding); `TargetFeatures` splits, takes and
    flattens by position; the core's drafters score the target's whole vocabulary with its LM head, and a
    `Proposal` without a reduced vocabulary reads its q as the target's distribution."""
    import torch

    from dspark.drafters.base import NoDrafter, Proposal, TargetFeatures
    from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig
    from dspark.sampling import SamplingParams

    V, dim = tiny_model.config.vocab_size, tiny_model.config.dim
    slots = torch.tensor([0, 1, 2])
    empty = NoDrafter(V).propose(slots, None, None, None, None, 0, SamplingParams(0.0), torch.Generator())
    assert empty.tokens.shape == (3, 0) and empty.q.shape == (3, 0, V) and empty.confidence is None

    feats = TargetFeatures(torch.arange(5 * 2 * 3.0).view(5, 2, 3), torch.arange(5 * 4.0).view(5, 4))
    first, rest = feats.split([2, 3])
    assert torch.equal(first.taps, feats.taps[:2]) and torch.equal(rest.last_hidden, feats.last_hidden[2:])
    assert torch.equal(feats.take(2).taps, first.taps) and feats.flat().shape == (5, 6)
    assert torch.equal(feats.flat()[1], feats.taps[1].flatten())

    drafter = ParallelDrafter(tiny_model, ParallelDrafterConfig(gamma=2, n_layers=1, ffn_hidden=8, rank=4))
    assert drafter.head.w1.weight.shape[0] == drafter.head.w2.weight.shape[0] == V  # a row per target id
    ids = torch.tensor([0, 3, V - 1])
    normed = torch.randn(2, dim)
    torch.testing.assert_close(drafter.target.lm_head(normed), normed @ tiny_model.lm_head.weight.T)
    h = torch.randn(2, 2, dim)
    torch.testing.assert_close(drafter.block_outputs(h)[1], drafter.out_norm(h) @ tiny_model.lm_head.weight.T)
    q = torch.softmax(torch.randn(3, 4, V), -1)
    assert Proposal(ids, q).probs is q
