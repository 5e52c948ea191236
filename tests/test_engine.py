"""The continuous-batching engine: greedy identity per request under every policy and
concurrency, slot reuse without leaks, bad requests rejected alone, Poisson arrivals."""

from __future__ import annotations

import pytest
import torch
from test_parallel_drafter import make
from test_speculative import GREEDY, prompts

from dspark.decoding import generate
from dspark.drafters.base import NoDrafter
from dspark.engine import Engine, Request
from dspark.sampling import SamplingParams
from dspark.scheduler import POLICY_NAMES, Scheduler, ThroughputProfile, make_policy

PROFILE = ThroughputProfile([1 / (1.0 + 0.05 * B) for B in range(1, 257)])
LENGTHS = [3, 17, 1, 9, 45, 60, 5, 30, 12, 2]  # 45 and 60 hit the 64-token context


def alone(model, prompt, max_new, eos_id=None):
    return generate(model, [prompt], max_new, GREEDY, eos_id=eos_id).tokens[0]


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
@pytest.mark.parametrize("concurrency", [1, 3, 16])
def test_every_request_equals_plain_decoding_alone(tiny_model, policy_name, concurrency):
    drafter = make(tiny_model, "dspark", gamma=4)
    ps = prompts(LENGTHS, seed=11)
    budgets = [5 + 3 * i for i in range(len(ps))]  # different lengths
    scheduler = Scheduler.for_drafter(make_policy(policy_name, threshold=0.3), drafter, PROFILE)
    engine = Engine(tiny_model, drafter, GREEDY, 4, concurrency, None, scheduler)
    result = engine.run([Request(p, n) for p, n in zip(ps, budgets)])
    for p, n, rec in zip(ps, budgets, result.records):
        assert rec.tokens == alone(tiny_model, p, n)
        assert rec.rounds and all(d.confidences is not None for d in rec.rounds)
    assert result.output_tokens == sum(len(r.tokens) for r in result.records) and result.throughput > 0


def test_eos_inside_a_block_stops_that_request_only(tiny_model):
    ps = prompts([4, 8, 6], seed=3)
    reference = [alone(tiny_model, p, 30) for p in ps]
    eos = reference[0][5]  # a token the first request emits mid-stream
    engine = Engine(tiny_model, make(tiny_model, "dspark", gamma=4), GREEDY, 4, 2, eos_id=eos)
    result = engine.run([Request(p, 30) for p in ps])
    for p, rec in zip(ps, result.records):
        assert rec.tokens == alone(tiny_model, p, 30, eos_id=eos)
        assert rec.stop_reason == ("eos" if eos in rec.tokens else "length")
    assert result.records[0].stop_reason == "eos" and len(result.records[0].tokens) <= 6


def test_hundreds_of_requests_reuse_slots_without_leaks(tiny_model):
    drafter = make(tiny_model, "dspark", gamma=3)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 40, (300,), generator=g).tolist()
    budgets = torch.randint(1, 12, (300,), generator=g).tolist()
    engine = Engine(tiny_model, drafter, SamplingParams(1.0), 3, 8)
    result = engine.run([Request(p, n) for p, n in zip(prompts(lengths, seed=5), budgets)])
    assert all(1 <= len(r.tokens) <= n for r, n in zip(result.records, budgets))
    assert len(engine.cache._free) == engine.cache.n_slots and not engine.cache._in_use
    assert int(engine.cache.lengths.sum()) == 0 and int(drafter.cache.lengths.sum()) == 0


def test_bad_requests_are_rejected_alone(tiny_model):
    good = prompts([5, 7], seed=8)
    requests = [
        Request(good[0], 6),
        Request([], 6),
        Request([1] * 64, 6),
        Request(good[1], 6),
        Request(good[0], 0),
    ]
    result = Engine(tiny_model, make(tiny_model, "dflash", gamma=3), GREEDY, 3, 2).run(requests)
    recs = result.records
    assert [r.stop_reason for r in recs] == ["length", "rejected", "rejected", "length", "rejected"]
    assert "empty" in recs[1].error and "context" in recs[2].error and "max_new_tokens" in recs[4].error
    assert recs[0].tokens == alone(tiny_model, good[0], 6) and recs[3].tokens == alone(tiny_model, good[1], 6)


def test_poisson_arrivals_and_latency_metrics(tiny_model):
    ps = prompts([4, 6, 8], seed=9)
    arrivals = [0.0, 0.05, 0.1]
    result = Engine(tiny_model, NoDrafter(tiny_model.config.vocab_size), GREEDY, 0, 2).run(
        [Request(p, 8, a) for p, a in zip(ps, arrivals)]
    )
    for p, a, rec in zip(ps, arrivals, result.records):
        assert rec.tokens == alone(tiny_model, p, 8)
        assert (
            rec.submitted == pytest.approx(a, abs=0.01)
            and rec.first_token >= a
            and rec.finished >= rec.first_token
        )
        assert rec.ttft >= 0 and rec.tpot is not None and rec.tpot >= 0
    assert result.seconds >= 0.1
