"""The routing training algorithm: supervised imitation of a teacher's per-decision distributions.

The environment side (which decisions to visit, what the teacher says) lives with the simulator in
:mod:`global_scheduler.routing_training`; this module only knows samples and the model, so the
algorithm is testable without a simulator (Stable-Baselines3 keeps algorithm and policy apart the
same way).

Loss: cross-entropy between the teacher's distribution and the policy's masked softmax over
``[clusters…, defer]`` of each decision.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch_geometric.utils import to_dense_batch

from gnn.buffers import DecisionBuffer, collate
from gnn.policy import GnnRoutingNet


def decision_logits(net: GnnRoutingNet, batch, n_max: int) -> torch.Tensor:
    """(B, n_max) logits: the clusters of each graph (padded) with "defer" in the last column."""
    scores, defer = net.model(batch.x, batch.edge_index, batch.edge_attr, batch.workload, batch.batch)
    dense, _present = to_dense_batch(scores, batch.batch, fill_value=0.0, max_num_nodes=n_max - 1)
    return torch.cat([dense, defer.unsqueeze(1)], dim=1)


def imitation_loss(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    masked = logits.masked_fill(~mask, -1e9)
    logp = torch.log_softmax(masked, dim=1)
    return -(target * logp.masked_fill(~mask, 0.0)).sum(dim=1).mean()


def train_imitation(net: GnnRoutingNet, buffer: DecisionBuffer, *, epochs: int = 4, batch_size: int = 128,
                    lr: float = 3e-3, weight_decay: float = 1e-5, seed: int = 0,
                    on_batch: Callable[[float], None] | None = None) -> list[float]:
    """Fit the policy to the buffer; returns the mean loss of each epoch.

    Keyword arguments: ``epochs`` passes over the buffer; ``batch_size`` decisions per step; ``lr``
    Adam step size; ``weight_decay`` L2 on weights; ``seed`` for the batch order.
    """
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(net.model.parameters(), lr=lr, weight_decay=weight_decay)
    net.model.train()
    history = []
    for _ in range(epochs):
        losses = []
        for batch, target, mask, _counts in buffer.batches(batch_size, rng):
            logits = decision_logits(net, batch, target.shape[1])
            loss = imitation_loss(logits, target, mask)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            if on_batch is not None:
                on_batch(loss.item())
        history.append(float(np.mean(losses)) if losses else float("nan"))
    net.model.eval()
    return history


def agreement(net: GnnRoutingNet, buffer: DecisionBuffer, batch_size: int = 512) -> float:
    """Share of decisions where the policy's top choice is the teacher's top choice."""
    if not len(buffer):
        return float("nan")
    hits = 0
    net.model.eval()
    with torch.inference_mode():
        for start in range(0, len(buffer), batch_size):
            batch, target, mask, _ = collate(buffer.samples[start:start + batch_size])
            logits = decision_logits(net, batch, target.shape[1]).masked_fill(~mask, -1e9)
            hits += int((logits.argmax(dim=1) == target.argmax(dim=1)).sum())
    return hits / len(buffer)
