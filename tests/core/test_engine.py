"""dspark/engine.py: speculative decoding is token-identical to plain greedy decoding for every drafter, verify
length, policy and concurrency (EOS and max-new-tokens inside a block, τ counting only what was output), slots are
reused without leaks, servable-but-bad requests are rejected alone, and each round's proposal reaches the scheduler."""

from __future__ import annotations

import itertools
import sys

import pytest
import torch
from helpers import GREEDY, LENGTHS, PROFILE, RAGGED, SHORT, OracleDrafter, make, make_drafter, prompts

from dspark.decoding import generate
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.base import NoDrafter, Proposal
from dspark.engine import Engine, Request, speculative_generate
from dspark.sampling import SamplingParams
from dspark.scheduler import POLICY_NAMES, Scheduler, ThroughputProfile, make_policy

CASES = [("none", 0), ("mtp", 1), ("mtp", 0)] + [
    (kind, gamma) for kind in ("eagle", "eagle-copy", "oracle") for gamma in (1, 2, 4, 5)
]


@pytest.mark.parametrize("kind, gamma", CASES)
def test_greedy_identity_for_every_drafter(tiny_model, kind, gamma):
    ps = prompts(RAGGED)
    reference = generate(tiny_model, ps, 24, GREEDY)
    result = speculative_generate(tiny_model, make_drafter(kind, tiny_model, gamma), ps, 24, GREEDY, gamma)
    assert result.tokens == reference.tokens
    assert result.stop_reasons == reference.stop_reasons


@pytest.mark.parametrize("kind", ["eagle-copy", "oracle"])
@pytest.mark.parametrize("ell", ["0", "1", "gamma-1", "gamma", "random"])
def test_verify_lengths_0_1_gamma_minus_1_gamma(tiny_model, kind, ell):
    gamma = 4
    fixed = {"0": 0, "1": 1, "gamma-1": gamma - 1, "gamma": gamma}
    g = torch.Generator().manual_seed(9)

    class Lengths(Scheduler):
        def __call__(self, proposal):
            R = proposal.tokens.shape[0]
            if ell == "random":  # a different length per request and per round
                return torch.randint(0, gamma + 1, (R,), generator=g)
            return torch.full((R,), fixed[ell], dtype=torch.long)

    ps = prompts(RAGGED, seed=1)
    reference = generate(tiny_model, ps, 20, GREEDY).tokens
    result = speculative_generate(tiny_model, make_drafter(kind, tiny_model, gamma), ps, 20, GREEDY, gamma,
                                  scheduler=Lengths(make_policy("fixed"), ThroughputProfile([1.0])))  # fmt: skip
    assert result.tokens == reference
    assert all(v <= gamma for lens in result.stats.verify_lens for v in lens)
    if ell == "0":
        assert result.stats.tau == 1.0 and not any(itertools.chain(*result.from_draft))


def test_oracle_gets_long_accepted_runs(tiny_model):
    result = speculative_generate(
        tiny_model, make_drafter("oracle", tiny_model, 5), prompts([4, 9]), 30, GREEDY, 5
    )
    assert result.stats.tau > 2.0  # the loop really accepts multi-token blocks
    rates = result.stats.acceptance_by_position(5)
    assert all(r is not None and 0 < r <= 1 for r in rates)


def test_eos_inside_a_block(tiny_model):
    ps = prompts([5, 11, 2], seed=4)
    free = generate(tiny_model, ps, 30, GREEDY).tokens
    eos = free[1][6]  # some token the second request emits mid-stream
    reference = generate(tiny_model, ps, 30, GREEDY, eos_id=eos)
    drafter = OracleDrafter(tiny_model, 6, noise=0.0)  # every block fully accepted
    result = speculative_generate(tiny_model, drafter, ps, 30, GREEDY, 6, eos_id=eos)
    assert result.tokens == reference.tokens and result.stop_reasons == reference.stop_reasons
    first = free[1].index(eos)
    assert first % 7 != 6  # EOS really fell inside a block of 7 emitted tokens, not at its end


@pytest.mark.parametrize("max_new", [1, 2, 9, 10, 13])
def test_max_new_tokens_boundary_inside_a_block(tiny_model, max_new):
    ps = prompts([6, 3], seed=5)
    reference = generate(tiny_model, ps, max_new, GREEDY).tokens
    result = speculative_generate(tiny_model, OracleDrafter(tiny_model, 4, noise=0.0), ps, max_new, GREEDY, 4)
    assert result.tokens == reference
    assert [len(t) for t in result.tokens] == [max_new, max_new]
    # τ counts committed tokens only: rounds' tokens + each prompt's first (prefill) token = all output
    stats = result.stats
    assert stats.tau * stats.rounds + len(ps) == pytest.approx(sum(len(t) for t in result.tokens))


