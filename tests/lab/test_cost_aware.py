"""Cost-aware scheduling: the drafting time in Theta, the speculate-or-not decision, the drafting-cost
profile. Free drafting must reproduce the paper's Algorithm 1 exactly; drafting that cannot pay must
draft nothing; the decision only ever reads earlier rounds."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from helpers import GREEDY, LENGTHS, PROFILE, linear_profile, make, prompts

from dspark.decoding import generate
from dspark.drafters.base import Proposal
from dspark.lab.cost_aware import draft_cost as draft_cost_module
from dspark.lab.cost_aware import scheduler as step_module
from dspark.lab.cost_aware.draft_cost import (
    DraftCost,
    cpu_draft_cost,
    measure_draft_cost,
    roofline_draft_cost,
)
from dspark.lab.cost_aware.engine import CostAwareEngine, PartialProposal
from dspark.lab.cost_aware.scheduler import (
    PROBE_STEPS,
    CostAwareScheduler,
    draft_plan,
    drafting_can_pay,
    faded_forecast,
    forecast_lengths,
    forecast_parts,
    forecast_survivals,
    step_rate,
    with_drafting,
    with_probes,
)
from dspark.lab.profiles import RooflineConfig
from dspark.sampling import SamplingParams
from dspark.scheduler import (
    Scheduler,
    ThroughputProfile,
    expected_rate,
    greedy_path,
    make_policy,
    prefix_schedule,
    prefix_survival,
)

CPU_LIKE = ThroughputProfile([1 / (0.0025 + 0.0001 * B) for B in range(1, 257)])  # ~2.5 ms a pass, flat-ish


def rounds(n: int, gamma: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.rand(n, gamma, generator=g, dtype=torch.float64) ** 0.3
    )  # mostly confident, like a trained head


def test_free_drafting_is_the_papers_algorithm_1_to_the_bit():
    for seed in range(30):
        conf = rounds(1 + seed % 9, 7, seed)
        proposal = Proposal(torch.zeros(conf.shape, dtype=torch.long), torch.zeros(*conf.shape, 3), conf)
        temps = torch.linspace(0.7, 1.4, 7, dtype=torch.float64)
        for name in ("dspark", "dspark-async"):
            today = CostAwareScheduler(make_policy(name), PROFILE, temps)
            free = CostAwareScheduler(make_policy(name), PROFILE, temps, DraftCost.free())
            assert torch.equal(today(proposal), free(proposal))
        assert torch.equal(prefix_schedule(prefix_survival(conf), PROFILE), prefix_schedule(prefix_survival(conf),
                           with_drafting(PROFILE, 0.0)))  # fmt: skip
    assert draft_plan([[[0.1] * 7], []], [0, 0], 7, PROFILE, DraftCost.free())[0].all()
    assert step_rate(3.0, 4, PROFILE) == 3.0 * PROFILE.sps(4)


def test_drafting_time_makes_verifying_relatively_cheaper():
    """Θ = τ / (1/SPS(B) + d): with the drafting time sunk, the early stop admits a superset (a longer
    prefix of the same greedy path), and Θ of the chosen lengths is the best along that path."""
    for seed in range(30):
        survivals = prefix_survival(rounds(6, 7, seed))
        free = prefix_schedule(survivals, CPU_LIKE)
        drafting = with_drafting(CPU_LIKE, 0.003)
        paid = prefix_schedule(survivals, drafting)
        assert bool((paid >= free).all())
        assert expected_rate(survivals, paid, drafting) >= expected_rate(survivals, free, drafting)


def test_drafting_that_cannot_pay_drafts_nothing():
    costly = DraftCost([1.0] * 64, "a second per drafting pass")
    assert not drafting_can_pay(4, 7, CPU_LIKE, costly)
    mask = draft_plan([[[0.99] * 7]] * 4, [0, 0, 50, 50], 7, CPU_LIKE, costly)[0]
    assert not mask.any()


def test_only_the_requests_worth_their_draft_draft():
    cost = DraftCost([0.0025 * (1 + 0.05 * n) for n in range(1, 65)], "about a target pass")
    good, bad = [[0.97] * 7, [0.95] * 7], [[0.02] * 7]
    mask = draft_plan([good, bad, good, bad], [0, 0, 0, 0], 7, CPU_LIKE, cost)[0]
    assert mask.tolist() == [True, False, True, False]
    # a request idle for long is judged more and more by the others' recent rounds: it drafts again
    mask = draft_plan([good, bad, bad], [0, 0, 40], 7, CPU_LIKE, cost)[0]
    assert mask.tolist() == [True, False, True]
    assert draft_plan([[], []], [0, 0], 7, CPU_LIKE, cost)[0].all()  # nothing known yet: find out
    assert draft_plan([good, []], [0, 0], 7, CPU_LIKE, cost)[0].tolist() == [
        True,
        True,
    ]  # new: the others' mean


def test_a_newcomer_is_forecast_from_earlier_requests_first_rounds():
    """A request that has not drafted yet is forecast by the mean of earlier requests' first drafted rounds
    (not by the others' recent rounds); without such memory by the others' mean; with neither, nothing is
    known (None) and everybody drafts to find out -- but a wave of newcomers whose first rounds did not pay
    before does not draft at all."""
    easy, hard = [0.95] * 7, [0.3] * 7
    forecast = forecast_survivals([[hard], []], [0, 0], 7, first_rounds=[easy, easy])
    assert torch.allclose(forecast[1], prefix_survival(torch.tensor([easy]))[0])
    assert torch.allclose(forecast[0], prefix_survival(torch.tensor([hard]))[0])  # its own rounds: unchanged
    assert torch.allclose(
        forecast_survivals([[hard], []], [0, 0], 7)[1], forecast[0]
    )  # no memory: the others'
    assert forecast_survivals([[], []], [0, 0], 7) is None
    cost = DraftCost([0.0025 * (1 + 0.05 * n) for n in range(1, 65)], "about a target pass")
    assert draft_plan([[]] * 4, [0] * 4, 7, CPU_LIKE, cost)[0].all()  # nothing known: find out
    assert not draft_plan([[]] * 4, [0] * 4, 7, CPU_LIKE, cost, first_rounds=[[0.02] * 7])[0].any()
    assert draft_plan([[]] * 4, [0] * 4, 7, CPU_LIKE, cost, first_rounds=[easy])[0].all()


def test_a_narrow_round_counts_only_at_the_positions_it_saw():
    """A round drafted two wide says nothing about positions 3..γ: there a request is forecast from its rounds
    that saw them, else from the other requests', else from earlier first rounds, else 0 (not planned); a
    forecast never rises along the positions."""
    full, narrow = [0.9] * 4, [0.5, 0.5]
    a_full, a_narrow = prefix_survival(torch.tensor([full]))[0], prefix_survival(torch.tensor([narrow]))[0]
    f = forecast_survivals([[full, narrow], [full]], [0, 0], 4)
    assert torch.allclose(f[0, :2], (a_full[:2] + a_narrow) / 2)  # both of its rounds saw positions 1-2
    assert torch.allclose(
        f[0, 2:], f[0, 1].expand(2)
    )  # its full round's 0.73, 0.66, capped by position 2's 0.53
    assert torch.allclose(f[1], a_full)
    f = forecast_survivals([[narrow], [full]], [0, 0], 4)  # only narrow rounds: the other's at 3-4 (capped)
    assert torch.allclose(f[0, :2], a_narrow) and torch.allclose(f[0, 2:], a_narrow[1].expand(2))
    f = forecast_survivals(
        [[[0.9, 0.9]], [[0.9, 0.9, 0.3, 0.3]]], [0, 0], 4
    )  # the other's at 3-4, lower there
    assert torch.allclose(f[0], f[1])
    assert torch.equal(forecast_survivals([[narrow]], [0], 4)[0, 2:], torch.zeros(2, dtype=torch.float64))
    f = forecast_survivals([[[0.99, 0.99]], []], [0, 0], 4, first_rounds=[full])
    assert torch.allclose(f[0, 2:], a_full[2:]) and torch.allclose(f[1], a_full)  # the first rounds'
    for history in ([[full, narrow], [full]], [[narrow], [[0.95] * 4]]):
        f = forecast_survivals(history, [0, 3], 4)
        assert bool((f[:, 1:] <= f[:, :-1]).all())


def test_the_block_is_as_wide_as_the_forecasts_need_where_width_costs():
    """With a cost that grows with the block's width, the drafting requests draft max ℓ̂ + DRAFT_SLACK positions,
    priced at that width; where the width costs nothing (or drafting is free, or nothing is known yet), γ."""
    flat = [0.0025 * (1 + 0.05 * n) for n in range(1, 65)]
    by_width = DraftCost(flat, "", 0.0, [f / 4 for f in flat], 7)
    cheap_first = [[0.9, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1]] * 2  # worth one draft, not seven
    mask, width = draft_plan([cheap_first] * 4, [0] * 4, 7, CPU_LIKE, by_width)
    ell = prefix_schedule(forecast_survivals([cheap_first] * 4, [0] * 4, 7), with_drafting(CPU_LIKE,
                          by_width.seconds(4)))  # fmt: skip
    assert mask.all() and width == int(ell.max()) + step_module.DRAFT_SLACK < 7
    same_at_any_width = DraftCost([f / 4 for f in flat])
    assert draft_plan([cheap_first] * 4, [0] * 4, 7, CPU_LIKE, same_at_any_width)[1] == 7
    free_mask, free_width = draft_plan([cheap_first] * 4, [0] * 4, 7, CPU_LIKE, DraftCost.free())
    assert free_mask.all() and free_width == 7
    assert draft_plan([[]] * 4, [0] * 4, 7, CPU_LIKE, by_width)[1] == 7  # nothing known: the whole block
    assert draft_plan([[[0.01] * 7]] * 4, [0] * 4, 7, CPU_LIKE, by_width)[1] == 0  # nobody drafts
    # a narrow block can pay where the whole one cannot
    dear = DraftCost([0.02] * 64, "", 0.0, [0.0002] * 64, 7)
    assert drafting_can_pay(4, 7, CPU_LIKE, dear) and not drafting_can_pay(
        4, 7, CPU_LIKE, DraftCost([0.02] * 64)
    )
    sched = CostAwareScheduler(make_policy("dspark"), CPU_LIKE, None, by_width)
    assert sched.speculate([cheap_first] * 4, [0] * 4, 7) == [width] * 4


def test_the_scheduler_remembers_each_requests_first_round_once():
    """`speculate` is called once per step; a request with one round and idle 0 drafted its first round last
    step: remembered once, whether it then drafts again or idles; at most FIRST_ROUNDS are kept."""
    cost = DraftCost([0.0025 * (1 + 0.05 * n) for n in range(1, 65)], "about a target pass")
    sched = CostAwareScheduler(make_policy("dspark"), CPU_LIKE, None, cost)
    a, b = [0.9] * 7, [0.5] * 7
    sched.speculate([[], []], [0, 0], 7)
    assert sched.first_rounds_seen == 0
    sched.speculate([[a], []], [0, 1], 7)  # request 0 drafted its first round, request 1 idled
    sched.speculate([[a], [b]], [1, 0], 7)  # now request 1's first round; request 0 idles (still one round)
    sched.speculate([[a, a], [b]], [0, 1], 7)  # request 0 drafts again: nothing new
    assert list(sched.first_rounds) == [a, b] and sched.first_rounds_seen == 2
    for i in range(step_module.FIRST_ROUNDS + 5):
        sched.speculate([[[i / 100] * 7]], [0], 7)
    assert len(sched.first_rounds) == step_module.FIRST_ROUNDS
    assert sched.first_rounds[-1] == [(step_module.FIRST_ROUNDS + 4) / 100] * 7


def test_an_idle_request_pays_for_catching_up():
    """A request that idled brings the tokens committed meanwhile to its next drafting pass: with a cost per
    such token, of two requests with the same recent rounds the one idle for long drafts only when that
    catch-up is cheap."""
    history = [[[0.95] * 7], [[0.95] * 7]]  # the same rounds: the same forecast, whatever the fade
    base = [0.0025 * (1 + 0.05 * n) for n in range(1, 65)]
    cheap, dear = DraftCost(base, "", 0.0), DraftCost(base, "", 0.001)
    assert draft_plan(history, [0, 60], 7, CPU_LIKE, cheap)[0].tolist() == [True, True]
    assert draft_plan(history, [0, 60], 7, CPU_LIKE, dear)[0].tolist() == [True, False]
    assert draft_plan(history, [0, 0], 7, CPU_LIKE, dear)[0].tolist() == [True, True]
    assert DraftCost([0.0], "", 0.0).is_free and not DraftCost([0.0], "", 1e-3).is_free


def test_the_decision_reads_only_earlier_rounds():
    """Same history in, same decision out, whatever the current proposal: the decision is a
    function of the earlier rounds' confidences and idle counts alone (its signature has no
    current drafts), and it is deterministic."""
    cost = DraftCost([0.002] * 64)
    history = [[list(r) for r in rounds(2, 7, s).tolist()] for s in range(5)]
    first = draft_plan(history, [0, 1, 2, 3, 9], 7, CPU_LIKE, cost)[0]
    again = draft_plan([[list(r) for r in h] for h in history], [0, 1, 2, 3, 9], 7, CPU_LIKE, cost)[0]
    assert torch.equal(first, again)


def test_the_async_policy_forecasts_with_its_global_search_on_a_staircase():
    """On a jagged SPS (CUDA-graph buckets of 16 tokens) the early-stop forecast halts at the first bucket
    edge: ℓ̂ = 0 for everybody and nobody drafts, although filling the buckets would pay. The async policy,
    whose budget is a global search, forecasts with that search and drafts; Algorithm 1 (whose verify step
    would stop at the same edge) does not. Either forecast reads earlier rounds only."""
    stairs = ThroughputProfile([1 / (0.002 + 0.0016 * math.ceil(B / 16)) for B in range(1, 257)])
    cost = DraftCost([0.0002] * 64)
    history, idle = [[[0.95] * 7]] * 16, [0] * 16
    assert not draft_plan(history, idle, 7, stairs, cost)[0].any()
    mask, width = draft_plan(history, idle, 7, stairs, cost, early_stop=False)
    assert mask.all() and width == 7
    for name, drafts in (("dspark", False), ("dspark-async", True)):
        widths = CostAwareScheduler(make_policy(name), stairs, None, cost).speculate(history, idle, 7)
        assert any(widths) == drafts, name
    # on a smooth profile the two forecasts agree here
    smooth = [draft_plan(history, idle, 7, CPU_LIKE, cost, early_stop=e) for e in (True, False)]
    assert torch.equal(smooth[0][0], smooth[1][0])


def test_a_reused_decision_equals_a_fresh_one(monkeypatch):
    """`CostAwareScheduler.speculate` reuses its last decision while the inputs are the same; along an engine-like
    sequence of steps (requests draft or idle, new ones arrive, realism moves) it always equals `draft_plan`
    computed afresh, and it does reuse (a lone idle request)."""
    cost = DraftCost([0.0025 * (1 + 0.05 * n) for n in range(1, 65)], "about a target pass")
    sched = CostAwareScheduler(make_policy("dspark"), CPU_LIKE, None, cost)
    g = torch.Generator().manual_seed(0)
    computed = []
    monkeypatch.setattr(step_module, "draft_plan", lambda *a, **k: computed.append(1) or draft_plan(*a, **k))
    history, idle = [[[0.3] * 7]], [0]  # a request whose drafts did not pay: alone, it idles on
    for step in range(200):
        mask = sched.speculate(history, idle, 7)
        who, width = draft_plan(
            history, idle, 7, CPU_LIKE, cost, None, sched.realism, list(sched.first_rounds)
        )
        assert mask == with_probes((who.long() * width).tolist(), idle, 7, cost.width_matters), step
        for r, drafts in enumerate(mask):
            if drafts:  # a new list, as the engine makes it
                level = 0.99 if (step // 20 + r) % 3 else 0.3
                history[r] = [*history[r], [level] * 7][-4:]
                idle[r] = 0
            else:
                idle[r] += 1
        if step % 50 == 49:  # a request that drafted well arrives; realism moves
            history, idle = [*history, [[0.99] * 7]], [*idle, 0]
            sched.observe(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
            sched.accepted_total += float(torch.rand(1, generator=g)) * 3
            sched.predicted_total += 1.0
    assert 50 < len(computed) < 200  # reused (the lone idle request), recomputed (fades, new rounds)


@pytest.mark.parametrize("width_matters", [False, True])
def test_a_lone_request_that_stopped_drafting_looks_again_and_resumes(width_matters):
    """Batch 1 has no other request to fade toward: after PROBE_STEPS idle steps the request drafts one
    narrow round (a probe); a probe that shows the text got easy brings drafting back for good, one that
    shows it still does not pay leaves it idle until the next probe."""
    one = [0.0012] if width_matters else None
    cost = DraftCost([0.0025], "about a target pass", 0.0, one, 7 if width_matters else 0)
    sched = CostAwareScheduler(make_policy("dspark"), CPU_LIKE, None, cost)
    history, idle = [[[0.2] * 7] * 4], [0]  # its last rounds: nothing would survive
    widths = []
    for step in range(8 * (PROBE_STEPS + 1)):
        (w,) = sched.speculate(history, idle, 7)
        widths.append(w)
        if w:
            level = 0.2 if step < 2 * (PROBE_STEPS + 1) else 0.98  # the text gets easy after two probes
            history, idle = [[*history[0], [level] * w][-4:]], [0]
        else:
            idle = [idle[0] + 1]
    probe = 2 if width_matters else 7
    # idle, one probe, idle, a second probe (both hard); then probes of easy text, until the forecast that
    # made it stop is outweighed (a few probes: it mixes a request's last four rounds): then every step drafts
    assert widths[: 3 * (PROBE_STEPS + 1)] == ([0] * PROBE_STEPS + [probe]) * 3
    resumed = next(i for i in range(len(widths)) if all(widths[i:]))
    assert resumed <= 6 * (PROBE_STEPS + 1) and len(widths) - resumed > 2 * PROBE_STEPS
    assert with_probes([0, 3, 0], [PROBE_STEPS, 0, PROBE_STEPS - 1], 7, True) == [3, 3, 0]


def test_the_forecast_parts_are_kept_while_only_idle_steps_change(monkeypatch):
    """Steps in which only idle counts move (the fade) re-plan from the kept `forecast_parts`; new rounds,
    arrivals and first rounds compute them again; the forecast from kept parts is the fresh one."""
    cost = DraftCost([0.0025 * (1 + 0.05 * n) for n in range(1, 65)], "about a target pass")
    sched = CostAwareScheduler(make_policy("dspark"), CPU_LIKE, None, cost)
    made = []
    monkeypatch.setattr(
        step_module, "forecast_parts", lambda *a, **k: made.append(1) or forecast_parts(*a, **k)
    )
    history, idle = [[[0.3] * 7], [[0.5] * 7, [0.4] * 7]], [3, 5]  # two idle requests: every step re-plans
    fresh = []
    for step in range(6):
        sched.speculate(history, [i + step for i in idle], 7)
        fresh.append(faded_forecast(sched._parts[2], [i + step for i in idle]))
    assert len(made) == 1  # computed once, then kept while only the idle steps moved
    for step, kept in enumerate(fresh):  # (these calls count too: after the check above)
        assert torch.equal(
            torch.tensor(kept, dtype=torch.float64),
            forecast_survivals(history, [i + step for i in idle], 7, None, []),
        )
    made.clear()
    history = [history[0], [*history[1], [0.9] * 7][-4:]]  # request 1 drafted: a new list
    sched.speculate(history, [9, 0], 7)
    assert len(made) == 1
    sched.speculate([*history, []], [10, 1, 0], 7)  # an arrival
    assert len(made) == 2


def test_rows_that_did_not_draft_verify_nothing():
    conf = torch.full((3, 4), 0.99, dtype=torch.float64)
    drafted = torch.tensor([True, False, True])
    proposal = PartialProposal(
        torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 4, 5), conf, drafted=drafted
    )
    for name in ("fixed", "dspark", "threshold", "mtp1"):
        lengths = CostAwareScheduler(make_policy(name), PROFILE, None, DraftCost([0.001] * 8))(proposal)
        assert lengths[1] == 0 and bool((lengths[[0, 2]] > 0).all()), name


def test_draft_cost_table():
    cost = DraftCost.from_points([1, 4, 16], [0.002, 0.003, 0.006], 32)
    assert cost.seconds(0) == 0.0 and cost.seconds(1) == 0.002 and cost.seconds(16) == pytest.approx(0.006)
    table = cost.seconds_by_requests
    assert all(a <= b for a, b in zip(table, table[1:])) and len(table) == 32
    assert cost.seconds(64) == pytest.approx(table[-1] * 2)
    with pytest.raises(ValueError):
        DraftCost([-1.0])


def test_gpu_drafting_cost_model():
    parallel = roofline_draft_cost(RooflineConfig(), 0.4e9, 7, parallel=True)
    chain = roofline_draft_cost(RooflineConfig(), 0.4e9, 7, parallel=False)
    assert parallel.seconds(1) < chain.seconds(1)  # one pass instead of γ
    assert parallel.seconds(1) < RooflineConfig().seconds(8)  # a small drafter costs less than the target
    # memory-bound at low load: the width costs nothing; compute-bound at high load: a narrow block is cheaper
    assert parallel.width_matters and not chain.width_matters
    assert parallel.seconds(1, 1) == pytest.approx(parallel.seconds(1, 7), rel=0.01)
    one_layer = roofline_draft_cost(RooflineConfig(), 0.4e9, 7, parallel=True, kv_fraction=1 / 32)
    assert one_layer.seconds(512, 1) < 0.5 * one_layer.seconds(512, 7)
    # its own KV cache: a 1-layer drafter reads 1/32 of the 32-layer target's context bytes (at 512 requests
    # of 2,048 tokens that is what a drafting pass is made of)
    assert one_layer.seconds(512) < 0.2 * parallel.seconds(512)


def test_a_width_dependent_cost_interpolates_between_one_position_and_the_block():
    cost = DraftCost([0.010, 0.016], "", 0.0, [0.004, 0.006], 4)
    assert cost.seconds(1, 1) == 0.004 and cost.seconds(1, 4) == cost.seconds(1) == 0.010
    assert cost.seconds(2, 2) == pytest.approx(0.006 + 0.010 / 3) and cost.seconds(0, 2) == 0.0
    assert cost.seconds(4, 1) == pytest.approx(0.012)  # beyond the table: proportionally longer
    assert not DraftCost([0.01, 0.02]).width_matters and DraftCost([0.01]).seconds(1, 1) == 0.01
    capped = DraftCost.from_points([1, 2], [0.01, 0.02], 2, one_position=[0.005, 0.03], block=7)
    assert capped.one_position == pytest.approx([0.005, 0.02])  # never dearer than the whole block
    for bad in (
        dict(one_position=[0.1]),
        dict(one_position=[-1.0, 0.0], block=4),
        dict(one_position=[0.0, 0.0]),
    ):
        with pytest.raises(ValueError):
            DraftCost([0.01, 0.02], **bad)


def test_measured_cost_is_cached_per_drafter_and_refreshed_on_demand(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path))
    calls = []
    real = draft_cost_module.measure_draft_cost

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(draft_cost_module, "measure_draft_cost", counting)
    drafter = make(tiny_model, "dspark", gamma=4)
    first = cpu_draft_cost(tiny_model, drafter, 4)
    again = cpu_draft_cost(tiny_model, drafter, 4)
    assert len(calls) == 1 and again == first and len(first.seconds_by_requests) == 32
    cpu_draft_cost(tiny_model, drafter, 3)  # another γ: another key
    cpu_draft_cost(tiny_model, drafter, 4, refresh=True)
    assert len(calls) == 3 and len(list((tmp_path / "profiles").glob("draft-*.json"))) == 2


def test_measuring_leaves_the_drafter_reset(tiny_model):
    drafter = make(tiny_model, "dspark", gamma=4)
    cost = measure_draft_cost(tiny_model, drafter, 4, [1, 2], context=8, repeats=1)
    assert len(cost.seconds_by_requests) == 2 and all(s > 0 for s in cost.seconds_by_requests)
    assert cost.seconds_per_token >= 0  # the catch-up slope was measured (its size is the machine's)
    assert int(drafter.cache.lengths.sum()) == 0


def test_engine_measured_cost_is_cached_beside_the_propose_table(tiny_model, tmp_path, monkeypatch):
    """`engine_draft_cost`: T_draft(n) as the engine pays it (a step in which n requests draft and verify
    nothing, minus one in which none drafts), cached under its own key next to the `propose` table whose
    catch-up slope it takes; free for a drafter that drafts nothing; leaves the drafter reset."""
    from dspark.drafters.base import NoDrafter
    from dspark.lab import step_cost

    monkeypatch.setenv("DSPARK_HOME", str(tmp_path))
    monkeypatch.setattr(step_cost, "STEPS", 3)
    calls = []
    real = step_cost.measure_engine_draft_cost
    monkeypatch.setattr(
        step_cost,
        "measure_engine_draft_cost",
        lambda t, d, g, *rest: calls.append(1) or real(t, d, g, [1, 2]),
    )
    drafter = make(tiny_model, "dspark", gamma=4)
    first = step_cost.engine_draft_cost(tiny_model, drafter, 4)
    assert first.name.startswith("engine-measured") and len(first.seconds_by_requests) == 2
    assert all(s >= 0 for s in first.seconds_by_requests) and first.seconds_per_token >= 0
    assert step_cost.engine_draft_cost(tiny_model, drafter, 4) == first and len(calls) == 1
    step_cost.engine_draft_cost(tiny_model, drafter, 4, refresh=True)
    assert (
        len(calls) == 2 and len(list((tmp_path / "profiles").glob("draft-*.json"))) == 2
    )  # + the propose table
    assert step_cost.engine_draft_cost(tiny_model, NoDrafter(97), 0).is_free
    assert int(drafter.cache.lengths.sum()) == 0


def test_engine_measured_cost_pairs_and_interleaves_its_runs(tiny_model, monkeypatch):
    """Each round runs every n: plain, then drafting a block of γ, then of one position; T_draft(n, w) is the
    median of the paired differences (never below 0), isotonic over n, one position never dearer than γ."""
    from dspark.lab import step_cost

    calls, fake = [], {(1, None): [4.0, 4.0, 4.0], (1, 4): [5.0, 9.0, 5.0], (1, 1): [4.5, 4.5, 4.0],
                       (2, None): [5.5, 5.0, 5.0], (2, 4): [6.0, 6.0, 8.0], (2, 1): [6.0, 5.2, 5.4]}  # fmt: skip
    monkeypatch.setattr(step_cost, "REPEATS", 3)

    def seconds(target, drafter, gamma, n, drafting, prompt_len):
        calls.append((n, gamma if drafting else None))
        return fake[calls[-1]][calls.count(calls[-1]) - 1]

    monkeypatch.setattr(step_cost, "seconds_per_step", seconds)
    monkeypatch.setattr(step_cost, "cpu_draft_cost", lambda *a, **k: DraftCost([0.0], "", 0.25))
    cost = step_cost.measure_engine_draft_cost(tiny_model, make(tiny_model, "dspark", gamma=4), 4, [1, 2])
    assert calls == [(1, None), (1, 4), (1, 1), (2, None), (2, 4), (2, 1)] * 3
    # γ = 4: n = 1: 1, 5, 1 -> 1; n = 2: 0.5, 1, 3 -> 1.  one position: 0.5, 0.5, 0 -> 0.5; 0.5, 0.2, 0.4 -> 0.4,
    # pooled with n = 1 (a larger n never costs less): 0.45, 0.45
    assert cost.seconds_by_requests == pytest.approx([1.0, 1.0]) and cost.seconds_per_token == 0.25
    assert cost.one_position == pytest.approx([0.45, 0.45]) and cost.block == 4 and cost.width_matters
    assert cost.seconds(2, 1) == pytest.approx(0.45) and cost.seconds(2, 3) == pytest.approx(
        0.45 + 0.55 * 2 / 3
    )
    assert cost.seconds(2) == cost.seconds(2, 4) == cost.seconds(2, 9) == pytest.approx(1.0)


# ---- the engine with speculate-or-not ---------------------------------------------------------------
def run_engine(model, drafter, scheduler, concurrency, requests, params=None, seed=0):
    engine = CostAwareEngine(
        model, drafter, params or GREEDY, drafter.max_gamma, concurrency, None, scheduler
    )
    return engine.run(requests, torch.Generator().manual_seed(seed))


def requests_for(lengths, seed):
    from dspark.engine import Request

    ps = prompts(lengths, seed=seed)
    return ps, [Request(p, 6 + 3 * i) for i, p in enumerate(ps)]


MIXED = DraftCost([0.05 + 0.05 * n for n in range(1, 1025)], "a twentieth of a pass, and as much per request")


@pytest.mark.parametrize("concurrency", [1, 3, 16])
def test_hopeless_drafting_drafts_nothing_and_is_plain_decoding(tiny_model, concurrency):
    drafter = make(tiny_model, "dspark", gamma=4)
    ps, reqs = requests_for(LENGTHS, seed=11)
    for name in ("dspark", "dspark-async"):
        scheduler = CostAwareScheduler.for_drafter(
            make_policy(name), drafter, PROFILE, None, DraftCost([100.0] * 64)
        )
        result = run_engine(tiny_model, drafter, scheduler, concurrency, reqs)
        assert result.drafted_rounds == 0 and all(d.verify_len == 0 for r in result.records for d in r.rounds)
        for p, req, rec in zip(ps, reqs, result.records):
            assert rec.tokens == generate(tiny_model, [p], req.max_new_tokens, GREEDY).tokens[0]


def test_the_engine_refuses_a_width_beyond_gamma(tiny_model):
    drafter = make(tiny_model, "dspark", gamma=4)
    _, reqs = requests_for(LENGTHS, seed=3)

    class TooWide(Scheduler):
        def speculate(self, history, idle_steps, gamma):
            return [5] * len(history)

    engine = CostAwareEngine(tiny_model, drafter, GREEDY, 4, 2, None, TooWide(make_policy("fixed"), PROFILE))
    with pytest.raises(ValueError, match="widths must be in 0..4"):
        engine.run(reqs)


def test_free_drafting_is_todays_engine(tiny_model):
    drafter = make(tiny_model, "dspark", gamma=4)
    _, reqs = requests_for(LENGTHS, seed=3)
    sampled = SamplingParams(1.0)
    outcomes = []
    for scheduler in (
        Scheduler.for_drafter(make_policy("dspark"), drafter, PROFILE),  # the core's: the paper's step
        CostAwareScheduler.for_drafter(make_policy("dspark"), drafter, PROFILE, None, DraftCost.free()),
    ):
        result = run_engine(tiny_model, drafter, scheduler, 3, reqs, sampled, seed=5)
        outcomes.append([(r.tokens, r.rounds) for r in result.records])
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("concurrency", [1, 3, 16])
def test_mixed_drafting_is_token_identical_to_plain_decoding(tiny_model, concurrency):
    drafter = make(tiny_model, "dspark", gamma=4)
    with torch.no_grad():  # spread the confidences, so that some requests are worth drafting and some not
        torch.nn.init.normal_(drafter.head.confidence.weight, std=2.0)
    ps, reqs = requests_for(LENGTHS, seed=7)
    shares = []
    for base in (0.05, 0.5, 1.0):  # drafting costs: between them, rounds with and without drafts
        cost = DraftCost([base + 0.05 * n for n in range(1, 1025)])
        scheduler = CostAwareScheduler.for_drafter(make_policy("dspark"), drafter, PROFILE, None, cost)
        result = run_engine(tiny_model, drafter, scheduler, concurrency, reqs)
        shares.append(result.drafted_rounds / sum(len(r.rounds) for r in result.records))
        for p, req, rec in zip(ps, reqs, result.records):
            assert rec.tokens == generate(tiny_model, [p], req.max_new_tokens, GREEDY).tokens[0]
            assert all(d.confidences is not None for d in rec.rounds)  # [] for the rounds without drafts
    assert any(0 < share < 1 for share in shares)  # the case under test happened


@pytest.mark.parametrize("concurrency", [1, 3, 16])
def test_narrow_blocks_are_token_identical_to_plain_decoding(tiny_model, concurrency):
    """Blocks narrower than γ (block boundaries 1, 2, γ-1, γ; rows that draft nothing beside them): every round
    verifies at most its width, records that many confidences, and the output is plain greedy decoding's."""
    drafter = make(tiny_model, "dspark", gamma=4)
    ps, reqs = requests_for(LENGTHS, seed=5)
    steps = []

    class Narrow(Scheduler):  # step s: width (1, 2, 3, 4)[s % 4]; every third row idles; all verified
        def speculate(self, history, idle, gamma):
            width = 1 + len(steps) % 4
            steps.append(width)
            return [0 if (r + len(steps)) % 3 == 0 else width for r in range(len(history))]

    narrow = Narrow(make_policy("fixed"), PROFILE)
    result = CostAwareEngine(tiny_model, drafter, GREEDY, 4, concurrency, None, narrow).run(reqs)
    widths = {len(d.confidences) for rec in result.records for d in rec.rounds}
    assert {1, 2, 3, 4} <= widths or concurrency == 1 and {1, 2, 4} <= widths
    for p, req, rec in zip(ps, reqs, result.records):
        assert rec.tokens == generate(tiny_model, [p], req.max_new_tokens, GREEDY).tokens[0]
        assert all(d.verify_len <= len(d.confidences) for d in rec.rounds)


