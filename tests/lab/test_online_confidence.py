"""The online confidence (dspark/lab/online_confidence.py) and its comparison with the trained head
(dspark/lab/study/confidence.py): it changes only the confidences, stays exact through verification, and is
calibrated by the very STS code that calibrates the head."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import MICRO, MICRO_LENGTH, MICRO_PROMPT, RAGGED, make, micro_target_and_law, prompts
from stats_helpers import assert_matches

import dspark.lab.calibration as lab_calibration
from dspark.engine import speculative_generate
from dspark.lab.online_confidence import OnlineConfidence, top_probability
from dspark.lab.study import confidence
from dspark.requests import RoundStats
from dspark.sampling import SamplingParams
from dspark.scheduler import Scheduler, ThresholdPolicy, ThroughputProfile


def test_top_probability_is_the_largest_entry_of_each_draft_distribution():
    q = torch.tensor([[[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], [[1.0, 0.0, 0.0], [0.3, 0.3, 0.4]]])
    torch.testing.assert_close(top_probability(q), torch.tensor([[0.7, 0.5], [1.0, 0.4]]))


def recorded_run(target, drafter, run_with, ps, params):
    """Decode `ps` with `run_with` (`drafter` or a wrapper of it), keeping every Proposal `drafter` made."""
    seen, inner = [], drafter.propose

    def spy(*args):
        seen.append(inner(*args))
        return seen[-1]

    drafter.propose = spy
    try:
        result = speculative_generate(target, run_with, ps, 12, params, 4, torch.Generator().manual_seed(0))
    finally:
        del drafter.propose
    return result, seen


def test_only_the_confidences_change(tiny_model):
    """Same seed, same drafts and q; the confidence is max q instead of the head's output."""
    drafter = make(tiny_model, "dspark", gamma=4)
    ps, params = prompts(RAGGED[:4], seed=11), SamplingParams(1.0)
    runs = {name: recorded_run(tiny_model, drafter, d, ps, params)
            for name, d in (("head", drafter), ("online", OnlineConfidence(drafter)))}  # fmt: skip
    (head, head_props), (online, online_props) = runs["head"], runs["online"]
    assert head.tokens == online.tokens and head.stats.accepted == online.stats.accepted
    for a, b in zip(head_props, online_props, strict=True):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.q, b.q)
    # what the engine recorded is the top probability of the inner drafter's q, round by round
    recorded = [c for r in online.stats.all_rounds() for c in r.confidences]
    expected = [c for p in online_props for row in top_probability(p.q).tolist() for c in row]
    assert sorted(recorded) == pytest.approx(sorted(expected))
    assert recorded != pytest.approx([c for r in head.stats.all_rounds() for c in r.confidences])


def test_greedy_proposals_are_refused(tiny_model):
    drafter = OnlineConfidence(make(tiny_model, "dspark", gamma=4))
    with pytest.raises(ValueError, match="one-hot at temperature 0"):
        speculative_generate(tiny_model, drafter, prompts([5]), 4, SamplingParams(0.0), 4)


def test_sampled_output_follows_the_target_exactly():
    """Verify lengths chosen from the online confidence (a threshold on its prefix survival): still the target's law."""
    target, joint = micro_target_and_law()
    drafter = OnlineConfidence(make(target, "dspark", gamma=3, rank=4))
    scheduler = Scheduler(ThresholdPolicy(0.5), ThroughputProfile([1.0] * 64))
    g = torch.Generator().manual_seed(42)
    counts, accepted, lengths = torch.zeros(MICRO.vocab_size**MICRO_LENGTH), 0, set()
    for _ in range(12):
        result = speculative_generate(target, drafter, [MICRO_PROMPT] * 1000, MICRO_LENGTH, SamplingParams(1.0), 3,
                                      generator=g, scheduler=scheduler)  # fmt: skip
        for toks in result.tokens:
            counts[toks[0] * 25 + toks[1] * 5 + toks[2]] += 1
        accepted += sum(itertools.chain(*result.from_draft))
        lengths.update(itertools.chain(*result.stats.verify_lens))
    assert accepted > 500 and min(lengths) < 3 == max(
        lengths
    )  # the confidence shortened some rounds, not all
    assert_matches(counts, joint.flatten())


def synthetic_rounds(conf: torch.Tensor, g: torch.Generator) -> RoundStats:
    """Fully verified rounds whose acceptances follow P(accept k | 1..k-1 accepted) = σ(logit(c_k) / 3):
    confidences over-sure by a temperature of 3."""
    truth = torch.sigmoid(torch.logit(conf) / 3)
    accepted = ((torch.rand(conf.shape, generator=g) < truth).long().cumprod(1)).sum(1)
    gamma = conf.shape[1]
    return RoundStats.from_lists([[gamma] * len(conf)], [accepted.tolist()], [conf.tolist()])


def test_both_confidences_are_calibrated_by_the_same_sts_code(monkeypatch):
    g = torch.Generator().manual_seed(0)
    make_conf = lambda n: torch.rand(n, 2, generator=g, dtype=torch.float64) * 0.98 + 0.01  # noqa: E731
    fit = {"head": synthetic_rounds(make_conf(3000), g), "online": synthetic_rounds(make_conf(3000), g)}
    held = synthetic_rounds(make_conf(1500), g)
    held = {"head": held, "online": held}
    calls = []
    fit_sts = lab_calibration.fit_sts

    def spy(conf, events, mask, shifts=False):
        calls.append(conf)
        return fit_sts(conf, events, mask, shifts=shifts)

    monkeypatch.setattr(lab_calibration, "fit_sts", spy)
    result = confidence.compare(
        fit, held, ThroughputProfile([1.0 / B for B in range(1, 64)]), [1], 8, 2, seeds=1
    )
    # select_sts -> fit_sts once per confidence, on that confidence's fitting half (every other round)
    assert [c.shape for c in calls] == [(1500, 2)] * 2
    for conf, name in zip(calls, ("head", "online")):
        assert torch.equal(conf, fit[name].calibration_arrays()[0][::2])
        # the over-sure confidences get position 1's temperature near 3 and a lower held-out ECE
        assert 2.0 < result["confidences"][name]["sts"][0][0] < 4.5
        first = result["confidences"][name]["positions"][0]
        assert first["ece_after"] < first["ece_before"]


def test_the_oracle_is_sure_exactly_up_to_the_accepted_drafts():
    rounds = RoundStats.from_lists([[3, 3], [3]], [[0, 2], [3]], [[[0.5] * 3, [0.4] * 3], [[0.9] * 3]])
    assert confidence.oracle(rounds).confidences == [[[0.0] * 3, [1.0, 1.0, 0.0]], [[1.0] * 3]]
    assert confidence.oracle(rounds).accepted == rounds.accepted


def test_the_oracle_replays_at_least_as_fast_as_verifying_everything():
    g = torch.Generator().manual_seed(1)
    rounds = synthetic_rounds(torch.rand(400, 4, generator=g, dtype=torch.float64) * 0.98 + 0.01, g)
    profile = ThroughputProfile([1.0 / (1 + 0.05 * B) for B in range(1, 512)])
    best = confidence.replay(confidence.oracle(rounds), None, "dspark", profile, 16, 4, 64, 2)
    everything = confidence.replay(rounds, None, "fixed", profile, 16, 4, 64, 2)
    assert best["tau"] == pytest.approx(
        everything["tau"]
    )  # it verifies exactly what is accepted: same tokens
    assert best["throughput"] > everything["throughput"] and best["mean_verify_len"] < 4
