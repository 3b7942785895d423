"""Placement quality metrics, vectorised over nodes.

- ``seed_fragmentation_score``: the seed analysis' score — the mean of the Gini coefficients of
  free CPU and free memory across nodes, × 100 (0 = free capacity spread evenly).
- FGD fragmentation (:mod:`meridian.fragmentation`) as % of cluster GPUs and % of idle GPUs.
- allocation ratios (CPU, memory, GPU), failure rate, variance of node utilisation,
  Jain's fairness index.
"""

from __future__ import annotations

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.fragmentation import TargetWorkload, cluster_fragmentation_milli
from meridian.model import MILLI_GPU_PER_DEVICE


def gini(values: np.ndarray) -> float:
    """Gini coefficient of non-negative values (0 = all equal, → 1 = one holds everything)."""
    x = np.sort(np.asarray(values, dtype=float).ravel())
    if x.size == 0:
        return 0.0
    if (x < 0).any():
        raise ValueError("gini is defined for non-negative values")
    total = x.sum()
    if total == 0:
        return 0.0
    n = x.size
    ranks = np.arange(1, n + 1)
    return float((2.0 * (ranks * x).sum()) / (n * total) - (n + 1.0) / n)


def jain_fairness(values: np.ndarray) -> float:
    """Jain's index ``(Σx)² / (n · Σx²)``: 1 when all equal, 1/n when one gets everything."""
    x = np.asarray(values, dtype=float).ravel()
    if x.size == 0:
        return 1.0
    denom = x.size * float((x * x).sum())
    return 1.0 if denom == 0 else float(x.sum() ** 2 / denom)


def seed_fragmentation_score(state: ClusterState) -> float:
    return 100.0 * 0.5 * (gini(state.free_milli_cpu) + gini(state.free_memory_bytes))


def cpu_alloc_pct(state: ClusterState) -> float:
    total = state.alloc_milli_cpu.sum()
    return 100.0 * float(state.req_milli_cpu.sum()) / float(total) if total else 0.0


def mem_alloc_pct(state: ClusterState) -> float:
    total = state.alloc_memory_bytes.sum()
    return 100.0 * float(state.req_memory_bytes.sum()) / float(total) if total else 0.0


def gpu_capacity_milli(state: ClusterState) -> int:
    return int(state.gpu_count.sum()) * MILLI_GPU_PER_DEVICE


def gpu_alloc_pct(state: ClusterState) -> float | None:
    cap = gpu_capacity_milli(state)
    if cap == 0:
        return None
    return 100.0 * (cap - float(state.gpu_free_milli[state.gpu_exists].sum())) / cap


def gpu_idle_split(state: ClusterState) -> tuple[float, float]:
    """Idle GPU capacity in GPUs, as (on devices partly in use, on wholly free devices). Shares of one
    device leave the first; whole devices stranded by CPU or memory, or waiting for a multi-GPU pod,
    the second."""
    free = state.gpu_free_milli[state.gpu_exists]
    partial = (free > 0) & (free < MILLI_GPU_PER_DEVICE)
    return float(free[partial].sum()) / MILLI_GPU_PER_DEVICE, float((free == MILLI_GPU_PER_DEVICE).sum())


def util_variance(state: ClusterState) -> float:
    """Variance across nodes of the mean of CPU and memory allocation fractions."""
    cpu = state.req_milli_cpu / np.maximum(state.alloc_milli_cpu, 1)
    mem = state.req_memory_bytes / np.maximum(state.alloc_memory_bytes, 1)
    return float(np.var((cpu + mem) / 2.0))


def gpu_fragmentation(state: ClusterState, workload: TargetWorkload) -> tuple[float, float] | None:
    """FGD fragmentation as (% of cluster GPUs, % of idle GPUs); None without GPUs."""
    cap = gpu_capacity_milli(state)
    if cap == 0:
        return None
    frag = cluster_fragmentation_milli(workload, state.free_milli_cpu, state.gpu_free_milli, state.gpu_model_id)
    idle = float(state.gpu_free_milli.sum())
    return 100.0 * frag / cap, (100.0 * frag / idle if idle else 0.0)