def test_tau_counts_only_tokens_before_eos(tiny_model):
    ps = prompts([5, 11, 2], seed=4)
    eos = generate(tiny_model, ps, 30, GREEDY).tokens[1][6]
    result = speculative_generate(
        tiny_model, OracleDrafter(tiny_model, 6, noise=0.0), ps, 30, GREEDY, 6, eos_id=eos
    )
    stats = result.stats
    cut = sum(a + 1 for acc in stats.accepted for a in acc) - sum(map(sum, stats.emitted))
    assert cut > 0  # some accepted tokens lay past EOS/the limit in a last round (the case under test)
    assert stats.tau * stats.rounds + len(ps) == pytest.approx(sum(len(t) for t in result.tokens))


def test_gamma_beyond_the_drafter_is_rejected(tiny_model):
    with pytest.raises(ValueError, match="gamma"):
        speculative_generate(tiny_model, make_drafter("mtp", tiny_model, 1), prompts([3]), 5, GREEDY, 2)


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
    assert result.new_tokens == sum(len(r.tokens) for r in result.records) and result.tokens_per_s > 0


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


def test_the_engine_hands_each_round_s_proposal_to_the_verify_function(tiny_model):
    """The scheduler sees the very confidences the engine records for that round."""
    drafter = make(tiny_model, "dspark", gamma=4)
    seen = []

    class VerifyTwo(Scheduler):
        def __call__(self, proposal: Proposal) -> torch.Tensor:
            seen.append(proposal.confidence.clone())
            return torch.full((proposal.tokens.shape[0],), 2)

    ps = prompts(RAGGED[:3], seed=4)
    scheduler = VerifyTwo(make_policy("fixed"), PROFILE)
    result = Engine(tiny_model, drafter, GREEDY, 4, 3, None, scheduler).run([Request(p, 9) for p in ps])
    recorded = [d.confidences for rec in result.records for d in rec.rounds]
    assert len(seen) == result.steps and sum(len(c) for c in seen) == len(recorded)
    assert all(
        d.verify_len <= 2 for rec in result.records for d in rec.rounds
    )  # 2, or less near the context end
    first_step = seen[0].tolist()
    assert [rec.rounds[0].confidences for rec in result.records] == first_step  # all three active in step 1


def test_the_engine_still_serves_good_requests_with_arrival_times(tiny_model):
    engine = Engine(tiny_model, make_drafter("mtp", tiny_model, 1), GREEDY, 1, 2)
    result = engine.run([Request(p, 3, a) for p, a in zip(prompts([3, 4]), (0, 0.001))])
    assert [len(r.tokens) for r in result.records] == [3, 3]


def test_confidences_are_recorded_per_round(tiny_model):
    ps = prompts(SHORT, seed=2)
    result = speculative_generate(tiny_model, make(tiny_model, "dspark", gamma=4), ps, 12, GREEDY, 4)
    for accs, confs in zip(result.stats.accepted, result.stats.confidences):
        assert len(confs) == len(accs) and all(len(c) == 4 and all(0 < x < 1 for x in c) for c in confs)
    eagle = AutoregressiveDrafter(tiny_model, AutoregressiveDrafterConfig("eagle", 3, ffn_hidden=32)).eval()
    assert speculative_generate(tiny_model, eagle, ps, 6, GREEDY, 3).stats.confidences == [[]] * len(ps)


def test_algorithm_1_is_three_calls_from_the_engine(tiny_model):
    """Issue #71: from `Engine.verify_lengths` to Algorithm 1's walk (`admitted_count`) in at most 3 calls
    (`Scheduler.__call__` → `prefix_schedule` → `admitted_count`), counted on the live call stack."""
    depths = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "admitted_count":
            depth, f = 0, frame
            while f is not None and f.f_code.co_name != "verify_lengths":
                f, depth = f.f_back, depth + 1
            depths.append(depth if f is not None else None)

    drafter = make(tiny_model, "dspark", gamma=4)
    engine = Engine(
        tiny_model,
        drafter,
        GREEDY,
        4,
        2,
        None,
        Scheduler.for_drafter(make_policy("dspark"), drafter, PROFILE),
    )
    requests = [Request(p, 6) for p in prompts([4, 7], seed=1)]
    sys.setprofile(watch)
    try:
        engine.run(requests)
    finally:
        sys.setprofile(None)
    assert depths and all(d is not None and d <= 3 for d in depths), depths
