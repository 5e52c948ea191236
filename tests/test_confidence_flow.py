"""The paper's central path, visible in signatures: drafter -> Proposal (with confidences or None)
-> Scheduler (policy + SPS profile + STS temperatures, all passed in) -> verify lengths.
Nobody reads a drafter's attributes to learn what it proposed."""

from __future__ import annotations

import pytest
import torch
from test_engine import PROFILE
from test_parallel_drafter import make
from test_speculative import GREEDY, RAGGED, prompts

from dspark.drafters import get_calibration, get_drafter, load_calibration
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.base import Proposal, TargetFeatures
from dspark.engine import Engine, Request
from dspark.sampling import SamplingParams
from dspark.scheduler import POLICY_NAMES, Scheduler, make_policy, prefix_schedule, prefix_survival

CONFIDENCE_POLICIES = [n for n in POLICY_NAMES if make_policy(n).needs_confidence]


def propose_once(drafter, model, gamma=4):
    drafter.reset(2)
    torch.manual_seed(0)
    n_taps = len(model.config.tap_layers)
    feats = TargetFeatures(torch.randn(7, n_taps, model.config.dim), torch.randn(7, model.config.dim))
    return drafter.propose(torch.tensor([0, 1]), torch.arange(7), feats, torch.tensor([3, 4]),
                           torch.tensor([5, 6]), gamma, SamplingParams(1.0), torch.Generator().manual_seed(3))  # fmt: skip


@pytest.mark.parametrize("kind", ["dspark", "dspark-rnn"])
def test_dspark_proposals_carry_confidences(tiny_model, kind):
    drafter = make(tiny_model, kind)
    proposal = propose_once(drafter, tiny_model)
    assert drafter.has_confidence and isinstance(proposal, Proposal)
    assert proposal.tokens.shape == (2, 4) and proposal.probs.shape == (2, 4, tiny_model.config.vocab_size)
    assert proposal.confidence.shape == (2, 4) and bool(
        ((proposal.confidence > 0) & (proposal.confidence < 1)).all()
    )


def test_drafters_without_a_trained_head_propose_no_confidence(tiny_model):
    dflash = make(tiny_model, "dflash")
    eagle = AutoregressiveDrafter(tiny_model, AutoregressiveDrafterConfig("eagle", 4, ffn_hidden=32)).eval()
    for drafter in (dflash, eagle):
        assert not drafter.has_confidence
        assert propose_once(drafter, tiny_model).confidence is None


@pytest.mark.parametrize("policy_name", CONFIDENCE_POLICIES)
@pytest.mark.parametrize("kind", ["dflash", "eagle", "none"])
def test_confidence_policies_refuse_drafters_without_a_head(tiny_model, policy_name, kind):
    drafter = (
        make(tiny_model, "dflash")
        if kind == "dflash"
        else get_drafter("none", tiny_model)
        if kind == "none"
        else AutoregressiveDrafter(tiny_model, AutoregressiveDrafterConfig("eagle", 4, ffn_hidden=32))
    )
    with pytest.raises(ValueError, match="no trained confidence head"):
        Scheduler.for_drafter(make_policy(policy_name), drafter, PROFILE)


def test_policies_that_ignore_confidences_accept_any_drafter(tiny_model):
    for name in sorted(set(POLICY_NAMES) - set(CONFIDENCE_POLICIES)):
        scheduler = Scheduler.for_drafter(make_policy(name), make(tiny_model, "dflash"), PROFILE)
        lengths = scheduler(Proposal(torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 4, 5)))
        assert lengths.shape == (3,) and bool(((lengths >= 0) & (lengths <= 4)).all())


def test_the_scheduler_uses_the_temperatures_it_is_given():
    """Same proposal, different STS temperatures passed in -> the lengths follow Algorithm 1 on
    the survivals calibrated with exactly those temperatures."""
    conf = torch.tensor([[0.9, 0.8, 0.7, 0.6], [0.6, 0.5, 0.9, 0.9]])
    proposal = Proposal(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, 5), conf)
    for temps in (None, torch.tensor([0.5, 0.5, 0.5, 0.5]), torch.tensor([3.0, 2.0, 1.0, 1.0])):
        got = Scheduler(make_policy("dspark"), PROFILE, temps)(proposal)
        assert torch.equal(got, prefix_schedule(prefix_survival(conf, temps), PROFILE))


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


def test_shipped_calibration_is_loaded_with_the_drafter_checkpoint(tmp_path):
    temps = get_calibration("dspark")
    assert temps is not None and temps.dtype == torch.float64 and temps.shape == (2, 7)  # T_k; b_k
    assert get_calibration("none") is None
    assert load_calibration(tmp_path / "nothing.safetensors") is None
