"""Routing policy names → constructors (no registration by import side effect)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from global_scheduler.routing import (
    gnn_routing,
    karmada,
    least_carbon,
    least_carbon_slo,
    least_cost,
    random_policy,
    round_robin,
)
from global_scheduler.routing.base import RoutingPolicy

REGISTRY: dict[str, Callable[..., RoutingPolicy]] = {
    round_robin.NAME: round_robin.build,
    karmada.NAME: karmada.build,
    least_carbon.NAME: least_carbon.build,
    least_carbon_slo.NAME: least_carbon_slo.build,
    least_cost.NAME: least_cost.build,
    random_policy.NAME: random_policy.build,
    gnn_routing.NAME: gnn_routing.build,
}

BASELINES = (round_robin.NAME, karmada.NAME, least_carbon.NAME, least_carbon_slo.NAME, least_cost.NAME,
             random_policy.NAME)


def names() -> list[str]:
    return list(REGISTRY)


def get_policy(name: str, **kwargs: Any) -> RoutingPolicy:
    try:
        build = REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown routing policy {name!r}; known: {', '.join(REGISTRY)}") from None
    return build(**kwargs)
