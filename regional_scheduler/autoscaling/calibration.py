"""Budget matching on training days: pick the forecast policy's head-room so that it spends no more
replica-hours than the HPA on the same (training) days, then use that on held-back days unchanged.

This is the only per-series fitting the forecast policy gets, it touches training days only, and it is
what makes "fewer SLO-violation minutes at ≤ 105% of the HPA's replica-hours" a fair comparison: the
policy is not allowed to buy latency with extra replicas it would not have been given.
"""

from __future__ import annotations

from dataclasses import dataclass

from regional_scheduler.autoscaling.policies.forecast_policy import ForecastPolicy
from regional_scheduler.autoscaling.policies.hpa_policy import HpaPolicy
from regional_scheduler.autoscaling.scenario import Scenario

Z_GRID: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
CALIBRATION_DAYS = 7


@dataclass(frozen=True)
class Calibration:
    z: float
    hpa_replica_hours: float
    replica_hours: float
    slo_violation_minutes: int


def calibrate_forecast_headroom(scenario: Scenario, budget_ratio: float = 1.0) -> Calibration:
    """The largest ``z`` whose training replica-hours stay within ``budget_ratio`` × the HPA's."""
    hpa = scenario.training(HpaPolicy(), last_days=CALIBRATION_DAYS)
    budget = budget_ratio * hpa["replica_hours"]
    best: Calibration | None = None
    for z in Z_GRID:
        run = scenario.training(ForecastPolicy(z), last_days=CALIBRATION_DAYS)
        candidate = Calibration(z, hpa["replica_hours"], run["replica_hours"], run["slo_violation_minutes"])
        if best is None or run["replica_hours"] <= budget:
            best = candidate if (best is None or run["replica_hours"] <= budget) else best
        if run["replica_hours"] > budget:
            break
    assert best is not None
    return best
