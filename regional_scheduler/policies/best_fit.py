"""``best-fit``: the node whose CPU and GPU left over after placement is smallest.

Follows the FGD simulator's ``best_fit_score.go``: ``s = Σ_r w_r (free_r − req_r) / maxSpec_r`` over
(CPU, GPU) with weights 0.5/0.5 and ``maxSpec`` = (128 CPUs, 8 GPUs); the node score is
``int((1 − s) · 100)`` (lower leftover is better). Ties (the integer score makes them common) go
to the first node in node order, the scheduler's rule; the FGD simulator draws among them at random.
"""

from __future__ import annotations

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.model import Pod
from regional_scheduler.policies.base import MAX_NODE_SCORE, MAX_SPEC_GPU_MILLI, MAX_SPEC_MILLI_CPU, Scores

NAME = "best-fit"


def best_fit_leftover(state: ClusterState, pod: Pod, nodes: np.ndarray) -> np.ndarray:
    """Normalised leftover in [0, 1] (0 = perfect fit); also a feature of the learned policy."""
    cpu_left = (state.free_milli_cpu[nodes] - pod.requests.milli_cpu) / MAX_SPEC_MILLI_CPU
    gpu_left = (state.gpu_free_total_milli[nodes] - pod.requests.gpu_milli_total) / MAX_SPEC_GPU_MILLI
    return 0.5 * cpu_left + 0.5 * gpu_left


class BestFitPolicy:
    name = NAME

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        leftover = best_fit_leftover(state, pod, nodes)
        return Scores(np.floor((1.0 - leftover) * MAX_NODE_SCORE))


def build() -> BestFitPolicy:
    return BestFitPolicy()
