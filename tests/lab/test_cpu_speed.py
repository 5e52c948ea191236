"""dspark/lab/cpu_speed.py: the CPU speed paths (`fast_on_cpu`) compute what the core's plain model,
attention and drafter compute, in another order."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import ATOL, GREEDY, RAGGED, TINY, full_logits, make, prompts, run_blocks

from dspark.decoding import generate
from dspark.drafters.base import TargetFeatures
from dspark.engine import speculative_generate
from dspark.model import RaggedIndex


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_swap_drafts_what_the_plain_backbone_does(tiny_model, dtype, monkeypatch):
    """`fast_on_cpu` swaps the drafter layers' attention too (in bf16 written out, `grouped_attention`): the
    backbone's block outputs stay within rounding of the plain drafter's (fp32: to fp32 rounding), and in fp32 a
    swapped target and drafter decode the target's greedy tokens."""
    import copy

    from dspark.lab import cpu_speed
    from dspark.lab.cpu_speed import CPUAttention, fast_on_cpu
    from dspark.model import cast_keeping_rope

    plain = cast_keeping_rope(make(copy.deepcopy(tiny_model).cast(dtype), "dspark"), dtype)
    fast = fast_on_cpu(copy.deepcopy(plain))
    assert all(type(layer.attn) is CPUAttention for layer in fast.layers)
    taken = []  # the lab's masked attention runs in the swapped drafter's blocks, not in the plain one's
    masked = cpu_speed.masked_attention_on_cpu
    monkeypatch.setattr(cpu_speed, "masked_attention_on_cpu", lambda *a: taken.append(1) or masked(*a))
    torch.manual_seed(0)
    feats = TargetFeatures(torch.randn(7, len(TINY.tap_layers), TINY.dim), torch.randn(7, TINY.dim))
    feats = TargetFeatures(feats.taps.to(dtype), feats.last_hidden.to(dtype))
    slots, outs = torch.tensor([0, 1]), []
    with torch.no_grad():
        for d in (plain, fast):
            d.reset(2)
            d.append_context(slots, feats, torch.tensor([3, 4]))
            outs.append(d.draft_block(slots, torch.tensor([5, 6]), 4))
            assert len(taken) == (0 if d is plain else len(fast.layers))
    tol = dict(atol=5e-2, rtol=5e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got.float(), want.float(), **tol)
    if dtype == torch.float32:
        target = fast_on_cpu(copy.deepcopy(tiny_model))
        ps = prompts(RAGGED, seed=6)
        result = speculative_generate(target, fast_on_cpu(make(target, "dspark")), ps, 24, GREEDY, 4)
        assert result.tokens == generate(tiny_model, ps, 24, GREEDY).tokens


def ragged_index(cache, slots, lens):
    slots = torch.tensor(slots)
    return RaggedIndex.build(slots, torch.tensor(lens), cache.lengths[slots], cache.max_seq_len)


