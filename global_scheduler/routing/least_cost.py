"""``least-cost``: greedy, the feasible cluster with the lowest electricity price right now."""

from __future__ import annotations

import numpy as np

from global_scheduler.routing.base import with_defer
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures

NAME = "least-cost"


class LeastCost:
    name = NAME

    def reset(self) -> None:
        return None

    def score(self, clusters: ClusterFeatures, workload: WorkloadFeatures, feasible: np.ndarray) -> np.ndarray:
        return with_defer(-clusters.price_per_mwh * clusters.pue)


def build() -> LeastCost:
    return LeastCost()
