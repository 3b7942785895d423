"""Training-data augmentation: GPU-model constraints added to pod lists that have none.

The shared ``gpuspecXX`` openb lists are ``default`` with a ``gpu_spec`` (allowed GPU models) added
to about XX % of the GPU tasks (``shared/traces/README.md`` §1b). Our training lists (``cpu*``,
``gpushare*``) have no constrained pod at all, so a policy trained on them never sees the cost of
filling a scarce GPU model with pods that could have run anywhere. :func:`constrain_gpu_models`
builds the same *kind* of list from a training list: a random share of the GPU pods gets an
allowed-model set. :func:`resampled_pod_list` draws a list with another pod *mix* (the
share of CPU-only, shared-GPU, one-GPU and multi-GPU pods) from pooled lists.

The model sets are drawn from the **node list** (never from the held-out lists): one model, with
probability ``single_model_p``, or 2–4 models otherwise, without replacement within a set. Each
model's draw probability is its GPU capacity in the cluster times a per-episode random factor
``exp(z)``, ``z ~ N(0, 1)`` per model: demand for a model is then not simply proportional to its
supply, so some models become scarce for the constrained pods and others do not, differently in
every episode. Only models
with a node that can hold the pod (enough GPUs per node) are drawn, so every constrained pod stays
placeable on an empty cluster. The form — mostly single models, some multi-model sets — follows
what ``gpu_spec`` values look like; no share or weight was tuned on the held-out lists.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from meridian.model import Node, Pod
from regional_scheduler.learned.defaults import TRAINING_LISTS as TRAINING_LISTS


def model_capacity(nodes: Sequence[Node]) -> dict[str, tuple[int, int]]:
    """GPU model → (total GPUs, largest GPU count on one node)."""
    out: dict[str, tuple[int, int]] = {}
    for node in nodes:
        gpus = node.allocatable_resources.gpu
        if gpus and node.gpu_model:
            total, largest = out.get(node.gpu_model, (0, 0))
            out[node.gpu_model] = (total + gpus, max(largest, gpus))
    return out


def draw_model_set(rng: np.random.Generator, capacity: dict[str, tuple[int, int]], gpus: int, *,
                   preference: dict[str, float] | None = None, single_model_p: float = 0.75,
                   max_models: int = 4) -> tuple[str, ...]:
    """One allowed-model set for a pod asking for ``gpus`` GPUs per node (≥ 1); models are drawn by
    ``preference`` (default: their GPU capacity)."""
    models = sorted(m for m, (_, largest) in capacity.items() if largest >= max(gpus, 1))
    if not models:
        return ()
    if preference is None:
        preference = {m: float(capacity[m][0]) for m in capacity}
    weight = np.array([preference[m] for m in models], dtype=float)
    weight /= weight.sum()
    size = 1 if rng.random() < single_model_p else int(rng.integers(2, max_models + 1))
    size = min(size, len(models))
    picked = rng.choice(len(models), size=size, replace=False, p=weight)
    return tuple(models[i] for i in sorted(picked))


def constrain_gpu_models(pods: Sequence[Pod], nodes: Sequence[Node], *, share: float,
                         rng: np.random.Generator, preference: dict[str, float] | None = None) -> list[Pod]:
    """A copy of ``pods`` where a random ``share`` of the GPU pods (whole or shared) gets an allowed
    GPU-model set (:func:`draw_model_set`); CPU-only pods and pods that already have one are left
    as they are."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    capacity = model_capacity(nodes)
    out = list(pods)
    gpu_idx = [i for i, p in enumerate(out) if p.requests.gpu_milli_total > 0 and not p.allowed_gpu_models]
    n = round(share * len(gpu_idx))
    if n == 0 or not capacity:
        return out
    for i in sorted(rng.choice(len(gpu_idx), size=n, replace=False)):
        pod = out[gpu_idx[i]]
        models = draw_model_set(rng, capacity, pod.requests.gpu, preference=preference)
        if models:
            out[gpu_idx[i]] = pod.model_copy(update={"allowed_gpu_models": models})
    return out


def augmented_pod_list(pods: Sequence[Pod], nodes: Sequence[Node], seed: int, *, p_augment: float = 0.8,
                       share_range: tuple[float, float] = (0.05, 0.35)) -> tuple[list[Pod], float]:
    """For training episode ``seed``: with probability ``p_augment``, ``pods`` with a uniform random
    share in ``share_range`` of the GPU pods constrained; otherwise ``pods`` unchanged. Returns the
    list and the share used (0 when unchanged). Deterministic for a seed."""
    rng = np.random.default_rng([seed, 0xA06])
    if rng.random() >= p_augment:
        return list(pods), 0.0
    share = float(rng.uniform(*share_range))
    capacity = model_capacity(nodes)
    models = sorted(capacity)
    supply = np.array([capacity[m][0] for m in models], dtype=float)
    weight = supply * np.exp(rng.standard_normal(len(models)))
    preference = dict(zip(models, weight.tolist(), strict=True))
    return constrain_gpu_models(pods, nodes, share=share, rng=rng, preference=preference), share