def test_slots_that_fill_a_range_in_any_order_are_read_as_a_view(tiny_model):
    """The CPU path (`fast_on_cpu`): a full batch's slots are a permutation of a range (requests finish and
    are replaced in any order), read as a view of the cache, request r at row slots[r] - lo; scattered or
    repeated slots are gathered in request order. Either way the swapped model equals the full forward."""
    from dspark.lab import cpu_speed

    torch.manual_seed(2)
    cache = tiny_model.new_cache(n_slots=6)
    for _ in range(6):
        cache.allocate()
    lens = [3, 1, 2]
    view = cpu_speed.part(ragged_index(cache, [4, 2, 3], lens))
    assert view.first == 2 and view.token_row.tolist() == [2, 2, 2, 0, 1, 1]
    assert cpu_speed.part(ragged_index(cache, [5, 0, 3], lens)).first is None
    assert cpu_speed.part(ragged_index(cache, [3, 3, 4], lens)).first is None  # not distinct: no view
    fast = cpu_speed.fast_on_cpu(copy.deepcopy(tiny_model))
    seqs = [torch.randint(0, TINY.vocab_size, (n,)) for n in (12, 7, 15)]
    slots = [4, 2, 3]
    schedule = [{0: 4, 1: 7, 2: 2}, {0: 3, 2: 6}, {0: 5, 2: 7}]  # then slots 4, 3: the range 3..4 reversed
    logits, _, _ = run_blocks(fast, cache, seqs, slots, schedule)
    for seq, got in zip(seqs, logits):
        torch.testing.assert_close(got, full_logits(tiny_model, seq)[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_attention_is_the_core_attention(dtype):
    """`ragged_attention_on_cpu` (by parts, through a view, written out in bf16) computes the core's plain path
    (`ragged_attention_reference`: gather, pad, SDPA) on passes that take each of its ways: slots that fill a
    range, scattered ones, long blocks beside short ones after cached context. fp32: to rounding; bf16: within
    bf16 rounding."""
    from dspark.kv_cache import KVCache
    from dspark.lab.cpu_speed import by_request, ragged_attention_on_cpu
    from dspark.model import ragged_attention_reference

    torch.manual_seed(4)
    cache = KVCache(1, 6, 2, 96, 8, dtype)
    cache.keys.copy_(torch.randn(cache.keys.shape))
    cache.values.copy_(torch.randn(cache.values.shape))
    cache.lengths[:] = torch.tensor([5, 0, 9, 2, 17, 3])
    cases = {"range": ([3, 1, 2], [1, 4, 2], 1), "scattered": ([5, 0, 2], [5, 1, 3], 1),
             "by parts": ([4, 1, 0, 2, 3], [2, 60, 3, 20, 1], 3)}  # fmt: skip
    for name, (slots, lens, n_parts) in cases.items():
        rb = ragged_index(cache, slots, lens)
        assert len(by_request(rb, cache.max_seq_len)) == n_parts, name
        q = torch.randn(rb.n_tokens, 6, 8).to(dtype)  # (N, H, hd)
        got = ragged_attention_on_cpu(q, cache.keys[0], cache.values[0], rb)
        want = ragged_attention_reference(q, cache.keys[0], cache.values[0], rb)
        tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.float(), want.float(), **tol, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_blocks_beside_short_ones_attend_on_their_own(tiny_model, dtype):
    """The CPU path: a prefill of one long prompt among short ones, then a pass of short blocks after cached
    context beside a new long prompt: padding every block to the longest would cost several times the query-key
    pairs the requests need, so each long block attends on its own and the short ones are padded together --
    equal to the full forward in fp32, and to the core's all-padded attention within bf16 rounding. Blocks of
    equal or short lengths (verify and decode passes) keep the padded attention."""
    from dspark.lab.cpu_speed import by_request, fast_on_cpu

    torch.manual_seed(3)
    # cast works in place: the shared fixture is copied first
    plain = copy.deepcopy(tiny_model).cast(dtype) if dtype != torch.float32 else tiny_model
    fast = fast_on_cpu(copy.deepcopy(plain))
    schedule = [{0: 6, 1: 60, 2: 3, 3: 9}, {0: 2, 2: 5, 3: 1, 4: 40}]
    lens = [sum(step.get(i, 0) for step in schedule) for i in range(5)]
    seqs = [torch.randint(0, TINY.vocab_size, (n,)) for n in lens]
    probe = plain.new_cache(n_slots=4)
    for _ in range(4):
        probe.allocate()
    long_part, short_part = by_request(ragged_index(probe, [0, 1, 2, 3], [6, 60, 3, 9]), probe.max_seq_len)
    assert long_part.rb.block_max == 60 and long_part.tokens.tolist() == [*range(6, 66)]
    assert short_part.tokens.tolist() == [*range(6), *range(66, 78)]  # the flat tokens of blocks 0, 2, 3
    assert len(by_request(long_part.rb, 64)) == 1 and len(by_request(short_part.rb, 64)) == 1
    assert len(by_request(ragged_index(probe, [0, 1, 2, 3], [40, 40, 38, 40]), 64)) == 1
    assert len(by_request(ragged_index(probe, [0, 1, 2, 3], [8, 1, 3, 8]), 64)) == 1

    def run(model):
        cache = model.new_cache(n_slots=5)
        slots = [cache.allocate() for _ in range(5)]
        logits, _, _ = run_blocks(model, cache, seqs, slots, schedule)
        return logits

    mixed = run(fast)
    if dtype == torch.float32:
        for seq, got in zip(seqs, mixed):
            torch.testing.assert_close(got, full_logits(plain, seq)[0], atol=ATOL, rtol=0)
    else:
        for got, padded in zip(mixed, run(plain)):
            torch.testing.assert_close(got.float(), padded.float(), atol=0.05, rtol=0.02)


def test_project_to_vocab_is_the_lm_head_in_another_order():
    """A large fp32 head with several rows is computed as (W xᵀ)ᵀ: the same logits to fp32 rounding, contiguous,
    any leading shape; one row, a small head and autograd keep `F.linear` bit for bit."""
    from dspark.lab.cpu_speed import TRANSPOSED_PRODUCT_MIN_WEIGHTS, project_to_vocab

    g = torch.Generator().manual_seed(0)
    big = torch.randn(TRANSPOSED_PRODUCT_MIN_WEIGHTS // 64, 64, generator=g)  # (V, dim) at the threshold
    small = big[: big.shape[0] // 2]
    x = torch.randn(3, 5, 64, generator=g)
    with torch.no_grad():
        got = project_to_vocab(x, big)
        assert got.shape == (3, 5, big.shape[0]) and got.is_contiguous()
        torch.testing.assert_close(got, torch.nn.functional.linear(x, big), rtol=1e-5, atol=1e-5)
        assert torch.equal(project_to_vocab(x[:1, :1], big), torch.nn.functional.linear(x[:1, :1], big))
        for rows in range(2, 6):  # three rows computed as four (PADDED_ROWS): the three rows' logits alone
            got = project_to_vocab(x[0, :rows], big)
            assert got.shape == (rows, big.shape[0]) and got.is_contiguous()
            torch.testing.assert_close(
                got, torch.nn.functional.linear(x[0, :rows], big), rtol=1e-5, atol=1e-5
            )
        assert torch.equal(project_to_vocab(x, small), torch.nn.functional.linear(x, small))
    w = big.clone().requires_grad_()
    out = project_to_vocab(x, w)
    assert torch.equal(out, torch.nn.functional.linear(x, w)) and out.requires_grad


def test_layer_linear_is_nn_linear_in_another_order(monkeypatch):
    """`LayerLinear` (the decoder layers' projections) is an nn.Linear with the same state_dict; in fp32 on the
    CPU without autograd, a large weight at 2..TRANSPOSED_LAYER_MAX_ROWS rows is computed as (W xᵀ)ᵀ: the
    same outputs to fp32 rounding. One row, more rows than the cap, a small weight, a bias and autograd
    keep `F.linear` bit for bit."""
    from dspark.lab import cpu_speed as projections
    from dspark.lab.cpu_speed import TRANSPOSED_LAYER_MAX_ROWS, TRANSPOSED_LAYER_MIN_WEIGHTS, LayerLinear

    taken = []
    transposed = projections.transposed_product
    monkeypatch.setattr(
        projections, "transposed_product", lambda x, w: taken.append(x.shape) or transposed(x, w)
    )
    torch.manual_seed(0)
    dim = 256
    big = LayerLinear(dim, TRANSPOSED_LAYER_MIN_WEIGHTS // dim, bias=False)  # at the threshold
    small = LayerLinear(dim, TRANSPOSED_LAYER_MIN_WEIGHTS // dim - 1, bias=False)
    plain = torch.nn.Linear(dim, big.out_features, bias=False)
    plain.load_state_dict(big.state_dict())  # the same parameters under the same names
    x = torch.randn(2, TRANSPOSED_LAYER_MAX_ROWS // 2, dim)  # the cap exactly
    with torch.no_grad():
        got = big(x)
        assert got.shape == (*x.shape[:-1], big.out_features) and got.is_contiguous()
        torch.testing.assert_close(got, plain(x), rtol=1e-5, atol=1e-5)
        assert taken == [x.shape]  # it did take the other order, once
        assert torch.equal(big(x[:1, :1]), plain(x[:1, :1]))  # one row
        over = torch.randn(TRANSPOSED_LAYER_MAX_ROWS + 1, dim)
        assert torch.equal(big(over), plain(over))  # beyond the cap
        assert torch.equal(small(x), torch.nn.functional.linear(x, small.weight))
        biased = LayerLinear(dim, big.out_features)
        assert torch.equal(biased(x), torch.nn.functional.linear(x, biased.weight, biased.bias))
    out = big(x)  # autograd
    assert torch.equal(out, plain(x)) and out.requires_grad
    assert taken == [x.shape]  # no other call took it


def test_the_cpu_speed_swap_is_the_plain_model_in_another_order(tiny_model, monkeypatch):
    """`fast_on_cpu` turns exactly the named layer projections into `LayerLinear` (same state_dict), the LM
    head into a `VocabHead` and every attention into a `CPUAttention`. A swapped model with weights above the
    thresholds computes the plain model's logits to fp32 rounding, taking the other order, and decodes the same
    greedy tokens; the tiny target (all below them) gives the same bits, and the same greedy tokens cached."""
    from dspark.decoding import generate
    from dspark.lab import cpu_speed
    from dspark.model import Attention, ModelConfig, Transformer
    from dspark.sampling import SamplingParams

    taken, attended = [], []
    transposed = cpu_speed.transposed_product
    monkeypatch.setattr(cpu_speed, "transposed_product", lambda x, w: taken.append(1) or transposed(x, w))
    ragged = cpu_speed.ragged_attention_on_cpu
    monkeypatch.setattr(cpu_speed, "ragged_attention_on_cpu", lambda *a: attended.append(1) or ragged(*a))
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=4096, dim=512, n_layers=2, n_heads=8, n_kv_heads=8, ffn_hidden=1024,
                         max_seq_len=64, tap_layers=(0, 1))  # fmt: skip
    plain = Transformer(config).eval()
    fast = cpu_speed.fast_on_cpu(copy.deepcopy(plain))
    swapped = {n for n, m in fast.named_modules() if isinstance(m, cpu_speed.LayerLinear)}
    assert swapped == {f"blocks.{i}.{part}" for i in range(2) for part in
                       ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "ffn.w_gate", "ffn.w_up", "ffn.w_down")}  # fmt: skip
    assert type(fast.lm_head) is cpu_speed.VocabHead and fast.lm_head.weight is fast.embed.weight  # tied
    assert cpu_speed.projection_method(fast) == cpu_speed.PROJECTION_METHOD
    assert fast.state_dict().keys() == plain.state_dict().keys()
    assert cpu_speed.projection_method(plain) == "F.linear" and type(plain.lm_head) is torch.nn.Linear
    assert {type(b.attn) for b in fast.blocks} == {cpu_speed.CPUAttention}
    assert type(plain.blocks[0].attn) is Attention  # the plain model keeps the core's
    tokens = torch.randint(0, config.vocab_size, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(fast(tokens).logits, plain(tokens).logits, rtol=1e-4, atol=1e-4)
    assert taken  # the other order was taken
    greedy = SamplingParams(0.0)
    prompts = [tokens[0].tolist()]
    assert generate(fast, prompts, 8, greedy).tokens == generate(plain, prompts, 8, greedy).tokens
    assert len(attended) == 8 * config.n_layers  # the cached passes of `fast` only: a prefill, 7 steps
    tiny = cpu_speed.fast_on_cpu(copy.deepcopy(tiny_model))
    with torch.no_grad():
        small = tokens % tiny_model.config.vocab_size
        assert torch.equal(tiny(small).logits, tiny_model(small).logits)
    prompts = [small[0].tolist(), small[0, :5].tolist()]
    assert generate(tiny, prompts, 8, greedy).tokens == generate(tiny_model, prompts, 8, greedy).tokens
