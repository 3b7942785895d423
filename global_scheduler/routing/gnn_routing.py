"""``gnn``: the GATv2 router from :mod:`gnn`, loaded from a checkpoint.

Without a checkpoint (or if the model raises) the policy falls back to ``least-carbon`` scores with
a headroom penalty and says so once in the log and in ``fallbacks``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from global_scheduler.routing.base import can_defer, with_defer
from gnn.features import ClusterFeatures, WorkloadFeatures, utilisation_after
from gnn.policy import DEFAULT_CHECKPOINT, CheckpointError, GnnRoutingNet

NAME = "gnn"
log = logging.getLogger(__name__)


class GnnRouting:
    name = NAME

    def __init__(self, checkpoint: str | Path | None = None, net: GnnRoutingNet | None = None) -> None:
        torch.set_num_threads(1)
        self.fallbacks = 0
        self.net: GnnRoutingNet | None = net
        if self.net is None:
            try:
                self.net = GnnRoutingNet.load(checkpoint or DEFAULT_CHECKPOINT)
            except CheckpointError as exc:
                log.warning("gnn routing: %s; falling back to the headroom-aware least-carbon heuristic", exc)

    def reset(self) -> None:
        return None

    def score(self, clusters: ClusterFeatures, workload: WorkloadFeatures, feasible: np.ndarray) -> np.ndarray:
        if self.net is not None:
            try:
                scores = self.net.logits(clusters, workload)
                if not can_defer(workload):
                    scores[-1] = -np.inf
                return scores
            except Exception:  # a model error must not stop routing
                log.exception("gnn routing: model failed; using the fallback for this decision")
        self.fallbacks += 1
        crowded = utilisation_after(clusters, workload) > 0.85
        return with_defer(-clusters.carbon_now - 1e3 * crowded)


def build(checkpoint: str | Path | None = None) -> GnnRouting:
    return GnnRouting(checkpoint)
