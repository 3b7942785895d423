"""The learned placement network's forward pass in numpy, for the serving hot path (as
:mod:`gnn.numpy_router` is the routing network's)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np

from regional_scheduler.learned.policy import (
    CONSTRAINED,
    CPU_ONLY,
    UNUSED,
    PlacementNet,
    ordered_search_layers,
    residual_logits,
)


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
        for name in ordered_search_layers(layers):
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