def test_the_decision_never_sees_the_current_round(tiny_model):
    """Perturb the confidences the drafter returns from step K on: the decisions of steps 1..K (made
    before step K's drafts exist) are unchanged; later ones may change (they read step K)."""
    K = 3

    def decisions(perturb: bool):
        drafter = make(tiny_model, "dspark", gamma=4)
        with torch.no_grad():
            torch.nn.init.normal_(drafter.head.confidence.weight, std=2.0)
        log, propose = [], drafter.propose

        class Logged(CostAwareScheduler):
            def speculate(self, history, idle, gamma):
                log.append(super().speculate(history, idle, gamma))
                return log[-1]

        scheduler = Logged.for_drafter(make_policy("dspark"), drafter, PROFILE, None, MIXED)

        def perturbed(*args, **kwargs):
            p = propose(*args, **kwargs)
            if perturb and len(log) >= K:
                return dataclasses.replace(p, confidence=1 - p.confidence)
            return p

        drafter.propose = perturbed
        _, reqs = requests_for(LENGTHS, seed=7)
        CostAwareEngine(tiny_model, drafter, GREEDY, 4, 6, None, scheduler).run(reqs)
        return log

    base, changed = decisions(False), decisions(True)
    assert base[:K] == changed[:K]
    assert base != changed  # the perturbation does reach later decisions: the check is not vacuous


