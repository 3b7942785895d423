"""FGD's scoring math (Weng et al., USENIX ATC '23): how much a pod on a node would change the cluster's
expected GPU fragmentation (:mod:`meridian.fragmentation`), and the node score that follows.

As in the paper's simulator (``fgd_score.go``), the node score is ``int(sigmoid(Δ / 1000) · 100)`` with
``Δ = frag_before − frag_after`` in milli-GPU. Every function here is a pure function of the cluster's
state and the target workload; :mod:`regional_scheduler.policies.fgd` caches their results per pod
shape and node, and keeps the target workload.
"""

from __future__ import annotations

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.fragmentation import TargetWorkload, fragment_per_type
from meridian.model import MILLI_GPU_PER_DEVICE, Pod
from regional_scheduler.policies.base import MAX_NODE_SCORE

# Fragmentation is a probability-weighted sum, so the same node's value differs by ~1e-14 with the
# number of nodes numpy's reduction saw at once (the cache computes stale nodes in batches of varying
# size). At Δ = 0 FGD's integer score sits exactly on the 50/49 boundary, so that noise flipped its
# choice, and the learned policy reads Δ as a feature. Deltas are therefore rounded to this grid
# (milli-GPU): a real delta is at least one milli-GPU times the smallest shape probability
# (1 / pod-list length, ~1e-4), far above it.
DELTA_DECIMALS = 6
DEVICE_TOLERANCE = 1e-6


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def node_score(delta: np.ndarray) -> np.ndarray:
    """The paper's node score of each fragmentation increase ``delta`` (milli-GPU): 0 to ``MAX_NODE_SCORE``."""
    return np.floor(sigmoid(-delta / 1000.0) * MAX_NODE_SCORE)


def after_per_type(
    state: ClusterState, pod: Pod, nodes: np.ndarray, workload: TargetWorkload
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each task type's fragment of each candidate node once ``pod`` is there: ``(T, k)``, or for a
    shared-GPU pod ``(T, k, D)``, one column per device it could take, with the ``(k, D)`` mask of
    the devices that can take it."""
    r = pod.requests
    cpu_after = state.free_milli_cpu[nodes] - r.milli_cpu
    left = state.gpu_free_milli[nodes]
    model = state.gpu_model_id[nodes]
    if r.gpu_milli:
        per_type = _shared_gpu_per_type_after(workload, cpu_after, left, model, r.gpu_milli)
        return per_type, (left >= r.gpu_milli) & state.gpu_exists[nodes]
    if r.gpu:
        idle = (left == MILLI_GPU_PER_DEVICE) & state.gpu_exists[nodes]
        take = idle & (np.cumsum(idle, axis=1) <= r.gpu)
        left = np.where(take, 0, left)
    return fragment_per_type(workload, cpu_after, left, model, left.sum(axis=1)), None


def weigh(probability: np.ndarray, per_type: np.ndarray, usable: np.ndarray | None,
          frag_before: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`after_per_type`'s fragments weighted by the target workload: the delta per node and,
    for a shared-GPU pod, the device that minimises it."""
    if usable is not None:
        frag = np.where(usable, np.einsum("t,tkd->kd", probability, per_type), np.inf)
        # The first device within tolerance of the best, so equal devices never tie-break on noise.
        device = (frag <= frag.min(axis=1, keepdims=True) + DEVICE_TOLERANCE).argmax(axis=1)
        frag_after = frag[np.arange(frag.shape[0]), device]
        return quantise(frag_after - frag_before), device
    return quantise(probability @ per_type - frag_before), np.full(per_type.shape[1], -1)


def quantise(delta: np.ndarray) -> np.ndarray:
    return np.round(delta, DELTA_DECIMALS) + 0.0  # + 0.0 turns -0.0 into 0.0


def _shared_gpu_per_type_after(
    workload: TargetWorkload, cpu_after: np.ndarray, left: np.ndarray, model: np.ndarray, gpu_milli: int,
) -> np.ndarray:
    """Each type's fragment of each node (k) after taking ``gpu_milli`` from each of its devices (D),
    ``(T, k, D)``; meaningless where the device cannot take it.

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
    return np.where(satisfied, too_small_after, total_after[None, :, None])


def fragments_now(state: ClusterState, nodes: np.ndarray, workload: TargetWorkload) -> np.ndarray:
    """Each task type's fragment of each of ``nodes`` as they are, ``(T, k)``."""
    gpu = state.gpu_free_milli[nodes]
    return fragment_per_type(workload, state.free_milli_cpu[nodes], gpu, state.gpu_model_id[nodes], gpu.sum(axis=1))
