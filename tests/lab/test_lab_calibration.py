"""The lab's side of calibration: SPS profiles cached only from a quiet machine (dspark/lab/profiles.py), the
roofline profile, and the STS selection with its ECE noise floor (dspark/lab/calibration.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import synthetic_rounds

from dspark import calibration
from dspark.calibration import ece
from dspark.lab import calibration as lab_calibration
from dspark.lab import profiles
from dspark.lab.profiles import RooflineConfig, default_buckets, roofline_profile
from dspark.profiler import profile_from_points
from dspark.requests import RoundStats
from dspark.scheduler import prefix_survival


def rounds_right_after_position_1(n: int, later: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Position 1 over-confident (true logit = raw / 2), yet every raw product c_1 ··· c_k for k >= 2 exactly
    right: c_2 absorbs c_1's error, the `later` - 1 positions after it have c = 0.95, truly."""
    g = torch.Generator().manual_seed(seed)
    c1 = torch.sigmoid(torch.randn(n, generator=g).abs() + 0.5).double()  # > 0.62, so c1_true < c1
    c1_true = torch.sigmoid(torch.logit(c1) / 2.0)
    conf = torch.cat(
        [c1[:, None], (c1_true * 0.95 / c1)[:, None], torch.full((n, later - 1), 0.95).double()], 1
    )
    truth = torch.cat([c1_true[:, None], torch.full((n, later), 0.95).double()], 1)  # P(accept k | 1..k-1)
    accepted = (torch.rand(n, later + 1, generator=g).double() < truth).long().cumprod(1).sum(1)
    return RoundStats.from_lists([[later + 1] * n], [accepted.tolist()], [conf.tolist()]).calibration_arrays()


def test_a_profile_measured_on_a_busy_machine_serves_the_run_but_is_not_cached(
    tiny_model, tmp_path, monkeypatch, capsys
):
    """The sweeps of one size disagree by more than BUSY_SPREAD (a busy machine): the profile (their medians)
    is used, one line says so, and nothing is cached; sweeps that agree are cached. Only the sizes asked for
    are measured, and a cached profile that stops short of a later run's needs is measured again to them."""
    sweeps, seen = iter([1.0, 1.9, 1.0, 1.0, 1.05, 1.0, 1.0, 1.02, 0.98, 1.0, 1.0, 1.0]), []

    def sweep(
        target, points, requests, context, repeats
    ):  # one sweep: every size `factor` times 1 ms a token
        factor = next(sweeps)
        seen.append(list(points))
        return profile_from_points(points, [factor * 1e-3 * b for b in points], max(points))

    monkeypatch.setattr(profiles, "measure_sps", sweep)
    monkeypatch.setattr(profiles, "BUSY_SPREAD", 0.25)
    path = tmp_path / "cpu.json"
    busy = profiles.cpu_profile(tiny_model, path=path, max_tokens=8)
    assert (
        not path.exists()
        and "was busy while measuring target passes (repeats differ by 90%)" in capsys.readouterr().err
    )
    assert busy.sps(8) == pytest.approx(1 / 8e-3) and seen[0] == [1, 2, 4, 8]  # the medians, sizes 1..8
    quiet = profiles.cpu_profile(tiny_model, path=path, max_tokens=8)
    assert path.exists() and "busy" not in capsys.readouterr().err and quiet.max_tokens == 8
    assert (
        profiles.cpu_profile(tiny_model, path=path, max_tokens=4).steps_per_second == quiet.steps_per_second
    )
    assert profiles.cpu_profile(tiny_model, path=path, max_tokens=12).max_tokens == 12  # measured again
    assert seen[-1] == [1, 2, 4, 8, 12] and len(seen) == 9


def test_a_profile_measured_beside_a_steady_load_is_not_cached(tiny_model, tmp_path, monkeypatch, capsys):
    """Sweeps that agree can still all be slow: another job running steadily beside the measurement. Other
    processes' CPU time while measuring (`OtherLoad`) above BUSY_CORES: used, one line, not cached."""
    import time

    from dspark.lab.machine import OtherLoad

    with OtherLoad() as idle:
        time.sleep(0.05)
    assert 0.0 <= idle.cores  # a real reading; its size depends on this machine, so only its sign is checked

    class Loaded(OtherLoad):
        def __exit__(self, *exc):
            self.cores = 1.2  # another process kept one core and a bit busy

    monkeypatch.setattr(profiles, "OtherLoad", Loaded)
    monkeypatch.setattr(profiles, "BUSY_CORES", 0.3)
    monkeypatch.setattr(
        profiles,
        "measure_sps",
        lambda target, points, *a: profile_from_points(points, [1e-3 * b for b in points], max(points)),
    )
    path = tmp_path / "cpu.json"
    profiles.cpu_profile(tiny_model, path=path, max_tokens=4)
    assert not path.exists() and "(other processes used 1.2 cores)" in capsys.readouterr().err
    monkeypatch.setattr(profiles, "OtherLoad", OtherLoad)
    monkeypatch.setattr(profiles, "BUSY_CORES", float("inf"))
    profiles.cpu_profile(tiny_model, path=path, max_tokens=4)
    assert path.exists() and "busy" not in capsys.readouterr().err


