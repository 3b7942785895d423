"""The score extension point (kube-scheduler's ``ScorePlugin``), as a small protocol.

A policy scores every feasible node of one pod in a single vectorised pass. Higher is better.
Policies that choose a GPU device for shared-GPU pods return it beside the score (FGD, for
example, picks the device that minimises the fragmentation increase); otherwise the state's
tightest-fit device rule applies. Ties are broken at random by the scheduler, as kube-scheduler's
``selectHost`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.model import Pod


@dataclass(frozen=True)
class Scores:
    scores: np.ndarray  # float64 (k,), one per candidate node
    devices: np.ndarray | None = None  # int64 (k,), device slot for a shared-GPU pod, -1 = default rule


class ScorePolicy(Protocol):
    name: str

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        """Score candidate ``nodes`` (indices into ``state``) for ``pod``."""
        ...


class WorkloadAware(Protocol):
    """A policy that needs the target workload (e.g. FGD's typical pods) before scheduling."""

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None: ...


class ObservesUnschedulable(Protocol):
    """A policy that learns the workload from the pods it sees (FGD's online target workload) and
    must also count the pods no node can hold: they are never scored, and leaving them out would
    bias the estimate towards the pods that still fit, the more so the fuller the cluster."""

    def observe_unschedulable(self, state: ClusterState, pod: Pod) -> None: ...


# The FGD simulator's normalisation constants (open-gpu-share utils: MaxSpecCpu, MaxSpecGpu).
MAX_SPEC_MILLI_CPU = 128_000
MAX_SPEC_GPU_MILLI = 8_000
MAX_NODE_SCORE = 100
