"""Prompt lookup (dspark/lab/prompt_lookup.py): proposes what its rule says on hand-made token sequences, and
speculative decoding with it is exact (greedy identity; the chi-square test of the other drafters)."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import GREEDY, MICRO, MICRO_LENGTH, MICRO_PROMPT, RAGGED, micro_target_and_law, prompts
from stats_helpers import assert_matches

from dspark.decoding import generate
from dspark.engine import speculative_generate
from dspark.lab.prompt_lookup import PromptLookupDrafter, lookup
from dspark.sampling import SamplingParams
from dspark.scheduler import Scheduler, ThresholdPolicy, ThroughputProfile


@pytest.mark.parametrize(
    ("text", "gamma", "kwargs", "drafts"),
    [
        ([1, 2, 3, 4, 1, 2], 3, {}, [3, 4, 1]),  # [1, 2] occurred at the start: what followed it
        ([5, 6, 1, 7, 8, 1], 2, {"max_ngram": 1}, [7, 8]),  # the most recent occurrence, not the first
        ([2, 1, 5, 7, 1, 6, 2, 1], 2, {}, [5, 7]),  # the longer n-gram wins over a more recent shorter one
        ([1, 2, 1], 5, {}, [2, 1]),  # the continuation may run to the end of the text: fewer than γ
        ([1, 2, 3], 4, {}, []),  # nothing repeats: nothing to copy
        ([5, 1, 7, 1], 3, {"min_ngram": 2}, []),  # only a unigram repeats, and unigrams are not asked for
        ([4], 3, {}, []),  # one token: no earlier place at all
        ([3, 3, 3, 3], 0, {}, []),  # γ = 0
    ],
)
def test_lookup_copies_what_followed_the_last_ngram(text, gamma, kwargs, drafts):
    assert lookup(text, gamma, **kwargs) == drafts


def test_the_proposal_is_the_lookup_filled_with_zero_confidence():
    drafter = PromptLookupDrafter(vocab_size=10, max_gamma=4)
    drafter.reset(3)
    # slot 2: text [1, 2, 3, 1] + anchor 2 -> copies [3, 1, 2]; slot 0: [4, 5] + anchor 6 -> nothing
    slots, lens, anchors = torch.tensor([2, 0]), torch.tensor([4, 2]), torch.tensor([2, 6])
    committed = torch.tensor([1, 2, 3, 1, 4, 5])
    p = drafter.propose(slots, committed, None, lens, anchors, 4, SamplingParams(1.0), torch.Generator())
    assert p.tokens.tolist() == [[3, 1, 2, 2], [6, 6, 6, 6]]
    assert p.confidence.tolist() == [[1, 1, 1, 0], [0, 0, 0, 0]]
    assert torch.equal(p.probs, torch.nn.functional.one_hot(p.tokens, 10).float())
    # the next call adds what was committed since (anchor + accepted drafts) to the same slot's text
    p = drafter.propose(torch.tensor([2]), torch.tensor([2, 3]), None, torch.tensor([2]), torch.tensor([9]), 2,
                        SamplingParams(1.0), torch.Generator())  # fmt: skip
    # 9 is new: nothing to copy
    assert drafter.texts[2] == [1, 2, 3, 1, 2, 3] and p.tokens.tolist() == [[9, 9]]
    drafter.release(2)
    assert drafter.texts[2] == [] and drafter.texts[0] == [4, 5]


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_identity(tiny_model, gamma):
    ps = prompts(RAGGED, seed=6) + [[7, 8, 9] * 6]  # a repetitive prompt, so some copies are accepted
    reference = generate(tiny_model, ps, 24, GREEDY)
    result = speculative_generate(tiny_model, PromptLookupDrafter(tiny_model.config.vocab_size), ps, 24, GREEDY,
                                  gamma)  # fmt: skip
    assert result.tokens == reference.tokens and result.stop_reasons == reference.stop_reasons
    assert result.stats.tau > 1.0  # some drafts accepted, so verification is exercised


def test_verifying_only_the_copied_drafts_keeps_greedy_identity(tiny_model):
    ps = prompts(RAGGED, seed=7) + [[4, 5] * 10]
    reference = generate(tiny_model, ps, 20, GREEDY)
    scheduler = Scheduler(ThresholdPolicy(0.5), ThroughputProfile([1.0] * 64))
    drafter = PromptLookupDrafter(tiny_model.config.vocab_size)
    result = speculative_generate(tiny_model, drafter, ps, 20, GREEDY, 4, scheduler=scheduler)
    assert result.tokens == reference.tokens
    assert min(map(min, result.stats.verify_lens)) == 0  # rounds without a copy verified nothing


def test_sampled_output_follows_the_target_exactly():
    target, joint = micro_target_and_law()
    drafter = PromptLookupDrafter(MICRO.vocab_size, max_gamma=3)
    g = torch.Generator().manual_seed(42)
    counts, accepted = torch.zeros(MICRO.vocab_size**MICRO_LENGTH), 0
    for _ in range(12):
        result = speculative_generate(target, drafter, [MICRO_PROMPT] * 1000, MICRO_LENGTH, SamplingParams(1.0),
                                      3, generator=g)  # fmt: skip
        for toks in result.tokens:
            counts[toks[0] * 25 + toks[1] * 5 + toks[2]] += 1
        accepted += sum(itertools.chain(*result.from_draft))
    assert accepted > 500  # one-hot drafts accepted and rejected alike
    assert_matches(counts, joint.flatten())


def test_a_block_wider_than_it_allows_is_refused():
    drafter = PromptLookupDrafter(vocab_size=10, max_gamma=2)
    drafter.reset(1)
    with pytest.raises(ValueError, match="at most 2"):
        drafter.propose(torch.tensor([0]), torch.tensor([1]), None, torch.tensor([1]), torch.tensor([1]), 3,
                        SamplingParams(1.0), torch.Generator())  # fmt: skip