def test_mixed_drafting_follows_the_target_law():
    """Chi-square against the exact law of a vocab-5 target, with speculate-or-not mixing drafting and
    plain rows in the same passes."""
    from helpers import MICRO_LENGTH, MICRO_PROMPT, linear_profile, micro_target_and_law
    from stats_helpers import assert_matches

    from dspark.engine import speculative_generate

    target, joint = micro_target_and_law()
    drafter = make(target, "dspark", gamma=3, rank=4)
    with torch.no_grad():
        torch.nn.init.normal_(drafter.head.confidence.weight, std=2.0)
    profile = linear_profile(1.0, 0.004, max_tokens=4096)
    cost = DraftCost([0.002 * n for n in range(1, 1025)])
    counts, drafted, g = torch.zeros(5**MICRO_LENGTH), [], torch.Generator().manual_seed(7)
    widths = set()

    class Narrowed(CostAwareScheduler):
        def speculate(self, history, idle, gamma):
            plan = super().speculate(history, idle, gamma)
            drafted.append(sum(w > 0 for w in plan) / len(plan))
            plan = [min(w, 1 + len(drafted) % 3) for w in plan]  # and narrower blocks (1, 2, 3) step to step
            widths.update(plan)
            return plan

    for _ in range(40):  # 40 batches of 300: small batches are where some requests draft and others not
        scheduler = Narrowed.for_drafter(make_policy("dspark"), drafter, profile, None, cost)
        result = speculative_generate(target, drafter, [MICRO_PROMPT] * 300, MICRO_LENGTH, SamplingParams(1.0), 3,
                                      g, None, scheduler, CostAwareEngine)  # fmt: skip
        for toks in result.tokens:
            counts[toks[0] * 25 + toks[1] * 5 + toks[2]] += 1
    assert any(0 < d < 1 for d in drafted)  # some steps mixed drafting and plain rows
    assert widths & {1, 2}  # and some drafted blocks narrower than γ
    assert_matches(counts, joint.flatten())


