"""The costs a run learns from its own steps (dspark/lab/cost_aware/learned_costs.py): the prior until the
first refit; per point the median ratio to the prior, pulled toward all points' median; a load that slows
every step alike changes no decision, one stall nothing; times non-decreasing in B; the engine reports each
step's batch size, drafting requests and width; the output stays plain decoding's."""

from __future__ import annotations

import pytest
import torch
from helpers import GREEDY, LENGTHS, make, prompts

from dspark.decoding import generate
from dspark.engine import Request
from dspark.lab.cost_aware.draft_cost import DraftCost
from dspark.lab.cost_aware.engine import CostAwareEngine
from dspark.lab.cost_aware.learned_costs import PRIOR_STEPS, REFIT_STEPS, WINDOW, LearnedCosts
from dspark.lab.cost_aware.scheduler import CostAwareScheduler, draft_plan
from dspark.scheduler import ThroughputProfile, make_policy

PRIOR = ThroughputProfile([1 / (0.050 + 0.005 * (B - 1)) for B in range(1, 9)], "prior")  # 50 ms + 5 ms/token
COST = DraftCost([0.014], "prior", 0.001, [0.007], 7)  # one request: 7 ms at width 1, 14 ms at width 7


def prior_seconds(B: int) -> float:
    return 1 / PRIOR.sps(B)


def test_the_prior_until_the_first_refit_then_the_median_ratio_per_point():
    learned = LearnedCosts(PRIOR, COST)
    for _ in range(REFIT_STEPS - 1):
        learned.observe(1, 1.2 * prior_seconds(1))
    assert learned.profile is PRIOR and learned.cost is COST and learned.version == 0
    learned.observe(4, 1.1 * prior_seconds(4), 1, 3, 0.5 * COST.seconds(1, 3))  # the 8th step: a refit
    assert learned.version == 1
    # B = 1: 7 steps at 1.2; all 8 steps' median is 1.2 too; B = 4: its own 1.1 (n = 1) and 1.2 (PRIOR_STEPS)
    assert 1 / learned.profile.sps(1) == pytest.approx(1.2 * prior_seconds(1))
    assert 1 / learned.profile.sps(4) == pytest.approx(
        prior_seconds(4) * (1.1 + PRIOR_STEPS * 1.2) / (1 + PRIOR_STEPS)
    )
    assert 1 / learned.profile.sps(8) == pytest.approx(
        1.2 * prior_seconds(8)
    )  # never seen: all points' ratio
    # drafting: the one pass seen, at width 3, and every other width follows it
    assert learned.cost.seconds(1, 3) == pytest.approx(0.5 * COST.seconds(1, 3))
    assert learned.cost.seconds(1, 7) == pytest.approx(0.5 * COST.seconds(1, 7))
    assert learned.cost.seconds(0) == 0.0


def test_one_stall_changes_nothing_and_the_window_forgets():
    learned = LearnedCosts(PRIOR, COST)
    for step in range(4 * REFIT_STEPS):
        stall = 20.0 if step == 5 else 1.0
        learned.observe(1 + step % 2, stall * prior_seconds(1 + step % 2))
    assert [1 / learned.profile.sps(B) for B in (1, 2, 5)] == pytest.approx(
        [prior_seconds(B) for B in (1, 2, 5)]
    )
    for _ in range(WINDOW):  # the machine got slower for good: the last WINDOW steps are all that count
        learned.observe(1, 3 * prior_seconds(1))
    assert 1 / learned.profile.sps(1) == pytest.approx(3 * prior_seconds(1))


def test_times_never_fall_as_the_batch_grows():
    learned = LearnedCosts(PRIOR, COST)
    for step in range(2 * REFIT_STEPS):  # B = 3 looks slower than B = 4 (a kernel's shape, or noise)
        B = 3 if step % 2 else 4
        learned.observe(B, (1.4 if B == 3 else 1.0) * prior_seconds(B))
    times = [1 / s for s in learned.profile.steps_per_second]
    assert times == sorted(times) and times[2] == times[3]  # pooled


def test_a_load_that_slows_every_step_alike_changes_no_decision():
    """Every step 3x slower (target and drafting alike): the learnt costs are the prior's times 3, and
    every speculate-or-not decision and block width is the prior's."""
    learned = LearnedCosts(PRIOR, COST)
    for step in range(2 * REFIT_STEPS):
        width = 1 + step % 7
        learned.observe(1 + step % 4, 3 * prior_seconds(1 + step % 4), 1, width, 3 * COST.seconds(1, width))
    assert learned.cost.seconds(1, 5) == pytest.approx(3 * COST.seconds(1, 5))
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        level = float(torch.rand(1, generator=gen))
        history, idle = [[[level] * 7] * 4], [int(torch.randint(0, 4, (1,), generator=gen))]
        before = draft_plan(history, idle, 7, PRIOR, COST)
        after = draft_plan(history, idle, 7, learned.profile, learned.cost)
        assert before[0].tolist() == after[0].tolist() and before[1] == after[1]


