"""``round-robin``: the next feasible cluster after the last one chosen."""

from __future__ import annotations

import numpy as np

from global_scheduler.routing.base import with_defer
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures

NAME = "round-robin"


class RoundRobin:
    name = NAME

    def __init__(self) -> None:
        self._next = 0

    def reset(self) -> None:
        self._next = 0

    def score(self, clusters: ClusterFeatures, workload: WorkloadFeatures, feasible: np.ndarray) -> np.ndarray:
        n = clusters.n
        # Distance ahead of the cursor, smallest wins: score = -((i - next) mod n).
        ahead = (np.arange(n) - self._next) % n
        scores = -ahead.astype(np.float64)
        candidates = np.flatnonzero(feasible)
        if candidates.size:
            chosen = candidates[np.argmin(ahead[candidates])]
            self._next = (int(chosen) + 1) % n
        return with_defer(scores)


def build() -> RoundRobin:
    return RoundRobin()
