"""``gnn``: the GATv2 router from :mod:`gnn`, loaded from a checkpoint, behind a shield.

Shield (Alshiekh et al., "Safe Reinforcement Learning via Shielding", AAAI 2018): among the feasible
clusters, those where the placement would leave less than ``shield_margin`` utilisation head-room
before its own or a running workload's latency SLO breaks (M/M/1 estimate) are ruled out whenever a
safe one exists; the network chooses among the rest. Without any, the clusters where no SLO would
break remain; if there are none either, the workload waits (it is retried; deferrable work defers). The margin the network was trained with is
recorded in its checkpoint (``meta["shield_margin"]``) and used unless one is given; checkpoints
without it used 0.1.

Work without a latency SLO must in addition leave ``batch_reserve`` (``meta["batch_reserve"]``) of
head-room: the last capacity of a cluster is kept for latency-sensitive arrivals, which cannot wait
and may have no other cluster within their SLO. A deferrable workload that finds no cluster outside
the reserve waits an hour (``select`` defers when every cluster is ruled out); one that cannot wait
falls back to the plain shield.

Without a checkpoint (or if the model raises) the policy falls back to ``least-carbon`` scores with
a headroom penalty and says so once in the log and in ``fallbacks``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from global_scheduler.routing.base import CountsFallbacks, RefinesScores, ScoresInBatch, can_defer, with_defer
from global_scheduler.routing.feasibility import slo_excess, slo_safe
from gnn.policy import DEFAULT_CHECKPOINT, CheckpointError, GnnRoutingNet
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures, utilisation_after

NAME = "gnn"
LEGACY_SHIELD_MARGIN = 0.1  # checkpoints that do not record theirs were trained and evaluated with this
FROM_CHECKPOINT: Literal["checkpoint"] = "checkpoint"
log = logging.getLogger(__name__)


class GnnRouting(ScoresInBatch, RefinesScores, CountsFallbacks):
    name = NAME

    def __init__(self, checkpoint: str | Path | None = None, net: GnnRoutingNet | None = None,
                 shield_margin: float | Literal["checkpoint"] | None = FROM_CHECKPOINT,
                 batch_reserve: float | Literal["checkpoint"] = FROM_CHECKPOINT) -> None:
        """``shield_margin``: utilisation head-room the shield keeps; ``None`` turns the shield off;
        ``"checkpoint"`` (default) takes the margin the network was trained with. ``batch_reserve``:
        extra head-room work *without* a latency SLO must leave (module doc); ``"checkpoint"``: the
        recorded one, 0 if none."""
        torch.set_num_threads(1)
        self.fallbacks = 0
        self.net: GnnRoutingNet | None = net
        if self.net is None:
            try:
                self.net = GnnRoutingNet.load(checkpoint or DEFAULT_CHECKPOINT)
            except CheckpointError as exc:
                log.warning("gnn routing: %s; falling back to the headroom-aware least-carbon heuristic", exc)
        if shield_margin == FROM_CHECKPOINT:
            recorded = self.net.meta.get("shield_margin") if self.net is not None else None
            shield_margin = LEGACY_SHIELD_MARGIN if recorded is None else float(recorded)
        self.shield_margin: float | None = shield_margin
        if batch_reserve == FROM_CHECKPOINT:
            batch_reserve = float(self.net.meta.get("batch_reserve", 0.0)) if self.net is not None else 0.0
        self.batch_reserve: float = batch_reserve

    def reset(self) -> None:
        return None

    def refine(self, clusters: ClusterFeatures, workload: WorkloadFeatures, feasible: np.ndarray,
               scores: np.ndarray) -> np.ndarray:
        """Defer only when allowed, and the shield (module doc), on the current state of the clusters."""
        scores = scores.copy()
        if not can_defer(workload):
            scores[-1] = -np.inf
        if self.shield_margin is None:
            return scores
        if workload.latency_slo_ms <= 0 and self.batch_reserve > 0:
            reserved = feasible & slo_safe(clusters, workload, self.shield_margin + self.batch_reserve)
            if reserved.any() or can_defer(workload):
                # Outside the reserve, or wait (an hour later, room or a cleaner hour may be there).
                scores[:-1] = np.where(reserved, scores[:-1], -np.inf)
                return scores
        safe = feasible & slo_safe(clusters, workload, self.shield_margin)
        if safe.any():
            scores[:-1] = np.where(safe, scores[:-1], -np.inf)
        elif feasible.any():
            # No cluster keeps the margin: give the margin up, but never place where an SLO would break
            # (the workload's own or a running one's). If every cluster would, the workload waits
            # (admission control: held in the queue and retried, as kube-scheduler leaves a pod pending)
            # instead of breaking the SLOs of everything already running there.
            within = feasible & (slo_excess(clusters, workload, 0.0) <= 0)
            scores[:-1] = np.where(within, scores[:-1], -np.inf)
        return scores

    def _fallback(self, clusters: ClusterFeatures, workload: WorkloadFeatures) -> np.ndarray:
        self.fallbacks += 1
        crowded = utilisation_after(clusters, workload) > 0.85
        return with_defer(-clusters.carbon_now - 1e3 * crowded)

    def score(self, clusters: ClusterFeatures, workload: WorkloadFeatures, feasible: np.ndarray) -> np.ndarray:
        if self.net is not None:
            try:
                return self.refine(clusters, workload, feasible, self.net.logits(clusters, workload))
            except Exception:  # a model error must not stop routing
                log.exception("gnn routing: model failed; using the fallback for this decision")
        return self._fallback(clusters, workload)

    def score_batch(self, clusters: ClusterFeatures, workloads: list[WorkloadFeatures]) -> np.ndarray | None:
        """Raw ``(B, n + 1)`` logits for many workloads in one forward pass (refined per decision), or None."""
        if self.net is None:
            return None
        try:
            return self.net.logits_batch(clusters, workloads)
        except Exception:
            log.exception("gnn routing: batched model call failed; deciding one by one")
            return None


def build(checkpoint: str | Path | None = None,
          shield_margin: float | Literal["checkpoint"] | None = FROM_CHECKPOINT,
          batch_reserve: float | Literal["checkpoint"] = FROM_CHECKPOINT) -> GnnRouting:
    return GnnRouting(checkpoint, shield_margin=shield_margin, batch_reserve=batch_reserve)
