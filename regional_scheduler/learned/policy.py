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

With ``gate_constrained`` (a hyper-parameter, session 4), a pod with a GPU-model constraint gets
``g ≡ 0`` on every candidate: FGD places it exactly as the ``fgd`` baseline would. Such a pod can only
go to nodes of its model, and re-ordering FGD's ties among them was a net loss on the validation
split's augmented runs (``docs/bench-learned.md`` §0f).

With ``gate_gpu_pods`` (a hyper-parameter, session 5), every pod that asks for a GPU gets ``g ≡ 0``:
the correction only places CPU-only pods. On a GPU cluster a CPU-only pod's node decides whose GPUs
its CPU strands, FGD's fragmentation delta scores that coarsely (most nodes tie), and that is where
the correction's gains were found on the validation split; re-ordering the GPU pods' ties added
nothing on average there and caused most of the runs behind FGD (``docs/bench-learned.md`` §0g).

With ``gate_share`` (a hyper-parameter, session 8), the whole workload is left to FGD when the share
of its GPU pods that carry a GPU-model constraint is at least ``gate_share``. Serving applies it
(:class:`~regional_scheduler.learned.serving.LearnedScorer`), from the target workload or, unprepared,
FGD's window of recent pods. On a validation split constrained like the ``gpuspec`` lists, the
correction lost to FGD on all seven runs with a share ≥ 0.25 (``docs/bench-learned.md`` §0j).

