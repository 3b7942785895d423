"""Quantile forecaster (count and linear families), the quantile policy's timing rules, its calibration on
training days, and its use in serving."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from regional_scheduler.autoscaling.calibration import (
    calibrate_quantile_levels,
    fit_quantile_policy,
    tau_pairs,
)
from regional_scheduler.autoscaling.forecaster import SeasonalForecaster
from regional_scheduler.autoscaling.online import OnlineAutoscaler, ServiceSample
from regional_scheduler.autoscaling.policies.hpa_policy import HpaPolicy
from regional_scheduler.autoscaling.policies.quantile_policy import QuantilePolicy
from regional_scheduler.autoscaling.quantile_forecaster import (
    HORIZONS,
    TAUS,
    QuantileForecast,
    QuantileForecaster,
    poisson_forecast,
    poisson_quantile,
)
from regional_scheduler.autoscaling.scenario import Scenario, build_scenario
from regional_scheduler.autoscaling.simulator import Observation


@pytest.mark.parametrize("rate", [0.05, 0.8, 3.0, 25.0, 59.0, 80.0, 400.0])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_poisson_quantile_matches_sampled_quantiles(rate: float, q: float) -> None:
    draws = np.random.default_rng(1).poisson(rate, 400_000)
    expected = float(np.quantile(draws, q, method="inverted_cdf"))
    got = float(poisson_quantile(np.array([rate]), q)[0])
    # Exact below 60 requests a minute; the normal approximation above is within one request.
    assert got == expected if rate < 60 else abs(got - expected) <= 1


def _noisy_series(days: int, seed: int = 0) -> np.ndarray:
    minutes = np.arange(days * 1440)
    rate = 4.0 + 3.0 * np.sin(2 * np.pi * (minutes % 1440) / 1440)
    return np.random.default_rng(seed).poisson(rate).astype(float)


def test_linear_family_is_causal_and_never_fits_past_fit_end() -> None:
    load = _noisy_series(6)
    end = 4 * 1440
    forecast = SeasonalForecaster().fit_transform(load)
    fitted = QuantileForecaster(steps=200).fit_transform(load, forecast, 1.0, fit_end=end)
    changed = load.copy()
    changed[end + 10:] *= 3.0  # the future (after fit_end and its 4-minute peak target) changes
    forecast_changed = SeasonalForecaster().fit_transform(changed)
    refit = QuantileForecaster(steps=200).fit_transform(changed, forecast_changed, 1.0, fit_end=end)
    np.testing.assert_allclose(refit.weights, fitted.weights)
    # A forecast made at minute t uses minutes <= t only.
    np.testing.assert_allclose(refit.values[:, :, : end + 10], fitted.values[:, :, : end + 10])
    assert not np.allclose(refit.values[:, :, end + 20:], fitted.values[:, :, end + 20:])


def test_linear_family_quantiles_cover_unseen_minutes_about_as_often_as_stated() -> None:
    load = _noisy_series(8, seed=3)
    end = 6 * 1440
    forecast = SeasonalForecaster().fit_transform(load)
    model = QuantileForecaster().fit_transform(load, forecast, 1.0, fit_end=end)
    t = np.arange(end, load.size - 2)
    for tau in (0.5, 0.9, 0.97):
        coverage = np.mean([load[m + 2] <= model.quantile(int(m), 2, tau) for m in t])
        # Poisson counts are discrete: "<= q" holds at least as often as τ, and not absurdly more.
        assert tau - 0.03 <= coverage <= min(1.0, tau + 0.15)
    # Quantiles never cross.
    assert np.all(np.diff(model.values, axis=1) >= -1e-9)


def test_count_family_is_poisson_around_the_recent_rate() -> None:
    filled = np.full(300, 6.0)  # load of 6 replicas at 0.5 request per replica-minute: 3 requests a minute
    model = poisson_forecast(filled, 0.5)
    i = TAUS.index(0.9)
    assert model.values[0, i, -1] == pytest.approx(poisson_quantile(np.array([3.0]), 0.9)[0] / 0.5)
    assert model.values[0, i, -1] == pytest.approx(5 / 0.5)  # P(X <= 4) = 0.815 < 0.9 <= P(X <= 5) = 0.916
    # The peak of four minutes needs a higher count than one minute at the same τ.
    assert model.peak_quantile(299, 0.9) > model.quantile(299, 1, 0.9)


def _flat_model(levels: dict[int, float], peak: float, n: int = 100) -> QuantileForecast:
    values = np.empty((len(HORIZONS) + 1, len(TAUS), n))
    for i, h in enumerate(HORIZONS):
        values[i] = levels[h]
    values[-1] = peak
    return QuantileForecast(values=values, taus=TAUS, horizons=HORIZONS, weights=np.zeros((3, len(TAUS), 0)))


def _obs(*, tick: int, current: int, observed_minutes: int, load: float = 1.0) -> Observation:
    return Observation(tick=tick, time_s=tick * 15.0, minute=tick // 4, current_replicas=current,
                       ready_replicas=current, pending_replicas=0, utilisation=0.5, load_replicas=load,
                       p99_latency_ms=100.0, error_rate=0.0, slo_breached=False, observed_minutes=observed_minutes)


def test_policy_scales_up_for_the_minute_new_pods_first_serve(scenario: Scenario) -> None:
    policy = QuantilePolicy(0.9, _flat_model({1: 5.0, 2: 12.0}, peak=12.0), tau_down=0.9)
    policy.reset(scenario.context)
    u = policy.utilisation
    # First tick of minute 10: minute 9 is the last observed, new pods serve minute 11 = horizon 2.
    assert policy.propose(_obs(tick=40, current=4, observed_minutes=10)) == math.ceil(12.0 / u)
    # Later ticks of minute 10 (minute 10 observed): new pods serve minute 11 = horizon 1.
    assert policy.propose(_obs(tick=41, current=4, observed_minutes=11)) == math.ceil(5.0 / u)


def test_policy_scales_down_only_to_what_the_coming_minutes_need(scenario: Scenario) -> None:
    policy = QuantilePolicy(0.9, _flat_model({1: 2.0, 2: 2.0}, peak=6.0), tau_down=0.9)
    policy.reset(scenario.context)
    u = policy.utilisation
    keep = math.ceil(6.0 / u)
    assert policy.propose(_obs(tick=41, current=30, observed_minutes=11, load=1.0)) == keep
    # The observed current minute counts too: a busy minute keeps its pods.
    assert policy.propose(_obs(tick=41, current=30, observed_minutes=11, load=15.0)) == math.ceil(15.0 / u)
    # Holding when already at or below the need.
    assert policy.propose(_obs(tick=41, current=keep, observed_minutes=11)) == keep


@pytest.fixture
def scenario(series_writer: Callable[..., Path], tmp_path: Path) -> Scenario:
    return build_scenario(series_writer(tmp_path / "noisy_events_per_minute.csv", days=12, seed=4))


def test_calibration_stays_inside_the_training_days_and_within_budget(scenario: Scenario) -> None:
    with pytest.raises(ValueError, match="training days"):
        calibrate_quantile_levels(scenario, poisson_forecast(scenario.context.forecast.last_observed, 1.0),
                                  end_minute=scenario.split.train_end_minute + 1)
    fitted = fit_quantile_policy(scenario, days=2)
    assert (fitted.calibration.tau_up, fitted.calibration.tau_down) in tau_pairs()
    assert fitted.family in fitted.candidates and set(fitted.candidates) == {"linear", "poisson"}
    chosen = fitted.calibration
    if any(c.replica_hours <= c.hpa_replica_hours for c in fitted.candidates.values()):
        assert chosen.replica_hours <= chosen.hpa_replica_hours
    # The calibration figures are reproducible by running the policy on those days again.
    end = scenario.split.train_end_minute
    result, first = scenario.run(fitted.policy(), end - 2 * 1440, end)
    assert result.summary(first)["slo_violation_minutes"] == chosen.slo_violation_minutes
    hpa, first = scenario.run(HpaPolicy(), end - 2 * 1440, end)
    assert hpa.summary(first)["replica_hours"] == pytest.approx(chosen.hpa_replica_hours)


def test_serving_uses_the_count_model_until_two_days_of_history() -> None:
    online = OnlineAutoscaler(QuantilePolicy(0.95), capacity_per_replica_rpm=10.0)
    decisions = []
    for minute in range(30):
        rate = 100.0 if minute < 20 else 400.0
        current = decisions[-1] if decisions else 1
        decisions.append(online.update(ServiceSample(rate, current, 0, 0.5, 100.0, 0.0)))
    # 100 requests a minute at 10 per replica-minute = 10 replicas busy; the SLO utilisation is ~0.74,
    # so the count model wants at least 14. After the jump to 400 a minute it follows its 5-minute
    # half-life rate: up every minute, past 3x within ten minutes.
    assert 14 <= decisions[19] <= 20
    assert all(b >= a for a, b in itertools.pairwise(decisions[20:]))
    assert decisions[-1] >= 3 * decisions[19]
