"""The learned placement policy's network: one logit per candidate node, permutation-invariant.

**Residual policy over FGD** (checkpoint version 2; Silver et al. 2018, "Residual Policy
Learning"). The served logit of candidate ``i`` is

    logit_i = fgd_i + b · squash(g_i)  for i in N = {j : fgd_j > max_k fgd_k − 2b}
    logit_i = fgd_i − b                otherwise (such a node cannot win)

where ``fgd_i`` is FGD's own integer node score (``FgdPolicy.score``, exactly as the ``fgd``
baseline computes it), ``b`` the checkpoint's ``residual_bound`` and ``g`` the network below,
evaluated on the near-best set ``N`` only (its pooled context too). With ``b < 0.5`` the
correction can only re-order FGD's exactly tied best nodes (FGD sends them to the first in node
order); with ``0.5 ≤ b < 1`` also the next score bin. With ``g ≡ 0`` every near-best logit equals
the best FGD score and the scheduler's first-in-order rule picks FGD's own node: the policy *is*
FGD, and training starts there (:func:`residual_logits`). ``squash(g) = (2/π)·arctan(g)`` maps
onto (−1, 1) like tanh but saturates slowly, so large corrections keep their order in float64
(tanh(g) is exactly 1.0 for g ≳ 19, which would turn distinct scores into ties). On a CPU-only cluster FGD scores every
node alike, so the policy is ``argmax g`` over all candidates.

Architecture of ``g`` (Deep Sets style; Zaheer et al., NeurIPS '17): for candidate node ``i`` with
features ``x_i`` (``N_NODE``), the pod's features ``p`` (``N_POD``) and the candidates' pooled
context ``c = [mean_j x_j ‖ max_j x_j]`` (``2·N_NODE``),

    g_i = w_lin · x_i  +  MLP([x_i ‖ p ‖ c])

With ``gate_unused`` (a hyper-parameter), an *unused* node (no pod on it: the ``node_unused``
feature is 1) gets the constant ``g_i = w_lin[node_unused]`` instead: the correction then never
chooses between empty nodes, which keep FGD's first-in-order rule. That rule is model-agnostic —
it opens nodes in list order, whatever their GPU model — whereas a correction that reads node
size or type opens all nodes of one kind first and can exhaust a GPU model that model-constrained
pods need (seen on the validation split: −4.3 points on an augmented ``gpushare40`` run).

With ``gate_constrained`` (a hyper-parameter), a pod with a GPU-model constraint gets
``g ≡ 0`` on every candidate: FGD places it exactly as the ``fgd`` baseline would. Such a pod can only
go to nodes of its model, and re-ordering FGD's ties among them was a net loss on the validation
split's augmented runs (``docs/history/bench-learned-diary.md``, "gate_constrained").

With ``gate_gpu_pods`` (a hyper-parameter), every pod that asks for a GPU gets ``g ≡ 0``:
the correction only places CPU-only pods. On a GPU cluster a CPU-only pod's node decides whose GPUs
its CPU strands, FGD's fragmentation delta scores that coarsely (most nodes tie), and that is where
the correction's gains were found on the validation split; re-ordering the GPU pods' ties added
nothing on average there and caused most of the runs behind FGD
(``docs/history/bench-learned-diary.md``, "gate_gpu_pods").

With ``gate_share`` (a hyper-parameter), the whole workload is left to FGD when the share
of its GPU pods that carry a GPU-model constraint is at least ``gate_share``. Serving applies it
(:class:`~regional_scheduler.learned.serving.LearnedScorer`), from FGD's window of recent pods or, when a
benchmark states it (``--paper``), the workload's distribution. On a validation split constrained like the ``gpuspec`` lists, the
correction lost to FGD on all seven runs with a share ≥ 0.25
(``docs/history/bench-learned-diary.md``, "a validation split with gpuspec-shaped constraints").

The MLP is shared across nodes, so the network is independent of the cluster's size and of the
node order; the linear *heuristic head* ``w_lin`` reads the baselines' scores directly, which makes
imitation of a heuristic easy and gives policy search a small, well-conditioned subspace to tune.
Infeasible nodes never reach the network (the scheduler's filter removes them); :func:`masked_logits`
sets them to ``-inf`` where a full-width mask is used (training).

Shapes: ``node_features (k, N_NODE)`` → ``logits (k,)``; batched training uses ``(B, K, N_NODE)``
with a ``(B, K)`` validity mask. The serving copy of the network in numpy is
:mod:`regional_scheduler.learned.numpy_policy`; checkpoint files are :mod:`regional_scheduler.learned.checkpoint`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from regional_scheduler.learned.features import IDX, N_NODE, N_POD, POD_FEATURES

UNUSED = IDX["node_unused"]
CONSTRAINED = POD_FEATURES.index("has_gpu_model_constraint")
CPU_ONLY = POD_FEATURES.index("is_cpu_only")

DEFAULT_RESIDUAL_BOUND = 0.45


def near_best(base: np.ndarray, bound: float) -> np.ndarray:
    """Indices of the candidates a correction bounded by ``bound`` could make the winner."""
    return np.flatnonzero(base > base.max() - 2.0 * bound)


def squash(g: np.ndarray) -> np.ndarray:
    """``(2/π)·arctan(g)``: monotone onto (−1, 1), order-preserving in float64 far beyond tanh's range."""
    return np.arctan(g) * (2.0 / np.pi)


