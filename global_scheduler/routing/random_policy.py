"""``random``: a uniformly random feasible cluster, from a seeded generator."""

from __future__ import annotations

import numpy as np

from global_scheduler.routing.base import with_defer
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures

NAME = "random"


class RandomRouting:
    name = NAME

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def reset(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def score(self, clusters: ClusterFeatures, workload: WorkloadFeatures, feasible: np.ndarray) -> np.ndarray:
        return with_defer(self._rng.random(clusters.n))


def build(seed: int = 0) -> RandomRouting:
    return RandomRouting(seed)
