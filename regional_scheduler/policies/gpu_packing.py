"""``gpu-packing``: fill partly used GPUs first, then idle GPUs on used nodes, then idle nodes.

The FGD simulator's ``gpu_packing_score.go`` rule, from high to low score:
1. the pod fits on already shared GPUs: ``100 − (free share of the used GPUs in %)/10``, at least 50;
2. it needs idle GPUs on a node that is partly used: ``50 − idle GPUs used``, at least 33;
3. the node is completely idle: ``33 − its GPU count``, at least its GPU count.
CPU-only pods score 0 everywhere, so the first feasible node takes them (the framework's tie-break). Devices are taken tightest-first.
"""

from __future__ import annotations

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.model import MILLI_GPU_PER_DEVICE, Pod
from regional_scheduler.policies.base import MAX_NODE_SCORE, Scores

NAME = "gpu-packing"


class GpuPackingPolicy:
    name = NAME

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        r = pod.requests
        if not r.gpu_milli_total:
            return Scores(np.zeros(nodes.size))
        full_free = state.gpu_full_free[nodes]
        count = state.gpu_count[nodes]
        idle_node = full_free == count
        case3 = np.maximum(MAX_NODE_SCORE // 3 - full_free, full_free)
        if r.gpu:  # whole GPUs always come from idle devices
            case2 = np.maximum(MAX_NODE_SCORE // 2 - r.gpu, MAX_NODE_SCORE // 3)
            return Scores(np.where(idle_node, case3, case2).astype(float))
        left = state.gpu_free_milli[nodes]
        fits = (left >= r.gpu_milli) & state.gpu_exists[nodes]
        partial_fit = fits & (left < MILLI_GPU_PER_DEVICE)
        tightest = np.where(partial_fit, left, MILLI_GPU_PER_DEVICE + 1).min(axis=1)
        case1 = np.maximum(MAX_NODE_SCORE - (tightest * 100 // MILLI_GPU_PER_DEVICE) // 10, MAX_NODE_SCORE // 2)
        case2 = np.full(nodes.size, max(MAX_NODE_SCORE // 2 - 1, MAX_NODE_SCORE // 3))
        score = np.where(idle_node, case3, np.where(partial_fit.any(axis=1), case1, case2))
        return Scores(score.astype(float))


def build() -> GpuPackingPolicy:
    return GpuPackingPolicy()
