"""What the learned placement policy sees: per-node features, pod features and cluster context.

One call builds a ``(k, F)`` float32 matrix for the ``k`` candidate nodes of one pod, vectorised
(no Python loop over nodes). Every value is normalised to roughly ``[-1, 1]`` so the same network
serves a 50-node 8-CPU cluster and the 1,213-node openb cluster:

- free and allocatable resources, as fractions of the node and in absolute units of the largest
  node spec (128 CPUs, 8 GPUs — the FGD simulator's ``MaxSpec``);
- the same quantities *after* placing the pod;
- GPU-device detail: each device's free share, sorted high → low (device order carries no meaning,
  so sorting keeps the features permutation-invariant across devices);
- the baselines' own scores: best-fit leftover, dot-product alignment, FGD's fragmentation delta
  (cached per pod shape in :class:`~regional_scheduler.policies.fgd.FgdPolicy`), the node's
  fragmentation before, least-allocated and balanced-allocation scores;
- node power and grid carbon intensity when telemetry has them (NaN → 0 plus a presence flag);
- GPU-model scarcity (layout version 2): ``model_pressure``, the share of the node's GPU model's
  capacity that the target workload's *model-constrained* GPU pods need (their GPU request spread
  evenly over the models each allows, the workload scaled to the cluster's GPU capacity, capped at
  2), and ``model_pressure_free_pod``, the same value when the pod being placed has no model
  constraint (0 otherwise) — the cost of using a node that constrained pods depend on for a pod
  that could run anywhere, readable by the linear head without the MLP.

Pod features describe the request and carry two cluster-wide figures (CPU and GPU allocation);
the network adds the pooled (mean, max) node features over the candidates as the rest of the
context. :data:`FEATURE_LAYOUT` is stored in every checkpoint, and a checkpoint built for another
layout is refused (see :mod:`regional_scheduler.learned.policy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meridian.cluster_state import MAX_GPUS, ClusterState
from meridian.model import GIB, MILLI_GPU_PER_DEVICE, Pod
from regional_scheduler.policies.base import MAX_NODE_SCORE, MAX_SPEC_GPU_MILLI, MAX_SPEC_MILLI_CPU
from regional_scheduler.policies.dot_product import dot_product_alignment
from regional_scheduler.policies.fgd import FgdPolicy
from regional_scheduler.policies.resource_allocation import (
    _requested_after,
    balanced_allocation,
    least_allocated,
)

FEATURE_VERSION = 2

NODE_FEATURES: tuple[str, ...] = (
    "free_cpu_frac", "free_mem_frac", "free_gpu_frac",
    "free_cpu_abs", "free_gpu_abs", "gpu_count_abs", "idle_gpus_abs", "partial_gpus_abs", "max_device_free",
    "after_cpu_frac", "after_mem_frac", "after_gpu_frac", "after_cpu_abs", "after_gpu_abs",
    "after_idle_gpus_abs",
    *(f"device_free_sorted_{d}" for d in range(MAX_GPUS)),
    "best_fit_leftover", "dot_product", "fgd_delta_gpus", "fgd_frag_before_gpus",
    "least_allocated", "balanced",
    "node_unused", "becomes_cpu_full", "becomes_mem_full", "becomes_gpu_full",
    "power_kw", "power_present", "carbon_kg_per_kwh", "carbon_present",
    "model_pressure", "model_pressure_free_pod",
)
POD_FEATURES: tuple[str, ...] = (
    "cpu_abs", "mem_abs", "gpu_total_abs", "gpu_share", "is_cpu_only", "is_shared_gpu", "is_whole_gpu",
    "has_gpu_model_constraint", "cluster_cpu_alloc", "cluster_gpu_alloc", "candidate_frac",
)
FEATURE_LAYOUT: dict[str, object] = {
    "version": FEATURE_VERSION,
    "node": list(NODE_FEATURES),
    "pod": list(POD_FEATURES),
}
N_NODE = len(NODE_FEATURES)
N_POD = len(POD_FEATURES)
IDX = {name: i for i, name in enumerate(NODE_FEATURES)}

_MAX_SPEC_MEMORY_BYTES = 1024 * GIB
MAX_MODEL_PRESSURE = 2.0


def model_pressure(state: ClusterState, workload: Sequence[Pod]) -> np.ndarray:
    """Per GPU model of ``state`` (last entry: nodes without GPUs, always 0): the share of that
    model's GPU capacity which the workload's GPU-model-constrained pods need, each pod's GPU request
    spread evenly over the models it allows, the workload scaled to the cluster's GPU capacity."""
    n_models = len(state.gpu_models)
    out = np.zeros(n_models + 1)
    cap = np.zeros(n_models + 1)
    has = state.gpu_model_id >= 0
    np.add.at(cap, state.gpu_model_id[has], state.gpu_count[has].astype(float) * MILLI_GPU_PER_DEVICE)
    total_demand = float(sum(p.requests.gpu_milli_total for p in workload))
    if total_demand <= 0 or cap.sum() <= 0:
        return out
    index = {m: i for i, m in enumerate(state.gpu_models)}
    demand = np.zeros(n_models + 1)
    for p in workload:
        if not p.allowed_gpu_models or p.requests.gpu_milli_total <= 0:
            continue
        ids = sorted({index[m] for m in p.allowed_gpu_models if m in index and cap[index[m]] > 0})
        if ids:
            demand[ids] += p.requests.gpu_milli_total / len(ids)
    scale = cap.sum() / total_demand
    out[:n_models] = np.where(cap[:n_models] > 0, demand[:n_models] * scale / np.maximum(cap[:n_models], 1), 0.0)
    return np.minimum(out, MAX_MODEL_PRESSURE)


