"""``least-carbon``: greedy, the feasible cluster whose grid is cleanest right now."""

from __future__ import annotations

import numpy as np

from global_scheduler.routing.base import with_defer
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures

NAME = "least-carbon"


class LeastCarbon:
    name = NAME

    def reset(self) -> None:
        return None

    def score(self, clusters: ClusterFeatures, workload: WorkloadFeatures, feasible: np.ndarray) -> np.ndarray:
        return with_defer(-clusters.carbon_now)


def build() -> LeastCarbon:
    return LeastCarbon()
