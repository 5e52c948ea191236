"""The lab's distribution loss with its gradient by hand (dspark/lab/training/fast_loss.py) against the core's
plain one under autograd (dspark/training.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import TINY, live, make

from dspark.lab.training import fast_loss
from dspark.lab.training import fast_loss as distribution_loss
from dspark.lab.training.anchors import every_anchor
from dspark.lab.training.fast_loss import soft_target_loss
from dspark.training import DFLASH_LOSS, BlockLoss, block_losses
from dspark.training import soft_target_loss as plain


def inputs(R=13, V=37, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(R, V, generator=g)).to(dtype)
    table = torch.softmax(2 * torch.randn(6, V, generator=g), -1)
    table[2, :] = 0  # the zero row of unsupervised positions
    table[3, V // 2 :] = 0  # a draft vocabulary: p's mass partly off these ids
    rows = torch.randint(0, 6, (R,), generator=g)
    return logits, table, rows


@pytest.mark.parametrize("chunk_elements", [37, 5 * 37, 1 << 18])  # one row, uneven chunks, all rows at once
def test_terms_and_gradient_equal_autograd(monkeypatch, chunk_elements):
    monkeypatch.setattr(distribution_loss, "CHUNK_ELEMENTS", chunk_elements)
    logits, table, rows = inputs()
    g = torch.Generator().manual_seed(1)
    weights = [torch.rand(logits.shape[0], generator=g) for _ in range(3)]  # any upstream gradient
    results = []
    for fn in (soft_target_loss, plain):
        z = logits.clone().requires_grad_()
        terms = fn(z, table, rows)
        sum(w @ t for w, t in zip(weights, terms)).backward()
        assert torch.equal(z.detach(), logits)  # the logits are read, never written
        results.append((terms, z.grad))
    (terms, grad), (ref_terms, ref_grad) = results
    for t, r in zip(terms, ref_terms):
        torch.testing.assert_close(t, r, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-5)
    assert float(grad.abs().max()) > 1e-2  # a real gradient, not zeros on both sides


def test_bf16_logits_get_a_bf16_gradient_of_the_fp32_math():
    logits, table, rows = inputs(dtype=torch.bfloat16)
    z = logits.clone().requires_grad_()
    ce, l1, _ = soft_target_loss(z, table, rows)
    (ce.sum() + l1.sum()).backward()
    ref = logits.float().requires_grad_()
    ref_ce, ref_l1, _ = plain(ref, table, rows)
    (ref_ce.sum() + ref_l1.sum()).backward()
    assert z.grad.dtype == torch.bfloat16
    torch.testing.assert_close(ce, ref_ce) and torch.testing.assert_close(l1, ref_l1)
    torch.testing.assert_close(z.grad.float(), ref.grad, atol=1e-2, rtol=1e-2)


def test_shapes_are_checked():
    logits, table, rows = inputs()
    with pytest.raises(ValueError, match="share V"):
        soft_target_loss(logits[:, :-1], table, rows)
    with pytest.raises(ValueError, match="rows must be"):
        soft_target_loss(logits, table, rows[:-1])


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_the_labs_packed_pass_and_distance_equal_the_cores_dense_mask(tiny_model, kind):
    """Every response position an anchor, fp32: the lab's training speed paths (the packed pass that scores
    only what `block_visibility` shows; the distance with its gradient by hand) give the loss and every
    gradient of the core's plain ones (the dense packed mask over all blocks; autograd)."""
    drafter = make(tiny_model, kind).train()
    tokens = torch.randint(0, TINY.vocab_size, (2, 16), generator=torch.Generator().manual_seed(8))
    batch = live(tiny_model, tokens, [16, 11], [4, 3])
    anchors, valid = every_anchor(batch.lengths, batch.prompt_lens)
    assert int(valid.sum()) == (16 - 1 - 4) + (11 - 1 - 3)

    def loss_and_grads(losses):
        drafter.zero_grad(set_to_none=True)
        loss, _, _ = losses(
            drafter, tiny_model, batch, anchors, valid, BlockLoss() if kind == "dspark" else DFLASH_LOSS
        )
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in drafter.named_parameters() if p.grad is not None}

    dense_loss, dense_grads = loss_and_grads(block_losses)
    loss, grads = loss_and_grads(fast_loss.block_losses)
    torch.testing.assert_close(loss, dense_loss, atol=1e-6, rtol=1e-5)
    assert grads.keys() == dense_grads.keys() and any(n.startswith("layers.") for n in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, dense_grads[name], atol=1e-6, rtol=1e-4, msg=name)