def constrained_share(pods: Sequence[Pod]) -> float:
    """The share of the GPU pods that carry an allowed-GPU-model set (0 without GPU pods)."""
    gpu = [p for p in pods if p.requests.gpu_milli_total > 0]
    return sum(bool(p.allowed_gpu_models) for p in gpu) / len(gpu) if gpu else 0.0


def _frac(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den``, 0 where ``den`` is 0 (a node without GPUs); one ufunc call, not three."""
    return np.divide(num, den, out=np.zeros(np.shape(num)), where=den > 0)


# The pod-dependent columns :meth:`FeatureBuilder.node_features` computes together, by the columns each
# group fills.
_GROUPS: dict[str, tuple[str, ...]] = {
    "frag_before": ("fgd_frag_before_gpus",),
    "cpu_after": ("after_cpu_frac", "after_cpu_abs", "becomes_cpu_full", "best_fit_leftover"),
    "mem_after": ("after_mem_frac", "becomes_mem_full"),
    "gpu_after": ("after_gpu_frac", "after_gpu_abs", "becomes_gpu_full", "best_fit_leftover"),
    "idle_after": ("after_idle_gpus_abs",),
    "dot_product": ("dot_product",),
    "allocation": ("least_allocated", "balanced"),
    "telemetry": ("power_kw", "power_present", "carbon_kg_per_kwh", "carbon_present"),
}


# Columns that do not depend on the pod being placed: kept per node in a cache refreshed only for
# nodes whose ``node_version`` moved (one node per placement), like FGD's fragmentation cache.
_STATIC_COLUMNS: tuple[str, ...] = (
    "free_cpu_frac", "free_mem_frac", "free_gpu_frac", "free_cpu_abs", "free_gpu_abs", "gpu_count_abs",
    "idle_gpus_abs", "partial_gpus_abs", "max_device_free", *(f"device_free_sorted_{d}" for d in range(MAX_GPUS)),
    "node_unused", "model_pressure",
)
_STATIC = np.array([name in _STATIC_COLUMNS for name in NODE_FEATURES])
_B = 15 + MAX_GPUS  # first column after the sorted devices
_UNUSED = IDX["node_unused"]


@dataclass(frozen=True)
class _Plan:
    """What :meth:`FeatureBuilder.node_features` computes for one column set."""

    groups: dict[str, bool]  # the column groups to compute
    zero: np.ndarray  # computed columns not asked for, set to 0


class _NodeCache:
    """Per-node quantities that change only when a pod lands on (or leaves) the node."""

    def __init__(self, state: ClusterState) -> None:
        n = state.n_nodes
        self.state = state
        self.version = np.full(n, -1, dtype=np.int64)
        self.static = np.zeros((n, N_NODE), dtype=np.float32)
        self.free_cpu = np.zeros(n)
        self.free_mem = np.zeros(n)
        self.gpu_free_total = np.zeros(n)
        self.idle = np.zeros(n)
        self.gpu_cap = (state.gpu_count * MILLI_GPU_PER_DEVICE).astype(np.float64)


class FeatureBuilder:
    """Builds features for one cluster; owns the FGD fragmentation cache it reads deltas from."""

    def __init__(self) -> None:
        self.fgd = FgdPolicy()
        self._pressure: np.ndarray | None = None
        # The workload's share of model-constrained GPU pods (the serving gate, ``gate_share``).
        self.constrained_share = 0.0
        self._window_estimate = -1  # unprepared: FGD's online estimate the two were computed for
        self._cache: _NodeCache | None = None
        self._plans: dict[bytes, _Plan] = {}

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None:
        self.fgd.prepare(state, workload)
        self._pressure = model_pressure(state, workload)
        self.constrained_share = constrained_share(workload)
        self._cache = None

    def follow_window(self, state: ClusterState) -> None:
        """Unprepared (a live scheduler): the workload-level values — GPU-model scarcity and the
        constrained share — follow FGD's window of recent pods, recomputed when FGD takes a new
        estimate from it (a decision that is slow already). Call after FGD has scored the pod."""
        window = self.fgd.online_window
        if window is not None and self.fgd.online_rebuilds != self._window_estimate:
            self._pressure = model_pressure(state, window)
            self.constrained_share = constrained_share(window)
            self._window_estimate = self.fgd.online_rebuilds
            self._cache = None

    def _refresh(self, state: ClusterState) -> _NodeCache:
        self.follow_window(state)
        cache = self._cache
        if cache is None or cache.state is not state or cache.version.size != state.n_nodes:
            cache = self._cache = _NodeCache(state)
        stale = np.flatnonzero(cache.version != state.node_version)
        if stale.size == 1:  # the usual case: one placement since the last decision
            self._fill_one(state, cache, int(stale[0]))
        elif stale.size:
            self._fill(state, cache, stale)
        if stale.size:
            cache.version[stale] = state.node_version[stale]
        return cache

    def _fill_one(self, state: ClusterState, cache: _NodeCache, i: int) -> None:
        """:meth:`_fill` for one node in Python floats: the same IEEE operations on the same values, so
        the same bits (a test compares them), without numpy's per-call overhead (~25 calls, 0.1 ms)."""
        alloc_cpu = float(state.alloc_milli_cpu[i])
        alloc_mem = float(state.alloc_memory_bytes[i])
        free_cpu = float(state.alloc_milli_cpu[i] - state.req_milli_cpu[i])
        free_mem = float(state.alloc_memory_bytes[i] - state.req_memory_bytes[i])
        gpu_free = state.gpu_free_milli[i].tolist()
        exists = state.gpu_exists[i].tolist()
        gpu_cap = float(cache.gpu_cap[i])
        gpu_free_total = float(sum(gpu_free))
        idle = sum(1 for f, e in zip(gpu_free, exists, strict=True) if e and f == MILLI_GPU_PER_DEVICE)
        partial = sum(1 for f, e in zip(gpu_free, exists, strict=True) if e and 0 < f < MILLI_GPU_PER_DEVICE)
        cache.free_cpu[i] = free_cpu
        cache.free_mem[i] = free_mem
        cache.gpu_free_total[i] = gpu_free_total
        cache.idle[i] = idle
        row = [0.0] * N_NODE
        row[0] = free_cpu / alloc_cpu if alloc_cpu > 0 else 0.0
        row[1] = free_mem / alloc_mem if alloc_mem > 0 else 0.0
        row[2] = gpu_free_total / gpu_cap if gpu_cap > 0 else 0.0
        row[3] = free_cpu / MAX_SPEC_MILLI_CPU
        row[4] = gpu_free_total / MAX_SPEC_GPU_MILLI
        row[5] = gpu_cap / MAX_SPEC_GPU_MILLI
        row[6] = idle / MAX_GPUS
        row[7] = partial / MAX_GPUS
        devices_sorted = [f / MILLI_GPU_PER_DEVICE for f in sorted(gpu_free, reverse=True)]
        row[8] = devices_sorted[0]
        row[15:15 + MAX_GPUS] = devices_sorted
        row[_UNUSED] = float(state.req_milli_cpu[i] == 0 and gpu_free_total == gpu_cap)
        pressure = self._pressure
        if pressure is not None and pressure.size == len(state.gpu_models) + 1:
            row[_B + 14] = float(pressure[state.gpu_model_id[i]])
        cache.static[i] = row

    def _fill(self, state: ClusterState, cache: _NodeCache, nodes: np.ndarray) -> None:
        alloc_cpu = state.alloc_milli_cpu[nodes]
        alloc_mem = state.alloc_memory_bytes[nodes]
        free_cpu = alloc_cpu - state.req_milli_cpu[nodes]
        free_mem = alloc_mem - state.req_memory_bytes[nodes]
        gpu_free = state.gpu_free_milli[nodes]
        exists = state.gpu_exists[nodes]
        gpu_cap = cache.gpu_cap[nodes]
        gpu_free_total = gpu_free.sum(axis=1)
        idle = ((gpu_free == MILLI_GPU_PER_DEVICE) & exists).sum(axis=1)
        partial = ((gpu_free > 0) & (gpu_free < MILLI_GPU_PER_DEVICE) & exists).sum(axis=1)
        cache.free_cpu[nodes] = free_cpu
        cache.free_mem[nodes] = free_mem
        cache.gpu_free_total[nodes] = gpu_free_total
        cache.idle[nodes] = idle
        out = np.zeros((nodes.size, N_NODE), dtype=np.float32)
        # One call for the three free fractions: on the usual one-node refresh, numpy's per-call
        # overhead is the cost, not the arithmetic.
        out[:, 0:3] = _frac(np.array([free_cpu, free_mem, gpu_free_total], dtype=np.float64),
                            np.array([alloc_cpu, alloc_mem, gpu_cap], dtype=np.float64)).T
        out[:, 3] = free_cpu / MAX_SPEC_MILLI_CPU
        out[:, 4] = gpu_free_total / MAX_SPEC_GPU_MILLI
        out[:, 5] = gpu_cap / MAX_SPEC_GPU_MILLI
        out[:, 6] = idle / MAX_GPUS
        out[:, 7] = partial / MAX_GPUS
        devices_sorted = np.sort(gpu_free, axis=1)[:, ::-1] / MILLI_GPU_PER_DEVICE  # high → low
        out[:, 8] = devices_sorted[:, 0]
        out[:, 15:15 + MAX_GPUS] = devices_sorted
        out[:, _UNUSED] = (state.req_milli_cpu[nodes] == 0) & (gpu_free_total == gpu_cap)
        pressure = self._pressure
        if pressure is not None and pressure.size == len(state.gpu_models) + 1:
            out[:, _B + 14] = pressure[state.gpu_model_id[nodes]]
        cache.static[nodes] = out

    def unused(self, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        """The ``node_unused`` feature of ``nodes`` as bool, from the cache :meth:`node_features` reads."""
        return self._refresh(state).static[nodes, _UNUSED] == 1.0

    def node_features(self, state: ClusterState, pod: Pod, nodes: np.ndarray, columns: np.ndarray | None = None, *,
                      fgd_delta: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(k, N_NODE)`` features of candidate ``nodes`` and FGD's device choice per node.

        The pod-independent columns come from a per-node cache (:class:`_NodeCache`); the others are
        computed here. ``columns`` (bool ``(N_NODE,)``): compute only these pod-dependent columns
        (the others not asked for are 0) — serving asks only for what the network reads.
        ``fgd_delta``: FGD's ``(delta, devices)`` of these nodes for this pod, when the caller has them.
        """
        need = np.ones(N_NODE, dtype=bool) if columns is None else columns
        key = need.tobytes()
        plan = self._plans.get(key)
        if plan is None:  # which column groups to compute, once per distinct column set
            plan = self._plans[key] = _Plan({g: bool(need[[IDX[n] for n in names]].any())
                                             for g, names in _GROUPS.items()},
                                            np.flatnonzero(~(need | _STATIC)))
        groups = plan.groups

        cache = self._refresh(state)
        r = pod.requests
        out = cache.static[nodes]  # a copy (fancy indexing), filled in below
        delta, devices = self.fgd.delta(state, pod, nodes) if fgd_delta is None else fgd_delta
        out[:, _B + 2] = delta / MILLI_GPU_PER_DEVICE
        if groups["frag_before"]:
            out[:, _B + 3] = self.fgd.node_fragmentation(state)[nodes] / MILLI_GPU_PER_DEVICE
        if groups["cpu_after"]:
            cpu_after = cache.free_cpu[nodes] - r.milli_cpu
            out[:, 9] = _frac(cpu_after, state.alloc_milli_cpu[nodes])
            out[:, 12] = cpu_after / MAX_SPEC_MILLI_CPU
            out[:, _B + 7] = cpu_after <= 0
        if groups["mem_after"]:
            mem_after = cache.free_mem[nodes] - r.memory_bytes
            out[:, 10] = _frac(mem_after, state.alloc_memory_bytes[nodes])
            out[:, _B + 8] = mem_after <= 0
        if groups["gpu_after"]:
            gpu_cap = cache.gpu_cap[nodes]
            gpu_after = cache.gpu_free_total[nodes] - r.gpu_milli_total
            out[:, 11] = _frac(gpu_after, gpu_cap)
            out[:, 13] = gpu_after / MAX_SPEC_GPU_MILLI
            out[:, _B + 9] = (gpu_cap > 0) & (gpu_after <= 0)
            # best_fit_leftover (policies.best_fit.best_fit_leftover), from the columns at hand.
            out[:, _B] = 0.5 * out[:, 12] + 0.5 * out[:, 13]
        if groups["idle_after"]:
            out[:, 14] = (cache.idle[nodes] - r.gpu) / MAX_GPUS
        if groups["dot_product"]:
            out[:, _B + 1] = dot_product_alignment(state, pod, nodes)[0]
        if groups["allocation"]:
            req, alloc = _requested_after(state, pod, nodes)
            out[:, _B + 4] = least_allocated(req, alloc) / MAX_NODE_SCORE
            out[:, _B + 5] = balanced_allocation(req, alloc) / MAX_NODE_SCORE
        if groups["telemetry"]:
            # Telemetry changes without a placement: never cached.
            power = state.power_watts[nodes]
            carbon = state.carbon_g_per_kwh[nodes]
            power_ok = np.isfinite(power)
            carbon_ok = np.isfinite(carbon)
            out[:, _B + 10] = np.where(power_ok, power, 0.0) / 1000.0
            out[:, _B + 11] = power_ok
            out[:, _B + 12] = np.where(carbon_ok, carbon, 0.0) / 1000.0
            out[:, _B + 13] = carbon_ok
        out[:, _B + 15] = 0.0 if pod.allowed_gpu_models else out[:, _B + 14]
        if plan.zero.size:
            out[:, plan.zero] = 0.0  # uniform: a column not asked for is 0 unless cached anyway
        return out, devices

    @staticmethod
    def pod_features(state: ClusterState, pod: Pod, n_candidates: int) -> np.ndarray:
        r = pod.requests
        cpu_total = float(state.alloc_milli_cpu.sum())
        gpu_total = float(state.gpu_count.sum()) * MILLI_GPU_PER_DEVICE
        gpu_used = gpu_total - float(state.gpu_free_milli.sum())
        return np.array([
            r.milli_cpu / MAX_SPEC_MILLI_CPU,
            r.memory_bytes / _MAX_SPEC_MEMORY_BYTES,
            r.gpu_milli_total / MAX_SPEC_GPU_MILLI,
            r.gpu_milli / MILLI_GPU_PER_DEVICE,
            float(r.gpu_milli_total == 0),
            float(r.gpu_milli > 0),
            float(r.gpu > 0),
            float(bool(pod.allowed_gpu_models)),
            float(state.req_milli_cpu.sum()) / cpu_total if cpu_total else 0.0,
            gpu_used / gpu_total if gpu_total else 0.0,
            n_candidates / max(state.n_nodes, 1),
        ], dtype=np.float32)
