"""Trace replay (hand-worked), trace extraction and the matched-throughput comparison."""

from __future__ import annotations

import pytest

from dspark.lab.cost_aware.draft_cost import DraftCost
from dspark.lab.study.pareto import at_matched_throughput
from dspark.lab.study.simulator import RequestTrace, simulate, traces_from_records
from dspark.scheduler import ThroughputProfile, make_policy

FLAT = ThroughputProfile([1.0] * 64)  # one step per second whatever the batch


def test_replay_hand_worked():
    trace = RequestTrace(confidences=[[0.9, 0.9], [0.9, 0.9]], accepted=[2, 0], length=5)
    out = simulate([trace], make_policy("fixed"), FLAT, concurrency=1, gamma=2, requests=1)
    # prefill gives token 1; step 1 verifies 2, accepts 2 -> +3 (4); step 2 accepts 0 -> +1 (5, done)
    assert out["steps"] == 2 and out["throughput"] == pytest.approx(5 / 2)
    assert out["tpot_ms"] == pytest.approx(1000 * 2 / 4) and out["tps_per_user"] == pytest.approx(2.0)
    assert out["mean_verify_len"] == 2 and out["tau"] == 2


def test_replay_min_of_verify_length_and_full_acceptance():
    trace = RequestTrace(confidences=[[0.9, 0.9, 0.9]], accepted=[3], length=9)
    mtp = simulate([trace], make_policy("mtp1"), FLAT, 1, 3, 1)
    plain = simulate([trace], make_policy("none"), FLAT, 1, 3, 1)
    assert mtp["steps"] == 4 and mtp["tau"] == 2  # min(1, 3) + 1 per step, cycling through the round
    assert plain["steps"] == 8 and plain["mean_verify_len"] == 0


def test_concurrency_shares_steps():
    traces = [RequestTrace([[0.5]], [0], 4)]
    one = simulate(traces, make_policy("none"), FLAT, 1, 1, 4)
    four = simulate(traces, make_policy("none"), FLAT, 4, 1, 4)
    assert one["steps"] == 12 and four["steps"] == 3  # 3 decode steps per request
    assert four["throughput"] == pytest.approx(4 * one["throughput"])
    with pytest.raises(ValueError):
        simulate([], make_policy("none"), FLAT, 1, 1, 1)


def test_traces_keep_only_fully_verified_rounds():
    traces = traces_from_records([[2, 1, 2]], [[1, 1, 2]], [[[0.5, 0.4], [0.6, 0.3], [0.7, 0.2]]], gamma=2)
    assert traces[0].accepted == [1, 2] and traces[0].confidences == [[0.5, 0.4], [0.7, 0.2]]
    assert traces[0].length == 2 + 2 + 3  # what the request emitted in the recording
    no_head = traces_from_records([[1]], [[0]], [[]], gamma=1)
    assert no_head[0].confidences == [[1.0]]


def test_matched_throughput_interpolates_along_the_frontier():
    points = [
        {"policy": "mtp1", "concurrency": 1, "throughput": 10.0, "tps_per_user": 10.0},
        {"policy": "mtp1", "concurrency": 4, "throughput": 30.0, "tps_per_user": 7.0},
        {"policy": "dspark", "concurrency": 1, "throughput": 15.0, "tps_per_user": 20.0},
        {"policy": "dspark", "concurrency": 4, "throughput": 45.0, "tps_per_user": 14.0},
    ]
    rows = at_matched_throughput(points, "dspark")
    assert len(rows) == 1  # throughput 10 lies outside DSpark's range
    assert rows[0]["tps_per_user"] == pytest.approx(20 - 6 * (30 - 15) / 30)
    assert rows[0]["gain"] == pytest.approx(17 / 7 - 1)


def test_drafting_time_is_paid_and_cost_aware_policies_stop_drafting_when_it_cannot_pay():
    traces = [RequestTrace([[0.9, 0.8, 0.7]] * 4, [2, 0, 3, 1], 12)]
    free = simulate(traces, make_policy("dspark"), FLAT, 2, 3, 4)
    paid = simulate(traces, make_policy("fixed"), FLAT, 2, 3, 4, draft_cost=DraftCost([0.5] * 8))
    assert free["draft_share"] == 0 and paid["draft_share"] == pytest.approx(0.5 / 1.5)
    hopeless = DraftCost([100.0] * 8)  # no draft can pay for that
    aware = simulate(traces, make_policy("dspark"), FLAT, 2, 3, 4, draft_cost=hopeless)
    plain = simulate(traces, make_policy("none"), FLAT, 2, 3, 4)
    assert aware["draft_share"] == 0 and aware["mean_verify_len"] == 0
    assert aware["throughput"] == pytest.approx(plain["throughput"])


def test_recorded_traces_are_replayed_only_for_the_weights_they_came_from(tiny_model, tmp_path, monkeypatch):
    """The trace cache is keyed by the target's and the drafter's weights (and γ, prompts, length): the same
    drafter replays its cached rounds, a retrained one (other weights) is recorded afresh."""
    import torch
    from helpers import make

    from dspark.lab.study import pareto
    from dspark.requests import RoundStats
    from dspark.sampling import SamplingParams

    monkeypatch.setenv("DSPARK_HOME", str(tmp_path))
    drafter = make(tiny_model, "dspark", gamma=4)
    recorded = []

    def measure_tau(target, drafter_, prompts, params, gamma, max_new_tokens, eos_id):
        recorded.append(1)
        return RoundStats.from_lists([[4, 4]], [[4, 1]], [[[0.9] * 4, [0.5] * 4]])

    monkeypatch.setattr(pareto, "get_drafter", lambda name, target, target_name="tiny": drafter)
    monkeypatch.setattr(pareto, "get_calibration", lambda name, target_name="tiny": None)
    monkeypatch.setattr(pareto.offline, "prompts_by_domain", lambda *a: {"code": [[1, 2, 3]]})
    monkeypatch.setattr(pareto.offline, "measure_tau", measure_tau)

    class Tok:
        eos_id = None

    def traces() -> list:
        return pareto.record_traces(tiny_model, Tok(), "dspark", 4, SamplingParams(1.0), 1, 8)[0]

    first = traces()
    assert len(recorded) == 1 and len(first) == 1
    assert traces()[0].accepted == first[0].accepted and len(recorded) == 1  # cached
    with torch.no_grad():
        drafter.head.w2.weight.add_(0.01)  # "retrained"
    traces()
    assert len(recorded) == 2
    pareto.record_traces(tiny_model, Tok(), "dspark", 4, SamplingParams(1.0), 1, 16)  # another length
    assert len(recorded) == 3
