"""``least-carbon-slo``: least-carbon that never places work where a latency SLO would break.

Greedy ``least-carbon`` fills the cleanest cluster to 100 % and so breaks the SLOs of the
latency-sensitive work running there (162 violations on the held-back window). This baseline asks
what greed costs once it keeps every SLO: among the feasible clusters only those where placing the
workload keeps its own and every running workload's latency within its SLO (M/M/1 estimate, no
head-room: ``global_scheduler.routing.feasibility.slo_excess ≤ 0``) remain, and the cleanest of them
wins. With none left the workload waits and is retried (deferrable work defers), as kube-scheduler leaves a pod pending.
It is the ``gnn`` policy's shield at zero margin with least-carbon's ranking behind it, so the two
differ only in the ranking and the GNN's head-room.
"""

from __future__ import annotations

import numpy as np

from global_scheduler.routing.base import with_defer
from global_scheduler.routing.feasibility import slo_excess
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures

NAME = "least-carbon-slo"


class LeastCarbonSlo:
    name = NAME

    def reset(self) -> None:
        return None

    def score(self, clusters: ClusterFeatures, workload: WorkloadFeatures, feasible: np.ndarray) -> np.ndarray:
        keeps_slos = slo_excess(clusters, workload, 0.0) <= 0
        return with_defer(np.where(keeps_slos, -clusters.carbon_now, -np.inf))


def build() -> LeastCarbonSlo:
    return LeastCarbonSlo()
