"""The ragged verify attention kernel against its PyTorch reference (Triton interpreter on CPU, fp32)."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

import dspark_kernels.ragged_attention  # noqa: E402
from dspark.kv_cache import KVCache  # noqa: E402
from dspark.model import RaggedIndex, ragged_attention_reference  # noqa: E402
from dspark_kernels import kernels_as
from dspark_kernels.ragged_attention import ragged_verify_attention  # noqa: E402

HEAD_DIM = 12  # not a power of two: BLOCK_D = 16 with 4 masked lanes


def ragged_case(n_slots_total, n_heads, n_kv_heads, slots, starts, block_lens, seed=0, t_max=40):
    """A one-layer cache of random keys/values (garbage beyond each block too), its RaggedIndex and q."""
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(1, n_slots_total, n_kv_heads, t_max, HEAD_DIM)
    cache.keys.copy_(torch.randn(cache.keys.shape, generator=gen))
    cache.values.copy_(torch.randn(cache.values.shape, generator=gen))
    slots, block_lens = torch.tensor(slots), torch.tensor(block_lens)
    cache.lengths[slots] = torch.tensor(starts)
    rb = RaggedIndex.build(slots, block_lens, cache.lengths[slots], cache.max_seq_len)
    q = torch.randn(int(block_lens.sum()), n_heads, HEAD_DIM, generator=gen)  # (N, H, hd)
    return q, cache.keys[0], cache.values[0], rb


def run_kernel(q, keys, values, rb, block_n=8, block_m=16):
    return ragged_verify_attention(
        q, keys, values, rb.slots, rb.starts, rb.cu_seqlens, rb.slot_index, block_n=block_n, block_m=block_m
    )


# (block_m, block_n): tiles >= 16 multiply with tl.dot; smaller ones with broadcast-multiply-sum.
TILES = [(16, 16), (2, 8)]  # (2, 8): blocks of 3..5 tokens span two or three query tiles


@pytest.mark.parametrize("block_m,block_n", TILES)
@pytest.mark.parametrize("n_heads,n_kv_heads", [(2, 2), (4, 1)])  # GQA ratios 1 and 4
@pytest.mark.parametrize(
    "slots,starts,block_lens",
    [
        ([3], [13], [1]),  # one request decoding one token; 14 keys: two tiles of 8, the 2nd ragged
        ([0], [0], [5]),  # one prefill into an empty slot
        # nine requests: slots out of order and with gaps, empty caches (start 0), blocks of 1..5
        ([6, 1, 9, 0, 4, 11, 2, 7, 10], [0, 9, 23, 1, 16, 0, 30, 7, 5], [3, 1, 5, 2, 1, 4, 1, 2, 3]),
    ],
)
def test_kernel_matches_reference(n_heads, n_kv_heads, slots, starts, block_lens, block_m, block_n):
    q, keys, values, rb = ragged_case(12, n_heads, n_kv_heads, slots, starts, block_lens)
    expected = ragged_attention_reference(q, keys, values, rb)
    out = run_kernel(q, keys, values, rb, block_n, block_m)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_tile_length_does_not_matter():
    q, keys, values, rb = ragged_case(4, 2, 1, [2, 0], [19, 4], [3, 2], seed=1)
    expected = ragged_attention_reference(q, keys, values, rb)
    # block_n: a tile per key, several ragged tiles, one tile larger than the context;
    # block_m: one query tile per block, a program per query, tiles of 2 (the last one ragged)
    for block_m, block_n in ((16, 1), (16, 4), (16, 32), (1, 4), (2, 32)):
        out = run_kernel(q, keys, values, rb, block_n, block_m)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_m", [8, 16, 64])
def test_blocks_longer_than_a_query_tile(block_m):
    """A 37-token prefill (block_m 16: query tiles of 16, 16 and a masked 5), a 20-token block after
    3 cached tokens, and a 1-token decode whose programs for the later query tiles have nothing to do."""
    q, keys, values, rb = ragged_case(5, 4, 2, [3, 0, 4], [0, 3, 30], [37, 20, 1], seed=2)
    expected = ragged_attention_reference(q, keys, values, rb)
    out = run_kernel(q, keys, values, rb, 16, block_m)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_hand_worked_case():
    """One head, hd = 2: scores ln 1..ln 4, so the softmax weights are 1:2:3:4."""
    cache = KVCache(1, 3, 1, 6, 2)
    cache.keys.fill_(50.0)  # garbage everywhere a token must not look (other slots, later positions)
    cache.values.fill_(-99.0)
    s2 = math.sqrt(2.0)  # q · k / sqrt(2) = ln(i) for q = (sqrt 2, 0), k_i = (ln i, 0)
    cache.keys[0, 1, 0, :4] = torch.tensor([[math.log(i), 0.0] for i in (1, 2, 3, 4)])
    cache.values[0, 1, 0, :4] = torch.tensor([[6.0, 0.0], [0.0, 6.0], [0.0, 0.0], [10.0, 10.0]])
    cache.lengths[1] = 2  # keys 0, 1 before the block; keys 2, 3 are the block's own
    rb = RaggedIndex.build(torch.tensor([1]), torch.tensor([2]), cache.lengths[[1]], cache.max_seq_len)
    q = torch.tensor([[[s2, 0.0]], [[s2, 0.0]]])  # (N=2, H=1, hd=2)
    # token at position 2 sees keys 0..2: (1·(6,0) + 2·(0,6) + 3·(0,0)) / 6 = (1, 2)
    # token at position 3 sees keys 0..3: (1·(6,0) + 2·(0,6) + 3·(0,0) + 4·(10,10)) / 10 = (4.6, 5.2)
    expected = torch.tensor([[[1.0, 2.0]], [[4.6, 5.2]]])
    out = run_kernel(q, cache.keys[0], cache.values[0], rb, block_n=2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ragged_attention_reference(q, cache.keys[0], cache.values[0], rb), expected)


def test_model_forward_cached_same_with_kernel(tiny_model, monkeypatch):
    """Prefill two requests (non-contiguous slots), then verify a ragged block: same logits either way."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return ragged_verify_attention(*args, **kwargs)

    monkeypatch.setattr(dspark_kernels.ragged_attention, "ragged_verify_attention", counted)
    results = {}
    for mode in ("reference", "triton"):
        cache = tiny_model.new_cache(4)
        with kernels_as(mode), torch.no_grad():
            prefill = tiny_model.forward_cached(
                torch.arange(10) % 97, torch.tensor([2, 0]), torch.tensor([7, 3]), cache
            )
            verify = tiny_model.forward_cached(
                torch.tensor([5, 6, 7, 8, 9]), torch.tensor([0, 2]), torch.tensor([4, 1]), cache
            )
        results[mode] = (prefill.logits, verify.logits)
    assert len(calls) == 2 * tiny_model.config.n_layers  # the kernel really ran, in every layer
    for got, expected in zip(results["triton"], results["reference"]):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_wrapper_rejects_bad_inputs():
    q, keys, values, rb = ragged_case(4, 2, 1, [1], [3], [2])
    index = (rb.slots, rb.starts, rb.cu_seqlens, rb.slot_index)
    with pytest.raises(ValueError, match="fp32, fp16 or bf16"):
        ragged_verify_attention(q.double(), keys, values, *index)
    with pytest.raises(ValueError, match="int32 or int64"):
        ragged_verify_attention(q, keys, values, rb.slots.float(), *index[1:])
    with pytest.raises(ValueError, match="contiguous"):
        ragged_verify_attention(q.transpose(0, 1).contiguous().transpose(0, 1), keys, values, *index)
    with pytest.raises(ValueError, match="cu_seqlens must have shape"):
        ragged_verify_attention(q, keys, values, rb.slots, rb.starts, rb.cu_seqlens[1:], rb.slot_index)
    # request_ids is not read by the kernel (its grid is per request) but still checked
    with pytest.raises(ValueError, match="request_ids must have shape"):
        ragged_verify_attention(q, keys, values, rb.slots, rb.starts, rb.cu_seqlens, rb.slot_index[1:])
    with pytest.raises(ValueError, match="block_m must be a power of two"):
        ragged_verify_attention(q, keys, values, *index, block_m=12)
