"""Policy names → constructors (no registration by import side effect). The CLI's ``--policies`` reads this."""

from __future__ import annotations

from collections.abc import Callable

from regional_scheduler.autoscaling.policies import (
    forecast_policy,
    hpa_policy,
    learned_policy,
    quantile_policy,
)
from regional_scheduler.autoscaling.policies.base import AutoscalingPolicy

REGISTRY: dict[str, Callable[[], AutoscalingPolicy]] = {
    hpa_policy.NAME: hpa_policy.build,
    forecast_policy.NAME: forecast_policy.build,
    forecast_policy.BURST_NAME: forecast_policy.build_burst,
    learned_policy.NAME: learned_policy.build,
    quantile_policy.NAME: quantile_policy.build,
    quantile_policy.BUDGET_NAME: quantile_policy.build_budget,
}


def build_policy(name: str) -> AutoscalingPolicy:
    try:
        return REGISTRY[name]()
    except KeyError:
        raise KeyError(f"unknown autoscaling policy {name!r}; known: {sorted(REGISTRY)}") from None
