"""dspark/requests.py: RoundStats counts (acceptance by position, a round cut by the token limit) and the
calibration arrays it hands to STS."""

from __future__ import annotations

import pytest
from helpers import committed_drafts

from dspark.requests import RoundStats


def test_round_arrays_masks_unverified_positions_and_needs_confidences():
    rounds = RoundStats.from_lists([[3, 1]], [[2, 1]], [[[0.9, 0.8, 0.7], [0.6, 0.5, 0.4]]])
    conf, events, mask = rounds.calibration_arrays()
    assert events.tolist() == [[1, 1, 0], [1, 0, 0]] and mask.tolist() == [[True] * 3, [True, False, False]]
    with pytest.raises(ValueError, match="confidence head"):
        RoundStats.from_lists([[1]], [[0]], [[]]).calibration_arrays()


def test_a_round_cut_by_the_token_limit_counts_only_what_it_output():
    stats = RoundStats.from_lists(
        verify_lens=[[7, 7]], accepted=[[7, 5]], emitted=[[8, 2]]
    )  # the last round: 2 of 6 output
    hits, tries = stats.acceptance_counts(7)
    assert sum(hits) == committed_drafts(stats) == 9
    assert tries == [2, 2, 1, 1, 1, 1, 1] and stats.tau == 5.0


def test_acceptance_counts_are_behind_the_rates():
    from dspark.requests import RoundStats

    stats = RoundStats.from_lists([[3, 3, 2]], [[3, 1, 0]], [[[], [], []]])
    hits, tries = stats.acceptance_counts(3)
    assert (hits, tries) == ([2, 1, 1], [3, 2, 1])
    assert stats.acceptance_by_position(3) == [2 / 3, 1 / 2, 1.0]