def test_cost_aware_engine_is_device_aware(tiny_model):
    from helpers import on_meta

    drafter = make(tiny_model, "dspark", gamma=4)
    with torch.no_grad():
        torch.nn.init.normal_(drafter.head.confidence.weight, std=2.0)
    _, reqs = requests_for(LENGTHS, seed=7)

    def run():
        scheduler = CostAwareScheduler.for_drafter(make_policy("dspark"), drafter, PROFILE, None, MIXED)
        result = run_engine(tiny_model, drafter, scheduler, 3, reqs, SamplingParams(1.0), seed=2)
        return [(r.tokens, [d.verify_len for d in r.rounds]) for r in result.records], result.drafted_rounds

    expected, got = on_meta(run)
    assert got == expected and 0 < expected[1]


def test_realism_scales_the_forecasts_and_never_collapses_on_one_round():
    """The scheduler learns how far the survival forecasts overstate the drafts that are then accepted;
    with REALISM_PRIOR tokens of pseudo-evidence, one unlucky round does not stop drafting for good."""
    from dspark.lab.cost_aware.scheduler import REALISM_PRIOR

    scheduler = CostAwareScheduler(make_policy("dspark"), CPU_LIKE, None, DraftCost([0.001] * 64))
    assert scheduler.realism == 1.0
    conf = torch.full((2, 4), 0.9, dtype=torch.float64)
    proposal = Proposal(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, 5), conf)
    lengths = scheduler(proposal)
    predicted = float((prefix_survival(conf) * (torch.arange(4) < lengths[:, None])).sum())
    scheduler.observe(lengths, torch.zeros(2, dtype=torch.long))  # nothing accepted
    assert scheduler.realism == pytest.approx(REALISM_PRIOR / (predicted + REALISM_PRIOR))
    assert 0 < scheduler.realism < 1
    scheduler.observe(lengths, lengths)  # a round nobody drafted (no verify lengths asked): ignored
    assert scheduler.realism == pytest.approx(REALISM_PRIOR / (predicted + REALISM_PRIOR))


