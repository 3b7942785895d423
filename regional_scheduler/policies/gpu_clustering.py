"""``gpu-clustering``: put pods of the same GPU shape together.

The FGD simulator's ``gpu_clustering_score.go``: a node whose placed pods all share the pod's GPU
shape class (shared, 1, 2, 4, 8 GPUs) scores in [75, 99]; a node hosting that class among others
in [50, 74]; an idle node in [25, 49]; a node with only other classes in [0, 24]. Within a band
the score grows with how little GPU is left: ``25 · (8000 − free milli-GPU) // 8000`` (integer
arithmetic), so an idle 8-GPU node scores exactly 25. CPU-only pods score 0.
"""

from __future__ import annotations

import numpy as np

from meridian.cluster_state import ClusterState, gpu_shape_class
from meridian.model import Pod
from regional_scheduler.policies.base import MAX_NODE_SCORE, MAX_SPEC_GPU_MILLI, Scores

NAME = "gpu-clustering"


class GpuClusteringPolicy:
    name = NAME

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        cls = gpu_shape_class(pod)
        if cls < 0:
            return Scores(np.zeros(nodes.size))
        counts = state.shape_class_count[nodes]
        present = counts > 0
        n_classes = present.sum(axis=1)
        has_own = present[:, cls]
        quarter = MAX_NODE_SCORE // 4
        within = quarter * (MAX_SPEC_GPU_MILLI - state.gpu_free_total_milli[nodes]) // MAX_SPEC_GPU_MILLI
        band = np.where(has_own, np.where(n_classes == 1, 3, 2), np.where(n_classes == 0, 1, 0))
        return Scores((within + band * quarter).astype(float))


def build() -> GpuClusteringPolicy:
    return GpuClusteringPolicy()