The MLP is shared across nodes, so the network is independent of the cluster's size and of the
node order; the linear *heuristic head* ``w_lin`` reads the baselines' scores directly, which makes
imitation of a heuristic easy and gives policy search a small, well-conditioned subspace to tune.
Infeasible nodes never reach the network (the scheduler's filter removes them); :func:`masked_logits`
sets them to ``-inf`` where a full-width mask is used (training).

Shapes: ``node_features (k, N_NODE)`` → ``logits (k,)``; batched training uses ``(B, K, N_NODE)``
with a ``(B, K)`` validity mask. Checkpoints hold the hyper-parameters, the feature layout and a
version, and load with ``torch.load(..., weights_only=True)`` only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from regional_scheduler.learned.features import FEATURE_LAYOUT, IDX, N_NODE, N_POD, POD_FEATURES

UNUSED = IDX["node_unused"]
CONSTRAINED = POD_FEATURES.index("has_gpu_model_constraint")
CPU_ONLY = POD_FEATURES.index("is_cpu_only")

# 2: residual over FGD (``residual_bound`` in the hyper-parameters). Version 1 files hold a full
# ranking network whose scores mean something else; they are refused, not reinterpreted.
CHECKPOINT_VERSION = 2
READABLE_FOR_CARRY_OVER = (1, 2)
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


def _layers(layers: Sequence[str]) -> list[str]:
    unknown = set(layers) - set(SEARCHABLE_LAYERS)
    if unknown:
        raise ValueError(f"policy search cannot move layer(s) {sorted(unknown)}; choose from {SEARCHABLE_LAYERS}")
    return [name for name in SEARCHABLE_LAYERS if name in layers]


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, unreadable, another version or feature layout."""


class PlacementNet(nn.Module):
    def __init__(self, n_node: int = N_NODE, n_pod: int = N_POD, hidden: int = 32,
                 feature_mean: np.ndarray | None = None, feature_std: np.ndarray | None = None,
                 residual_bound: float = DEFAULT_RESIDUAL_BOUND, gate_unused: bool = False,
                 gate_constrained: bool = False, gate_gpu_pods: bool = False,
                 gate_share: float | None = None, replays: int = 0) -> None:
        super().__init__()
        if replays < 0:
            raise ValueError(f"replays must be >= 0, got {replays}")
        # Serving: replays of a prepared workload that must show the correction ahead of FGD
        # (regional_scheduler.learned.replay); 0 = none.
        self.replays = int(replays)
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
        for name in _layers(layers):
            layer = self.mlp[int(name.split(".")[1])]
            parts += [layer.weight.detach().numpy().ravel(), layer.bias.detach().numpy()]
        return np.concatenate(parts).astype(np.float64)

    def set_search_vector(self, vec: np.ndarray, layers: Sequence[str] = ()) -> None:
        n = self.n_node
        with torch.no_grad():
            self.heuristic_head.weight.copy_(torch.as_tensor(vec[:n], dtype=torch.float32).view(1, -1))
            self.mlp_scale.fill_(float(vec[n]))
            at = n + 1
            for name in _layers(layers):
                layer = self.mlp[int(name.split(".")[1])]
                for p in (layer.weight, layer.bias):
                    p.copy_(torch.as_tensor(vec[at:at + p.numel()], dtype=torch.float32).view_as(p))
                    at += p.numel()

    # ------------------------------------------------------------------ checkpoints
    def hyper_parameters(self) -> dict[str, float | None]:
        return {"n_node": self.n_node, "n_pod": self.n_pod, "hidden": self.hidden,
                "residual_bound": self.residual_bound, "gate_unused": self.gate_unused,
                "gate_constrained": self.gate_constrained, "gate_gpu_pods": self.gate_gpu_pods,
                "gate_share": self.gate_share, "replays": self.replays}

    def zero_correction(self) -> None:
        """``g ≡ 0``: the residual policy becomes FGD exactly (the search's starting point)."""
        self.set_search_vector(np.zeros_like(self.search_vector()))


def masked_logits(logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(~valid, float("-inf"))


def save_checkpoint(path: Path | str, profiles: dict[str, PlacementNet], *, extra: dict[str, Any] | None = None) -> None:
    """One file, several *profiles* (e.g. ``gpu`` for GPU clusters, ``cpu`` for CPU-only ones): the
    same architecture and feature layout, separately trained weights."""
    payload = {
        "version": CHECKPOINT_VERSION,
        "feature_layout": FEATURE_LAYOUT,
        "profiles": {
            name: {"hyper_parameters": net.hyper_parameters(),
                   "state_dict": {k: v.detach().clone() for k, v in net.state_dict().items()}}
            for name, net in profiles.items()
        },
        "extra": extra or {},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)


def load_checkpoint(path: Path | str) -> tuple[dict[str, PlacementNet], dict[str, Any]]:
    """Rebuild the networks from a checkpoint; refuse one of another version or feature layout."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt or unsafe files
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if not isinstance(payload, dict) or "version" not in payload or "profiles" not in payload:
        raise CheckpointError(f"{path} is not a Meridian placement checkpoint")
    if payload["version"] != CHECKPOINT_VERSION:
        raise CheckpointError(f"checkpoint {path} has version {payload['version']}; "
                              f"this build reads version {CHECKPOINT_VERSION} (the residual policy over FGD; "
                              "version 1 held a full ranking network) — retrain it")
    layout = payload.get("feature_layout")
    if layout != FEATURE_LAYOUT:
        got = layout.get("version") if isinstance(layout, dict) else layout
        n_got = len(layout.get("node", [])) if isinstance(layout, dict) else "?"
        raise CheckpointError(
            f"checkpoint {path} was trained on another feature layout (version {got}, {n_got} node "
            f"features); this build has version {FEATURE_LAYOUT['version']} with {N_NODE} node "
            "features — retrain it")
    nets: dict[str, PlacementNet] = {}
    for name, entry in payload["profiles"].items():
        hp = dict(entry["hyper_parameters"])
        net = PlacementNet(n_node=int(hp["n_node"]), n_pod=int(hp["n_pod"]), hidden=int(hp["hidden"]),
                           residual_bound=float(hp["residual_bound"]), gate_unused=bool(hp.get("gate_unused", False)),
                           gate_constrained=bool(hp.get("gate_constrained", False)),
                           gate_gpu_pods=bool(hp.get("gate_gpu_pods", False)),
                           gate_share=None if hp.get("gate_share") is None else float(hp["gate_share"]),
                           replays=int(hp.get("replays", 0)))
        try:
            net.load_state_dict(entry["state_dict"])
        except RuntimeError as exc:
            raise CheckpointError(f"checkpoint {path} profile {name!r} does not match the network: {exc}") from exc
        net.eval()
        nets[name] = net
    return nets, payload.get("extra", {})


def upgrade_profiles(path: Path | str, *, residual_bound: float = DEFAULT_RESIDUAL_BOUND,
                     ) -> tuple[dict[str, PlacementNet], dict[str, Any], int]:
    """The profiles of a checkpoint written for an *older* feature layout or checkpoint version,
    carried over to this one: every node feature the old layout lacks gets zero weight (in the
    heuristic head and in the MLP's node and pooled-context inputs) and identity normalisation, so
    the upgraded network gives the old one's ``g`` wherever it is used. A version-1 network becomes
    the correction ``g`` of a residual policy with ``residual_bound``: on a CPU-only cluster (every
    FGD score equal) that policy ranks exactly as the old network did. Only for
    ``meridian train placement --merge``/``--init``; serving still refuses the old file. Requires the
    same pod features and the old node features as a subset of the new ones. Returns the networks,
    the checkpoint's ``extra`` and the old layout's version."""
    path = Path(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt or unsafe files
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    layout = payload.get("feature_layout") if isinstance(payload, dict) else None
    if not isinstance(layout, dict) or payload.get("version") not in READABLE_FOR_CARRY_OVER:
        raise CheckpointError(f"{path} is not a Meridian placement checkpoint of version "
                              f"{' or '.join(map(str, READABLE_FOR_CARRY_OVER))}")
    old_node, new_node = list(layout.get("node", [])), list(FEATURE_LAYOUT["node"])  # type: ignore[call-overload]
    if list(layout.get("pod", [])) != list(FEATURE_LAYOUT["pod"]) or not set(old_node) <= set(new_node):  # type: ignore[call-overload]
        raise CheckpointError(f"checkpoint {path}'s feature layout cannot be carried over to version "
                              f"{FEATURE_LAYOUT['version']}")
    where = torch.tensor([new_node.index(f) for f in old_node])
    nets: dict[str, PlacementNet] = {}
    for name, entry in payload["profiles"].items():
        old = entry["state_dict"]
        hp = dict(entry["hyper_parameters"])
        n_old, n_pod = hp["n_node"], hp["n_pod"]
        net = PlacementNet(hidden=int(hp["hidden"]), residual_bound=float(hp.get("residual_bound", residual_bound)))
        sd = {k: v.clone() for k, v in net.state_dict().items()}
        sd["feature_mean"].zero_()
        sd["feature_std"].fill_(1.0)
        sd["feature_mean"][where] = old["feature_mean"]
        sd["feature_std"][where] = old["feature_std"]
        sd["heuristic_head.weight"].zero_()
        sd["heuristic_head.weight"][:, where] = old["heuristic_head.weight"]
        w0_old, w0 = old["mlp.0.weight"], sd["mlp.0.weight"]
        w0.zero_()
        n, p = net.n_node, net.n_pod
        w0[:, where] = w0_old[:, :n_old]
        w0[:, n:n + p] = w0_old[:, n_old:n_old + n_pod]
        w0[:, n + p + where] = w0_old[:, n_old + n_pod:2 * n_old + n_pod]
        w0[:, 2 * n + p + where] = w0_old[:, 2 * n_old + n_pod:]
        for key in ("mlp.0.bias", "mlp.2.weight", "mlp.2.bias", "mlp.4.weight", "mlp.4.bias", "mlp_scale"):
            sd[key] = old[key].clone()
        net.load_state_dict(sd)
        net.eval()
        nets[name] = net
    return nets, payload.get("extra", {}), int(layout.get("version", 0))


class NumpyPlacementNet:
    """The same forward pass in numpy, exported from a :class:`PlacementNet` for the serving hot path.

    A decision is a handful of small matrix products over ``k ≤ 1,213`` nodes; numpy's per-call
    overhead (~1–3 µs) is well below torch's dispatcher (~10 µs per op), which matters at a 1 ms
    budget. :meth:`predict` equals ``PlacementNet.predict`` to float32 rounding (a test checks it).
    """

    def __init__(self, net: PlacementNet) -> None:
        sd = {k: v.detach().numpy().astype(np.float32) for k, v in net.state_dict().items()}
        self.n_node = net.n_node
        self.residual_bound = net.residual_bound
        self.gate_unused = net.gate_unused
        self.gate_constrained = net.gate_constrained
        self.gate_gpu_pods = net.gate_gpu_pods
        self.gate_share = net.gate_share  # read on every decision: a torch Module's attribute lookup is slow
        self.mean = sd["feature_mean"]
        self.inv_std = (1.0 / sd["feature_std"]).astype(np.float32)
        w0 = sd["mlp.0.weight"]  # (H, n_node + n_pod + 2 n_node)
        n, p = net.n_node, net.n_pod
        self.w_node = np.ascontiguousarray(w0[:, :n].T)
        self.w_pod = np.ascontiguousarray(w0[:, n:n + p].T)
        self.w_ctx = np.ascontiguousarray(w0[:, n + p:].T)
        self.b0 = sd["mlp.0.bias"]
        self.w1 = np.ascontiguousarray(sd["mlp.2.weight"].T)
        self.b1 = sd["mlp.2.bias"]
        self.w2 = np.ascontiguousarray(sd["mlp.4.weight"].T)  # (H, 1)
        self.b2 = sd["mlp.4.bias"]
        self.w_lin = np.ascontiguousarray(sd["heuristic_head.weight"].T)  # (n_node, 1)
        self.mlp_scale = float(sd["mlp_scale"])
        self._head_only()

    def _head_only(self) -> None:
        """With ``mlp_scale == 0`` the correction is linear: only the head's non-zero columns are read,
        so serving builds only those features (:attr:`columns`) and skips the MLP and the context."""
        self.linear = self.mlp_scale == 0.0
        self.columns = (self.w_lin[:, 0] != 0) if self.linear else np.ones(self.n_node, dtype=bool)
        used = np.flatnonzero(self.columns)
        self._used = used
        self._w_used = np.ascontiguousarray((self.w_lin[used, 0] * self.inv_std[used]).astype(np.float32))
        self._b_used = float(-(self.mean[used] * self.inv_std[used]) @ self.w_lin[used, 0]) if used.size else 0.0
        self._g_unused = float(self.w_lin[UNUSED, 0])

    def with_search_vector(self, vec: np.ndarray, layers: Sequence[str] = ()) -> NumpyPlacementNet:
        """A copy with another ``[heuristic head ‖ mlp_scale ‖ layers…]`` (policy search's candidates;
        the layout of :meth:`PlacementNet.search_vector`)."""
        other = copy.copy(self)
        n = self.n_node
        other.w_lin = np.asarray(vec[:n], dtype=np.float32).reshape(-1, 1)
        other.mlp_scale = float(vec[n])
        at = n + 1
        h = self.w1.shape[0]
        for name in _layers(layers):
            rows = h if name == "mlp.2" else 1
            w = np.asarray(vec[at:at + rows * h], dtype=np.float32).reshape(rows, h)
            b = np.asarray(vec[at + rows * h:at + rows * h + rows], dtype=np.float32)
            at += rows * h + rows
            # Stored transposed, as in __init__ (torch's Linear keeps (out, in)).
            if name == "mlp.2":
                other.w1, other.b1 = np.ascontiguousarray(w.T), b
            else:
                other.w2, other.b2 = np.ascontiguousarray(w.T), b
        other._head_only()
        return other

    def residual(self, base: np.ndarray, node_features: Callable[[np.ndarray], np.ndarray],
                 pod_features: np.ndarray) -> np.ndarray:
        """The served logits (:func:`residual_logits`): ``base`` are FGD's scores of the candidates,
        ``node_features(idx)`` builds the features of candidates ``idx`` only."""
        if self._fgd_only(pod_features):
            return residual_logits(base, self.residual_bound, lambda idx: np.zeros(len(idx)))
        return residual_logits(base, self.residual_bound,
                               lambda idx: self.predict(node_features(idx), pod_features))

    def residual_columns(self, base: np.ndarray, node_features: Callable[[np.ndarray, np.ndarray], np.ndarray],
                         pod_features: np.ndarray, unused: Callable[[np.ndarray], np.ndarray] | None = None
                         ) -> np.ndarray:
        """:meth:`residual` with ``node_features(idx, columns)`` asked only for :attr:`columns`.

        ``unused(idx)``: which candidates are unused nodes (the ``node_unused`` feature). With
        ``gate_unused`` a linear correction gives every unused node the same constant, so their
        features are never built: early in a run most of FGD's near-best nodes are empty."""
        if self._fgd_only(pod_features):
            return residual_logits(base, self.residual_bound, lambda idx: np.zeros(len(idx)))
        if unused is None or not (self.linear and self.gate_unused):
            return residual_logits(base, self.residual_bound,
                                   lambda idx: self.predict(node_features(idx, self.columns), pod_features))

        def correction(idx: np.ndarray) -> np.ndarray:
            g = np.full(idx.size, self._g_unused)
            used = np.flatnonzero(~unused(idx))
            if used.size:
                g[used] = self.predict(node_features(idx[used], self.columns), pod_features)
            return g

        return residual_logits(base, self.residual_bound, correction)

    def _fgd_only(self, pod_features: np.ndarray) -> bool:
        """``g ≡ 0`` for this pod (no node features needed): ``gate_constrained`` and a model-constrained
        pod, or ``gate_gpu_pods`` and a pod that asks for a GPU."""
        return ((self.gate_constrained and bool(pod_features[CONSTRAINED] > 0))
                or (self.gate_gpu_pods and not bool(pod_features[CPU_ONLY] > 0)))

    def predict(self, node_features: np.ndarray, pod_features: np.ndarray) -> np.ndarray:
        """The correction ``g`` (the raw network output) of each given node."""
        if self._fgd_only(pod_features):
            return np.zeros(len(node_features))
        if self.linear:
            # (x − mean) · inv_std · w over the used columns, folded into one weight vector and a bias.
            return self._gate(node_features, (node_features[:, self._used] @ self._w_used + self._b_used
                                              ).astype(np.float64))
        x = (node_features - self.mean) * self.inv_std
        ctx = np.concatenate([x.mean(axis=0), x.max(axis=0)])
        # The pod and context terms are the same for every node: one (H,) vector added to all rows.
        shared = pod_features @ self.w_pod + ctx @ self.w_ctx + self.b0
        h = np.tanh(x @ self.w_node + shared)
        h = np.tanh(h @ self.w1 + self.b1)
        out = self.mlp_scale * (h @ self.w2 + self.b2) + x @ self.w_lin
        return self._gate(node_features, out[:, 0].astype(np.float64))

    def _gate(self, node_features: np.ndarray, g: np.ndarray) -> np.ndarray:
        if not self.gate_unused:
            return g
        return np.where(node_features[:, UNUSED] == 1.0, self._g_unused, g)
