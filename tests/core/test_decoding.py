"""dspark/decoding.py: plain generation (the engine without a drafter) batched == one by one == a naive
recompute-everything loop (EOS, context limit, seeds, cache slots returned), and bad prompts or budgets refused
with a clear ValueError by the entry points' one check (the lab's detailed messages: tests/lab/test_inputs.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import TINY, make_drafter

from dspark.decoding import generate
from dspark.decoding import generate as plain_generate
from dspark.drafters.base import NoDrafter
from dspark.engine import Engine, Request, speculative_generate
from dspark.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def naive_greedy(model, prompt: list[int], n: int, eos_id: int | None) -> list[int]:
    """No cache at all: rerun the whole sequence for every token."""
    seq, out = list(prompt), []
    with torch.no_grad():
        while len(out) < n and len(seq) <= TINY.max_seq_len:
            token = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            out.append(token)
            seq.append(token)
            if token == eos_id:
                break
    return out


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, TINY.vocab_size, (n,), generator=g).tolist() for n in lengths]


def test_batched_greedy_equals_naive_loop(tiny_model):
    ps = prompts([3, 17, 1, 9])
    result = generate(tiny_model, ps, 12, GREEDY)
    assert [len(t) for t in result.tokens] == [12] * 4
    assert result.stop_reasons == ["length"] * 4
    for p, got in zip(ps, result.tokens):
        assert got == naive_greedy(tiny_model, p, 12, None)


def test_batched_equals_alone(tiny_model):
    ps = prompts([5, 30, 2], seed=1)
    together = generate(tiny_model, ps, 10, GREEDY).tokens
    alone = [generate(tiny_model, [p], 10, GREEDY).tokens[0] for p in ps]
    assert together == alone


def test_eos_stops_each_request_on_its_own(tiny_model):
    ps = prompts([4, 6], seed=2)
    free_run = generate(tiny_model, ps, 20, GREEDY).tokens
    eos = free_run[0][3]  # pretend the 4th token of request 0 is EOS
    result = generate(tiny_model, ps, 20, GREEDY, eos_id=eos)
    assert result.tokens[0] == free_run[0][: free_run[0].index(eos) + 1]
    assert result.stop_reasons[0] == "eos"
    expected = naive_greedy(tiny_model, ps[1], 20, eos)
    assert result.tokens[1] == expected


def test_context_limit_stops_generation(tiny_model):
    ps = prompts([60])
    result = generate(tiny_model, ps, 50, GREEDY)
    # 60 prompt positions + 4 fed tokens fill the 64-slot cache; the 5th token needs no slot
    assert len(result.tokens[0]) == 5 and result.stop_reasons == ["context"]
    assert result.tokens[0] == naive_greedy(tiny_model, ps[0], 5, None)


def test_sampling_is_reproducible_with_a_seed(tiny_model):
    ps = prompts([5, 8], seed=3)
    params = SamplingParams(temperature=1.0, top_k=20, top_p=0.9)
    a = generate(tiny_model, ps, 15, params, torch.Generator().manual_seed(11)).tokens
    b = generate(tiny_model, ps, 15, params, torch.Generator().manual_seed(11)).tokens
    c = generate(tiny_model, ps, 15, params, torch.Generator().manual_seed(12)).tokens
    assert a == b and a != c


def test_cache_slots_are_returned(tiny_model):
    engine = Engine(tiny_model, NoDrafter(TINY.vocab_size), GREEDY, 0, 3)
    for _ in range(4):
        engine.run([Request(p, 3) for p in prompts([4, 5, 6])])
    assert engine.cache.n_free == 3


@pytest.mark.parametrize("bad", [[], [[]], [[1] * 64]])
def test_bad_prompts(tiny_model, bad):
    with pytest.raises(ValueError, match="no prompts given|prompt 1 must be a non-empty list"):
        generate(tiny_model, bad, 4, GREEDY)


def test_max_new_tokens_must_be_positive(tiny_model):
    with pytest.raises(ValueError):
        generate(tiny_model, prompts([3]), 0, GREEDY)


def test_decoding_records_no_autograd_graph(tiny_model, monkeypatch):
    """Plain decoding and the engine run every target pass without autograd (a recorded graph costs time and
    memory on every step), even when the caller has gradients enabled."""
    from dspark.drafters.base import NoDrafter
    from dspark.engine import speculative_generate

    seen = []
    forward = tiny_model.forward_cached  # (whatever an earlier test swapped in: the instance's own)
    monkeypatch.setattr(tiny_model, "forward_cached",
                        lambda *a, **k: seen.append(torch.is_grad_enabled()) or forward(*a, **k))  # fmt: skip
    with torch.enable_grad():
        generate(tiny_model, [[1, 2, 3]], 4, SamplingParams(0.0))
        speculative_generate(tiny_model, NoDrafter(TINY.vocab_size), [[1, 2, 3]], 4, SamplingParams(0.0), 0)
    assert len(seen) >= 4 and not any(seen)


# ---- the inputs are validated where they enter (token ids, max_new_tokens) ---------------------------------------
BAD_PROMPTS = [
    ([[1.5, 2]], "prompt 1 must be a non-empty list of token ids"),
    ([[3, True]], "prompt 1 must be a non-empty list of token ids"),
    ([[4, 5], [-1, 3]], "prompt 2: a token id is outside the vocabulary 0..96"),
    ([[TINY.vocab_size]], "prompt 1: a token id is outside the vocabulary"),
    ([torch.tensor([1, 2])], "prompt 1 must be a non-empty list of token ids"),
]


@pytest.mark.parametrize("ps, message", BAD_PROMPTS)
@pytest.mark.parametrize("entry", ["generate", "speculative_generate"])
def test_bad_token_ids_are_a_clear_value_error(tiny_model, entry, ps, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        if entry == "generate":
            plain_generate(tiny_model, ps, 4, GREEDY)
        else:
            speculative_generate(tiny_model, make_drafter("mtp", tiny_model, 1), ps, 4, GREEDY, 1)


@pytest.mark.parametrize("budget", [4.5, True, 0, "4"])
def test_max_new_tokens_must_be_an_integer(tiny_model, budget):
    for call in (lambda: plain_generate(tiny_model, prompts([3]), budget, GREEDY),
                 lambda: speculative_generate(tiny_model, make_drafter("mtp", tiny_model, 1), prompts([3]), budget, GREEDY, 1)):  # fmt: skip
        with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
            call()
