"""Name → constructor for every placement policy (kube-scheduler's ``registry.go``).

No registration by import side effect: this table is the whole list, and the CLI's
``--policies`` reads it. ``learned`` is constructed by the regional scheduler's serving code
(it needs a checkpoint) and is added here lazily so the baselines never import torch.
"""

from __future__ import annotations

from collections.abc import Callable

from regional_scheduler.policies import (
    best_fit,
    dot_product,
    fgd,
    gpu_clustering,
    gpu_packing,
    random_fit,
    resource_allocation,
)
from regional_scheduler.policies.base import ScorePolicy


def _learned() -> ScorePolicy:
    from regional_scheduler.learned.serving import new_learned_policy

    return new_learned_policy()


REGISTRY: dict[str, Callable[[], ScorePolicy]] = {
    random_fit.NAME: random_fit.new,
    "least-allocated": resource_allocation.least,
    "most-allocated": resource_allocation.most,
    "balanced": resource_allocation.balanced,
    "requested-to-capacity": resource_allocation.rtcr,
    best_fit.NAME: best_fit.new,
    dot_product.NAME: dot_product.new,
    gpu_packing.NAME: gpu_packing.new,
    gpu_clustering.NAME: gpu_clustering.new,
    fgd.NAME: fgd.new,
    "learned": _learned,
}

BASELINES: tuple[str, ...] = tuple(name for name in REGISTRY if name != "learned")


class UnknownPolicyError(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown placement policy {name!r}; known: {', '.join(REGISTRY)}")


def get_policy(name: str) -> ScorePolicy:
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(name) from None
    return factory()
