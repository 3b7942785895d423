"""Shadow routing: the active policy routes, a candidate scores the same workload on the same snapshot, and
both choices' outcome is recorded for the online evaluation.

Both policies see the same clusters and feasibility mask, so each choice's outcome is computed, not guessed,
for the arm that was not served too:

* ``carbon_per_replica_hour``: the chosen cluster's forecast grid intensity over the workload's next hours
  times its PUE (gCO2 per kWh of IT load; the energy of a replica-hour is the same whichever cluster runs it,
  so the ratio of two arms is the ratio of their carbon);
* ``slo_violations``: 1 when the choice would take a latency SLO past its ceiling — the workload's own or a
  running workload's — by the router's own M/M/1 model (:func:`~.feasibility.slo_excess`), else 0.

A decision where either arm defers or finds no cluster is not paired (its carbon depends on a later hour
and place the shadow cannot know): it is counted in ``unpaired`` and left out. Routing has no canary here:
a policy is handed a workload's features, not its id, so a per-workload split belongs to the router's
caller.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from global_scheduler.routing.base import RoutingPolicy, can_defer, select
from global_scheduler.routing.feasibility import slo_excess
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoutingShadowRecord:
    active_choice: int
    candidate_choice: int
    active_carbon: float
    candidate_carbon: float
    active_slo_violation: bool
    candidate_slo_violation: bool

    @property
    def agree(self) -> bool:
        return self.active_choice == self.candidate_choice


class RoutingShadowSink(Protocol):
    def __call__(self, record: RoutingShadowRecord) -> None: ...


class ShadowRouting:
    """A :class:`~.base.RoutingPolicy` that routes with ``active`` and records ``candidate`` beside it."""

    def __init__(self, active: RoutingPolicy, candidate: RoutingPolicy, *, sink: RoutingShadowSink | None = None) -> None:
        self.active, self.candidate, self.sink = active, candidate, sink
        self.name = f"{active.name}+shadow-{candidate.name}"
        self.records: list[RoutingShadowRecord] = []
        self.unpaired = 0

    def reset(self) -> None:
        self.active.reset()
        self.candidate.reset()
        self.records.clear()
        self.unpaired = 0

    def score(self, clusters: ClusterFeatures, workload: WorkloadFeatures, feasible: np.ndarray) -> np.ndarray:
        scores = self.active.score(clusters, workload, feasible)
        try:
            shadow = self.candidate.score(clusters, workload, feasible)
        except Exception as exc:  # the shadow must never break the live decision
            log.warning("shadow routing failed: %s", exc)
            return scores
        deferrable = can_defer(workload)
        choices = (select(np.asarray(scores), feasible, deferrable), select(np.asarray(shadow), feasible, deferrable))
        if min(choices) < 0:
            self.unpaired += 1
            return scores
        carbon = clusters.carbon_forecast * clusters.pue
        breaks = slo_excess(clusters, workload, 0.0) > 0
        record = RoutingShadowRecord(choices[0], choices[1], float(carbon[choices[0]]), float(carbon[choices[1]]),
                                     bool(breaks[choices[0]]), bool(breaks[choices[1]]))
        self.records.append(record)
        if self.sink is not None:
            self.sink(record)
        return scores
