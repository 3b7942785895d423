"""The :class:`~gnn.gatv2_router.GATv2Router` forward pass in numpy, for one decision's graph.

A routing decision runs the network once over a ~100-node graph. Through torch and PyG that is ~60
small operator calls, each with ~10 µs of dispatch, so the dispatch, not the arithmetic, was most of
a decision (PyG's GATv2Conv alone ~1 ms on a slow core). Here the same arithmetic takes ~20 numpy calls:

- the graph of a cluster layout is fixed, so its edges are sorted by target once, and each layer's
  edge term ``W_e e_ij`` (edge features do not depend on the workload) is computed once per layout;
- the attention softmax over each node's incoming edges is a segment max and a segment sum
  (``reduceat``) over the sorted edges, as PyG's ``softmax`` does with scatter.

It follows PyG's GATv2Conv as the router configures it (``concat=False``, ``share_weights=False``,
no residual inside the layer, negative slope 0.2, self loops already in the graph) and equals the torch
forward to float32 rounding (a test compares them on the committed checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gnn.gatv2_router import GATv2Router

_NEGATIVE_SLOPE = 0.2


def _elu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0)))


@dataclass(frozen=True)
class _Layer:
    w_l: np.ndarray  # (hidden, H*C), transposed for x @ w
    b_l: np.ndarray
    w_r: np.ndarray
    b_r: np.ndarray
    w_e: np.ndarray  # (edge features, H*C)
    att: np.ndarray  # (H, C)
    bias: np.ndarray  # (C,)


@dataclass(frozen=True)
class _Edges:
    """One layout's edges, sorted by target node, and each layer's edge term."""

    src: np.ndarray
    dst: np.ndarray
    starts: np.ndarray  # first edge of each target node (every node has its self loop)
    edge_terms: list[np.ndarray]  # per layer (E, H, C)


class NumpyGATv2Router:
    """The forward pass of a :class:`GATv2Router` with its weights at export time (eval mode)."""

    def __init__(self, model: GATv2Router) -> None:
        if not model.graph_self_loops:
            raise ValueError("the numpy forward needs a graph that carries its self loops (graph_self_loops)")
        sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
        self.heads, self.hidden = model.heads, model.hidden
        self.w_enc, self.b_enc = sd["encoder.weight"].T.copy(), sd["encoder.bias"]
        self.layers = [
            _Layer(sd[f"convs.{i}.lin_l.weight"].T.copy(), sd[f"convs.{i}.lin_l.bias"],
                   sd[f"convs.{i}.lin_r.weight"].T.copy(), sd[f"convs.{i}.lin_r.bias"],
                   sd[f"convs.{i}.lin_edge.weight"].T.copy(), sd[f"convs.{i}.att"].reshape(self.heads, self.hidden),
                   sd[f"convs.{i}.bias"])
            for i in range(model.n_layers)
        ]
        self.score = [(sd[f"score_head.{j}.weight"].T.copy(), sd[f"score_head.{j}.bias"]) for j in (0, 2)]
        self.defer = [(sd[f"defer_head.{j}.weight"].T.copy(), sd[f"defer_head.{j}.bias"]) for j in (0, 2)]
        self._edges_for: tuple[torch.Tensor, torch.Tensor] | None = None
        self._edges: _Edges | None = None

    def _prepare_edges(self, edge_index: torch.Tensor, edge_attr: torch.Tensor, n: int) -> _Edges:
        if self._edges is not None and self._edges_for is not None and self._edges_for[0] is edge_index \
                and self._edges_for[1] is edge_attr:
            return self._edges
        ei = edge_index.numpy()
        order = np.argsort(ei[1], kind="stable")
        src, dst = ei[0][order], ei[1][order]
        if not np.array_equal(np.unique(dst), np.arange(n)):
            raise ValueError("every node needs an incoming edge (its self loop)")
        starts = np.flatnonzero(np.r_[True, dst[1:] != dst[:-1]])
        attr = edge_attr.numpy().astype(np.float32)[order]
        terms = [(attr @ layer.w_e).reshape(-1, self.heads, self.hidden) for layer in self.layers]
        self._edges = _Edges(src, dst, starts, terms)
        self._edges_for = (edge_index, edge_attr)
        return self._edges

    def forward(self, x: np.ndarray, edge_index: torch.Tensor, edge_attr: torch.Tensor,
                workload: np.ndarray) -> tuple[np.ndarray, float]:
        """``(scores (N,), defer)`` for one graph: ``x`` (N, F) with the workload broadcast."""
        e = self._prepare_edges(edge_index, edge_attr, x.shape[0])
        h = _elu(x @ self.w_enc + self.b_enc)
        n, hc = h.shape[0], (self.heads, self.hidden)
        for layer, edge_term in zip(self.layers, e.edge_terms, strict=True):
            x_l = (h @ layer.w_l + layer.b_l).reshape(n, *hc)
            x_r = (h @ layer.w_r + layer.b_r).reshape(n, *hc)
            x_j = x_l[e.src]  # (E, H, C): the message's source term, used twice
            m = x_j + x_r[e.dst]
            m += edge_term
            m = np.maximum(m, m * np.float32(_NEGATIVE_SLOPE))  # LeakyReLU (slope < 1)
            alpha = np.einsum("ehc,hc->eh", m, layer.att)
            alpha = np.exp(alpha - np.maximum.reduceat(alpha, e.starts, axis=0)[e.dst])
            alpha /= np.add.reduceat(alpha, e.starts, axis=0)[e.dst] + np.float32(1e-16)
            x_j *= alpha[:, :, None]
            out = np.add.reduceat(x_j, e.starts, axis=0)  # (N, H, C)
            h = h + _elu(out.mean(axis=1) + layer.bias)
        (w0, b0), (w1, b1) = self.score
        scores = (_elu(np.concatenate([h, x], axis=1) @ w0 + b0) @ w1 + b1)[:, 0]
        pooled = np.concatenate([h.mean(axis=0), h.max(axis=0), workload])
        (w0, b0), (w1, b1) = self.defer
        defer = float((_elu(pooled @ w0 + b0) @ w1 + b1)[0])
        return scores, defer
