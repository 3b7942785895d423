"""The routing tier's checkpoint validator for the model registry (``meridian.model_validators``: ``routing``):
a checkpoint is registered only if :meth:`gnn.policy.GnnRoutingNet.load` (``torch.load(..., weights_only=True)``)
rebuilds the router for this build's feature version and sizes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


class RoutingCheckpointValidator:
    """Loads a GNN router checkpoint as serving would; refuses one of another feature version or shape."""

    def validate(self, path: Path) -> dict[str, Any]:
        from gnn.features import CLUSTER_FEATURES, EDGE_FEATURES, FEATURE_VERSION, WORKLOAD_FEATURES
        from gnn.policy import CheckpointError, GnnRoutingNet

        try:
            net = GnnRoutingNet.load(path)
        except CheckpointError:
            raise
        except Exception as exc:  # torch raises several types for a foreign, corrupt or mis-sized file
            raise CheckpointError(f"{path}: not a routing checkpoint of this build's layout: {exc}") from exc
        layout = {"cluster": list(CLUSTER_FEATURES), "workload": list(WORKLOAD_FEATURES), "edge": list(EDGE_FEATURES)}
        return {"feature_version": FEATURE_VERSION, "cluster_features": len(CLUSTER_FEATURES),
                "workload_features": len(WORKLOAD_FEATURES), "edge_features": len(EDGE_FEATURES),
                "layout_sha256": hashlib.sha256(json.dumps(layout).encode()).hexdigest(),
                "neighbours": net.builder.neighbours}
