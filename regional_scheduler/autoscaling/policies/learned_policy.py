"""The learned policy: the DQN picks a replica change every minute; guard rails apply on every tick.

If the checkpoint is missing or refused, the policy falls back to the forecast policy and says so in a
log line (it never silently runs without rails or without a model it can explain).
"""

from __future__ import annotations

import logging
from pathlib import Path

from regional_scheduler.autoscaling.actions import proposed_replicas
from regional_scheduler.autoscaling.dqn.checkpoint import (
    DEFAULT_CHECKPOINT,
    CheckpointMismatchError,
    load_checkpoint,
)
from regional_scheduler.autoscaling.dqn.policy import QNetwork
from regional_scheduler.autoscaling.features import observation_features
from regional_scheduler.autoscaling.policies.base import GuardedPolicy, PolicyContext
from regional_scheduler.autoscaling.policies.forecast_policy import DEFAULT_Z, slo_utilisation
from regional_scheduler.autoscaling.simulator import Observation

NAME = "learned"
log = logging.getLogger(__name__)


class LearnedPolicy(GuardedPolicy):
    name = NAME

    def __init__(self, network: QNetwork | None = None, *, decision_interval_s: float = 60.0,
                 fallback_z: float = DEFAULT_Z) -> None:
        super().__init__()
        self.network = network
        self.decision_interval_s = decision_interval_s
        self.fallback_z = fallback_z
        self.context: PolicyContext | None = None
        self.u_slo = 0.0
        self._proposal = 0
        self._next_decision_s = 0.0
        self.last_action: int | None = None

    def reset(self, context: PolicyContext) -> None:
        self.context = context
        self.u_slo = slo_utilisation(context)
        self._next_decision_s = float("-inf")
        self.reset_rails(context)

    def decide(self, observation: Observation) -> int:
        assert self.context is not None, "reset() first"
        if observation.time_s >= self._next_decision_s:
            if self.network is None:
                from regional_scheduler.autoscaling.policies.forecast_policy import ForecastPolicy

                fallback = ForecastPolicy(self.fallback_z)
                fallback.context, fallback.utilisation = self.context, self.u_slo
                self._proposal = fallback.propose(observation)
            else:
                self.last_action = self.network.predict(observation_features(self.context, observation))
                self._proposal = proposed_replicas(self.last_action, self.context, observation, self.u_slo)
            self._next_decision_s = observation.time_s + self.decision_interval_s - 1e-9
        return self.guard(self._proposal, observation)


def build(checkpoint: Path | None = None) -> LearnedPolicy:
    path = checkpoint or DEFAULT_CHECKPOINT
    try:
        network, _ = load_checkpoint(path)
    except FileNotFoundError:
        log.warning("no autoscaler checkpoint at %s; the learned policy falls back to the forecast policy", path)
        network = None
    except CheckpointMismatchError as exc:
        log.error("%s; the learned policy falls back to the forecast policy", exc)
        network = None
    return LearnedPolicy(network)
