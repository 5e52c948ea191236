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
    flattens by position; the core's `Vocabulary` is the target's whole vocabulary (ids map to themselves, its
    logits are the target's LM head) and a `Proposal` without one reads its q as the target's distribution."""
    import torch

    from dspark.drafters.base import NoDrafter, Proposal, TargetFeatures, Vocabulary
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

    vocab = Vocabulary(tiny_model)
    ids = torch.tensor([0, 3, V - 1])
    assert vocab.size == 0 and vocab.n_out == vocab.n_prev == V
    assert torch.equal(vocab.to_draft(ids), ids) and torch.equal(vocab.to_target(ids), ids)
    normed = torch.randn(2, dim)
    torch.testing.assert_close(vocab.logits(normed), normed @ tiny_model.lm_head.weight.T)
    q = torch.softmax(torch.randn(3, 4, V), -1)
    assert Proposal(ids, q).probs is q