def test_roofline_smooth_vs_bucketed():
    smooth = roofline_profile(RooflineConfig(max_tokens=512))
    jagged = roofline_profile(RooflineConfig(max_tokens=512, buckets=default_buckets(512)))
    capacity = lambda p: [b * p.sps(b) for b in range(1, 513)]  # noqa: E731
    assert all(a <= b for a, b in zip(capacity(smooth), capacity(smooth)[1:]))  # more tokens, more capacity
    drops = [b for b, (x, y) in enumerate(zip(capacity(jagged), capacity(jagged)[1:]), start=1) if y < x]
    assert drops and all(b in default_buckets(512) for b in drops)  # capacity falls right after a bucket
    # memory-bound at small B: the 8 B model's 16 GB of weights at 4.8 TB/s, plus overhead
    assert 1 / smooth.sps(1) == pytest.approx(16e9 / 4.8e12 + 2e-4, rel=0.05)


def test_ece_noise_floor_shrinks_with_more_rounds():
    g = torch.Generator().manual_seed(3)
    small, large = torch.rand(300, generator=g).double(), torch.rand(30_000, generator=g).double()
    floor_small, floor_large = lab_calibration.ece_noise_floor(small), lab_calibration.ece_noise_floor(large)
    assert floor_small > 2 * floor_large > 0
    # a calibrated predictor's measured ECE is of the size of the floor, not zero
    events = (torch.rand(300, generator=g, dtype=torch.float64) < small).double()
    assert ece(small, events) < 3 * floor_small


def test_selected_sts_keeps_what_helps_and_falls_back_to_one():
    from dspark.lab.calibration import select_sts

    # plenty of rounds, a clearly overconfident head at positions 1-2: the fitted temperatures stay
    conf, events, mask = synthetic_rounds(20_000, 3, [2.5, 2.0, 1.0]).calibration_arrays()
    temps, reasons = select_sts(conf, events, mask, shifts=False)
    assert temps[0] == pytest.approx(2.5, rel=0.25) and temps[1] == pytest.approx(2.0, rel=0.3)
    assert reasons[0].startswith("T = 2") and "held-out ECE" in reasons[0]
    with_shifts, _ = select_sts(conf, events, mask)  # (2, γ): a pure temperature needs no offset
    assert with_shifts.shape == (2, 3) and with_shifts[0, 0] == pytest.approx(2.5, rel=0.25)
    assert with_shifts[1, :2].abs().max() <= 0.2

    # too few rounds reach the late positions: T = 1 there, whatever the fit says
    conf, events, mask = synthetic_rounds(300, 4, [3.0, 3.0, 3.0, 3.0]).calibration_arrays()
    temps, reasons = select_sts(conf, events, mask, min_survivors=100, shifts=False)
    reached = [int(mask[::2, k].sum()) if k == 0 else int(events[::2, k - 1].sum()) for k in range(4)]
    for k in range(4):
        if reached[k] < 100:
            assert temps[k] == 1.0 and "reach position" in reasons[k]
    assert any(r < 100 for r in reached) and reached[0] >= 100

    # the fitting half is overconfident, the checking half is not: the fit would make held-out ECE worse
    over = synthetic_rounds(8_000, 2, [3.0, 3.0], seed=2).calibration_arrays()
    fair = synthetic_rounds(8_000, 2, [1.0, 1.0], seed=3).calibration_arrays()
    conf, events, mask = (torch.cat([a, b]) for a, b in zip(over, fair))
    fit_rows = torch.arange(16_000) < 8_000
    temps, reasons = select_sts(conf, events, mask, fit_rows=fit_rows)
    assert temps.tolist() == [[1.0, 1.0], [0.0, 0.0]] and "does not lower held-out ECE" in reasons[0]


def test_selected_sts_weighs_a_fix_against_what_it_breaks_later():
    # scaling c_1 fixes position 1 and breaks every later product (each contains c_1): with three later
    # positions the loss outweighs the gain and the selection keeps T = 1; with one it does not
    conf, events, mask = rounds_right_after_position_1(20_000, later=3, seed=0)
    for shifts in (False, True):
        sts, reasons = lab_calibration.select_sts(conf, events, mask, shifts=shifts)
        assert (sts.flatten()[:1] == 1.0).all() and "raises it at 3 later position(s)" in reasons[0]
        assert "by more in all" in reasons[0]
    assert calibration.fit_sts(conf, events, mask)[0] > 1.5  # what the fit alone would have kept

    conf, events, mask = rounds_right_after_position_1(20_000, later=1, seed=1)
    sts, reasons = lab_calibration.select_sts(conf, events, mask, shifts=False)
    assert sts[0] > 1.5 and reasons[0].startswith("T = 1.")  # kept
    fresh = rounds_right_after_position_1(20_000, later=1, seed=2)
    total = [sum(ece(a[:, k], fresh[1][:, k]) for k in range(2)) for a in
             (prefix_survival(fresh[0]), prefix_survival(fresh[0], sts))]  # fmt: skip
    assert total[1] < total[0]  # new rounds: less calibration error over both positions than as trained
