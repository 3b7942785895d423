"""One deployment's request series as continual learning sees it: the service it defines, a checkpoint's
counterfactual over a range of windows, and DQN training on a stretch of it.

A **deployment** is a per-minute request rate on a clock (``start``) and a fixed capacity per replica (the
service's CPU per request does not change when its traffic does, so a regime change moves the load in
replicas, not the replica). Everything here is computed from those three inputs alone, so the scenario's
evaluation and the retrainer, which only has the learning records, build the same service and forecast.

**Counterfactual of a checkpoint over windows** (``window_minutes`` each): the learned policy is replayed
continuously from a defined start state, ``warm_up_minutes`` before the first window (not counted), with
the replicas the HPA's target utilisation needs for the load of that minute, no backlog and fresh guard
rails, as :meth:`..scenario.Scenario.run` does. The forecast is the causal seasonal forecast of the whole
series (index ``m`` uses minutes ``≤ m`` only), so no decision sees the future. Each window's outcome is its
SLO-violation minutes (missing minutes excluded) and the replica-hours its ticks held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import torch

from regional_scheduler.autoscaling.dqn.algorithm import DQN
from regional_scheduler.autoscaling.dqn.policy import QNetwork
from regional_scheduler.autoscaling.env import AutoscaleEnv, initial_replicas
from regional_scheduler.autoscaling.forecaster import SeasonalForecaster
from regional_scheduler.autoscaling.policies.base import PolicyContext
from regional_scheduler.autoscaling.policies.learned_policy import LearnedPolicy
from regional_scheduler.autoscaling.request_series import DaySplit, RequestSeries
from regional_scheduler.autoscaling.scenario import Scenario
from regional_scheduler.autoscaling.service_sizing import ServiceSizing
from regional_scheduler.autoscaling.settings import AutoscalerSettings
from regional_scheduler.autoscaling.simulator import ServiceSimulator

WARM_UP_MINUTES = 60


@dataclass(frozen=True)
class Deployment:
    """A request rate per minute (NaN = missing) from ``start``, served by replicas of a fixed capacity."""

    name: str
    start: datetime
    requests_per_minute: np.ndarray
    capacity_per_replica_rpm: float

    @property
    def minutes(self) -> int:
        return int(self.requests_per_minute.size)


def deployment_scenario(deployment: Deployment, settings: AutoscalerSettings | None = None) -> Scenario:
    """The simulator's view of ``deployment``: its load in replicas at 100 %, sizing and causal forecast."""
    settings = settings or AutoscalerSettings()
    capacity = deployment.capacity_per_replica_rpm
    sizing = ServiceSizing(
        capacity_per_replica_rpm=capacity,
        cpu_seconds_per_request=settings.service.workers_per_replica * 60.0 / capacity,
        target_utilisation=settings.sizing.target_utilisation,
        reference_replicas=settings.sizing.reference_replicas,
        min_replicas=settings.sizing.min_replicas,
        max_replicas=math.ceil(settings.sizing.max_replicas_factor * settings.sizing.reference_replicas))
    load = sizing.load_in_replicas(deployment.requests_per_minute)
    context = PolicyContext(sizing=sizing, service=settings.service,
                            forecast=SeasonalForecaster().fit_transform(load),
                            start_minute_of_day=deployment.start.hour * 60 + deployment.start.minute,
                            start_weekday=deployment.start.weekday())
    series = RequestSeries(deployment.name, deployment.start, deployment.requests_per_minute, 60)
    split = DaySplit(train_end_minute=deployment.minutes, total_minutes=deployment.minutes,
                     train_days=deployment.minutes // 1440, held_back_days=0.0)
    return Scenario(series=series, split=split, load=load, context=context, settings=settings)


def window_outcomes(network: QNetwork, scenario: Scenario, first_minute: int, windows: int,
                    window_minutes: int) -> dict[str, np.ndarray]:
    """SLO-violation minutes and replica-hours of the learned policy on each of ``windows`` windows from
    ``first_minute`` (see the module docstring for the start state)."""
    warm_start = max(0, first_minute - WARM_UP_MINUTES)
    end = first_minute + windows * window_minutes
    simulator = ServiceSimulator(scenario.load, scenario.settings.service,
                                 initial_replicas=initial_replicas(scenario, warm_start),
                                 start_minute=warm_start, end_minute=end)
    policy = LearnedPolicy(network)
    policy.reset(scenario.context)
    result = simulator.run(policy.decide)
    skip = first_minute - warm_start
    violated = (result.minute_violated & result.minute_observed)[skip:].reshape(windows, window_minutes)
    tpm = simulator.ticks_per_minute
    replicas = result.replicas[skip * tpm:].reshape(windows, window_minutes * tpm)
    return {"slo_violation_minutes": violated.sum(axis=1).astype(float),
            "replica_hours": replicas.sum(axis=1) * scenario.settings.service.tick_s / 3600.0}


class StretchEnv(AutoscaleEnv):
    """:class:`AutoscaleEnv` whose episodes lie anywhere in ``[first_minute, end_minute)`` of
    one scenario: a retrain has hours to days of the new regime, not the weeks the base environment's
    "skip the first day" rule assumes, and every minute of it must be reachable."""

    def __init__(self, scenario: Scenario, *, first_minute: int, end_minute: int, **kwargs: Any) -> None:
        super().__init__([scenario], **kwargs)
        self.first_minute, self.end_minute = first_minute, end_minute

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:

        gym_reset = super(AutoscaleEnv, self).reset
        gym_reset(seed=seed)
        scenario = self.scenarios[0]
        last_start = self.end_minute - self.episode_minutes
        start = int(self.np_random.integers(self.first_minute, max(last_start, self.first_minute + 1)))
        return self.begin_episode(scenario, start)


class FineTuningDQN(DQN):
    """:class:`DQN` that may start from a parent's weights with ε decaying from ``initial_epsilon``: a
    fine-tune already knows the action values roughly and explores to correct them, not from scratch."""

    def __init__(self, env: StretchEnv, *, parent: QNetwork | None, initial_epsilon: float = 1.0,
                 **kwargs: Any) -> None:
        super().__init__(env, **kwargs)  # type: ignore[arg-type]
        self.initial_epsilon = initial_epsilon
        if parent is not None:
            self.q_net.load_state_dict(parent.state_dict())
            self.target_net.load_state_dict(parent.state_dict())

    def _epsilon(self, step: int, total: int) -> float:
        progress = min(1.0, step / max(1.0, self.exploration_fraction * total))
        return self.initial_epsilon + progress * (self.exploration_final_eps - self.initial_epsilon)


def train_on_stretch(scenario: Scenario, *, first_minute: int, steps: int, seed: int,
                     end_minute: int | None = None, parent: QNetwork | None = None, episode_minutes: int = 240,
                     violation_penalty: float = 3.0, learning_rate: float = 1e-3,
                     initial_epsilon: float = 0.3) -> QNetwork:
    """A DQN trained on minutes ``[first_minute, end_minute)`` of ``scenario`` (default: to its end; the
    minutes before only feed the forecast's history), from ``parent`` when given. The violation penalty
    is the shipped checkpoint's; a fine-tune explores from ``initial_epsilon`` (a fresh network from 1)."""
    torch.set_num_threads(1)
    end = scenario.split.train_end_minute if end_minute is None else end_minute
    available = end - first_minute
    env = StretchEnv(scenario, first_minute=first_minute, end_minute=end,
                     episode_minutes=min(episode_minutes, available // 2), violation_penalty=violation_penalty)
    agent = FineTuningDQN(env, parent=parent, initial_epsilon=initial_epsilon if parent is not None else 1.0,
                          seed=seed, learning_rate=learning_rate,
                          learning_starts=min(1_000, steps // 4), buffer_size=max(steps, 1_000))
    return agent.learn(steps)
