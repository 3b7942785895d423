"""``meridian explain``: why the learned policy put one pod where it did.

For one placement we show the top nodes with their served scores, FGD's own score of each (the
residual policy's base) and the features that drove the learned correction ``g``: gradient × input attributions (Simonyan et al. 2014; Shrikumar et al. 2016) of the
node's logit with respect to its own normalised features, measured from the training mean (a
feature at its average contributes 0). The pooled cluster context and the pod's features are the
same for every node, so they shift all scores alike and are not attributed per node. The filter's
diagnosis says how many nodes each hard constraint removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from meridian.cluster_state import ClusterState
from meridian.model import Pod
from regional_scheduler.filters import run_filters
from regional_scheduler.learned.features import NODE_FEATURES
from regional_scheduler.learned.policy import near_best
from regional_scheduler.learned.serving import LearnedScorer


@dataclass
class NodeExplanation:
    node: str
    score: float
    rank: int
    fgd_score: float = 0.0
    top_features: list[tuple[str, float, float]] = field(default_factory=list)  # (name, value, attribution)


@dataclass
class PlacementExplanation:
    pod: str
    profile: str
    n_nodes: int
    n_feasible: int
    rejected_by: dict[str, int]
    chosen: str | None
    nodes: list[NodeExplanation]
    # Set when the profile's ``gate_share`` leaves this workload to FGD: no correction to attribute.
    gate: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod, "profile": self.profile, "n_nodes": self.n_nodes, "n_feasible": self.n_feasible,
            "rejected_by": self.rejected_by, "chosen": self.chosen, "gate": self.gate,
            "nodes": [{"node": n.node, "score": n.score, "rank": n.rank, "fgd_score": n.fgd_score,
                       "top_features": [{"feature": f, "value": v, "attribution": a} for f, v, a in n.top_features]}
                      for n in self.nodes],
        }


def explain(scorer: LearnedScorer, state: ClusterState, pod: Pod, *, top: int = 5,
            n_features: int = 5) -> PlacementExplanation:
    mask, diagnosis = run_filters(state, pod)
    nodes = np.flatnonzero(mask)
    base = PlacementExplanation(pod.name, scorer.profile, state.n_nodes, int(nodes.size), diagnosis.rejected_by,
                                None, [])
    if nodes.size == 0:
        return base
    net = scorer.net
    # Rank with the serving path's own scores, so the explanation names the node actually chosen;
    # torch (same weights, same formula, context pooled over the same near-best set) only supplies
    # the gradients of the correction g.
    fgd = scorer.features.fgd.score(state, pod, nodes).scores
    served = scorer.score(state, pod, nodes).scores
    if scorer.left_to_fgd:
        base.gate = (f"{scorer.constrained_share:.0%} of the workload's GPU pods are GPU-model-constrained, at "
                     f"or above the profile's gate_share {net.gate_share:.0%}: FGD places every pod, with no "
                     "correction")
        for rank, i in enumerate(np.argsort(-served, kind="stable")[:top]):
            base.nodes.append(NodeExplanation(state.names[int(nodes[i])], float(served[i]), rank + 1, float(fgd[i])))
        base.chosen = base.nodes[0].node
        return base
    x_np, _ = scorer.features.node_features(state, pod, nodes)
    p_np = scorer.features.pod_features(state, pod, nodes.size)
    near = near_best(fgd, net.residual_bound)
    x = torch.from_numpy(x_np).requires_grad_(True)
    context = net.pooled(x.detach()[torch.from_numpy(near)])
    logits = net(x, torch.from_numpy(p_np), context=context)
    order = np.argsort(-served, kind="stable")[:top]
    grads = torch.autograd.grad(logits[torch.from_numpy(order)].sum(), x)[0].numpy()
    normalised = ((x.detach() - net.feature_mean) / net.feature_std).numpy()
    # d logit / d x_raw × (x_raw − mean) = d logit / d x_norm × x_norm.
    attributions = grads * normalised * net.feature_std.numpy()
    for rank, i in enumerate(order):
        strongest = np.argsort(-np.abs(attributions[i]), kind="stable")[:n_features]
        base.nodes.append(NodeExplanation(
            state.names[int(nodes[i])], float(served[i]), rank + 1, float(fgd[i]),
            [(NODE_FEATURES[j], float(x_np[i, j]), float(attributions[i, j])) for j in strongest]))
    base.chosen = base.nodes[0].node
    return base
