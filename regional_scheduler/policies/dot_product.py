"""``dot-product``: Tetris' alignment heuristic (Grandl et al., SIGCOMM '14), as the FGD simulator
runs it (``dot_product_score.go`` with ``-dimext share -norm max``).

Vectors are (CPU, GPU) normalised by the maximum node spec. For a shared-GPU pod each device that
fits is a separate candidate whose GPU dimension is that device's free share; for whole-GPU and
CPU-only pods the GPU dimension is the node's total free GPU. The simulator scores
``1 − (free · request) / dims`` — the smaller the product of what is free and what is asked, the
tighter the packing — and keeps the best device; the node score is that × 100, truncated.
"""

from __future__ import annotations

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.model import MILLI_GPU_PER_DEVICE, Pod
from regional_scheduler.policies.base import MAX_NODE_SCORE, MAX_SPEC_GPU_MILLI, MAX_SPEC_MILLI_CPU, Scores

NAME = "dot-product"


def dot_product_alignment(state: ClusterState, pod: Pod, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node: the best (smallest) normalised dot product and the device that gives it."""
    r = pod.requests
    cpu = state.free_milli_cpu[nodes] / MAX_SPEC_MILLI_CPU * (r.milli_cpu / MAX_SPEC_MILLI_CPU)
    if r.gpu_milli:
        left = state.gpu_free_milli[nodes]
        fits = (left >= r.gpu_milli) & state.gpu_exists[nodes]
        gpu = left / MILLI_GPU_PER_DEVICE * (r.gpu_milli / MILLI_GPU_PER_DEVICE)
        dot = np.where(fits, (cpu[:, None] + gpu) / 2, np.inf)
        device = dot.argmin(axis=1)
        return dot[np.arange(nodes.size), device], device
    gpu = state.gpu_free_total_milli[nodes] / MAX_SPEC_GPU_MILLI * (r.gpu_milli_total / MAX_SPEC_GPU_MILLI)
    return (cpu + gpu) / 2, np.full(nodes.size, -1)


class DotProductPolicy:
    name = NAME

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        dot, device = dot_product_alignment(state, pod, nodes)
        return Scores(np.floor((1.0 - dot) * MAX_NODE_SCORE), device)


def build() -> DotProductPolicy:
    return DotProductPolicy()
