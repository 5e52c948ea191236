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
