"""dspark/profiler.py: the measured SPS profile is monotone and interleaves its sizes; isotonic pooling and
interpolation never make a bigger batch faster."""

from __future__ import annotations

import pytest

from dspark.lab import profiles
from dspark.profiler import interpolated_times, isotonic_fit, measure_sps, profile_from_points


def test_measured_profile_is_monotone_and_cached(tiny_model, tmp_path, monkeypatch):
    profile = measure_sps(tiny_model, [1, 3, 8], requests=4, context=8, repeats=1)
    assert profile.max_tokens == 8
    assert all(a >= b for a, b in zip(profile.steps_per_second, profile.steps_per_second[1:]))
    monkeypatch.setattr(profiles, "measure_sps", lambda *args: profile)
    path = tmp_path / "cpu.json"
    first = profiles.cpu_profile(tiny_model, path=path)

    def no_measuring(*args):
        raise AssertionError("the cached profile should be reused")

    monkeypatch.setattr(profiles, "measure_sps", no_measuring)
    assert profiles.cpu_profile(tiny_model, path=path).steps_per_second == first.steps_per_second
    with pytest.raises(AssertionError, match="context"):
        measure_sps(tiny_model, [100], requests=1, context=8)  # does not fit the 64-token context


def test_profile_sizes_are_interleaved_round_by_round(tiny_model, monkeypatch):
    """measure_sps times every size once per round (a busy spell slows all sizes alike), warm-up round
    first, so the passes come as 1, 3, 8, 1, 3, 8, ..."""
    sizes, real = [], tiny_model.forward_cached

    def recording(tokens, *args, **kwargs):
        sizes.append(tokens.shape[0])
        return real(tokens, *args, **kwargs)

    monkeypatch.setattr(tiny_model, "forward_cached", recording)
    measure_sps(tiny_model, [1, 3, 8], requests=4, context=8, repeats=2)
    assert sizes[1:] == [1, 3, 8] * 3  # (the first pass fills the context)


def test_isotonic_fit_pools_a_noisy_point_with_its_neighbours():
    assert isotonic_fit([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]  # already non-decreasing: unchanged
    # one slow measurement at the second point: pooled with the two lower points after it, not carried to them
    fitted = isotonic_fit([123.0, 177.0, 150.0, 150.0, 183.0])
    assert fitted == pytest.approx([123.0, 159.0, 159.0, 159.0, 183.0])
    assert isotonic_fit([3.0, 2.0, 1.0]) == pytest.approx([2.0, 2.0, 2.0])
    times = interpolated_times([1, 2, 4, 8, 12], [123.0, 177.0, 150.0, 150.0, 183.0], 12)
    # (the max-clamp carried 177 up to B = 8)
    assert times[1] == pytest.approx(159.0) and max(times[:8]) == pytest.approx(159.0)
    assert all(a <= b for a, b in zip(times, times[1:]))


def test_profile_from_points_interpolates_and_never_speeds_up():
    profile = profile_from_points([1, 4, 8], [1.0, 2.5, 2.0], max_tokens=10)  # a noisy dip at 8
    assert profile.sps(1) == 1.0 and profile.sps(4) == pytest.approx(1 / 2.25)  # 4 and 8 pooled: 2.25
    assert profile.sps(8) == pytest.approx(1 / 2.25)
    assert profile.sps(2) == pytest.approx(1 / (1.0 + 1.25 / 3))  # linear between the points
    assert all(a >= b for a, b in zip(profile.steps_per_second, profile.steps_per_second[1:]))
    assert profile.sps(20) == pytest.approx(profile.sps(10) / 2)  # beyond the table: proportional
