"""dspark/kv_cache.py with the model's cached pass: prefill, decode and ragged blocks in any slots equal one full
forward (fp32); rollback then re-append equals fresh; slots are freed and reused; overflow is refused."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from helpers import ATOL, TINY, full_logits, run_blocks


def random_schedule(lengths, prefill, max_block, rng):
    """Prefill lengths first, then ragged blocks of 1..max_block until every sequence is consumed."""
    schedule = [dict(enumerate(prefill))]
    pos = list(prefill)
    while any(p < n for p, n in zip(pos, lengths)):
        step = {}
        for i, (p, n) in enumerate(zip(pos, lengths)):
            if p < n and rng.random() < 0.8:
                step[i] = min(rng.randint(1, max_block), n - p)
                pos[i] += step[i]
        if step:
            schedule.append(step)
    return schedule


@pytest.mark.parametrize("swapped", [False, True])  # the core's attention, the lab's CPU one (`fast_on_cpu`)
@pytest.mark.parametrize("max_block", [1, 2, 8])  # token-by-token decode, small and large blocks
def test_prefill_decode_and_ragged_blocks_match_full_forward(tiny_model, max_block, swapped):
    from dspark.lab.cpu_speed import fast_on_cpu

    model = fast_on_cpu(copy.deepcopy(tiny_model)) if swapped else tiny_model
    rng = random.Random(max_block)
    torch.manual_seed(max_block)
    lengths = [23, 9, 40, 1, 64]  # includes a one-token sequence and one exactly the context
    seqs = [torch.randint(0, TINY.vocab_size, (n,)) for n in lengths]
    prefill = [5, 1, 17, 1, 30]  # all different
    cache = tiny_model.new_cache(n_slots=7)
    slots = [cache.allocate() for _ in range(7)][2:]  # not starting at slot 0
    logits, taps, pos = run_blocks(
        model, cache, seqs, slots, random_schedule(lengths, prefill, max_block, rng)
    )
    assert pos == lengths
    for seq, got_l, got_t in zip(seqs, logits, taps):
        ref_l, ref_t = full_logits(tiny_model, seq)
        torch.testing.assert_close(got_l, ref_l, atol=ATOL, rtol=0)
        torch.testing.assert_close(got_t, ref_t, atol=ATOL, rtol=0)
    assert cache.lengths[slots].tolist() == lengths


def test_non_contiguous_slots_in_any_order(tiny_model):
    torch.manual_seed(1)
    seqs = [torch.randint(0, TINY.vocab_size, (n,)) for n in (12, 7, 15)]
    cache = tiny_model.new_cache(n_slots=6)
    for _ in range(6):
        cache.allocate()
    slots = [5, 0, 3]  # the engine will hand out scattered slots
    schedule = [{0: 4, 1: 7, 2: 2}, {0: 3, 2: 6}, {0: 5, 2: 7}]
    logits, _, _ = run_blocks(tiny_model, cache, seqs, slots, schedule)
    for seq, got in zip(seqs, logits):
        torch.testing.assert_close(got, full_logits(tiny_model, seq)[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("keep", [0, 1, 9, 10, 11, 17, 18])  # into the prompt, into the block, keep all
def test_rollback_then_reappend_equals_fresh(tiny_model, keep):
    torch.manual_seed(keep)
    prompt = torch.randint(0, TINY.vocab_size, (10,))
    rejected = torch.randint(0, TINY.vocab_size, (8,))  # a "draft block" that gets thrown away
    accepted = torch.randint(0, TINY.vocab_size, (6,))
    cache = tiny_model.new_cache(n_slots=2)
    slot = cache.allocate()
    one = torch.tensor([slot])
    with torch.no_grad():
        tiny_model.forward_cached(prompt, one, torch.tensor([10]), cache)
        tiny_model.forward_cached(rejected, one, torch.tensor([8]), cache)
        cache.rollback(slot, keep)
        got = tiny_model.forward_cached(accepted, one, torch.tensor([6]), cache).logits
    fed = torch.cat([torch.cat([prompt, rejected])[:keep], accepted])
    ref = full_logits(tiny_model, fed)[0][keep:]
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    assert int(cache.lengths[slot]) == keep + 6


def test_rollback_cannot_grow(tiny_model):
    cache = tiny_model.new_cache(n_slots=1)
    slot = cache.allocate()
    with torch.no_grad():
        tiny_model.forward_cached(torch.tensor([1, 2, 3]), torch.tensor([slot]), torch.tensor([3]), cache)
    with pytest.raises(AssertionError):
        cache.rollback(slot, 4)
    with pytest.raises(AssertionError):
        cache.rollback(slot, -1)


def test_slots_free_and_reuse(tiny_model):
    cache = tiny_model.new_cache(n_slots=2)
    a, b = cache.allocate(), cache.allocate()
    with pytest.raises(AssertionError):
        cache.allocate()
    torch.manual_seed(3)
    junk = torch.randint(0, TINY.vocab_size, (30,))
    with torch.no_grad():
        tiny_model.forward_cached(junk, torch.tensor([a]), torch.tensor([30]), cache)
    cache.free(a)
    with pytest.raises(AssertionError):
        cache.free(a)  # double free
    assert cache.n_free == 1
    c = cache.allocate()
    assert c == a and int(cache.lengths[c]) == 0
    seq = torch.randint(0, TINY.vocab_size, (12,))
    with torch.no_grad():  # the reused slot must not see the old request's keys
        got = tiny_model.forward_cached(seq, torch.tensor([c]), torch.tensor([12]), cache).logits
    torch.testing.assert_close(got, full_logits(tiny_model, seq)[0], atol=ATOL, rtol=0)
    cache.free(b)
    cache.free(c)
    assert cache.n_free == 2


def test_overflow_and_bad_blocks_are_rejected(tiny_model):
    cache = tiny_model.new_cache(n_slots=1)
    slot = torch.tensor([cache.allocate()])
    with torch.no_grad():
        tiny_model.forward_cached(torch.zeros(60, dtype=torch.long), slot, torch.tensor([60]), cache)
        with pytest.raises(AssertionError, match="context"):
            tiny_model.forward_cached(torch.zeros(5, dtype=torch.long), slot, torch.tensor([5]), cache)
        assert int(cache.lengths[0]) == 60  # nothing was written on failure
        with pytest.raises(AssertionError):
            tiny_model.forward_cached(torch.zeros(3, dtype=torch.long), slot, torch.tensor([2]), cache)
        with pytest.raises(AssertionError):
            tiny_model.forward_cached(torch.zeros(0, dtype=torch.long), slot, torch.tensor([0]), cache)
