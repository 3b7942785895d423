"""Gymnasium environment, DQN determinism for a seed, policies on a scenario, shadow mode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from regional_scheduler.autoscaling.dqn.algorithm import DQN
from regional_scheduler.autoscaling.env import AutoscaleEnv
from regional_scheduler.autoscaling.features import FEATURE_LAYOUT
from regional_scheduler.autoscaling.policies.forecast_policy import ForecastPolicy
from regional_scheduler.autoscaling.policies.hpa_policy import HpaPolicy
from regional_scheduler.autoscaling.policies.learned_policy import LearnedPolicy
from regional_scheduler.autoscaling.scenario import Scenario, build_scenario
from regional_scheduler.autoscaling.shadow import ShadowRunner


@pytest.fixture
def scenario(per_minute_csv: Path) -> Scenario:
    return build_scenario(per_minute_csv)


def test_env_follows_the_gymnasium_api(scenario: Scenario) -> None:
    env = AutoscaleEnv([scenario], episode_minutes=60)
    check_env(env, skip_render_check=True)
    state, info = env.reset(seed=1)
    assert state.shape == (len(FEATURE_LAYOUT),) and info["series"] == scenario.name


def test_env_never_reaches_held_back_days(scenario: Scenario) -> None:
    env = AutoscaleEnv([scenario], episode_minutes=120)
    for seed in range(20):
        env.reset(seed=seed)
        assert env._sim is not None and env._sim.end_minute <= scenario.split.train_end_minute


def _train(scenario: Scenario, seed: int) -> DQN:
    agent = DQN(AutoscaleEnv([scenario], episode_minutes=60), seed=seed, learning_starts=50, buffer_size=500,
                batch_size=16, target_update_interval=50, hidden=(16,))
    agent.learn(200)
    return agent


def test_fixed_seed_gives_the_same_network_and_decisions(scenario: Scenario) -> None:
    a, b = _train(scenario, 7), _train(scenario, 7)
    for pa, pb in zip(a.q_net.parameters(), b.q_net.parameters(), strict=True):
        assert torch.equal(pa, pb)
    states = np.random.default_rng(0).uniform(-1, 1, size=(20, len(FEATURE_LAYOUT))).astype(np.float32)
    assert [a.q_net.predict(s) for s in states] == [b.q_net.predict(s) for s in states]


@pytest.mark.parametrize(
    "make",
    [pytest.param(HpaPolicy, id="hpa"), pytest.param(lambda: ForecastPolicy(1.0), id="forecast"),
     pytest.param(lambda: LearnedPolicy(None), id="learned-without-model-falls-back")],
)
def test_policies_report_benchmark_keys_on_held_back_days(scenario: Scenario, make) -> None:  # type: ignore[no-untyped-def]
    summary = scenario.held_back(make())
    assert set(summary) >= {"slo_violation_minutes", "p99_latency_ms", "replica_hours", "scale_events"}
    assert summary["replica_hours"] > 0


def test_shadow_mode_records_both_and_actuates_only_live(scenario: Scenario) -> None:
    live_only = scenario.held_back(HpaPolicy())
    runner = ShadowRunner(HpaPolicy(), ForecastPolicy(1.0))
    with_shadow = scenario.held_back(runner)  # type: ignore[arg-type]
    assert with_shadow == live_only
    assert runner.records and {r.live_replicas for r in runner.records}
    assert 0.0 <= runner.disagreement_fraction() <= 1.0


class _OneReplica:
    """A deliberately starved candidate: one replica whatever the load."""

    name = "one-replica"

    def reset(self, context) -> None:  # type: ignore[no-untyped-def]
        pass

    def decide(self, observation) -> int:  # type: ignore[no-untyped-def]
        return 1


def test_shadow_models_both_arms_outcomes_and_publishes_windows(scenario: Scenario, redis_bus) -> None:  # type: ignore[no-untyped-def]
    from meridian.lifecycle.records import EvaluationRecord, evaluations_stream
    from regional_scheduler.autoscaling.shadow_publisher import evaluation_publisher

    publisher = evaluation_publisher(redis_bus, candidate="autoscaling-v2", active="autoscaling-v1",
                                          window_decisions=60)
    runner = ShadowRunner(HpaPolicy(), _OneReplica(), sink=publisher)
    scenario.held_back(runner)  # type: ignore[arg-type]
    records = runner.records
    assert all(r.shadow_replicas == 1 for r in records)
    # the starved arm violates the modelled SLO far more often than the HPA it shadows
    assert sum(r.shadow_violation for r in records) > 5 * max(1, sum(r.live_violation for r in records))
    windows = [EvaluationRecord.model_validate_json(e.payload)
               for e in redis_bus.read_range(evaluations_stream("autoscaling"))]
    assert len(windows) == len(records) // 60 == publisher.published
    first = windows[0]
    assert first.active_outcomes["replica_hours"] == pytest.approx(
        sum(r.live_replicas * r.interval_s for r in records[:60]) / 3600)
    assert first.candidate_outcomes["replica_hours"] == pytest.approx(sum(r.interval_s for r in records[:60]) / 3600)
    total_candidate = sum(w.candidate_outcomes["slo_violation_minutes"] for w in windows)
    total_active = sum(w.active_outcomes["slo_violation_minutes"] for w in windows)
    assert total_candidate > total_active