def test_a_step_that_drafts_is_algorithm_1_on_the_profile_with_drafting():
    """The cost-aware scheduler prices drafting by handing the core's walk `with_drafting(profile, d)`:
    it admits exactly the greedy path's prefix that a walk on Θ = τ / (1/SPS(B) + d) computed here admits
    (ties in survival broken by position then request, early stop or global argmax, smooth and jagged
    profiles); d = 0 is the profile itself, the paper's Θ to the bit. The lab's host-side `forecast_lengths`
    (lists, for the speculate-or-not forecast) admits exactly what `prefix_schedule` does, ties included."""
    g = torch.Generator().manual_seed(3)
    profiles = [
        linear_profile(0.3, 0.05),
        linear_profile(1.0, 0.002),
        ThroughputProfile([1.0] + [0.6] * 7 + [0.3] * 56),
    ]
    drafting_changed = checked = 0
    for trial in range(300):
        R, gamma = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 8, (1,), generator=g))
        conf = torch.rand(R, gamma, generator=g)
        if trial % 3 == 0:  # many exact ties
            conf = (conf * 4).round() / 4
        if trial % 5 == 0:
            conf[0] = conf[-1]  # two identical requests
        survivals = prefix_survival(conf)
        gains = [float(survivals[r, j]) for r, j in greedy_path(survivals).tolist()]
        for profile, early_stop, d in itertools.product(profiles, (True, False), (0.0, 0.02)):
            rates = [(R + sum(gains[:n])) / (1 / profile.sps(R + n) + d) for n in range(len(gains) + 1)]
            best, n_admit, near_tie = rates[0], 0, False
            for n in range(1, len(rates)):
                near_tie |= abs(rates[n] - best) <= 1e-9 * best  # rounding may decide: no claim
                if rates[n] > best:
                    best, n_admit = rates[n], n
                elif early_stop:
                    break
            got = prefix_schedule(survivals, with_drafting(profile, d), early_stop)
            # the lab's host-side forecast sorts the same path on lists and walks it with the same function
            assert forecast_lengths(survivals.tolist(), with_drafting(profile, d), early_stop) == got.tolist()
            if not near_tie:
                assert int(got.sum()) == n_admit, (conf, profile.steps_per_second[:3], early_stop, d)
                checked += 1
            free = prefix_schedule(survivals, profile, early_stop)
            drafting_changed += d > 0 and not torch.equal(got, free)
            if d == 0:
                assert with_drafting(profile, d) is profile
    assert drafting_changed > 0 and checked > 3000  # the drafting time changes some decisions; few near-ties
