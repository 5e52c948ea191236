"""Reduced draft vocabularies (dspark/lab/draft_vocab.py): drafts only from the K chosen ids, q = 0 elsewhere,
and speculative decoding stays exact -- greedy token-identical, sampling chi-square-matched on the 5-token
micro target with K = 3 (target tokens the drafter can never propose still come out at their probability)."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import GREEDY, MICRO, MICRO_LENGTH, MICRO_PROMPT, RAGGED, TINY, micro_target_and_law, prompts
from stats_helpers import assert_matches

from dspark.decoding import generate
from dspark.drafters.base import TargetFeatures
from dspark.engine import speculative_generate
from dspark.lab.draft_vocab import DraftVocabulary, load_checkpoint, most_frequent
from dspark.lab.storage import save_checkpoint
from dspark.lab.training.drafters import DrafterTrainConfig, batch_loss, new_drafter
from dspark.sampling import SamplingParams
from dspark.training import FeatureBatch

KINDS = ["mtp", "eagle", "dflash", "dspark", "dspark-rnn"]


def drafter_with_vocab(target, kind, ids, seed=0):
    torch.manual_seed(seed)
    drafter = new_drafter(target, kind, gamma=4, rank=8, draft_vocab=len(ids))
    drafter.vocab.set_ids(torch.tensor(ids))
    if hasattr(drafter, "w2"):
        torch.nn.init.normal_(drafter.head.w2.weight, std=0.5)  # a non-trivial sequential head
    return drafter.eval()


def test_most_frequent_keeps_the_top_ids_and_the_forced_ones():
    counts = torch.tensor([5, 0, 9, 9, 1, 7])
    assert most_frequent(counts, 3).tolist() == [2, 3, 5]  # ties: the lower id first
    assert most_frequent(counts, 3, keep=(1,)).tolist() == [1, 2, 3]
    with pytest.raises(ValueError):
        most_frequent(counts, 7)


def test_maps_between_draft_indices_and_target_ids(tiny_model):
    vocab = DraftVocabulary(tiny_model, 4)
    vocab.set_ids(torch.tensor([40, 3, 7, 90]))
    assert vocab.n_out == 4 and vocab.n_prev == 5
    assert vocab.to_draft(torch.tensor([3, 90, 41])).tolist() == [1, 3, 4]  # 41: "other"
    assert vocab.to_target(torch.tensor([0, 3])).tolist() == [40, 90]
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    full = vocab.expand(q)
    assert full.shape == (1, TINY.vocab_size) and full[0, [40, 3, 7, 90]].tolist() == q[0].tolist()
    assert float(full.sum()) == pytest.approx(1.0) and vocab.restrict(full).tolist() == q.tolist()
    torch.testing.assert_close(
        vocab.logits(torch.ones(2, TINY.dim)), tiny_model.lm_head(torch.ones(2, TINY.dim))[:, vocab.ids]
    )
    with pytest.raises(ValueError, match="distinct"):
        vocab.set_ids(torch.tensor([1, 1, 2, 3]))


@pytest.mark.parametrize("kind", KINDS)
def test_proposals_stay_inside_the_draft_vocabulary(tiny_model, kind):
    ids = list(range(10, 40))
    drafter = drafter_with_vocab(tiny_model, kind, ids)
    ps = prompts(RAGGED, seed=3)
    result = speculative_generate(tiny_model, drafter, ps, 20, SamplingParams(1.0), 1 if kind == "mtp" else 4,
                                  generator=torch.Generator().manual_seed(0))  # fmt: skip
    drafted = [t for toks, marks in zip(result.tokens, result.from_draft) for t, m in zip(toks, marks) if m]
    assert drafted and set(drafted) <= set(ids)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_identity_with_a_draft_vocabulary(tiny_model, kind):
    ps = prompts(RAGGED, seed=6)
    reference = generate(tiny_model, ps, 24, GREEDY)
    greedy_ids = sorted({t for toks in reference.tokens for t in toks})[:20]  # some targets outside it
    drafter = drafter_with_vocab(
        tiny_model, kind, greedy_ids + [i for i in range(60, 70) if i not in greedy_ids]
    )
    result = speculative_generate(tiny_model, drafter, ps, 24, GREEDY, 1 if kind == "mtp" else 4)
    assert result.tokens == reference.tokens and result.stop_reasons == reference.stop_reasons


@pytest.mark.parametrize("kind", KINDS)
def test_q_over_the_whole_vocabulary_is_built_only_when_read(tiny_model, kind, monkeypatch):
    """Greedy verification compares ids, so at T = 0 nobody builds the drafts' q over the whole vocabulary
    (a large write with a reduced draft vocabulary); read, it is the draft-vocabulary q expanded, built once."""
    ps = prompts(RAGGED, seed=6)
    reference = generate(tiny_model, ps, 12, GREEDY)
    drafter = drafter_with_vocab(tiny_model, kind, list(range(10, 40)))
    gamma = 1 if kind == "mtp" else 4
    expansions = []
    expand = DraftVocabulary.expand
    monkeypatch.setattr(
        DraftVocabulary, "expand", lambda self, q: expansions.append(q.shape) or expand(self, q)
    )
    result = speculative_generate(tiny_model, drafter, ps, 12, GREEDY, gamma)
    assert result.tokens == reference.tokens and expansions == []
    drafter.reset(4)
    slots, toks = torch.arange(2), torch.tensor([3, 4, 5, 6, 7])
    features = tiny_model.forward_cached(toks, slots, torch.tensor([2, 3]), tiny_model.new_cache(4),
                                         return_taps=True)  # fmt: skip
    proposal = drafter.propose(slots, toks, TargetFeatures(features.taps, features.last_hidden), torch.tensor([2, 3]),
                               torch.tensor([8, 9]), gamma, SamplingParams(1.0), torch.Generator().manual_seed(0))  # fmt: skip
    assert expansions == [] and proposal.q.shape == (2, gamma, 30)  # q over the K = 30 draft ids only
    q = proposal.probs
    assert q.shape == (2, gamma, TINY.vocab_size) and len(expansions) == 1
    assert torch.equal(q[..., 10:40], proposal.q)  # the ids 10..39 in order: the draft indices' columns
    torch.testing.assert_close(q.sum(-1), torch.ones(2, gamma))
    assert float(q[..., :10].sum() + q[..., 40:].sum()) == 0  # zero off the draft ids


@pytest.mark.parametrize("kind", ["eagle", "dspark"])
def test_sampling_is_exact_when_the_drafter_cannot_propose_some_tokens(kind):
    """K = 3 of the micro target's 5 tokens: the other two only ever come from the residual."""
    target, joint = micro_target_and_law()
    drafter = drafter_with_vocab(target, kind, [0, 2, 4], seed=1)
    g = torch.Generator().manual_seed(7)
    counts, accepted = torch.zeros(MICRO.vocab_size**MICRO_LENGTH), 0
    for _ in range(12):
        result = speculative_generate(target, drafter, [MICRO_PROMPT] * 1000, MICRO_LENGTH, SamplingParams(1.0), 3,
                                      generator=g)  # fmt: skip
        for toks in result.tokens:
            counts[toks[0] * 25 + toks[1] * 5 + toks[2]] += 1
        accepted += sum(itertools.chain(*result.from_draft))
    assert accepted > 500
    assert_matches(counts, joint.flatten())


