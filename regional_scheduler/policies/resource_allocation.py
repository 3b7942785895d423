"""kube-scheduler's ``NodeResourcesFit`` scoring strategies and ``NodeResourcesBalancedAllocation``.

Pure functions over requested-after-placement and allocatable arrays, chosen from a dict as
kube-scheduler's ``nodeResourceStrategyTypeMap`` does (pkg/scheduler/framework/plugins/noderesources):

- LeastAllocated: ``Σ_r w_r · (alloc_r − req_r) · 100 / alloc_r / Σ w`` (integer arithmetic);
- MostAllocated: ``Σ_r w_r · req_r · 100 / alloc_r / Σ w``;
- RequestedToCapacityRatio: a piecewise-linear ``shape`` of utilisation (0–100) → score (0–10),
  scaled ×10, averaged with weights;
- BalancedAllocation: ``(1 − std(fractions)) · 100`` over the requested fractions.

Resources are CPU and memory with weight 1 each (the default ``resources`` of the plugin args).
``balanced`` is the default kube-scheduler profile's sum of BalancedAllocation and LeastAllocated
(both weight 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.model import Pod
from regional_scheduler.policies.base import MAX_NODE_SCORE, Scores

# One policy class, four policies: each constructor ``build_<variant>`` builds ``<VARIANT>_NAME``.
LEAST_NAME = "least-allocated"
MOST_NAME = "most-allocated"
BALANCED_NAME = "balanced"
RTCR_NAME = "requested-to-capacity"

Strategy = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (requested (R,k), allocatable (R,k)) -> (k,)


def _requested_after(state: ClusterState, pod: Pod, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    req = np.stack([state.req_milli_cpu[nodes] + pod.requests.milli_cpu,
                    state.req_memory_bytes[nodes] + pod.requests.memory_bytes])
    alloc = np.stack([state.alloc_milli_cpu[nodes], state.alloc_memory_bytes[nodes]])
    return req, alloc


def least_allocated(req: np.ndarray, alloc: np.ndarray) -> np.ndarray:
    safe = np.maximum(alloc, 1)
    per = np.where((alloc > 0) & (req <= alloc), (alloc - req) * MAX_NODE_SCORE // safe, 0)
    return per.sum(axis=0) // req.shape[0]


def most_allocated(req: np.ndarray, alloc: np.ndarray) -> np.ndarray:
    safe = np.maximum(alloc, 1)
    per = np.where((alloc > 0) & (req <= alloc), req * MAX_NODE_SCORE // safe, 0)
    return per.sum(axis=0) // req.shape[0]


def balanced_allocation(req: np.ndarray, alloc: np.ndarray) -> np.ndarray:
    fractions = np.minimum(req / np.maximum(alloc, 1), 1.0)
    return ((1.0 - fractions.std(axis=0)) * MAX_NODE_SCORE).astype(np.int64)


def requested_to_capacity_ratio(shape: Sequence[tuple[float, float]]) -> Strategy:
    """``shape``: (utilisation %, score 0–10) points, as in ``RequestedToCapacityRatioParam``."""
    xs = np.array([p[0] for p in shape], dtype=float)
    ys = np.array([p[1] for p in shape], dtype=float) * (MAX_NODE_SCORE / 10)

    def strategy(req: np.ndarray, alloc: np.ndarray) -> np.ndarray:
        util = np.where(alloc > 0, req * 100 / np.maximum(alloc, 1), 100.0)
        return np.rint(np.interp(util, xs, ys).mean(axis=0)).astype(np.int64)

    return strategy


# Bin packing: score rises with utilisation (the shape the Kubernetes docs use as the example).
DEFAULT_RTCR_SHAPE: tuple[tuple[float, float], ...] = ((0.0, 0.0), (100.0, 10.0))

STRATEGIES: dict[str, Strategy] = {
    "LeastAllocated": least_allocated,
    "MostAllocated": most_allocated,
    "RequestedToCapacityRatio": requested_to_capacity_ratio(DEFAULT_RTCR_SHAPE),
}


class ResourceAllocationPolicy:
    """Sums the given strategies' scores (each weight 1), like a kube-scheduler profile."""

    def __init__(self, name: str, strategies: Sequence[Strategy]) -> None:
        self.name = name
        self.strategies = list(strategies)

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        req, alloc = _requested_after(state, pod, nodes)
        total = np.zeros(nodes.size, dtype=np.int64)
        for strategy in self.strategies:
            total += strategy(req, alloc)
        return Scores(total.astype(float))


def build_least() -> ResourceAllocationPolicy:
    return ResourceAllocationPolicy(LEAST_NAME, [least_allocated])


def build_most() -> ResourceAllocationPolicy:
    return ResourceAllocationPolicy(MOST_NAME, [most_allocated])


def build_balanced() -> ResourceAllocationPolicy:
    return ResourceAllocationPolicy(BALANCED_NAME, [balanced_allocation, least_allocated])


def build_rtcr(shape: Sequence[tuple[float, float]] = DEFAULT_RTCR_SHAPE) -> ResourceAllocationPolicy:
    return ResourceAllocationPolicy(RTCR_NAME, [requested_to_capacity_ratio(shape)])
