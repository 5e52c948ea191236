"""Drafter training is device-aware: a step, and a short run with its feature cache, run with CPU models and CPU
inputs inside `with torch.device("meta")` (every tensor factory without an explicit device then makes a meta
tensor, and mixing meta with CPU fails) gives the same loss and gradients as outside it, for every kind; and
the learning-rate schedule is the reference's (4% linear warm-up, cosine decay)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from helpers import make, make_drafter

from dspark.lab.training.drafters import DrafterTrainConfig, batch_loss, learning_rate
from dspark.training import FeatureBatch


def features(target, seed: int = 0) -> FeatureBatch:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, target.config.vocab_size, (3, 24), generator=g)
    with torch.no_grad():
        out = target(tokens, return_taps=True)
    lse = torch.logsumexp(target.lm_head(out.last_hidden).float(), -1)
    return FeatureBatch(
        tokens, torch.tensor([24, 19, 12]), torch.tensor([5, 3, 6]), out.taps, out.last_hidden, lse
    )


@pytest.mark.parametrize("kind", ["mtp", "eagle", "dflash", "dspark", "dspark-rnn"])
@pytest.mark.parametrize("anchors", [0, 4])
def test_a_training_step_is_device_aware(tiny_model, kind, anchors):
    drafter = (
        make(tiny_model, kind)
        if kind in ("dflash", "dspark", "dspark-rnn")
        else make_drafter(kind, tiny_model, 3)
    )
    drafter.train()
    tc = DrafterTrainConfig(anchors_per_seq=anchors, bf16=False)
    batch = features(tiny_model)

    def step():
        drafter.zero_grad(set_to_none=True)
        loss, acc, n_anchors, pairs = batch_loss(
            drafter, tiny_model, batch, tc, torch.Generator().manual_seed(1)
        )
        loss.backward()
        grads = [p.grad.clone() for p in drafter.parameters() if p.grad is not None]
        return loss.detach(), [a.detach() for a in acc], n_anchors, pairs, grads

    plain = step()
    with torch.device("meta"):
        inside = step()
    assert torch.equal(plain[0], inside[0]) and plain[2:4] == inside[2:4]
    for a, b in zip(plain[1] + plain[4], inside[1] + inside[4]):
        assert a.device.type == "cpu" and torch.equal(a.nan_to_num(), b.nan_to_num())


def test_the_learning_rate_schedule():
    steps, peak = 1000, 6e-4
    warm = round(0.04 * steps)  # 40 warm-up steps
    assert learning_rate(0, steps, peak, 0.04) == pytest.approx(peak / warm)
    assert learning_rate(warm - 1, steps, peak, 0.04) == pytest.approx(peak)  # warm-up ends at the peak
    mid = warm + (steps - warm) // 2
    assert learning_rate(mid, steps, peak, 0.04) == pytest.approx(peak / 2, rel=1e-2)  # cosine half-way
    assert 0 < learning_rate(steps - 1, steps, peak, 0.04) < peak * 1e-4  # the last step: almost 0
    lrs = [learning_rate(s, steps, peak, 0.04) for s in range(steps)]
    assert all(a <= b for a, b in zip(lrs[:warm], lrs[1:warm]))
    assert all(a >= b for a, b in zip(lrs[warm - 1 :], lrs[warm:]))
    assert max(lrs) == pytest.approx(peak) and not any(math.isnan(x) for x in lrs)


@pytest.mark.parametrize("kind", ["mtp", "eagle", "dflash", "dspark"])
def test_a_short_run_is_device_aware(tiny_model, tmp_path, kind):
    """`train features` (the cache build) and `train_drafter` end to end (steps from the cache, validation on
    live features, checkpoint): the same weights and validation inside the meta context as outside it."""
    from dspark.checkpoint import read_checkpoint
    from dspark.lab.training.drafters import train_drafter
    from dspark.lab.training.feature_cache import LiveFeatures, build_feature_cache

    g = torch.Generator().manual_seed(0)
    records = [{"prompt_ids": torch.randint(0, 97, (4,), generator=g).tolist(),
                "response_ids": torch.randint(0, 97, (n,), generator=g).tolist()} for n in (9, 14, 6, 11)]  # fmt: skip
    tc = DrafterTrainConfig(steps=2, batch_size=2, eval_every=1, anchors_per_seq=3, bf16=False,
                            unroll=1 if kind == "mtp" else 3)  # fmt: skip

    saved = []
    for name, where in (("outside", contextlib.nullcontext()), ("inside", torch.device("meta"))):
        drafter = (
            make(tiny_model, kind)
            if kind in ("dflash", "dspark")
            else make_drafter(kind, tiny_model, tc.unroll)
        )
        with where:
            cache = build_feature_cache(tiny_model, records, tmp_path / f"{name}-features", dtype="float32")
            live = LiveFeatures(tiny_model, records)
            train_drafter(drafter, tiny_model, cache, live, tc, tmp_path / f"{name}.safetensors", {})
        saved.append(read_checkpoint(tmp_path / f"{name}.safetensors"))
    (meta_a, weights_a), (meta_b, weights_b) = saved
    assert meta_a["meta"]["val_expected_acceptance"] == meta_b["meta"]["val_expected_acceptance"]
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
