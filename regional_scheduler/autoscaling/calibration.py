"""Budget matching on training days: pick the forecast policy's head-room so that it spends no more
replica-hours than the HPA on the same (training) days, then use that on held-back days unchanged.

This is the only per-series fitting the forecast policy gets, it touches training days only, and it is
what makes "fewer SLO-violation minutes at ≤ 105% of the HPA's replica-hours" a fair comparison: the
policy is not allowed to buy latency with extra replicas it would not have been given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

from regional_scheduler.autoscaling.policies.forecast_policy import ForecastPolicy
from regional_scheduler.autoscaling.policies.hpa_policy import HpaPolicy
from regional_scheduler.autoscaling.policies.quantile_policy import QuantilePolicy
from regional_scheduler.autoscaling.quantile_forecaster import (
    QuantileForecast,
    QuantileForecaster,
    poisson_forecast,
)
from regional_scheduler.autoscaling.scenario import Scenario
from regional_scheduler.autoscaling.settings import BudgetSettings

Z_GRID: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)
CALIBRATION_DAYS = 7
#: Replica-hours allowed relative to the HPA on the calibration days: inside the benchmark's 105%
#: with a margin for held-back days being busier or calmer than training days.
BUDGET_RATIO = 1.03


class _Run(Protocol):
    replica_hours: float
    slo_violation_minutes: int


C = TypeVar("C", bound=_Run)


def _best_within_budget(runs: list[C], budget: float, *, spend_on_ties: bool) -> C:
    """The fewest SLO-violation minutes among the runs within ``budget`` replica-hours (ties: the cheaper,
    or with ``spend_on_ties`` the one spending more); if none fits, the cheapest run."""
    within = [c for c in runs if c.replica_hours <= budget]
    if within:
        sign = -1.0 if spend_on_ties else 1.0
        return min(within, key=lambda c: (c.slo_violation_minutes, sign * c.replica_hours))
    return min(runs, key=lambda c: (c.replica_hours, c.slo_violation_minutes))


@dataclass(frozen=True)
class Calibration:
    z: float
    hpa_replica_hours: float
    replica_hours: float
    slo_violation_minutes: int


def calibrate_forecast_headroom(scenario: Scenario, budget_ratio: float = BUDGET_RATIO, *, burst: bool = False,
                                end_minute: int | None = None) -> Calibration:
    """Among the ``z`` whose training replica-hours stay within ``budget_ratio`` × the HPA's, the one with
    the fewest training SLO-violation minutes (then the cheapest); if none fits, the cheapest ``z``.

    Replica-hours are not monotonic in ``z``: too little head-room breaches the SLO, the guard rail
    then scales up at once, and that costs more than the head-room would have.
    """
    end = scenario.split.train_end_minute if end_minute is None else end_minute
    hpa = scenario.training(HpaPolicy(), last_days=CALIBRATION_DAYS, end_minute=end)
    budget = budget_ratio * hpa["replica_hours"]
    runs = []
    for z in Z_GRID:
        run = scenario.training(ForecastPolicy(z, burst=burst), last_days=CALIBRATION_DAYS, end_minute=end)
        runs.append(Calibration(z, hpa["replica_hours"], run["replica_hours"], run["slo_violation_minutes"]))
    return _best_within_budget(runs, budget, spend_on_ties=False)


#: (τ up, τ down) pairs the quantile policy may use: a scale-down keeps a quantile of the next minutes'
#: peak at most the scale-up quantile (the peak of four minutes is already the higher risk) and at
#: least 0.15 below it (lower would flap: remove pods, then re-add them a minute later).
TAU_UP_GRID: tuple[float, ...] = (0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999)
TAU_DOWN_GRID: tuple[float, ...] = (0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999)
TAU_DOWN_BELOW_UP_MAX = 0.15
QUANTILE_BUDGET_RATIO = 1.0


@dataclass(frozen=True)
class QuantileCalibration:
    tau_up: float
    tau_down: float
    hpa_replica_hours: float
    replica_hours: float
    slo_violation_minutes: int


def tau_pairs() -> list[tuple[float, float]]:
    return [(up, down) for up in TAU_UP_GRID for down in TAU_DOWN_GRID
            if up - TAU_DOWN_BELOW_UP_MAX - 1e-9 <= down <= up + 1e-9]


def calibrate_quantile_levels(scenario: Scenario, model: QuantileForecast, *,
                              budget_ratio: float = QUANTILE_BUDGET_RATIO, days: int = CALIBRATION_DAYS,
                              end_minute: int | None = None) -> QuantileCalibration:
    """Budget matching for :class:`QuantilePolicy` on the ``days`` training days before ``end_minute``
    (default: the end of the training days): among the ``(τ up, τ down)`` pairs whose replica-hours stay
    within ``budget_ratio`` × the HPA's on the same days, the fewest SLO-violation minutes, then the
    one spending more of the budget; if none fits, the cheapest pair."""
    end = scenario.split.train_end_minute if end_minute is None else end_minute
    if end > scenario.split.train_end_minute:
        raise ValueError("calibration must end inside the training days")
    hpa = scenario.training(HpaPolicy(), last_days=days, end_minute=end)
    budget = budget_ratio * hpa["replica_hours"]
    runs = []
    for up, down in tau_pairs():
        summary = scenario.training(QuantilePolicy(up, model, tau_down=down), last_days=days, end_minute=end)
        runs.append(QuantileCalibration(up, down, hpa["replica_hours"], summary["replica_hours"],
                                        int(summary["slo_violation_minutes"])))
    # A tie spends more of the budget: equal violations on a week are noise, head-room is not.
    return _best_within_budget(runs, budget, spend_on_ties=True)


@dataclass(frozen=True)
class FittedQuantilePolicy:
    """The quantile policy of one series as fitted and calibrated on its training days."""

    family: str
    model: QuantileForecast
    calibration: QuantileCalibration
    candidates: dict[str, QuantileCalibration]

    def policy(self, budget: BudgetSettings | None = None) -> QuantilePolicy:
        """The calibrated policy; with ``budget``, under an online replica-hours budget as well."""
        return QuantilePolicy(self.calibration.tau_up, self.model, tau_down=self.calibration.tau_down, budget=budget)


def fit_quantile_policy(scenario: Scenario, *, end_minute: int | None = None, days: int = CALIBRATION_DAYS,
                        budget_ratio: float = QUANTILE_BUDGET_RATIO) -> FittedQuantilePolicy:
    """Fit both forecaster families on minutes before ``end_minute`` (default: the end of the training
    days), budget-match each on the ``days`` before it, keep the family with fewer calibration
    violations within budget (a tie: the one spending more of the budget, i.e. more head-room).

    The linear family is fitted on the calibration days too (in-sample there); the count family has
    nothing to fit. The selection is automatic and identical for every series."""
    end = scenario.split.train_end_minute if end_minute is None else end_minute
    cap = scenario.context.sizing.capacity_per_replica_rpm
    models = {
        "linear": QuantileForecaster().fit_transform(scenario.load, scenario.context.forecast, cap, fit_end=end),
        "poisson": poisson_forecast(scenario.context.forecast.last_observed, cap),
    }
    candidates = {name: calibrate_quantile_levels(scenario, model, budget_ratio=budget_ratio, days=days,
                                                  end_minute=end) for name, model in models.items()}
    within = {n: c for n, c in candidates.items() if c.replica_hours <= budget_ratio * c.hpa_replica_hours}
    if within:
        family = min(within, key=lambda n: (within[n].slo_violation_minutes, -within[n].replica_hours))
    else:
        family = min(candidates, key=lambda n: candidates[n].replica_hours)
    return FittedQuantilePolicy(family, models[family], candidates[family], candidates)
