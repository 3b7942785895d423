"""The placement tier's decision windows for continual learning: what one window is, how it travels in a
learning record, and what a checkpoint scores on it.

A **window** is one small, complete placement episode: a random subset of the openb GPU nodes (empty at
the start) and the pods that arrive on it, drawn from one openb pod list until their GPU request reaches
the subset's GPU capacity. Each pod is placed online, in arrival order, by FGD with the checkpoint's
bounded correction (:func:`~regional_scheduler.learned.policy.residual_logits`), as it is served. The
window's outcome is the number of pods that fit no node (``unschedulable_pods``) and the cluster's GPU
fragmentation at its end (``gpu_fragmentation``, the FGD measure as a share of GPU capacity). Small
windows make a counterfactual cheap (tens of milliseconds), so the bench can score ~45 checkpoints on
hundreds of windows, and a window's outcome depends on its placements alone.

FGD's target workload is the pods of the windows before (:data:`HISTORY_WINDOWS` of them), as a live
FGD estimates it from the pods it has recently placed: no decision sees a pod that has not arrived. A
window's pods (and the nodes) travel in its learning record's ``data``
(:func:`encode_window` / :func:`decode_window`), and the scenario scores the decoded pods, so a
retrainer that reads records trains on exactly what was scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meridian.lifecycle.records import DataValue
from meridian.model import MIB, Node, Pod, Resources
from regional_scheduler.learned.algorithm import rollout
from regional_scheduler.learned.env import Episode
from regional_scheduler.learned.numpy_policy import NumpyPlacementNet

# 16 of the 1,213 GPU nodes (~80 GPUs): a multigpu50 window is ~67 pods, a gpushare100 one ~170, 30–80 ms
# to replay on one core. On 8-node windows placement has too little choice to matter: no fine-tuned
# correction beat another there (oracle vs stale +0.03 ± 0.18 pods a window over 100 windows).
NODES_PER_WINDOW = 16
# FGD's target workload: the pods of the two windows before (~130–340 pods), as a live FGD's online
# window of recent pods; a regime change reaches it two windows late, for every model alike.
HISTORY_WINDOWS = 2
UNSCHEDULABLE = "unschedulable_pods"
GPU_FRAGMENTATION = "gpu_fragmentation"
POD_REQUEST_MIX = "pod_request_mix"
NODE_UTILISATION = "node_utilisation"


@dataclass(frozen=True)
class Window:
    """One window's input: the subset's nodes (positions in the node list) and the pods in arrival order."""

    index: int
    node_index: tuple[int, ...]
    pods: tuple[Pod, ...]


def draw_window(index: int, pod_list: Sequence[Pod], node_gpus: np.ndarray, rng: np.random.Generator,
                *, nodes_per_window: int = NODES_PER_WINDOW) -> Window:
    """A random node subset and pods drawn (with replacement) from ``pod_list`` until their GPU request
    reaches the subset's GPU capacity: the window ends full, where placement decides who fits."""
    node_index = np.sort(rng.choice(node_gpus.size, size=nodes_per_window, replace=False))
    capacity_milli = int(node_gpus[node_index].sum()) * 1000
    pods: list[Pod] = []
    requested_milli = 0
    while requested_milli < capacity_milli:
        pod = pod_list[int(rng.integers(len(pod_list)))]
        pods.append(pod)
        requested_milli += pod.requests.gpu_milli_total
    # Through the record's encoding, so the scenario scores what a retrainer reads back.
    return decode_window(index, encode_window(node_index.tolist(), pods))


def encode_window(node_index: Sequence[int], pods: Sequence[Pod]) -> dict[str, DataValue]:
    """A window as a learning record's ``data``: per pod ``[milli_cpu, memory_mib, gpu, gpu_milli]``
    (whole GPUs or a share of one) and its allowed GPU models (``|``-joined, empty: any)."""
    return {
        "node_index": [float(i) for i in node_index],
        "pod_requests": [[float(p.requests.milli_cpu), float(p.requests.memory_bytes // MIB),
                          float(p.requests.gpu), float(p.requests.gpu_milli)] for p in pods],
        "pod_gpu_models": ["|".join(p.allowed_gpu_models) for p in pods],
    }


def decode_window(index: int, data: dict[str, DataValue]) -> Window:
    """The window a learning record's ``data`` describes (:func:`encode_window`)."""
    requests = data["pod_requests"]
    models = data["pod_gpu_models"]
    if len(requests) != len(models):
        raise ValueError(f"window {index}: {len(requests)} pod requests but {len(models)} GPU-model entries")
    pods = tuple(
        Pod(name=f"w{index}-p{j}",
            requests=Resources(milli_cpu=int(r[0]), memory_bytes=int(r[1]) * MIB, gpu=int(r[2]),
                               gpu_milli=int(r[3])),
            allowed_gpu_models=tuple(m for m in str(spec).split("|") if m))
        for j, (r, spec) in enumerate(zip(requests, models, strict=True)))  # type: ignore[arg-type]
    return Window(index, tuple(int(i) for i in data["node_index"]), pods)  # type: ignore[arg-type]


def window_episodes(windows: Sequence[Window], nodes: Sequence[Node], *,
                    history: Sequence[Pod] = ()) -> list[Episode]:
    """Each window as an :class:`Episode`, FGD's target workload being the pods of the
    :data:`HISTORY_WINDOWS` windows before it (``history``: the pods before the first one)."""
    episodes = []
    recent: list[tuple[Pod, ...]] = [tuple(history)]
    for window in windows:
        workload = [pod for pods in recent[-HISTORY_WINDOWS:] for pod in pods] or list(window.pods)
        episodes.append(Episode([nodes[i] for i in window.node_index], list(window.pods), workload, None))
        recent.append(window.pods)
    return episodes


def episode_outcome(policy: NumpyPlacementNet, episode: Episode) -> tuple[float, float]:
    """``(unschedulable pods, GPU fragmentation)`` of one window placed by ``policy``."""
    result = rollout(policy, episode)
    return float(result.n_failed), float(result.fragmentation)


def window_features(window: Window, node_gpus: np.ndarray) -> dict[str, list[float]]:
    """The drift detectors' samples of a window, in arrival order, one per pod: its GPU request in GPUs
    (``pod_request_mix``: a share below 1, whole GPUs above) and the subset's requested GPU share after
    it arrives (``node_utilisation``: the demand the nodes carry, whichever model places it)."""
    capacity = float(node_gpus[list(window.node_index)].sum())
    request = np.array([p.requests.gpu_milli_total / 1000.0 for p in window.pods])
    return {POD_REQUEST_MIX: request.tolist(),
            NODE_UTILISATION: np.minimum(np.cumsum(request) / max(capacity, 1.0), 1.0).tolist()}
