"""dspark/drafters/parallel.py (DFlash, DSpark): rank 0 DSpark is the DFlash path, the heads read the normed
hidden state, proposals carry confidences, QK-norm is one network in training and inference; greedy identity and
exact sampling (chi-square) through the speculative loop."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import (
    GREEDY,
    MICRO,
    MICRO_LENGTH,
    MICRO_PROMPT,
    RAGGED,
    TINY,
    make,
    micro_target_and_law,
    prompts,
    propose_once,
)
from stats_helpers import assert_matches

from dspark.decoding import generate
from dspark.drafters.base import Proposal, TargetFeatures
from dspark.drafters.parallel import MarkovHead, ParallelDrafter, ParallelDrafterConfig, RNNHead
from dspark.engine import speculative_generate
from dspark.sampling import SamplingParams
from dspark.training import packed_blocks


def test_rank_zero_dspark_is_the_dflash_path(tiny_model):
    dflash = make(tiny_model, "dflash")
    dspark = make(tiny_model, "dspark", rank=8)
    shared = {k: v for k, v in dflash.state_dict().items() if not k.startswith("confidence")}
    dspark.load_state_dict({**dspark.state_dict(), **shared})  # same backbone, plus a Markov head
    with torch.no_grad():
        dspark.head.w2.weight.zero_()  # the Markov term W1[x] W2 vanishes
        params = SamplingParams(temperature=1.0)
        outs = []
        for d in (dflash, dspark):
            d.reset(2)
            torch.manual_seed(0)
            feats = TargetFeatures(torch.randn(7, len(TINY.tap_layers), TINY.dim), torch.randn(7, TINY.dim))
            proposal = d.propose(torch.tensor([0, 1]), torch.arange(7), feats, torch.tensor([3, 4]),
                                    torch.tensor([5, 6]), 4, params, torch.Generator().manual_seed(3))  # fmt: skip
            outs.append((proposal.tokens, proposal.probs))
    assert torch.equal(outs[0][0], outs[1][0])
    torch.testing.assert_close(outs[0][1], outs[1][1])
    assert ParallelDrafterConfig("dflash", rank=64).rank == 0


@pytest.mark.parametrize("kind", ["dflash", "dspark", "dspark-rnn"])
@pytest.mark.parametrize("gamma", [1, 3, 4])
def test_greedy_identity(tiny_model, kind, gamma):
    ps = prompts(RAGGED, seed=6)
    reference = generate(tiny_model, ps, 24, GREEDY)
    drafter = make(tiny_model, kind)
    result = speculative_generate(tiny_model, drafter, ps, 24, GREEDY, gamma)
    assert result.tokens == reference.tokens and result.stop_reasons == reference.stop_reasons
    assert result.stats.tau > 1.0  # some drafts accepted, so verification is exercised


def test_heads_read_the_normed_hidden_state(tiny_model):
    drafter = ParallelDrafter(
        tiny_model, ParallelDrafterConfig("dspark", gamma=3, ffn_hidden=64, rank=8, mask_id=5)
    )
    h = torch.randn(2, 3, TINY.dim) * 7
    head_input, u = drafter.block_outputs(h)
    normed_h = drafter.out_norm(h)
    torch.testing.assert_close(head_input, normed_h)
    torch.testing.assert_close(u, tiny_model.lm_head(normed_h))


@pytest.mark.parametrize("kind", ["dflash", "dspark", "dspark-rnn"])
def test_sampled_output_follows_the_target_exactly(kind):
    target, joint = micro_target_and_law()
    params, prompt, length = SamplingParams(temperature=1.0), MICRO_PROMPT, MICRO_LENGTH
    drafter = make(target, kind, gamma=3, rank=4)
    g = torch.Generator().manual_seed(42)
    counts = torch.zeros(MICRO.vocab_size**length)
    accepted = 0
    for _ in range(12):
        result = speculative_generate(target, drafter, [prompt] * 1000, length, params, 3, generator=g)
        for toks in result.tokens:
            counts[toks[0] * 25 + toks[1] * 5 + toks[2]] += 1
        accepted += sum(itertools.chain(*result.from_draft))
    assert accepted > 500
    assert_matches(counts, joint.flatten())


def test_each_sequential_head_is_a_class_and_a_checkpoint_keeps_flat_names(tiny_model):
    """DSpark's heads are small modules (`drafter.head`, None for DFlash); `state_dict` names their tensors
    w1, w2, rnn, confidence -- the layout of the shipped checkpoints and the exporters -- and loads them back."""
    for kind, head, names in (("dflash", type(None), set()), ("dspark", MarkovHead, {"w1", "w2", "confidence"}),
                              ("dspark-rnn", RNNHead, {"w1", "w2", "rnn", "confidence"})):  # fmt: skip
        config = ParallelDrafterConfig(kind, gamma=4, ffn_hidden=64, rank=8, mask_id=5)
        torch.manual_seed(0)
        drafter = ParallelDrafter(tiny_model, config)
        assert type(drafter.head) is head
        state = drafter.state_dict()
        assert not any(key.startswith("head.") for key in state)
        assert {key.split(".")[0] for key in state} >= names
        assert {n.split(".")[1] for n, _ in drafter.named_parameters() if n.startswith("head.")} == names
        with torch.no_grad():
            for p in drafter.parameters():
                p.add_(torch.randn_like(p))
        twin = ParallelDrafter(tiny_model, config)
        twin.load_state_dict(drafter.state_dict())  # strict: every name found
        assert all(torch.equal(a, b) for a, b in zip(twin.parameters(), drafter.parameters()))


@pytest.mark.parametrize("kind", ["dspark", "dspark-rnn"])
def test_dspark_proposals_carry_confidences(tiny_model, kind):
    drafter = make(tiny_model, kind)
    proposal = propose_once(drafter, tiny_model)
    assert drafter.has_confidence and isinstance(proposal, Proposal)
    assert proposal.tokens.shape == (2, 4) and proposal.probs.shape == (2, 4, tiny_model.config.vocab_size)
    assert proposal.confidence.shape == (2, 4) and bool(
        ((proposal.confidence > 0) & (proposal.confidence < 1)).all()
    )


def qk_drafter(target, kind="dspark"):
    torch.manual_seed(0)
    config = ParallelDrafterConfig(kind, gamma=4, ffn_hidden=64, rank=8, mask_id=5, qk_norm=True)
    drafter = ParallelDrafter(target, config)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "q_norm" in name or "k_norm" in name or name == "head.w2.weight":
                p.normal_(1.0 if "norm" in name else 0.0, 0.5)
    return drafter.eval()


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_qk_norm_is_the_same_network_in_training_and_inference(tiny_model, kind):
    drafter = qk_drafter(tiny_model, kind)
    assert {"layers.0.attn.q_norm.weight", "layers.0.attn.k_norm.weight"} <= set(drafter.state_dict())
    tokens = torch.randint(0, TINY.vocab_size, (1, 30), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[3, 11, 25]])
    with torch.no_grad():
        out = tiny_model(tokens, return_taps=True)
        _, u_packed = packed_blocks(drafter, out.taps, tokens, anchors, last_hidden=out.last_hidden)
        for j, a in enumerate(anchors[0].tolist()):
            drafter.reset(1)
            slot = torch.tensor([0])
            drafter.append_context(
                slot, TargetFeatures(out.taps[0, :a], out.last_hidden[0, :a]), torch.tensor([a])
            )
            _, u_inf = drafter.draft_block(slot, tokens[0, a : a + 1], drafter.config.gamma)
            torch.testing.assert_close(u_packed[0, j], u_inf[0], atol=1e-5, rtol=0)
        plain = ParallelDrafter(tiny_model, ParallelDrafterConfig(kind, 4, ffn_hidden=64, rank=8, mask_id=5))
        plain.load_state_dict({k: v for k, v in drafter.state_dict().items() if "_norm.weight" not in k or
                               "attn." not in k})  # fmt: skip
        _, u_plain = packed_blocks(plain, out.taps, tokens, anchors, last_hidden=out.last_hidden)
    assert not torch.allclose(u_plain, u_packed, atol=1e-3)  # the norm is really applied, q and k alike
