"""DSpark / DFlash drafter: block masks, packed training == inference, rank 0 == DFlash,
greedy identity and exact sampling through the speculative loop."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from conftest import TINY
from stats_helpers import assert_matches
from test_speculative import GREEDY, MICRO, MICRO_LENGTH, MICRO_PROMPT, RAGGED, micro_target_and_law, prompts

from dspark.checkpoint import CheckpointError
from dspark.decoding import generate
from dspark.drafters import load_drafter
from dspark.drafters.base import TargetFeatures
from dspark.drafters.parallel import MarkovHead, ParallelDrafter, ParallelDrafterConfig, RNNHead
from dspark.engine import speculative_generate
from dspark.lab.storage import save_checkpoint
from dspark.lab.training import fast_loss
from dspark.lab.training.anchors import every_anchor, sample_anchors
from dspark.sampling import SamplingParams
from dspark.training import BlockLoss, FeatureBatch, block_losses, block_visibility, packed_blocks


def make(target, kind, gamma=4, rank=8, seed=0):
    torch.manual_seed(seed)
    mask_id = min(5, target.config.vocab_size - 1)
    config = ParallelDrafterConfig(kind, gamma=gamma, ffn_hidden=64, rank=rank, mask_id=mask_id)
    drafter = ParallelDrafter(target, config)
    if kind != "dflash":  # a non-trivial sequential head (W2 starts at zero)
        torch.nn.init.normal_(drafter.head.w2.weight, std=0.5)
    return drafter.eval()


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

    def loss_and_grads(**speed):
        drafter.zero_grad(set_to_none=True)
        loss, _, _ = block_losses(drafter, tiny_model, batch, anchors, valid, **speed)
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in drafter.named_parameters() if p.grad is not None}

    dense_loss, dense_grads = loss_and_grads()
    loss, grads = loss_and_grads(speed=(fast_loss.packed_backbone, fast_loss.soft_target_loss))
    torch.testing.assert_close(loss, dense_loss, atol=1e-6, rtol=1e-5)
    assert grads.keys() == dense_grads.keys() and any(n.startswith("layers.") for n in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, dense_grads[name], atol=1e-6, rtol=1e-4, msg=name)


def live(target, tokens, lengths, prompt_lens) -> FeatureBatch:
    with torch.no_grad():
        out = target(tokens, return_taps=True)
    return FeatureBatch(tokens, torch.tensor(lengths), torch.tensor(prompt_lens), out.taps, out.last_hidden)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_swap_drafts_what_the_plain_backbone_does(tiny_model, dtype):
    """`fast_on_cpu` swaps the drafter layers' attention too (in bf16 written out, `grouped_attention`): the
    backbone's block outputs stay within rounding of the plain drafter's (fp32: to fp32 rounding), and in fp32 a
    swapped target and drafter decode the target's greedy tokens."""
    import copy

    from dspark.lab.cpu_speed import fast_on_cpu, masked_attention_on_cpu
    from dspark.model import cast_keeping_rope

    plain = cast_keeping_rope(make(copy.deepcopy(tiny_model).cast(dtype), "dspark"), dtype)
    fast = fast_on_cpu(copy.deepcopy(plain))
    assert all(layer.attn.attend_masked is masked_attention_on_cpu for layer in fast.layers)
    torch.manual_seed(0)
    feats = TargetFeatures(torch.randn(7, len(TINY.tap_layers), TINY.dim), torch.randn(7, TINY.dim))
    feats = TargetFeatures(feats.taps.to(dtype), feats.last_hidden.to(dtype))
    slots, outs = torch.tensor([0, 1]), []
    with torch.no_grad():
        for d in (plain, fast):
            d.reset(2)
            d.append_context(slots, feats, torch.tensor([3, 4]))
            outs.append(d.draft_block(slots, torch.tensor([5, 6]), 4))
    tol = dict(atol=5e-2, rtol=5e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got.float(), want.float(), **tol)
    if dtype == torch.float32:
        target = fast_on_cpu(copy.deepcopy(tiny_model))
        ps = prompts(RAGGED, seed=6)
        result = speculative_generate(target, fast_on_cpu(make(target, "dspark")), ps, 24, GREEDY, 4)
        assert result.tokens == generate(tiny_model, ps, 24, GREEDY).tokens


def test_a_checkpoint_naming_an_option_dspark_no_longer_has_is_refused_in_one_line(tiny_model, tmp_path):
    """Three options left the drafters (normed_head_input, final_hidden, tied_rank; the shipped JSONs no longer
    name them): a checkpoint that still names one is refused in one line naming it, not half-loaded."""
    drafter = make(tiny_model, "dspark")
    path = tmp_path / "d.safetensors"
    save_checkpoint(drafter, drafter.config, path)
    record = json.loads(path.with_suffix(".json").read_text())
    for key in ("normed_head_input", "final_hidden", "tied_rank"):
        path.with_suffix(".json").write_text(json.dumps(record | {"config": record["config"] | {key: 0}}))
        with pytest.raises(CheckpointError, match=f"drafter config of .* is invalid .*{key}"):
            load_drafter(path, tiny_model)
    path.with_suffix(".json").write_text(json.dumps(record))
    loaded = load_drafter(path, tiny_model)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), drafter.state_dict().values()))


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
