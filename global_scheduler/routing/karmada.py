"""``karmada``: Karmada's dynamic weighting by available replicas.

Karmada's ``ReplicaSchedulingStrategy`` with ``weightPreference.dynamicWeight: AvailableReplicas``
weights each cluster by how many replicas of the workload it can still take (its estimator's
answer). Meridian routes a workload whole, so the weights pick clusters with smooth weighted
round-robin (the nginx algorithm): every feasible cluster's credit grows by its weight, the largest
credit wins and pays back the total. Over many workloads each cluster receives work in proportion to
its free room, deterministically, as Karmada's divided replicas would.
"""

from __future__ import annotations

import numpy as np

from global_scheduler.routing.base import with_defer
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures, available_replicas

NAME = "karmada"


class KarmadaDynamicWeight:
    name = NAME

    def __init__(self) -> None:
        self._credit: np.ndarray = np.zeros(0)

    def reset(self) -> None:
        self._credit = np.zeros(0)

    def score(self, clusters: ClusterFeatures, workload: WorkloadFeatures, feasible: np.ndarray) -> np.ndarray:
        if self._credit.shape != (clusters.n,):
            self._credit = np.zeros(clusters.n)
        weights = np.where(feasible, np.minimum(available_replicas(clusters, workload), 1e6), 0.0)
        total = weights.sum()
        if total <= 0:
            return with_defer(np.zeros(clusters.n))
        self._credit += weights
        scores = np.where(feasible, self._credit, -np.inf)
        chosen = int(np.argmax(scores))
        self._credit[chosen] -= total
        return with_defer(scores)


def build() -> KarmadaDynamicWeight:
    return KarmadaDynamicWeight()
