"""dspark/training.py: the block masks (hand-worked; no block sees at or after its anchor), packed training
blocks == the inference path, the block losses and their recipe options."""

from __future__ import annotations

import pytest
import torch
from helpers import TINY, live, make

from dspark.drafters.base import TargetFeatures
from dspark.lab.training.anchors import sample_anchors
from dspark.training import BlockLoss, block_losses, block_visibility, packed_blocks


def test_block_visibility_hand_worked():
    vis = block_visibility(torch.tensor([[2, 4]]), T=6, gamma=2)[0].int()
    #            ctx 0..5        block slots (a=2: 0,1 | a=4: 2,3)
    expected = [[1, 1, 0, 0, 0, 0, 1, 1, 0, 0],
                [1, 1, 0, 0, 0, 0, 1, 1, 0, 0],
                [1, 1, 1, 1, 0, 0, 0, 0, 1, 1],
                [1, 1, 1, 1, 0, 0, 0, 0, 1, 1]]  # fmt: skip
    assert vis.tolist() == expected


@pytest.mark.parametrize("kind", ["dflash", "dspark", "dspark-rnn"])
def test_packed_training_blocks_equal_the_inference_path(tiny_model, kind):
    drafter = make(tiny_model, kind)
    tokens = torch.randint(0, TINY.vocab_size, (1, 30), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[3, 11, 12, 25]])
    with torch.no_grad():
        out = tiny_model(tokens, return_taps=True)
        taps, last = out.taps, out.last_hidden
        _, u_packed = packed_blocks(drafter, taps, tokens, anchors, last_hidden=last)
        for j, a in enumerate(anchors[0].tolist()):
            _, u_alone = packed_blocks(drafter, taps, tokens, anchors[:, j : j + 1], last_hidden=last)
            torch.testing.assert_close(
                u_packed[0, j], u_alone[0, 0], atol=1e-5, rtol=0
            )  # no other block there
            drafter.reset(2)
            slot = torch.tensor([1])
            feats = TargetFeatures(taps[0, :a], last[0, :a])
            drafter.append_context(slot, feats, torch.tensor([a]))  # positions strictly before the anchor
            _, u_inf = drafter.draft_block(slot, tokens[0, a : a + 1], drafter.config.gamma)
            torch.testing.assert_close(u_packed[0, j], u_inf[0], atol=1e-5, rtol=0)


def test_blocks_never_see_at_or_after_their_anchor(tiny_model):
    drafter = make(tiny_model, "dspark")
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, TINY.vocab_size, (1, 24), generator=g)
    changed = tokens.clone()
    changed[0, 10:] = torch.randint(0, TINY.vocab_size, (14,), generator=g)  # rewrite the future
    changed[0, 9] = tokens[0, 9]
    anchors = torch.tensor([[4, 9, 15]])  # packed in one pass; the third block's anchor token is rewritten
    with torch.no_grad():
        _, u1 = packed_blocks(drafter, tiny_model(tokens, return_taps=True).taps, tokens, anchors)
        _, u2 = packed_blocks(drafter, tiny_model(changed, return_taps=True).taps, changed, anchors)
    # the blocks at anchors 4 and 9 read only positions < their anchor (+ the anchor token) and their own
    # slots: neither the rewritten context nor the block at 15, whose anchor token changed
    torch.testing.assert_close(u1[:, :2], u2[:, :2])
    assert not torch.allclose(u1[:, 2], u2[:, 2])  # the block at 15 does see the rewrite (the test can fail)


def test_training_loss_terms_and_gradients(tiny_model):
    drafter = make(tiny_model, "dspark").train()
    tokens = torch.randint(0, TINY.vocab_size, (2, 20), generator=torch.Generator().manual_seed(4))
    batch = live(tiny_model, tokens, [20, 9], [3, 2])
    anchors, valid = sample_anchors(batch.lengths, batch.prompt_lens, 5, torch.Generator().manual_seed(0))
    loss, acc, terms = block_losses(drafter, tiny_model, batch, anchors, valid)
    loss.backward()
    assert set(terms) == {"ce", "tv", "conf"} and len(acc) == drafter.config.gamma
    assert all(0 <= float(a) <= 1 for a in acc)
    assert drafter.head.w1.weight.grad.abs().sum() > 0 and drafter.head.confidence.weight.grad.abs().sum() > 0


def test_loss_recipe_options(tiny_model):
    """Position decay, soft-label CE and the CE weight change the loss as documented; DFlash has no
    confidence term (and no confidence head)."""
    tokens = torch.randint(0, TINY.vocab_size, (2, 24), generator=torch.Generator().manual_seed(5))
    batch = live(tiny_model, tokens, [24, 20], [4, 6])
    anchors, valid = sample_anchors(batch.lengths, batch.prompt_lens, 0, torch.Generator().manual_seed(0))
    drafter = make(tiny_model, "dspark")
    with torch.no_grad():
        base, _, terms = block_losses(drafter, tiny_model, batch, anchors, valid, BlockLoss())
        assert float(base) == pytest.approx(0.1 * terms["ce"] + 0.9 * terms["tv"] + terms["conf"])
        _, _, soft = block_losses(drafter, tiny_model, batch, anchors, valid, BlockLoss(soft_ce=True))
        assert float(soft["ce"]) != pytest.approx(float(terms["ce"]))  # against p_t, not the token
        assert float(soft["tv"]) == pytest.approx(float(terms["tv"]))
        _, _, flat = block_losses(drafter, tiny_model, batch, anchors, valid, BlockLoss(decay=1e9))
        assert float(flat["tv"]) != pytest.approx(float(terms["tv"]))
        dflash = make(tiny_model, "dflash")
        assert not hasattr(dflash, "confidence") and not dflash.has_confidence
        loss, _, terms = block_losses(dflash, tiny_model, batch, anchors, valid)
        assert terms["conf"] == 0.0 and float(loss) == pytest.approx(float(terms["ce"]))
