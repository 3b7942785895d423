"""Autoscaling policy names → constructors, in the scheme of the placement registry's docstring
(``regional_scheduler.policies.registry``; :class:`meridian.policy_registry.PolicyRegistry`): entries
are ``"module:build"`` strings, imported on first construction. The CLI's ``--policies`` reads this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meridian.policy_registry import PolicyRegistry, UnknownPolicyError

if TYPE_CHECKING:
    from regional_scheduler.autoscaling.policies.base import AutoscalingPolicy

__all__ = ["BASELINES", "REGISTRY", "UnknownPolicyError", "get_policy", "names"]

LEARNED = "learned"
REGISTRY: PolicyRegistry[AutoscalingPolicy] = PolicyRegistry("autoscaling", {
    "hpa": "regional_scheduler.autoscaling.policies.hpa_policy:build",
    "forecast": "regional_scheduler.autoscaling.policies.forecast_policy:build",
    "forecast-burst": "regional_scheduler.autoscaling.policies.forecast_policy:build_burst",
    "learned": "regional_scheduler.autoscaling.policies.learned_policy:build",  # torch and a checkpoint
    "quantile": "regional_scheduler.autoscaling.policies.quantile_policy:build",
    "quantile-budget": "regional_scheduler.autoscaling.policies.quantile_policy:build_budget",
}, learned=LEARNED)

BASELINES: tuple[str, ...] = REGISTRY.baselines
names = REGISTRY.names
get_policy = REGISTRY.get
