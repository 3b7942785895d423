"""``fgd``: Fragmentation Gradient Descent (Weng et al., USENIX ATC '23).

Each pod goes to the node — and, for a shared-GPU pod, the GPU device — that increases the
cluster's expected GPU fragmentation (:mod:`meridian.fragmentation`) the least. As in the paper's
simulator (``fgd_score.go``), the node score is ``int(sigmoid(Δ / 1000) · 100)`` with
``Δ = frag_before − frag_after`` in milli-GPU. The simulator breaks ties at random; the framework
takes the first node in order, without which the paper's figures are not reproduced
(:mod:`regional_scheduler.framework`).

Target workload: ``prepare(state, pods)`` gives it (the simulator passes the trace's pod list). A
live scheduler that was never prepared learns it online from the pods it is asked to place (the
last ``ONLINE_WINDOW`` shapes, looked at every ``ONLINE_REFRESH`` pods), so FGD works from the first
pod on a real cluster too. A new estimate replaces the old one only when the shape distribution has
moved by more than ``ONLINE_DRIFT`` (total variation): replacing it empties every cache, and the cold
passes that follow cost 8–10 ms a decision on 1,213 nodes, while two samples of one stationary stream
differ by sampling noise alone.

Speed: fragmentation only changes on the node a pod lands on, so scores are cached per pod
shape and node and recomputed only for nodes whose ``node_version`` moved since (a placement
invalidates one node). A cold shape costs one vectorised pass over all nodes; `prepare` pays it
for every shape of the target workload up front.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.fragmentation import TargetWorkload, node_fragmentation_milli
from meridian.model import MILLI_GPU_PER_DEVICE, Pod
from regional_scheduler.policies.base import MAX_NODE_SCORE, Scores

NAME = "fgd"
ONLINE_WINDOW = 2000
ONLINE_REFRESH = 100
ONLINE_DRIFT = 0.02
# Fragmentation is a probability-weighted sum, so the same node's value differs by ~1e-14 with the
# number of nodes numpy's reduction saw at once (the cache computes stale nodes in batches of varying
# size). At Δ = 0 FGD's integer score sits exactly on the 50/49 boundary, so that noise flipped its
# choice, and the learned policy reads Δ as a feature. Deltas are therefore rounded to this grid
# (milli-GPU): a real delta is at least one milli-GPU times the smallest shape probability
# (1 / pod-list length, ~1e-4), far above it.
DELTA_DECIMALS = 6
DEVICE_TOLERANCE = 1e-6


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def fragmentation_delta(
    state: ClusterState, pod: Pod, nodes: np.ndarray, workload: TargetWorkload, frag_before: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Increase of each candidate node's fragmentation (milli-GPU) if ``pod`` lands there, and the
    device that minimises it (-1 where the rule does not choose a device)."""
    r = pod.requests
    cpu_after = state.free_milli_cpu[nodes] - r.milli_cpu
    left = state.gpu_free_milli[nodes]
    model = state.gpu_model_id[nodes]
    if r.gpu_milli:
        frag = _shared_gpu_frag_after(workload, cpu_after, left, state.gpu_exists[nodes], model, r.gpu_milli)
        # The first device within tolerance of the best, so equal devices never tie-break on noise.
        device = (frag <= frag.min(axis=1, keepdims=True) + DEVICE_TOLERANCE).argmax(axis=1)
        frag_after = frag[np.arange(nodes.size), device]
        return _quantise(frag_after - frag_before), device
    if r.gpu:
        idle = (left == MILLI_GPU_PER_DEVICE) & state.gpu_exists[nodes]
        take = idle & (np.cumsum(idle, axis=1) <= r.gpu)
        left = np.where(take, 0, left)
    frag_after = node_fragmentation_milli(workload, cpu_after, left, model)
    return _quantise(frag_after - frag_before), np.full(nodes.size, -1)


def _quantise(delta: np.ndarray) -> np.ndarray:
    return np.round(delta, DELTA_DECIMALS) + 0.0  # + 0.0 turns -0.0 into 0.0