def test_the_scheduler_decides_again_on_the_learnt_costs():
    """A prior that overprices drafting makes a lone request stop; steps showing drafting cheap (and plain
    steps dearer than the prior says) make the same history draft after the refit."""
    dear = DraftCost([0.040], "overpriced", 0.0, [0.030], 7)
    learned = LearnedCosts(PRIOR, dear)
    sched = CostAwareScheduler(make_policy("dspark"), PRIOR, None, dear, learned)
    history, idle = [[[0.45] * 7] * 4], [0]
    assert sched.speculate(history, idle, 7) == [0]
    for _ in range(REFIT_STEPS):
        learned.observe(1, 1.1 * prior_seconds(1), 1, 2, 0.2 * dear.seconds(1, 2))
    assert sched.speculate(history, idle, 7)[0] > 0
    assert sched.profile is learned.profile and sched.draft_cost is learned.cost
    # given no learner (tests, a GPU, a free cost), nothing changes
    assert CostAwareScheduler(make_policy("dspark"), PRIOR, None, dear).learned is None
    assert CostAwareScheduler(make_policy("dspark"), PRIOR, None, DraftCost.free(), learned).learned is None


@pytest.mark.parametrize("concurrency", [1, 3])
def test_the_engine_times_each_step_and_the_output_is_plain_decodings(tiny_model, concurrency):
    drafter = make(tiny_model, "dspark", gamma=4)
    with torch.no_grad():  # spread the confidences: some rounds draft, some not
        torch.nn.init.normal_(drafter.head.confidence.weight, std=2.0)
    ps = prompts(LENGTHS, seed=7)
    reqs = [Request(p, 6 + 3 * i) for i, p in enumerate(ps)]
    profile = ThroughputProfile([1 / (0.002 + 0.0002 * B) for B in range(1, 65)])
    cost = DraftCost(
        [0.0005 + 0.0005 * n for n in range(1, 33)], "", 0.0001, [0.0002 * n for n in range(1, 33)], 4
    )
    seen = []

    class Logged(LearnedCosts):
        def observe(self, *timings):
            seen.append((*timings, 0, 0, 0.0, 0)[:6])  # a plain step gives (B, seconds) alone
            super().observe(*timings)

    learned = Logged(profile, cost)
    sched = CostAwareScheduler.for_drafter(make_policy("dspark"), drafter, profile, None, cost, learned)
    engine = CostAwareEngine(tiny_model, drafter, GREEDY, 4, concurrency, None, sched)
    result = engine.run(reqs)
    assert len(seen) == result.steps and learned.version == result.steps // REFIT_STEPS > 0
    assert all(t[1] > 0 for t in seen)
    drafting_steps = [t for t in seen if t[2]]
    assert drafting_steps and all(1 <= t[3] <= 4 and t[4] > 0 for t in drafting_steps)
    assert any(t[2] == 0 for t in seen) or concurrency > 1  # some steps at batch 1 decoded plainly
    # B = the requests active that step + the drafts they verified
    assert sum(t[0] for t in seen) == sum(1 + d.verify_len for rec in result.records for d in rec.rounds)
    for p, req, rec in zip(ps, reqs, result.records):
        assert rec.tokens == generate(tiny_model, [p], req.max_new_tokens, GREEDY).tokens[0]


def test_bench_policies_runs_the_scheduler_with_and_without_learning(tmp_path, monkeypatch):
    """`bench policies --unlearnt`: a row for the default scheduler (learning) and one on the measured costs
    alone, each with its decisions, both giving plain decoding's text at T = 0."""
    import json

    from dspark import bench
    from dspark.lab.benchmarks.policies import UNLEARNT
    from dspark.lab.cli import run_main

    monkeypatch.setenv("DSPARK_HOME", str(tmp_path))
    out = tmp_path / "policies.json"
    argv = ["policies", "--prompts-per-domain", "1", "--lengths", "2", "--max-new-tokens", "6", "--unlearnt",
            "--json", str(out)]  # fmt: skip
    assert run_main(bench.main, argv) == 0
    rows = json.loads(out.read_text())["results"]
    for system in ("default", UNLEARNT):
        mine = [r for r in rows if r["system"] == system]
        assert mine and all(r["same_text_as_plain"] == "1/1" and "drafted_share" in r for r in mine)
    assert {r["system"] for r in rows} == {"plain", "fixed l=2", "default", UNLEARNT}
