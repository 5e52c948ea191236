"""dspark/lab/inputs.py: what the lab's commands refuse before calling the core, each message naming the bad
item (prompt or request numbered from 1, token position, the value): token ids, budgets, arrival times, a
cached SPS profile."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import TINY

from dspark.lab.inputs import check_max_new_tokens, check_prompts, check_requests
from dspark.lab.profiles import profile_from_record
from dspark.requests import Request

BAD_PROMPTS = [
    ([[1.5, 2]], "token 1 is 1.5, not an integer"),
    ([[3, True]], "token 2 is True, not an integer"),
    ([[4, 5], [-1, 3]], "prompt 2: token id -1 is outside the vocabulary 0..96"),
    ([[TINY.vocab_size]], f"prompt 1: token id {TINY.vocab_size} is outside the vocabulary"),
    ([torch.tensor([1, 2])], "prompt 1 is a Tensor, not a list"),
    ([], "no prompts given"),
    ([[]], "prompt 1 is empty"),
    ([[1] * 64], "prompt 1 is 64 tokens; the model's context is 64 tokens"),
]


@pytest.mark.parametrize("ps, message", BAD_PROMPTS)
def test_bad_prompts_are_named_in_one_line(ps, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        check_prompts(ps, TINY.max_seq_len, TINY.vocab_size)


def test_prompts_are_called_by_their_names():
    with pytest.raises(ValueError, match="notes.txt line 3 is empty"):
        check_prompts([[1], []], 64, names=["notes.txt line 1", "notes.txt line 3"])
    check_prompts([[1, 2], [3]], 64, TINY.vocab_size)  # good ones pass


@pytest.mark.parametrize("budget", [4.5, True, 0, "4"])
def test_max_new_tokens_must_be_an_integer(budget):
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        check_max_new_tokens(budget)


@pytest.mark.parametrize("request_, message", [
    (Request([1, 2], 4, -1.0), "request 2: the arrival time must be a finite number of seconds >= 0, got -1.0"),
    (Request([1, 2], 4, math.nan), "arrival time must be"),
    (Request([1, 2], 4, math.inf), "arrival time must be"),
    (Request([1, 2], 4.5), "request 2: max_new_tokens must be an integer"),
    (Request([1, 2.0], 4), "request 2: token 2 is 2.0"),
    (Request([1, 500], 4), "request 2: token id 500 is outside the vocabulary"),
    (Request(torch.tensor([1]), 4), "request 2: the prompt is a Tensor"),
])  # fmt: skip
def test_malformed_requests_are_refused(request_, message):
    """A negative arrival used to be served with a TTFT of 100 s; requests are numbered from 1."""
    with pytest.raises(ValueError, match=message):
        check_requests([Request([3, 4], 4), request_], TINY)
    check_requests([Request([3, 4], 4), Request([1], 2, 0.5)], TINY)  # good ones pass


@pytest.mark.parametrize("steps", [[1.0, 0.0], [], [2.0, -1.0], [math.nan]])
def test_a_cached_profile_needs_positive_steps_per_second(steps):
    with pytest.raises(ValueError, match="positive steps/s"):
        profile_from_record({"steps_per_second": steps, "name": "edited"})
    assert profile_from_record({"steps_per_second": [2.0, 1.5], "name": "cpu"}).sps(2) == 1.5