def _shared_gpu_frag_after(
    workload: TargetWorkload, cpu_after: np.ndarray, left: np.ndarray, exists: np.ndarray, model: np.ndarray,
    gpu_milli: int,
) -> np.ndarray:
    """Fragmentation of each node (k) after taking ``gpu_milli`` from each of its devices (D),
    ``(k, D)``, +inf where the device cannot take it.

    Only device ``j`` changes (``L → L − g``), so each type's count of fitting devices and its sum of
    too-small slices are corrected incrementally: ``(T, k, D)`` work instead of rebuilding ``D``
    virtual nodes of ``D`` devices each.
    """
    need = workload.gpu_milli_per_device[:, None, None]  # (T, 1, 1)
    l3 = left[None, :, :]  # (1, k, D)
    fits = l3 >= need  # (T, k, D)
    n_fit = fits.sum(axis=2, keepdims=True)  # (T, k, 1)
    too_small = np.where(fits, 0, l3).sum(axis=2, keepdims=True)
    after = l3 - gpu_milli
    fits_after = after >= need
    n_fit_after = n_fit - fits + fits_after
    too_small_after = too_small - np.where(fits, 0, l3) + np.where(fits_after, 0, after)
    total_after = left.sum(axis=1) - gpu_milli  # (k,)
    satisfied = (
        workload.model_access[:, model][:, :, None]
        & (cpu_after[None, :, None] >= workload.milli_cpu[:, None, None])
        & (n_fit_after >= workload.gpu_count[:, None, None])
        & (need > 0)
    )
    per_type = np.where(satisfied, too_small_after, total_after[None, :, None])
    frag = np.einsum("t,tkd->kd", workload.probability, per_type)
    return np.where((left >= gpu_milli) & exists, frag, np.inf)


@dataclass
class _Cache:
    version: np.ndarray
    values: np.ndarray
    devices: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class FgdPolicy:
    name = NAME

    def __init__(self, workload: TargetWorkload | None = None) -> None:
        self.workload = workload
        self._state: ClusterState | None = None
        self._frag: _Cache | None = None
        self._by_shape: dict[tuple, _Cache] = {}
        self._seen: deque[Pod] | None = None if workload is not None else deque(maxlen=ONLINE_WINDOW)
        self._since_refresh = 0
        self.online_rebuilds = 0  # how often the online target workload replaced the previous one

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None:
        """Fix the target workload and fill the score cache for each of its pod shapes, so that no
        decision pays a cold pass over every node (8–10 ms for a shared-GPU shape on 1,213 nodes).
        Decisions do not depend on the cache (deltas are quantised), only their latency does."""
        self.workload = TargetWorkload.from_pods(workload, state.gpu_models)
        self._seen = None
        self._state = None
        shapes = {(p.requests.milli_cpu, p.requests.gpu, p.requests.gpu_milli): p for p in workload}
        every_node = np.arange(state.n_nodes)
        for pod in shapes.values():
            self.delta(state, pod, every_node)

    def _observe(self, state: ClusterState, pod: Pod) -> None:
        """Online target workload for an unprepared (live) scheduler."""
        if self._seen is None:
            return
        self._seen.append(pod)
        self._since_refresh += 1
        if self.workload is None or self._since_refresh >= ONLINE_REFRESH:
            self._since_refresh = 0
            fresh = TargetWorkload.from_pods(list(self._seen), state.gpu_models)
            if self.workload is None or fresh.distance(self.workload) > ONLINE_DRIFT:
                self.workload = fresh
                self.online_rebuilds += 1
                self._state = None  # cached fragmentation was computed for the old workload

    def _sync(self, state: ClusterState) -> None:
        if self.workload is None:
            raise RuntimeError("FGD needs a target workload: call prepare(state, pods) first")
        if self._state is not state or self._frag is None or self._frag.version.size != state.n_nodes:
            n = state.n_nodes
            self._state = state
            self._frag = _Cache(np.full(n, -1, dtype=np.int64), np.zeros(n))
            self._by_shape = {}
        stale = np.flatnonzero(self._frag.version != state.node_version)
        if stale.size:
            self._frag.values[stale] = node_fragmentation_milli(
                self.workload, state.free_milli_cpu[stale], state.gpu_free_milli[stale], state.gpu_model_id[stale])
            self._frag.version[stale] = state.node_version[stale]

    def node_fragmentation(self, state: ClusterState) -> np.ndarray:
        """Current per-node fragmentation in milli-GPU (cached)."""
        self._sync(state)
        assert self._frag is not None
        return self._frag.values

    def delta(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Fragmentation increase and chosen device per candidate node (cached per pod shape)."""
        self._sync(state)
        assert self._frag is not None and self.workload is not None
        r = pod.requests
        key = (r.milli_cpu, r.gpu, r.gpu_milli)
        cache = self._by_shape.get(key)
        if cache is None:
            n = state.n_nodes
            cache = _Cache(np.full(n, -1, dtype=np.int64), np.zeros(n), np.full(n, -1, dtype=np.int64))
            self._by_shape[key] = cache
        stale = nodes[cache.version[nodes] != state.node_version[nodes]]
        if stale.size:
            d, dev = fragmentation_delta(state, pod, stale, self.workload, self._frag.values[stale])
            cache.values[stale] = d
            cache.devices[stale] = dev
            cache.version[stale] = state.node_version[stale]
        return cache.values[nodes], cache.devices[nodes]

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        self._observe(state, pod)
        delta, device = self.delta(state, pod, nodes)
        score = np.floor(_sigmoid(-delta / 1000.0) * MAX_NODE_SCORE)
        return Scores(score, device)


def new() -> FgdPolicy:
    return FgdPolicy()
