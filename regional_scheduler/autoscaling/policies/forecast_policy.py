"""Pure forecast policy: provision for the forecast peak plus its noise, sized to the latency SLO.

``desired = ceil((max(load now, forecast peak over the lead window) + z × spread) / u_slo)`` then the guard
rails, where ``spread`` is the recent RMS one-minute forecast error and ``u_slo`` the highest utilisation
whose p99 meets the SLO (from the queueing model), less a 5% margin. The HPA instead aims every
replica at one utilisation whatever the noise; this policy runs hot when load is smooth and keeps
head-room when it is noisy or about to rise. ``z`` is calibrated on training days only
(:mod:`..calibration`) so the policy spends about the HPA's replica-hours there.
"""

from __future__ import annotations

import math

from regional_scheduler.autoscaling.policies.base import (
    GuardedPolicy,
    PolicyContext,
    forecast_needed_load,
    forecast_spread,
)
from regional_scheduler.autoscaling.queueing import max_utilisation_within_slo
from regional_scheduler.autoscaling.simulator import Observation

NAME = "forecast"
SLO_UTILISATION_MARGIN = 0.95
DEFAULT_Z = 1.5


def slo_utilisation(context: PolicyContext) -> float:
    svc = context.service
    return SLO_UTILISATION_MARGIN * max_utilisation_within_slo(
        workers=svc.workers_per_replica, service_time_s=svc.service_time_ms / 1000.0,
        slo_s=svc.slo_p99_ms / 1000.0)


class ForecastPolicy(GuardedPolicy):
    name = NAME

    def __init__(self, z: float | None = None) -> None:
        super().__init__()
        self.z = DEFAULT_Z if z is None else z
        self.context: PolicyContext | None = None
        self.utilisation = 0.0

    def reset(self, context: PolicyContext) -> None:
        self.context = context
        self.utilisation = slo_utilisation(context)
        self.reset_rails(context)

    def propose(self, observation: Observation, z: float | None = None) -> int:
        assert self.context is not None, "reset() first"
        needed = forecast_needed_load(self.context, observation)
        spread = forecast_spread(self.context, observation)
        return math.ceil((needed + (self.z if z is None else z) * spread) / self.utilisation)

    def decide(self, observation: Observation) -> int:
        return self.guard(self.propose(observation), observation)


def build(z: float | None = None) -> ForecastPolicy:
    return ForecastPolicy(z)
