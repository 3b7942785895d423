"""Routing policy names → constructors, in the scheme of the placement registry's docstring
(``regional_scheduler.policies.registry``; :class:`meridian.policy_registry.PolicyRegistry`): entries
are ``"module:build"`` strings, imported on first construction, so listing the names (``meridian
global serve`` checking ``--policy``, ``bench routing --policies``) imports neither torch nor numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meridian.policy_registry import PolicyRegistry, UnknownPolicyError

if TYPE_CHECKING:
    from global_scheduler.routing.base import RoutingPolicy

__all__ = ["BASELINES", "REGISTRY", "UnknownPolicyError", "get_policy", "names"]

LEARNED = "gnn"
REGISTRY: PolicyRegistry[RoutingPolicy] = PolicyRegistry("routing", {
    "round-robin": "global_scheduler.routing.round_robin:build",
    "karmada": "global_scheduler.routing.karmada:build",
    "least-carbon": "global_scheduler.routing.least_carbon:build",
    "least-carbon-slo": "global_scheduler.routing.least_carbon_slo:build",
    "least-cost": "global_scheduler.routing.least_cost:build",
    "random": "global_scheduler.routing.random_policy:build",
    "gnn": "global_scheduler.routing.gnn_routing:build",  # torch and a checkpoint
}, learned=LEARNED)

BASELINES: tuple[str, ...] = REGISTRY.baselines
names = REGISTRY.names
get_policy = REGISTRY.get
