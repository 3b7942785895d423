"""Pure forecast policy: provision for the forecast peak plus its noise, sized to the latency SLO.

``desired = ceil((max(load now, forecast peak over the lead window) + z × spread) / u_slo)`` then the guard
rails, where ``spread`` is the recent robust one-minute forecast error and ``u_slo`` the highest
utilisation whose p99 meets the SLO (from the queueing model), less a 5% margin. The HPA instead aims
every replica at one utilisation whatever the noise; this policy runs hot when load is smooth and keeps
head-room when it is noisy or about to rise. A proposed scale-down smaller than
``scale_down_tolerance`` of the current replicas is not made (hysteresis: a pod removed and re-added a
minute later pays its start-up again). ``z`` is calibrated on training days only (:mod:`..calibration`)
so the policy spends about the HPA's replica-hours there.

Two variants share this module: ``forecast`` uses the median seasonal forecast, ``forecast-burst`` the
upper seasonal forecast (bursts that recurred at this clock time on some of the previous days).
"""

from __future__ import annotations

import math

from regional_scheduler.autoscaling.policies.base import (
    GuardedPolicy,
    PolicyContext,
    forecast_needed_load,
    forecast_spread,
    forecast_upper_load,
)
from regional_scheduler.autoscaling.queueing import max_utilisation_within_slo
from regional_scheduler.autoscaling.simulator import Observation

NAME = "forecast"
BURST_NAME = "forecast-burst"
SLO_UTILISATION_MARGIN = 0.95
DEFAULT_Z = 1.0
SCALE_DOWN_TOLERANCE = 0.1  # as the HPA's tolerance: ignore a scale-down of under 10%


def slo_utilisation(context: PolicyContext) -> float:
    svc = context.service
    return SLO_UTILISATION_MARGIN * max_utilisation_within_slo(
        workers=svc.workers_per_replica, service_time_s=svc.service_time_ms / 1000.0,
        slo_s=svc.slo_p99_ms / 1000.0)


class ForecastPolicy(GuardedPolicy):
    def __init__(self, z: float | None = None, *, burst: bool = False,
                 scale_down_tolerance: float = SCALE_DOWN_TOLERANCE) -> None:
        super().__init__()
        self.name = BURST_NAME if burst else NAME
        self.z = DEFAULT_Z if z is None else z
        self.burst = burst
        self.scale_down_tolerance = scale_down_tolerance
        self.context: PolicyContext | None = None
        self.utilisation = 0.0

    def reset(self, context: PolicyContext) -> None:
        self.context = context
        self.utilisation = slo_utilisation(context)
        self.reset_rails(context)

    def propose(self, observation: Observation, z: float | None = None) -> int:
        assert self.context is not None, "reset() first"
        needed = (forecast_upper_load if self.burst else forecast_needed_load)(self.context, observation)
        spread = forecast_spread(self.context, observation)
        target = math.ceil((needed + (self.z if z is None else z) * spread) / self.utilisation)
        current = observation.current_replicas
        if current * (1.0 - self.scale_down_tolerance) <= target < current:
            return current
        return target

    def decide(self, observation: Observation) -> int:
        return self.guard(self.propose(observation), observation)


def build(z: float | None = None) -> ForecastPolicy:
    return ForecastPolicy(z)


def build_burst(z: float | None = None) -> ForecastPolicy:
    return ForecastPolicy(z, burst=True)
