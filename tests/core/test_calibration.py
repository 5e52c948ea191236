"""dspark/calibration.py: ECE and AUROC hand-worked; Sequential Temperature Scaling recovers the temperatures
(and logit offsets) of synthetic rounds and calibrates held-out ones."""

from __future__ import annotations

import pytest
import torch
from helpers import synthetic_rounds

from dspark.calibration import auroc, ece, fit_sts
from dspark.lab.calibration import position_metrics


def test_ece_hand_worked():
    pred = torch.tensor([0.1, 0.1, 0.9, 0.9]).double()
    obs = torch.tensor([0.0, 1.0, 1.0, 1.0]).double()
    # bin [0.1, 0.2): mean 0.1 vs frequency 0.5, half the mass; bin [0.9, 1): 0.9 vs 1.0, half the mass
    assert ece(pred, obs, bins=10) == pytest.approx(0.5 * 0.4 + 0.5 * 0.1)
    assert ece(obs, obs) == 0.0


def test_auroc_hand_worked():
    label = torch.tensor([0.0, 0.0, 1.0, 1.0]).double()
    assert auroc(torch.tensor([0.1, 0.2, 0.3, 0.4]), label) == 1.0
    assert auroc(torch.tensor([0.4, 0.3, 0.2, 0.1]), label) == 0.0
    assert auroc(torch.tensor([0.5, 0.5, 0.5, 0.5]), label) == 0.5
    assert auroc(torch.tensor([0.1, 0.3, 0.2, 0.4]), label) == 0.75
    assert auroc(torch.tensor([0.1, 0.2]), torch.tensor([1.0, 1.0])) is None


def test_sts_recovers_the_temperatures_and_calibrates():
    true = [2.0, 1.5, 3.0, 1.0]
    conf, events, mask = synthetic_rounds(40_000, 4, true).calibration_arrays()
    temps = fit_sts(conf, events, mask)
    held_out = synthetic_rounds(40_000, 4, true, seed=1).calibration_arrays()
    rows = position_metrics(*held_out, temps)
    for t, t_true, row in zip(temps.tolist(), true, rows):
        assert t == pytest.approx(t_true, rel=0.25)
        assert row["ece_after"] < 0.02 < row["ece_before"] or t_true == 1.0
        assert 0.5 < row["auroc"] <= 1.0 and 0 <= row["brier"] <= 1
    assert rows[0]["ece_before"] > 0.05  # an overconfident head really was miscalibrated


def test_sts_offsets_fix_what_no_temperature_can():
    # a head over-confident by a constant logit offset (sure drafts right, the middle range too high):
    # temperatures alone cannot fix it, (T, b) recovers the offset and calibrates held-out rounds
    true_t, true_b = [1.0, 1.0, 1.0], [0.6, 0.0, -0.4]
    conf, events, mask = synthetic_rounds(16_000, 3, true_t, true_shifts=true_b).calibration_arrays()
    sts = fit_sts(conf, events, mask, shifts=True)
    assert sts.shape == (2, 3) and sts[0].tolist() == pytest.approx([1.0] * 3, rel=0.1)
    # the late offset is seen through fewer survivors (and ties go towards b = 0): its sign is what is sure
    assert sts[1, :2].tolist() == pytest.approx(true_b[:2], abs=0.15) and sts[1, 2] < 0
    held_out = synthetic_rounds(16_000, 3, true_t, seed=1, true_shifts=true_b).calibration_arrays()
    with_offsets = position_metrics(*held_out, sts)
    temperatures_only = position_metrics(*held_out, fit_sts(conf, events, mask))
    assert with_offsets[0]["ece_after"] < 0.015 < temperatures_only[0]["ece_after"]
    assert all(r["ece_after"] < 0.015 for r in with_offsets)
