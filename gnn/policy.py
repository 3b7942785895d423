"""The routing policy: a :class:`~gnn.gatv2_router.GATv2Router` plus what it needs to decide and to
be rebuilt from a checkpoint (feature layout version, graph neighbours, training metadata).

Checkpoints are a plain dict of tensors and JSON-able values, loaded with
``torch.load(..., weights_only=True)`` only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnn.features import (
    CLUSTER_FEATURES,
    EDGE_FEATURES,
    FEATURE_VERSION,
    WORKLOAD_FEATURES,
    ClusterFeatures,
    WorkloadFeatures,
)
from gnn.gatv2_router import GATv2Router
from gnn.graph import DEFAULT_NEIGHBOURS, GraphBuilder

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "router.pt"


class CheckpointError(RuntimeError):
    pass


class GnnRoutingNet:
    """Model + graph builder; ``logits`` gives ``(n + 1,)`` scores, the last one "defer"."""

    def __init__(self, model: GATv2Router | None = None, *, neighbours: int = DEFAULT_NEIGHBOURS,
                 meta: dict[str, Any] | None = None) -> None:
        self.model = model or GATv2Router(len(CLUSTER_FEATURES) + len(WORKLOAD_FEATURES), len(WORKLOAD_FEATURES),
                                          len(EDGE_FEATURES))
        self.builder = GraphBuilder(neighbours, self_loops=self.model.graph_self_loops)
        self.meta = meta or {}

    def graph(self, clusters: ClusterFeatures, workload: WorkloadFeatures) -> Any:
        return self.builder.build(clusters, workload)

    def logits(self, clusters: ClusterFeatures, workload: WorkloadFeatures) -> np.ndarray:
        g = self.graph(clusters, workload)
        self.model.eval()
        with torch.inference_mode():
            scores, defer = self.model(g.x, g.edge_index, g.edge_attr, g.workload)
        return torch.cat([scores, defer]).numpy().astype(np.float64)

    def save(self, path: str | Path, meta: dict[str, Any] | None = None) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        torch.save({"state_dict": state, "config": self.model.config(), "feature_version": FEATURE_VERSION,
                    "neighbours": self.builder.neighbours,
                    "meta_json": json.dumps({**self.meta, **(meta or {})}, sort_keys=True)}, path)
        return path

    @classmethod
    def load(cls, path: str | Path = DEFAULT_CHECKPOINT) -> GnnRoutingNet:
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"routing checkpoint not found: {path}")
        blob = torch.load(path, map_location="cpu", weights_only=True)
        if blob.get("feature_version") != FEATURE_VERSION:
            raise CheckpointError(f"{path}: feature version {blob.get('feature_version')} != {FEATURE_VERSION}")
        config = {"graph_self_loops": False, **blob["config"]}  # older checkpoints: loops added in the layer
        model = GATv2Router(**config)
        model.load_state_dict(blob["state_dict"])
        model.eval()
        return cls(model, neighbours=int(blob["neighbours"]), meta=json.loads(blob["meta_json"]))


def set_random_seed(seed: int) -> None:
    """One seed for ``random``, numpy and torch (the simulator takes the same seed)."""
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