def residual_logits(base: np.ndarray, bound: float, correction: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """FGD's scores ``base`` plus ``bound · squash(correction(near))`` on the near-best candidates.

    ``correction(idx)`` returns ``g`` for the candidates ``idx`` (the network runs on them only:
    usually a small share of the feasible nodes). A single near-best node is FGD's choice and the
    network is not run at all."""
    near = near_best(base, bound)
    out = base.astype(np.float64) - bound
    if near.size == 1:
        out[near] = base[near]
        return out
    out[near] = base[near] + bound * squash(correction(near))
    return out


# MLP layers a policy search may move besides ``[head ‖ mlp_scale]`` (the hidden and output layers;
# the input layer, 1,664 weights, is left to imitation): ``mlp.2`` 16×16 + 16, ``mlp.4`` 16 + 1.
SEARCHABLE_LAYERS: tuple[str, ...] = ("mlp.2", "mlp.4")


def ordered_search_layers(layers: Sequence[str]) -> list[str]:
    unknown = set(layers) - set(SEARCHABLE_LAYERS)
    if unknown:
        raise ValueError(f"policy search cannot move layer(s) {sorted(unknown)}; choose from {SEARCHABLE_LAYERS}")
    return [name for name in SEARCHABLE_LAYERS if name in layers]


class PlacementNet(nn.Module):
    def __init__(self, n_node: int = N_NODE, n_pod: int = N_POD, hidden: int = 32,
                 feature_mean: np.ndarray | None = None, feature_std: np.ndarray | None = None,
                 residual_bound: float = DEFAULT_RESIDUAL_BOUND, gate_unused: bool = False,
                 gate_constrained: bool = False, gate_gpu_pods: bool = False,
                 gate_share: float | None = None) -> None:
        super().__init__()
        self.gate_unused = bool(gate_unused)
        self.gate_constrained = bool(gate_constrained)
        self.gate_gpu_pods = bool(gate_gpu_pods)
        if gate_share is not None and not 0.0 < gate_share <= 1.0:
            raise ValueError(f"gate_share must be in (0, 1] or None, got {gate_share}")
        self.gate_share = None if gate_share is None else float(gate_share)
        if not residual_bound > 0:
            raise ValueError(f"residual_bound must be > 0, got {residual_bound}")
        self.n_node, self.n_pod, self.hidden = n_node, n_pod, hidden
        self.residual_bound = float(residual_bound)
        self.mlp = nn.Sequential(
            nn.Linear(n_node + n_pod + 2 * n_node, hidden), nn.Tanh(),
            nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, 1),
        )
        self.heuristic_head = nn.Linear(n_node, 1, bias=False)
        # Scale of the MLP's contribution; policy search tunes it with the heuristic head.
        self.mlp_scale = nn.Parameter(torch.ones(()))
        # Input normalisation (fitted on the imitation data; identity until then).
        self.register_buffer("feature_mean", torch.zeros(n_node))
        self.register_buffer("feature_std", torch.ones(n_node))
        if feature_mean is not None:
            self.feature_mean.copy_(torch.as_tensor(feature_mean, dtype=torch.float32))
        if feature_std is not None:
            self.feature_std.copy_(torch.as_tensor(feature_std, dtype=torch.float32))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                nn.init.orthogonal_(layer.weight, gain=1.0)
                nn.init.zeros_(layer.bias)
        nn.init.zeros_(self.heuristic_head.weight)

    def normalise(self, node_features: torch.Tensor) -> torch.Tensor:
        return (node_features - self.feature_mean) / self.feature_std

    def pooled(self, node_features: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Raw pooled context ``[mean ‖ max]`` of node features over the valid candidates:
        ``(..., K, N_NODE)`` → ``(..., 2·N_NODE)`` (normalised inside :meth:`forward`)."""
        if valid is None:
            return torch.cat([node_features.mean(dim=-2), node_features.max(dim=-2).values], dim=-1)
        v = valid.unsqueeze(-1).to(node_features.dtype)
        mean = (node_features * v).sum(dim=-2) / v.sum(dim=-2).clamp(min=1.0)
        mx = node_features.masked_fill(~valid.unsqueeze(-1), -1e4).max(dim=-2).values
        return torch.cat([mean, mx], dim=-1)

    def forward(self, node_features: torch.Tensor, pod_features: torch.Tensor,
                valid: torch.Tensor | None = None, context: torch.Tensor | None = None) -> torch.Tensor:
        """``node_features (..., K, N_NODE)``, ``pod_features (..., N_POD)``, ``valid (..., K)`` bool →
        logits ``(..., K)`` (``-inf`` where not valid). ``context (..., 2·N_NODE)`` overrides the
        pooled context (training on a subsample of candidates keeps the full set's context)."""
        x = self.normalise(node_features)
        if context is None:
            context = self.pooled(node_features, valid)
        # mean and max commute with the (positive) affine normalisation.
        context = (context - self.feature_mean.repeat(2)) / self.feature_std.repeat(2)
        k = x.shape[-2]
        ctx = context.unsqueeze(-2).expand(*x.shape[:-2], k, 2 * self.n_node)
        pod = pod_features.unsqueeze(-2).expand(*x.shape[:-2], k, self.n_pod)
        logits = (self.mlp_scale * self.mlp(torch.cat([x, pod, ctx], dim=-1)).squeeze(-1)
                  + self.heuristic_head(x).squeeze(-1))
        if self.gate_unused:
            unused = node_features[..., UNUSED]
            logits = unused * self.heuristic_head.weight[0, UNUSED] + (1.0 - unused) * logits
        if self.gate_constrained:
            keep = (pod_features[..., CONSTRAINED] <= 0).to(logits.dtype)
            logits = logits * keep.unsqueeze(-1)
        if self.gate_gpu_pods:
            keep = (pod_features[..., CPU_ONLY] > 0).to(logits.dtype)
            logits = logits * keep.unsqueeze(-1)
        if valid is not None:
            logits = masked_logits(logits, valid)
        return logits

    @torch.inference_mode()
    def predict(self, node_features: np.ndarray, pod_features: np.ndarray) -> np.ndarray:
        """Logits for one pod's candidates, one forward pass: ``(k, N_NODE)`` → ``(k,)`` float64."""
        out = self.forward(torch.from_numpy(node_features), torch.from_numpy(pod_features))
        return out.numpy().astype(np.float64)

    # ------------------------------------------------------------------ the policy-search subspace
    def search_vector(self, layers: Sequence[str] = ()) -> np.ndarray:
        """``[heuristic head weights ‖ mlp_scale]`` — what policy search tunes — followed by the
        weights and biases of the MLP ``layers`` named (``"mlp.2"``, ``"mlp.4"``; in
        :data:`SEARCHABLE_LAYERS` order, weight row-major then bias), when a search moves them too."""
        head = self.heuristic_head.weight.detach().numpy().ravel().astype(np.float64)
        parts = [head, [float(self.mlp_scale.detach())]]
        for name in ordered_search_layers(layers):
            layer = self.mlp[int(name.split(".")[1])]
            parts += [layer.weight.detach().numpy().ravel(), layer.bias.detach().numpy()]
        return np.concatenate(parts).astype(np.float64)

    def set_search_vector(self, vec: np.ndarray, layers: Sequence[str] = ()) -> None:
        n = self.n_node
        with torch.no_grad():
            self.heuristic_head.weight.copy_(torch.as_tensor(vec[:n], dtype=torch.float32).view(1, -1))
            self.mlp_scale.fill_(float(vec[n]))
            at = n + 1
            for name in ordered_search_layers(layers):
                layer = self.mlp[int(name.split(".")[1])]
                for p in (layer.weight, layer.bias):
                    p.copy_(torch.as_tensor(vec[at:at + p.numel()], dtype=torch.float32).view_as(p))
                    at += p.numel()

    # ------------------------------------------------------------------ checkpoints
    def hyper_parameters(self) -> dict[str, float | None]:
        return {"n_node": self.n_node, "n_pod": self.n_pod, "hidden": self.hidden,
                "residual_bound": self.residual_bound, "gate_unused": self.gate_unused,
                "gate_constrained": self.gate_constrained, "gate_gpu_pods": self.gate_gpu_pods,
                "gate_share": self.gate_share}

    def zero_correction(self) -> None:
        """``g ≡ 0``: the residual policy becomes FGD exactly (the search's starting point)."""
        self.set_search_vector(np.zeros_like(self.search_vector()))


def masked_logits(logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(~valid, float("-inf"))