@pytest.mark.parametrize("kind", ["eagle", "dspark"])
def test_checkpoint_keeps_the_ids(tiny_model, kind, tmp_path):
    drafter = drafter_with_vocab(tiny_model, kind, [50, 3, 11, 7, 60, 2])
    save_checkpoint(drafter, drafter.config, tmp_path / "d.safetensors", dtype=torch.float16)
    again = load_checkpoint(tmp_path / "d.safetensors", tiny_model)
    assert again.vocab.ids.tolist() == [50, 3, 11, 7, 60, 2] and again.vocab.ids.dtype == torch.long
    assert again.vocab.to_draft(torch.tensor([60])).tolist() == [4]


def _batch(target) -> FeatureBatch:
    tokens = torch.randint(0, TINY.vocab_size, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = target(tokens, return_taps=True)
    return FeatureBatch(tokens, torch.tensor([24, 15]), torch.tensor([4, 3]), out.taps, out.last_hidden)


@pytest.mark.parametrize("kind", KINDS)
def test_a_draft_vocabulary_of_every_id_trains_like_the_full_vocabulary(tiny_model, kind):
    """K = V in a shuffled order, the same weights (W1/W2 rows permuted alike): the same loss and c*. With
    fewer ids the expected acceptance c* counts the target's mass off the draft ids as lost."""
    V = TINY.vocab_size
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    full = new_drafter(tiny_model, kind, gamma=4, rank=8)
    permuted = new_drafter(tiny_model, kind, gamma=4, rank=8, draft_vocab=V)
    permuted.vocab.set_ids(perm)
    state = full.state_dict()
    if "w1.weight" in state:
        torch.nn.init.normal_(full.head.w2.weight, std=0.5)
        state = full.state_dict()
        state["w1.weight"] = torch.cat(
            [state["w1.weight"][perm], torch.zeros(1, state["w1.weight"].shape[1])]
        )
        state["w2.weight"] = state["w2.weight"][perm]
    permuted.load_state_dict({**state, "vocab.ids": perm})
    tc = DrafterTrainConfig(bf16=False, anchors_per_seq=6)
    batch = _batch(tiny_model)
    a = batch_loss(full, tiny_model, batch, tc, torch.Generator().manual_seed(0))
    b = batch_loss(permuted, tiny_model, batch, tc, torch.Generator().manual_seed(0))
    torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.stack(list(a[1])), torch.stack(list(b[1])), rtol=1e-5, atol=1e-5)
    small = new_drafter(tiny_model, kind, gamma=4, rank=8, draft_vocab=10)
    small.vocab.set_ids(perm[:10])
    loss, acc, _, _ = batch_loss(small, tiny_model, batch, tc, torch.Generator().manual_seed(0))
    with torch.no_grad():
        p = torch.softmax(tiny_model(batch.tokens).logits, -1)[..., perm[:10]].sum(
            -1
        )  # mass on the draft ids
    assert torch.isfinite(loss.detach()) and float(acc[0]) <= float(p.max()) + 1e-6


def test_target_probs_at_draft_ids_from_the_cached_normaliser(tiny_model):
    """p_t at K ids from K head rows and the stored log-sum-exp == the full softmax read at those ids."""
    from dspark.lab.training.fast_loss import draft_target_probs
    from dspark.lab.training.feature_cache import features_of_tokens
    from dspark.training import supervised_target_probs

    tokens = torch.randint(0, TINY.vocab_size, (2, 24), generator=torch.Generator().manual_seed(4))
    batch = features_of_tokens(tiny_model, tokens, torch.tensor([24, 15]), torch.tensor([4, 3]))
    ids = torch.randperm(TINY.vocab_size, generator=torch.Generator().manual_seed(1))[:30]
    fast, rows = draft_target_probs(tiny_model, batch, ids)
    batch.lse = None
    slow, rows_again = draft_target_probs(tiny_model, batch, ids)
    full, _ = supervised_target_probs(tiny_model, batch)
    assert torch.equal(rows, rows_again) and fast.shape == (full.shape[0], 30)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(fast, full[:, ids], rtol=1e-5, atol=1e-7)
    assert float(fast[:-1].sum(-1).max()) < 1  # a part of the distribution: the mass off the ids is missing
