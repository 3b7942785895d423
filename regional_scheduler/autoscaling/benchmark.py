"""``meridian bench autoscale``: every policy on the held-back days of every series, in one run.

Per series: size the service and calibrate the forecast policies' head-room on the *training* days
(the quantile policy: fit its forecasters and pick its quantile levels there), then replay the
*held-back* days (the last 25% of whole days, never used for training the DQN, fitting or any
calibration) under each policy, after a one-hour warm-up that is not counted. The target is checked
per series against the HPA of the same run.

``--validation`` runs the same protocol one week earlier, entirely inside the training days: fitting
and calibration end ``VALIDATION_DAYS`` before the training days do, and the policies are compared on
those last training days. Design variants are chosen on that split; the held-back days are for the
final figures only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from regional_scheduler.autoscaling.calibration import (
    FittedQuantilePolicy,
    calibrate_forecast_headroom,
    fit_quantile_policy,
)
from regional_scheduler.autoscaling.policies import forecast_policy, learned_policy, quantile_policy
from regional_scheduler.autoscaling.policies.base import AutoscalingPolicy
from regional_scheduler.autoscaling.policies.registry import get_policy
from regional_scheduler.autoscaling.scenario import build_scenario
from regional_scheduler.autoscaling.settings import AutoscalerSettings

VIOLATION_REDUCTION_TARGET = 0.40
REPLICA_HOURS_LIMIT = 1.05
VALIDATION_DAYS = 7


def _policy(name: str, z: dict[str, float], checkpoint: Path | None,
            quantile: FittedQuantilePolicy | None = None, settings: AutoscalerSettings | None = None) -> AutoscalingPolicy:
    if name == quantile_policy.NAME and quantile is not None:
        return quantile.policy()
    if name == quantile_policy.BUDGET_NAME and quantile is not None:
        return quantile.policy(budget=(settings or AutoscalerSettings()).budget)
    if name == forecast_policy.NAME:
        return forecast_policy.build(z[name])
    if name == forecast_policy.BURST_NAME:
        return forecast_policy.build_burst(z[name])
    if name == learned_policy.NAME:
        return learned_policy.build(checkpoint)
    return get_policy(name)


def compare_with_hpa(hpa: dict[str, float], other: dict[str, float]) -> dict[str, Any]:
    base = hpa["slo_violation_minutes"]
    reduction = 1.0 - other["slo_violation_minutes"] / base if base > 0 else (
        0.0 if other["slo_violation_minutes"] == 0 else -float(other["slo_violation_minutes"]))
    ratio = other["replica_hours"] / hpa["replica_hours"] if hpa["replica_hours"] > 0 else float("inf")
    return {"violation_reduction": reduction, "replica_hours_ratio": ratio,
            "meets_target": bool(reduction >= VIOLATION_REDUCTION_TARGET and ratio <= REPLICA_HOURS_LIMIT)}


def _quantile_entry(fitted: FittedQuantilePolicy) -> dict[str, Any]:
    return {"family": fitted.family, "tau_up": fitted.calibration.tau_up, "tau_down": fitted.calibration.tau_down,
            "calibration": {name: {"tau_up": c.tau_up, "tau_down": c.tau_down,
                                   "slo_violation_minutes": c.slo_violation_minutes,
                                   "replica_hours_ratio": round(c.replica_hours / c.hpa_replica_hours, 4)}
                            for name, c in fitted.candidates.items()}}


def run_benchmark(series: list[Path], policies: list[str], *, checkpoint: Path | None = None,
                  settings: AutoscalerSettings | None = None,
                  advance: Callable[[str], None] | None = None, validation: bool = False) -> dict[str, Any]:
    """Every policy on each series' held-back days (``validation``: on its last training week instead,
    with everything fitted and calibrated before that week)."""
    settings = settings or AutoscalerSettings()
    results: dict[str, Any] = {}
    for path in series:
        scenario = build_scenario(path, settings)
        end = scenario.split.train_end_minute
        if validation:
            end = max(end - VALIDATION_DAYS * 1440, min(end, 2 * 1440))
        z = {name: calibrate_forecast_headroom(scenario, burst=name == forecast_policy.BURST_NAME,
                                               end_minute=end).z
             for name in policies if name in (forecast_policy.NAME, forecast_policy.BURST_NAME)}
        quantile = fit_quantile_policy(scenario, end_minute=end) \
            if {quantile_policy.NAME, quantile_policy.BUDGET_NAME} & set(policies) else None
        per_policy: dict[str, dict[str, float]] = {}
        for name in policies:
            policy = _policy(name, z, checkpoint, quantile, settings)
            if validation:
                result, first = scenario.run(policy, end, scenario.split.train_end_minute)
                per_policy[name] = result.summary(first)
            else:
                per_policy[name] = scenario.held_back(policy)
            if advance is not None:
                advance(f"{scenario.name}: {name}")
        entry: dict[str, Any] = {
            "file": str(path), "source_step_s": scenario.series.source_step_s,
            "train_days": scenario.split.train_days, "held_back_days": round(scenario.split.held_back_days, 3),
            "evaluated_minutes": [end if validation else scenario.split.train_end_minute,
                                  scenario.split.train_end_minute if validation else scenario.split.total_minutes],
            "capacity_per_replica_rpm": scenario.context.sizing.capacity_per_replica_rpm,
            "forecast_headroom_z": z, "policies": per_policy,
        }
        if quantile is not None:
            entry["quantile"] = _quantile_entry(quantile)
        if "hpa" in per_policy:
            entry["vs_hpa"] = {n: compare_with_hpa(per_policy["hpa"], r) for n, r in per_policy.items() if n != "hpa"}
        results[scenario.name] = entry
    return {
        "target": {"violation_reduction_min": VIOLATION_REDUCTION_TARGET, "replica_hours_ratio_max": REPLICA_HOURS_LIMIT},
        "split": "validation (last training days)" if validation else "held-back days",
        "settings": settings.model_dump(mode="json"),
        "series": results,
    }
