"""GPU fragmentation as defined by the FGD paper (Weng et al., USENIX ATC '23, §3–4).

Given a *target workload* — the distribution of task shapes and their popularity — a node's
fragmentation is the expected amount of its unallocated GPU (milli-GPU) that a task drawn from
that distribution cannot use. Per task type ``t`` on node ``n`` (the paper's Fig. 4 quadrants and
the simulator's ``GetNodePodFrag``):

- ``t`` asks for no GPU (x-axis), the node's GPU model is not allowed for ``t`` (no access), or ``t``
  does not fit (lacks CPU, GPU or both): *all* of the node's free GPU counts as fragment;
- ``t`` fits (Q3): only the GPUs whose free share is below ``t``'s per-GPU request are fragment.

Cluster fragmentation is the sum over nodes. Everything here is vectorised over task types,
nodes and GPU devices: arrays are ``(T, m)`` or ``(T, m, D)``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from meridian.model import MILLI_GPU_PER_DEVICE, Pod


def shape_key(pod: Pod) -> tuple[int, int, int, tuple[str, ...]]:
    """A pod's task type: milli-CPU, milli-GPU per device, GPU count and allowed GPU models."""
    r = pod.requests
    return (r.milli_cpu, r.gpu_milli if r.gpu_milli else (MILLI_GPU_PER_DEVICE if r.gpu else 0),
            r.gpu or (1 if r.gpu_milli else 0), tuple(sorted(pod.allowed_gpu_models)))


@dataclass(frozen=True)
class TargetWorkload:
    """Typical task shapes with their popularity (probabilities summing to 1)."""

    milli_cpu: np.ndarray  # (T,)
    gpu_milli_per_device: np.ndarray  # (T,) 0 for CPU-only, 1000 for whole GPUs, else the share
    gpu_count: np.ndarray  # (T,)
    model_access: np.ndarray  # (T, n_models + 1) bool; last column = node without GPU model
    probability: np.ndarray  # (T,)

    @property
    def n_types(self) -> int:
        return int(self.probability.size)

    @classmethod
    def from_pods(cls, pods: Sequence[Pod], gpu_models: Sequence[str], *, popularity: float = 0.95) -> TargetWorkload:
        """The most popular shapes covering ``popularity`` of the pods, renormalised (the FGD
        simulator's typical-pods rule with ``podPopularityThreshold: 95``, CPU pods included)."""
        if not pods:
            raise ValueError("a target workload needs at least one pod")
        return cls.from_counts(Counter(shape_key(p) for p in pods), gpu_models, popularity=popularity)

    @classmethod
    def from_counts(cls, shapes: Mapping[tuple, int], gpu_models: Sequence[str], *,
                    popularity: float = 0.95) -> TargetWorkload:
        """:meth:`from_pods` from pod counts per :func:`shape_key` (zero counts are ignored)."""
        total = sum(shapes.values())
        if total <= 0:
            raise ValueError("a target workload needs at least one pod")
        chosen, covered = [], 0
        for shape, count in sorted(shapes.items(), key=lambda kv: (-kv[1], kv[0])):
            if count <= 0:
                break
            chosen.append((shape, count))
            covered += count
            if covered >= popularity * total:
                break
        n_models = len(gpu_models)
        access = np.ones((len(chosen), n_models + 1), dtype=bool)
        for i, ((_, _, _, models), _) in enumerate(chosen):
            if models:
                access[i, :] = False
                for m in models:
                    if m in gpu_models:
                        access[i, list(gpu_models).index(m)] = True
        counts = np.array([c for _, c in chosen], dtype=float)
        return cls(
            milli_cpu=np.array([s[0] for s, _ in chosen], dtype=np.int64),
            gpu_milli_per_device=np.array([s[1] for s, _ in chosen], dtype=np.int64),
            gpu_count=np.array([s[2] for s, _ in chosen], dtype=np.int64),
            model_access=access,
            probability=counts / counts.sum(),
        )

    def distance(self, other: TargetWorkload) -> float:
        """Total-variation distance between the two shape distributions (0 = same, 1 = disjoint).

        Exactly rounded (``math.fsum``): a plain sum over the key set depends on the set's order,
        i.e. on the process's hash seed, and online FGD compares this value with a threshold."""
        mine, theirs = self._by_shape(), other._by_shape()
        return 0.5 * math.fsum(abs(mine.get(k, 0.0) - theirs.get(k, 0.0)) for k in mine.keys() | theirs.keys())

    def _by_shape(self) -> dict[tuple, float]:
        # Two shapes can be one type: gpuspec25 lists 'V100M16|V100M32' and 'V100M16|V100M32|V100M32', and
        # two models the cluster lacks both give no access. Their probabilities add up, or the distance
        # would miss one of them.
        out: dict[tuple, float] = {}
        for key, p in zip(self.type_keys(), self.probability.tolist(), strict=True):
            out[key] = out.get(key, 0.0) + p
        return out

    def type_keys(self) -> list[tuple]:
        """One hashable key per task type, in row order."""
        return [(int(c), int(g), int(n), a.tobytes())
                for c, g, n, a in zip(self.milli_cpu, self.gpu_milli_per_device, self.gpu_count, self.model_access,
                                      strict=True)]

    def select(self, rows: np.ndarray) -> TargetWorkload:
        """The task types at ``rows``, their probabilities as they are (not renormalised)."""
        return TargetWorkload(self.milli_cpu[rows], self.gpu_milli_per_device[rows], self.gpu_count[rows],
                              self.model_access[rows], self.probability[rows])


def node_fragmentation_milli(
    workload: TargetWorkload,
    free_milli_cpu: np.ndarray,
    gpu_free_milli: np.ndarray,
    gpu_model_id: np.ndarray,
) -> np.ndarray:
    """Expected fragmented milli-GPU of each node, shape ``(m,)``.

    ``free_milli_cpu`` (m,), ``gpu_free_milli`` (m, D) with 0 in slots without a device,
    ``gpu_model_id`` (m,) with -1 for nodes without GPUs.
    """
    total = gpu_free_milli.sum(axis=1)
    per_type = fragment_per_type(workload, free_milli_cpu, gpu_free_milli, gpu_model_id, total)
    return workload.probability @ per_type


def fragment_per_type(
    workload: TargetWorkload,
    free_milli_cpu: np.ndarray,
    gpu_free_milli: np.ndarray,
    gpu_model_id: np.ndarray,
    total: np.ndarray,
) -> np.ndarray:
    """Fragmented milli-GPU per task type and node, ``(T, m)``."""
    need = workload.gpu_milli_per_device[:, None, None]
    left = gpu_free_milli[None, :, :]
    fits_device = left >= need  # (T, m, D)
    n_fit = fits_device.sum(axis=2)
    too_small = np.where(fits_device, 0, left).sum(axis=2)  # free GPU slices a task of type t cannot use
    access = workload.model_access[:, gpu_model_id]  # column -1 = "no model"
    satisfied = (
        access
        & (free_milli_cpu[None, :] >= workload.milli_cpu[:, None])
        & (n_fit >= workload.gpu_count[:, None])
        & (workload.gpu_milli_per_device[:, None] > 0)
    )
    return np.where(satisfied, too_small, total[None, :])


def cluster_fragmentation_milli(workload: TargetWorkload, free_milli_cpu: np.ndarray, gpu_free_milli: np.ndarray,
                                gpu_model_id: np.ndarray) -> float:
    return float(node_fragmentation_milli(workload, free_milli_cpu, gpu_free_milli, gpu_model_id).sum())
