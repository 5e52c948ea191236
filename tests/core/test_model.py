"""dspark/model.py: a cached pass scores only the rows asked for (last_only, logits_at) and equals the
full forward there; ModelConfig refuses sizes it cannot build."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import ATOL, TINY, full_logits

from dspark.model import ModelConfig


def test_last_only_returns_each_blocks_final_logits(tiny_model):
    torch.manual_seed(4)
    seqs = [torch.randint(0, TINY.vocab_size, (n,)) for n in (5, 11)]
    cache = tiny_model.new_cache(n_slots=2)
    slots = torch.tensor([cache.allocate(), cache.allocate()])
    with torch.no_grad():
        out = tiny_model.forward_cached(torch.cat(seqs), slots, torch.tensor([5, 11]), cache, last_only=True)
    assert out.logits.shape == (2, TINY.vocab_size)
    for row, seq in zip(out.logits, seqs):
        torch.testing.assert_close(row, full_logits(tiny_model, seq)[0][-1], atol=ATOL, rtol=0)


def test_logits_at_scores_only_those_positions_and_keeps_every_hidden_state(tiny_model):
    torch.manual_seed(4)
    seqs = [torch.randint(0, TINY.vocab_size, (n,)) for n in (5, 11)]
    outs = []
    for logits_at in (None, torch.tensor([4, 15])):
        cache = tiny_model.new_cache(n_slots=2)
        slots = torch.tensor([cache.allocate(), cache.allocate()])
        with torch.no_grad():
            outs.append(tiny_model.forward_cached(torch.cat(seqs), slots, torch.tensor([5, 11]), cache,
                                                  return_taps=True, logits_at=logits_at))  # fmt: skip
    full, some = outs
    assert some.logits.shape == (2, TINY.vocab_size) and some.last_hidden.shape == full.last_hidden.shape
    torch.testing.assert_close(some.logits, full.logits[[4, 15]], atol=ATOL, rtol=0)
    assert torch.equal(some.taps, full.taps) and torch.equal(some.last_hidden, full.last_hidden)
    with pytest.raises(AssertionError, match="exclude"):
        tiny_model.forward_cached(
            seqs[0], slots[:1], torch.tensor([5]), cache, last_only=True, logits_at=slots
        )


@pytest.mark.parametrize("field", ["vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden",
                                   "max_seq_len"])  # fmt: skip
@pytest.mark.parametrize("value", [0, -1])
def test_model_config_needs_positive_sizes(field, value):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{field: value})


def test_model_config_needs_positive_finite_rope_and_eps():
    for field in ("rope_theta", "norm_eps"):
        for value in (0.0, -1.0, math.inf, math.nan):
            with pytest.raises(ValueError, match=field):
                ModelConfig(**{field: value})
