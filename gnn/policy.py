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
    cluster_matrix,
    cluster_matrix_batch,
    workload_vector,
)
from gnn.gatv2_router import GATv2Router
from gnn.graph import DEFAULT_NEIGHBOURS, GraphBuilder
from gnn.numpy_router import NumpyGATv2Router
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "router.pt"


class CheckpointError(RuntimeError):
    pass


class GnnRoutingNet:
    """Model + graph builder; ``logits`` gives ``(n + 1,)`` scores, the last one "defer"."""

    def __init__(self, model: GATv2Router | None = None, *, neighbours: int = DEFAULT_NEIGHBOURS,
                 layers: int = 1, meta: dict[str, Any] | None = None) -> None:
        # One GATv2 layer by default: at 100 clusters each layer costs ~0.3-0.5 ms of a decision, and a
        # second one did not improve agreement with the teacher (both ~0.66-0.68 top-1).
        self.model = model or GATv2Router(len(CLUSTER_FEATURES) + len(WORKLOAD_FEATURES), len(WORKLOAD_FEATURES),
                                          len(EDGE_FEATURES), layers=layers)
        self.builder = GraphBuilder(neighbours, self_loops=self.model.graph_self_loops)
        self.meta = meta or {}
        self._fast: NumpyGATv2Router | None = None
        self._fast_version: tuple[int, ...] = ()

    def graph(self, clusters: ClusterFeatures, workload: WorkloadFeatures) -> Any:
        return self.builder.build(clusters, workload)

    def logits(self, clusters: ClusterFeatures, workload: WorkloadFeatures) -> np.ndarray:
        # The decision path skips the PyG Data container (tens of microseconds at 100 clusters) and,
        # where it can, torch itself (gnn.numpy_router).
        node = cluster_matrix(clusters, workload)
        wl = workload_vector(clusters, workload)
        x = np.empty((node.shape[0], node.shape[1] + wl.shape[0]), dtype=np.float32)
        x[:, :node.shape[1]] = node
        x[:, node.shape[1]:] = wl
        edge_index, edge_attr = self.builder.edges(clusters)
        if self.model.training:
            self.model.eval()
        fast = self._numpy_forward()
        if fast is not None:
            scores, defer = fast.forward(x, edge_index, edge_attr, wl)
        else:
            with torch.inference_mode():
                t_scores, t_defer = self.model(torch.from_numpy(x), edge_index, edge_attr,
                                               torch.from_numpy(wl).unsqueeze(0))
            scores, defer = t_scores.numpy(), float(t_defer[0])
        out = np.empty(node.shape[0] + 1)
        out[:-1] = scores
        out[-1] = defer
        return out

    def _numpy_forward(self) -> NumpyGATv2Router | None:
        """The numpy forward of the current weights, re-exported when training has changed them (an
        optimiser step bumps each parameter's version counter); None for graphs without self loops."""
        if not self.model.graph_self_loops:
            return None
        version = tuple(p._version for p in self.model.parameters())
        if self._fast is None or self._fast_version != version:
            self._fast, self._fast_version = NumpyGATv2Router(self.model), version
        return self._fast

    def logits_batch(self, clusters: ClusterFeatures, workloads: list[WorkloadFeatures]) -> np.ndarray:
        """``(B, n + 1)`` logits of many workloads over one snapshot, in one forward pass (disjoint union)."""
        n, b = clusters.n, len(workloads)
        node = cluster_matrix_batch(clusters, workloads)  # (B, n, Fc)
        wv = np.stack([workload_vector(clusters, w) for w in workloads])  # (B, Fw)
        x_np = np.empty((b, n, node.shape[2] + wv.shape[1]), dtype=np.float32)
        x_np[:, :, :node.shape[2]] = node
        x_np[:, :, node.shape[2]:] = wv[:, None, :]
        x = torch.from_numpy(x_np.reshape(b * n, -1))
        wl = torch.from_numpy(wv)
        edge_index, edge_attr = self.builder.edges(clusters)
        e = edge_index.shape[1]
        offsets = (torch.arange(b, dtype=torch.int64) * n).repeat_interleave(e)
        ei = edge_index.repeat(1, b) + offsets
        ea = edge_attr.repeat(b, 1)
        batch = torch.arange(b, dtype=torch.int64).repeat_interleave(n)
        if self.model.training:
            self.model.eval()
        with torch.inference_mode():
            scores, defer = self.model(x, ei, ea, wl, batch)
        out = np.empty((b, n + 1))
        out[:, :n] = scores.numpy().reshape(b, n)
        out[:, n] = defer.numpy()
        return out

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
