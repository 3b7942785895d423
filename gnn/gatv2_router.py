"""GATv2 cluster router: one score per cluster plus one score for "defer to a later hour".

Paper: Brody, Alon & Yahav, "How Attentive are Graph Attention Networks?", ICLR 2022 (GATv2).
GATv2 is used rather than GraphSAGE because the value of a neighbour depends on *this* cluster's
state (a nearby cluster with spare room matters when this one is full and not otherwise); GATv2's
dynamic attention ranks neighbours conditioned on the receiving node, which GAT and SAGE cannot.

Update rule (per layer ``l``, heads averaged, with a residual connection):

    e_ij   = aᵀ · LeakyReLU(W_s h_j + W_t h_i + W_e e_ij)        for j ∈ N(i) ∪ {i}
    α_ij   = softmax_j(e_ij)
    h_i'   = h_i + ELU( Σ_j α_ij · W_s h_j )

Heads: ``score_i = MLP([h_i ‖ w])`` for each cluster and ``defer = MLP([mean_i h_i ‖ max_i h_i ‖ w])``
where ``w`` is the workload vector.

Shapes: ``x`` (N, F_c + F_w) cluster features with the workload broadcast; ``edge_index`` (2, E);
``edge_attr`` (E, F_e); ``workload`` (B, F_w); ``batch`` (N,) graph index of each node (``None``: one
graph, B = 1). Output: ``(scores (N,), defer (B,))`` logits. A decision uses one graph; training
stacks many decisions into one disjoint-union batch, PyG style.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GATv2Conv, global_max_pool, global_mean_pool


class GATv2Router(nn.Module):
    def __init__(self, in_channels: int, workload_channels: int, edge_channels: int = 2, hidden: int = 32,
                 layers: int = 2, heads: int = 2, dropout: float = 0.0, graph_self_loops: bool = True) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.workload_channels = workload_channels
        self.edge_channels = edge_channels
        self.hidden = hidden
        self.n_layers = layers
        self.heads = heads
        self.dropout = dropout
        # True: the graph already carries self loops with their own edge features (built once per
        # layout and cached), so the convolutions do not add them on every call (0.5 → 0.3 ms a layer
        # at 100 clusters). Checkpoints from before this option add them in the layer.
        self.graph_self_loops = graph_self_loops
        self.encoder = nn.Linear(in_channels, hidden)
        self.convs = nn.ModuleList(
            GATv2Conv(hidden, hidden, heads=heads, concat=False, edge_dim=edge_channels, dropout=dropout,
                      add_self_loops=not graph_self_loops, fill_value="mean")
            for _ in range(layers)
        )
        self.score_head = nn.Sequential(nn.Linear(hidden + in_channels, hidden), nn.ELU(), nn.Linear(hidden, 1))
        self.defer_head = nn.Sequential(nn.Linear(2 * hidden + workload_channels, hidden), nn.ELU(),
                                        nn.Linear(hidden, 1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.encoder.reset_parameters()
        for conv in self.convs:
            conv.reset_parameters()
        for head in (self.score_head, self.defer_head):
            for layer in head:
                if isinstance(layer, nn.Linear):
                    layer.reset_parameters()

    def config(self) -> dict[str, int | float]:
        """Everything needed to rebuild the module from a checkpoint."""
        return {"in_channels": self.in_channels, "workload_channels": self.workload_channels,
                "edge_channels": self.edge_channels, "hidden": self.hidden, "layers": self.n_layers,
                "heads": self.heads, "dropout": self.dropout, "graph_self_loops": self.graph_self_loops}

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor,
                workload: torch.Tensor, batch: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.nn.functional.elu(self.encoder(x))
        for conv in self.convs:
            h = h + torch.nn.functional.elu(conv(h, edge_index, edge_attr))
        scores = self.score_head(torch.cat([h, x], dim=1)).squeeze(1)
        if batch is None:
            pooled = torch.cat([h.mean(dim=0, keepdim=True), h.max(dim=0, keepdim=True).values], dim=1)
        else:
            pooled = torch.cat([global_mean_pool(h, batch), global_max_pool(h, batch)], dim=1)
        defer = self.defer_head(torch.cat([pooled, workload], dim=1)).squeeze(1)
        return scores, defer

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, hidden={self.hidden}, layers={self.n_layers}, "
                f"heads={self.heads})")
