"""Gymnasium environment: one decision per minute over a day of a training series.

* **State**: :data:`..features.FEATURE_LAYOUT` (replicas, utilisation, request rate and its history,
  latency, error rate, forecasts, time-of-day and day-of-week encodings).
* **Action**: :mod:`..actions` (hold, or a replica change to a head-room level over the forecast).
  The guard rails are applied on every tick, exactly as in serving, so the agent learns inside them.
* **Reward** per minute: ``−replica_cost × replicas / reference_replicas − violation_penalty × violated``,
  with ``violated`` = the minute broke the SLO (missing minutes never count). Normalising by the
  reference replicas makes the trade-off the same for every series.

Episodes start at a random minute of the training range (after the first day, so the forecaster has
history) and last ``episode_minutes``; held-back days are never reachable from this environment.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from regional_scheduler.autoscaling.actions import N_ACTIONS, proposed_replicas
from regional_scheduler.autoscaling.features import FEATURE_LAYOUT, RATIO_CLIP, observation_features
from regional_scheduler.autoscaling.guard_rails import GuardRails
from regional_scheduler.autoscaling.policies.forecast_policy import slo_utilisation
from regional_scheduler.autoscaling.scenario import Scenario
from regional_scheduler.autoscaling.simulator import ServiceSimulator


class AutoscaleEnv(gym.Env[np.ndarray, int]):
    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(self, scenarios: list[Scenario], *, episode_minutes: int = 720, replica_cost: float = 1.0,
                 violation_penalty: float = 1.0) -> None:
        super().__init__()
        if not scenarios:
            raise ValueError("at least one scenario")
        self.scenarios = scenarios
        self.episode_minutes = episode_minutes
        self.replica_cost = replica_cost
        self.violation_penalty = violation_penalty
        self.observation_space = gym.spaces.Box(-RATIO_CLIP, RATIO_CLIP, (len(FEATURE_LAYOUT),), np.float32)
        self.action_space = gym.spaces.Discrete(N_ACTIONS)
        self._scenario: Scenario | None = None
        self._sim: ServiceSimulator | None = None
        self._rails: GuardRails | None = None
        self._minute = 0
        self._u_slo = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        scenario = self.scenarios[int(self.np_random.integers(len(self.scenarios)))]
        first = min(1440, scenario.split.train_end_minute - self.episode_minutes - 1)
        start = int(self.np_random.integers(max(first, 0), scenario.split.train_end_minute - self.episode_minutes))
        return self.begin_episode(scenario, start)

    def begin_episode(self, scenario: Scenario, start: int) -> tuple[np.ndarray, dict[str, Any]]:
        """An episode of ``scenario`` from minute ``start``: the replicas the target utilisation needs for that
        minute's load (:func:`initial_replicas`), no backlog, fresh guard rails."""
        self._sim = ServiceSimulator(scenario.load, scenario.settings.service,
                                     initial_replicas=initial_replicas(scenario, start),
                                     start_minute=start, end_minute=start + self.episode_minutes)
        self._sim.reset()
        self._scenario = scenario
        self._rails = GuardRails(scenario.context.guard_rail_settings())
        self._u_slo = slo_utilisation(scenario.context)
        self._minute = 0
        return observation_features(scenario.context, self._sim.observe()), {"series": scenario.name}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        sim, scenario, rails = self._sim, self._scenario, self._rails
        assert sim is not None and scenario is not None and rails is not None, "reset() first"
        context = scenario.context
        proposal: int | None = None
        replicas = 0.0
        for _ in range(sim.ticks_per_minute):
            obs = sim.observe()
            if proposal is None:
                proposal = proposed_replicas(int(action), context, obs, self._u_slo)
            decision = rails.apply(proposed=proposal, current=obs.current_replicas, now_s=obs.time_s,
                                   slo_breached=obs.slo_breached, utilisation=obs.utilisation,
                                   ready=obs.ready_replicas)
            sim.step(decision.replicas)
            replicas += sim.ready + len(sim.pending)
        replicas /= sim.ticks_per_minute
        violated = sim.minute_violated(self._minute) and bool(sim.minute_observed_all[sim.start_minute + self._minute])
        reward = (-self.replica_cost * replicas / context.sizing.reference_replicas
                  - self.violation_penalty * float(violated))
        self._minute += 1
        truncated = sim.done
        return (observation_features(context, sim.observe() if not truncated else obs), reward, False, truncated,
                {"violated": violated, "replicas": replicas})


def initial_replicas(scenario: Scenario, minute: int) -> int:
    """The replicas the target utilisation needs for ``minute``'s load (1 replica's worth when it is missing),
    within the service's bounds: an episode's start state."""
    sizing = scenario.context.sizing
    load = scenario.load[minute]
    initial = math.ceil((load if np.isfinite(load) else 1.0) / sizing.target_utilisation)
    return min(max(initial, sizing.min_replicas, 1), sizing.max_replicas)
