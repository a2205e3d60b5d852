"""Loss-curve convergence check (docs/measurement.md; Megatron-Bridge thresholds, NaN fails)."""

from __future__ import annotations

import math

import pytest

from launcher.judge.convergence import check


def curve(n: int = 20, scale: float = 1.0, wiggle: float = 0.0) -> dict[int, float]:
    return {
        s: scale * (0.55 + 0.9 * math.exp(-s / 6.0)) + wiggle * math.sin(3.1 * s) for s in range(n)
    }


def test_near_identical_curves_pass_with_every_figure():
    ref = curve()
    cand = {s: v * (1 + 0.0005 * math.sin(s)) for s, v in ref.items()}
    res = check(cand, ref)
    assert res.passed, res.reasons
    assert res.correlation > 0.9999
    assert res.final_loss_difference < 0.001
    assert res.pointwise_failures == 0
    assert res.steps_compared == 16 and res.steps_skipped == 4  # first 20% skipped


def test_a_missing_step_fails():
    ref = curve()
    cand = dict(ref)
    del cand[12]
    res = check(cand, ref)
    assert not res.passed and res.missing_steps == [12]


def test_a_nan_step_fails_even_in_the_skipped_warmup():
    ref = curve()
    cand = dict(ref)
    cand[1] = float("nan")
    res = check(cand, ref)
    assert not res.passed and res.nan_steps == [1]


def test_shifted_curve_fails_pointwise_and_final_loss():
    ref = curve()
    res = check(curve(scale=1.08), ref)
    assert not res.passed
    assert res.correlation == pytest.approx(1.0)  # same shape: correlation alone would pass
    assert res.pointwise_failures == 16
    assert res.final_loss_difference == pytest.approx(0.08)


def test_uncorrelated_noise_fails_correlation():
    ref = curve()
    cand = {s: 0.7 + 0.02 * math.sin(5.0 * s) for s in ref}
    res = check(cand, ref, max_pointwise_failure_fraction=1.0, max_final_loss_difference=1.0)
    assert not res.passed
    assert res.correlation < 0.95
    assert any("correlation" in r for r in res.reasons)


def test_thresholds_are_parameters():
    ref = curve()
    cand = curve(scale=1.08)
    assert check(
        cand, ref, max_pointwise_failure_fraction=1.0, max_final_loss_difference=0.1
    ).passed


def test_pointwise_tolerance_depends_on_loss_magnitude():
    # Loss around 0.3: 2% tolerance, so a 3% offset fails every point.
    ref = {s: 0.3 + 0.01 * (20 - s) for s in range(20)}
    cand = {s: v * 1.03 for s, v in ref.items()}
    res = check(cand, ref, max_final_loss_difference=1.0)
    assert res.pointwise_failures == res.steps_compared
    # Loss around 3: 10% tolerance, the same 3% offset passes.
    ref = {s: 3.0 + 0.1 * (20 - s) for s in range(20)}
    cand = {s: v * 1.03 for s, v in ref.items()}
    assert check(cand, ref).pointwise_failures == 0


def test_a_residual_spike_is_counted_as_an_outlier():
    ref = curve()
    cand = {s: v * (1 + 0.0005 * math.sin(s)) for s, v in ref.items()}
    cand[15] = ref[15] * 1.04  # within the 5% pointwise tolerance, far outside the residual spread
    res = check(cand, ref)
    assert res.outliers == 1 and res.outlier_fraction == pytest.approx(1 / 16)
    assert res.passed  # 6.25% <= 10%
    strict = check(cand, ref, max_outlier_fraction=0.05)
    assert not strict.passed and any("outlier" in r for r in strict.reasons)