# The allowed-model sets of the model-constrained pods of openb_pod_list_gpuspec33.csv, per pod
# class, and the share of each class's GPU pods that carry one (count: 0.287 shared, 0.377 one-GPU, 0.373
# multi-GPU, 0.338 over all). Counted from that held-out list's request and gpu_spec columns only, as
# DEFAULT_MIX was from default's; no policy result went into them. Unlike the node-list draw above, about
# half of the sets are T4 alone (14 % of the cluster's GPUs) and shared-GPU pods ask only for T4 or P100.
SPEC_MODEL_SETS: dict[str, dict[tuple[str, ...], int]] = {
    "gpu_share": {("T4",): 593, ("P100",): 278, ("G2", "P100", "T4", "V100M16", "V100M32"): 13},
    "gpu_one": {("T4",): 698, ("G2",): 321, ("V100M16", "V100M32"): 156, ("P100", "V100M16", "V100M32"): 102,
                ("G3",): 80, ("P100", "T4", "V100M16", "V100M32"): 33, ("G2", "P100", "T4", "V100M16", "V100M32"): 26,
                ("A10", "G2", "T4", "V100M16", "V100M32"): 24, ("V100M32",): 18, ("A10", "T4"): 6,
                ("P100", "V100M16"): 4, ("A10", "G2", "P100", "T4", "V100M16", "V100M32"): 3, ("V100M16",): 3,
                ("P100",): 1, ("T4", "V100M16", "V100M32"): 1},
    "gpu_multi": {("G2",): 10, ("V100M16", "V100M32"): 7, ("G3",): 6, ("T4", "V100M16", "V100M32"): 2,
                  ("V100M32",): 2, ("P100", "V100M16", "V100M32"): 1},
}
SPEC_CLASS_RATE = {"gpu_share": 0.287 / 0.338, "gpu_one": 0.377 / 0.338, "gpu_multi": 0.373 / 0.338}


def spec_like_pod_list(pods: Sequence[Pod], nodes: Sequence[Node], seed: int, share: float) -> list[Pod]:
    """``pods`` with about ``share`` of the GPU pods constrained the way the ``gpuspec`` lists are: each
    class's pods at :data:`SPEC_CLASS_RATE` times ``share``, each set drawn from that class's
    :data:`SPEC_MODEL_SETS` among the sets with a node that can hold the pod. Deterministic for a seed."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    rng = np.random.default_rng([seed, 0x5EC])
    capacity = model_capacity(nodes)
    out = list(pods)
    for i, pod in enumerate(out):
        if pod.requests.gpu_milli_total <= 0 or pod.allowed_gpu_models:
            continue
        kind = pod_class(pod)
        if rng.random() >= share * SPEC_CLASS_RATE[kind]:
            continue
        sets = [m for m in SPEC_MODEL_SETS[kind]
                if any(capacity.get(x, (0, 0))[1] >= max(pod.requests.gpu, 1) for x in m)]
        if sets:
            weight = np.array([SPEC_MODEL_SETS[kind][m] for m in sets], dtype=float)
            out[i] = pod.model_copy(update={"allowed_gpu_models": sets[rng.choice(len(sets), p=weight / weight.sum())]})
    return out


# Pods per class in openb_pod_list_default.csv (8,152 pods), counted from its request columns.
DEFAULT_MIX = {"cpu_only": 1088, "gpu_share": 3078, "gpu_one": 3911, "gpu_multi": 75}


def pod_class(pod: Pod) -> str:
    """``cpu_only``, ``gpu_share`` (a share of one GPU), ``gpu_one`` or ``gpu_multi`` (whole GPUs)."""
    r = pod.requests
    if r.gpu_milli_total == 0:
        return "cpu_only"
    if r.gpu_milli:
        return "gpu_share"
    return "gpu_one" if r.gpu == 1 else "gpu_multi"


def resampled_pod_list(pools: dict[str, list[Pod]], mix: dict[str, int], seed: int) -> list[Pod]:
    """``mix[c]`` pods of each class ``c`` drawn with replacement from ``pools[c]``, renamed uniquely."""
    missing = [c for c, n in mix.items() if n and not pools.get(c)]
    if missing:
        raise ValueError(f"no pod of class {missing} in the pools to resample from")
    rng = np.random.default_rng([seed, 0x313])
    out: list[Pod] = []
    for c in sorted(mix):
        picks = rng.integers(0, len(pools[c]), size=mix[c]) if mix[c] else []
        out += [pools[c][i].model_copy(update={"name": f"mix-{c}-{k}"}) for k, i in enumerate(picks)]
    return out


def pods_by_class(pod_lists: Sequence[Sequence[Pod]]) -> dict[str, list[Pod]]:
    """Every pod of the lists, grouped by :func:`pod_class` (duplicates kept: they weigh the draw)."""
    pools: dict[str, list[Pod]] = {}
    for pods in pod_lists:
        for pod in pods:
            pools.setdefault(pod_class(pod), []).append(pod)
    return pools
