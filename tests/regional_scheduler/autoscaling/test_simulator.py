"""The service simulator: start-up delay, metrics delay, queueing latency, missing minutes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regional_scheduler.autoscaling.forecaster import SeasonalForecaster
from regional_scheduler.autoscaling.queueing import max_utilisation_within_slo, p99_latency_s
from regional_scheduler.autoscaling.settings import ServiceSettings
from regional_scheduler.autoscaling.simulator import ServiceSimulator

SERVICE = ServiceSettings()


def test_new_pods_serve_only_after_the_startup_delay() -> None:
    sim = ServiceSimulator(np.full(10, 2.0), SERVICE, initial_replicas=2)
    sim.reset()
    sim.step(5)  # tick 0: ask for 3 more
    ready = [sim.ready]
    for _ in range(6):
        sim.step(5)
        ready.append(sim.ready)
    # 60 s start-up at 15 s ticks: the pods created at tick 0 serve from tick 4.
    assert ready == [2, 2, 2, 2, 5, 5, 5]


def test_controllers_see_metrics_one_scrape_late() -> None:
    load = np.array([1.0, 3.0, 3.0])
    sim = ServiceSimulator(load, SERVICE, initial_replicas=4)
    sim.reset()
    seen = []
    while not sim.done:
        obs = sim.observe()
        seen.append(obs.load_replicas)
        sim.step(4)
    # tick 4 is the first tick of minute 1; with a 15 s delay it still sees minute 0's rate.
    assert seen[4] == 1.0 and seen[5] == 3.0


@pytest.mark.parametrize(
    ("replicas", "violated"),
    [pytest.param(10, False, id="enough-replicas"), pytest.param(4, True, id="overloaded")],
)
def test_slo_violation_minutes(replicas: int, violated: bool) -> None:
    sim = ServiceSimulator(np.full(5, 5.0), SERVICE, initial_replicas=replicas)
    result = sim.run(lambda obs: replicas)
    assert bool(result.minute_violated.any()) is violated


def test_missing_minutes_are_not_counted() -> None:
    load = np.array([5.0, np.nan, np.nan, 5.0])
    result = ServiceSimulator(load, SERVICE, initial_replicas=1).run(lambda obs: 1)
    summary = result.summary()
    assert summary["observed_minutes"] == 2 and summary["slo_violation_minutes"] == 2


def test_latency_model_breaches_slo_above_its_utilisation() -> None:
    u = max_utilisation_within_slo(workers=4, service_time_s=0.1, slo_s=0.5)
    assert 0.7 < u < 0.8
    assert p99_latency_s(np.array(u - 0.01), workers=4, service_time_s=0.1) <= 0.5
    assert p99_latency_s(np.array(u + 0.01), workers=4, service_time_s=0.1) > 0.5


@settings(max_examples=10, deadline=None)
@given(cut=st.integers(min_value=1500, max_value=3000), seed=st.integers(0, 1000))
def test_forecaster_is_causal(cut: int, seed: int) -> None:
    """Changing the future never changes a forecast made before it."""
    rng = np.random.default_rng(seed)
    rate = rng.gamma(2.0, 2.0, size=3200)
    other = rate.copy()
    other[cut:] = rng.gamma(2.0, 5.0, size=rate.size - cut)
    a = SeasonalForecaster().fit_transform(rate)
    b = SeasonalForecaster().fit_transform(other)
    horizons = np.arange(1, 6)
    np.testing.assert_allclose(a.forecast(cut - 1, horizons), b.forecast(cut - 1, horizons))
    np.testing.assert_allclose(a.level[:cut], b.level[:cut])
    np.testing.assert_allclose(a.spread[:cut], b.spread[:cut])
    # The seasonal base for minute T uses days before T only, so it agrees up to one day past the cut.
    np.testing.assert_allclose(a.base[: cut + 1440 - 3], b.base[: cut + 1440 - 3])
