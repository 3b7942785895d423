"""The cluster graph as a PyTorch Geometric :class:`~torch_geometric.data.Data`.

Nodes are clusters; each cluster receives edges from its ``k`` nearest clusters by round trip
(clusters of its own region first, ties by index), so the graph stays sparse (``E = k·N``) and a
decision over 100 clusters stays near a millisecond on one core: GATv2's cost grows with ``E``, and a
complete graph over 100 clusters (9,900 edges) measured 5.7 ms against 1.1 ms at ``k = 8``. Edge features are the round trip and
the bandwidth between the regions. The workload's features are broadcast onto every node
(``x = [cluster features ‖ workload features]``), so the network scores "this workload on this
cluster" with its neighbourhood in view.
"""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import Data

from gnn.features import BANDWIDTH_SCALE_GBPS, RTT_SCALE_MS, cluster_matrix, workload_vector
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures

DEFAULT_NEIGHBOURS = 8


def cluster_edges(region_index: np.ndarray, rtt_ms: np.ndarray, bandwidth_gbps: np.ndarray,
                  neighbours: int = DEFAULT_NEIGHBOURS, *, self_loops: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(2, E) edge index and (E, 2) edge features; with ``self_loops`` each cluster also gets an edge to
    itself carrying its own region's round trip and bandwidth."""
    reg = region_index
    n = reg.shape[0]
    rtt = rtt_ms[reg[:, None], reg[None, :]].astype(np.float64)
    k = min(neighbours, n - 1)
    idx = np.arange(n)
    if k <= 0:
        src = dst = idx if self_loops else idx[:0]
        attr = np.stack([rtt[src, dst] / RTT_SCALE_MS, bandwidth_gbps[reg[src], reg[dst]] / BANDWIDTH_SCALE_GBPS], axis=1)
        return (torch.from_numpy(np.stack([src, dst]).astype(np.int64)),
                torch.from_numpy(attr.reshape(-1, 2).astype(np.float32)))
    # Tie-break by index distance so equal round trips give a deterministic, spread-out choice.
    key = rtt * n + np.abs(idx[:, None] - idx[None, :]) / n
    np.fill_diagonal(key, np.inf)
    nearest = np.argpartition(key, k - 1, axis=1)[:, :k]  # (n, k): sources for each destination
    dst = np.repeat(idx, k)
    src = nearest.reshape(-1)
    if self_loops:
        src = np.concatenate([src, idx])
        dst = np.concatenate([dst, idx])
    attr = np.stack([rtt[src, dst] / RTT_SCALE_MS,
                     bandwidth_gbps[reg[src], reg[dst]] / BANDWIDTH_SCALE_GBPS], axis=1)
    return (torch.from_numpy(np.stack([src, dst]).astype(np.int64)),
            torch.from_numpy(attr.astype(np.float32)))


class GraphBuilder:
    """Builds graphs for one federation layout; caches the edges (they change only with the layout)."""

    def __init__(self, neighbours: int = DEFAULT_NEIGHBOURS, *, self_loops: bool = False) -> None:
        self.neighbours = neighbours
        self.self_loops = self_loops
        self._key: tuple | None = None
        self._edges: tuple[torch.Tensor, torch.Tensor] | None = None

    def edges(self, c: ClusterFeatures) -> tuple[torch.Tensor, torch.Tensor]:
        key = (c.region_index.tobytes(), c.rtt_ms.tobytes(), c.bandwidth_gbps.tobytes())
        if key != self._key or self._edges is None:
            self._edges = cluster_edges(c.region_index, c.rtt_ms, c.bandwidth_gbps, self.neighbours,
                                        self_loops=self.self_loops)
            self._key = key
        return self._edges

    def build(self, c: ClusterFeatures, w: WorkloadFeatures) -> Data:
        node = cluster_matrix(c, w)
        wl = workload_vector(c, w)
        x = np.concatenate([node, np.broadcast_to(wl, (c.n, wl.shape[0]))], axis=1)
        edge_index, edge_attr = self.edges(c)
        return Data(x=torch.from_numpy(np.ascontiguousarray(x)), edge_index=edge_index, edge_attr=edge_attr,
                    workload=torch.from_numpy(wl).unsqueeze(0))
