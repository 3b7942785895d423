"""The router's extension point and its staged orchestrator.

A policy implements :class:`RoutingPolicy`: given the clusters, the workload and the feasibility
mask from the filter stage, it returns ``n + 1`` scores, the last one for "defer this workload to a
later hour" (``-inf`` for policies that never defer). The :class:`Router` reads as Karmada's
``Schedule``: snapshot → filter → score → select → assign, each stage timed, and an error in any
stage is raised as :class:`RoutingStageError` naming the stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gnn.features import ClusterFeatures, WorkloadFeatures, feasible_mask

DEFER = -1
NO_CLUSTER = -2


class RoutingPolicy(Protocol):
    name: str

    def score(self, clusters: ClusterFeatures, workload: WorkloadFeatures, feasible: np.ndarray) -> np.ndarray:
        """``(n + 1,)`` scores, higher is better; entry ``n`` is "defer"."""
        ...

    def reset(self) -> None:
        """Forget per-run state (rotation counters, random streams) before a new run."""
        ...


class RoutingStageError(RuntimeError):
    def __init__(self, stage: str, cause: BaseException) -> None:
        self.stage = stage
        super().__init__(f"routing stage {stage!r} failed: {cause}")


@dataclass
class Decision:
    """``cluster`` is an index, :data:`DEFER`, or :data:`NO_CLUSTER` (see ``diagnosis``)."""

    cluster: int
    diagnosis: dict[str, int] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    feasible: np.ndarray | None = None

    @property
    def total_seconds(self) -> float:
        return sum(self.stage_seconds.values())

    def explain(self, n_clusters: int) -> str:
        if not self.diagnosis:
            return f"0/{n_clusters} clusters available"
        parts = ", ".join(f"{count} {reason}" for reason, count in sorted(self.diagnosis.items()))
        return f"0/{n_clusters} clusters available: {parts}"


def can_defer(workload: WorkloadFeatures) -> bool:
    return workload.deferrable and workload.deadline_hours >= 1.0


class Router:
    """Runs one policy through the stages; ``snapshot`` returns the clusters' current features."""

    def __init__(self, policy: RoutingPolicy) -> None:
        self.policy = policy

    def _stage(self, name: str, timings: dict[str, float], fn: Callable[[], object]) -> object:
        start = time.perf_counter()
        try:
            return fn()
        except RoutingStageError:
            raise
        except Exception as exc:
            raise RoutingStageError(name, exc) from exc
        finally:
            timings[name] = time.perf_counter() - start

    def decide(self, snapshot: Callable[[], ClusterFeatures], workload: WorkloadFeatures) -> Decision:
        t: dict[str, float] = {}
        clusters = self._stage("snapshot", t, snapshot)
        assert isinstance(clusters, ClusterFeatures)
        mask, diagnosis = self._stage("filter", t, lambda: feasible_mask(clusters, workload))  # type: ignore[misc]
        deferrable = can_defer(workload)
        if not mask.any() and not deferrable:
            return Decision(NO_CLUSTER, diagnosis, t, mask)
        scores = self._stage("score", t, lambda: self.policy.score(clusters, workload, mask))
        choice = self._stage("select", t, lambda: select(np.asarray(scores), mask, deferrable))
        assert isinstance(choice, int)
        return Decision(choice, _ruled_out(diagnosis, choice, mask, self.policy), t, mask)


    def decide_scored(self, clusters: ClusterFeatures, workload: WorkloadFeatures, scores: np.ndarray,
                      excluded: np.ndarray | None = None) -> Decision:
        """The stages for a workload whose raw scores came from a batched score (``score_batch``): filter
        on the *current* clusters (earlier decisions of the batch already reserved capacity), refine the
        scores if the policy does (``refine``), select."""
        t: dict[str, float] = {}

        def _filter() -> tuple[np.ndarray, dict[str, int]]:
            mask, diagnosis = feasible_mask(clusters, workload)
            if excluded is not None and excluded.any():
                if (mask & excluded).any():
                    diagnosis["rejected this workload before"] = int((mask & excluded).sum())
                mask = mask & ~excluded
            return mask, diagnosis

        mask, diagnosis = self._stage("filter", t, _filter)  # type: ignore[misc]
        deferrable = can_defer(workload)
        if not mask.any() and not deferrable:
            return Decision(NO_CLUSTER, diagnosis, t, mask)
        refine = getattr(self.policy, "refine", None)
        final = self._stage("score", t, lambda: refine(clusters, workload, mask, scores) if refine else scores)
        choice = self._stage("select", t, lambda: select(np.asarray(final), mask, deferrable))
        assert isinstance(choice, int)
        return Decision(choice, _ruled_out(diagnosis, choice, mask, self.policy), t, mask)


def _ruled_out(diagnosis: dict[str, int], choice: int, mask: np.ndarray, policy: RoutingPolicy) -> dict[str, int]:
    """Name the policy when it, not the filter, left no cluster (the gnn shield: every cluster would
    break a latency SLO), so "waiting: …" says why."""
    if choice == NO_CLUSTER and mask.any():
        return {**diagnosis, f"ruled out by {policy.name} (e.g. an SLO would break)": int(mask.sum())}
    return diagnosis


def select(scores: np.ndarray, feasible: np.ndarray, deferrable: bool) -> int:
    """Highest-scoring feasible cluster, or :data:`DEFER` when deferring scores higher (ties: lowest index);
    :data:`NO_CLUSTER` when nothing is feasible or every feasible cluster scores −∞."""
    n = feasible.shape[0]
    masked = np.where(feasible, scores[:n], -np.inf)
    best = int(np.argmax(masked)) if feasible.any() else NO_CLUSTER
    if best != NO_CLUSTER and masked[best] == -np.inf:
        best = NO_CLUSTER  # a policy ruled every feasible cluster out (argmax would return index 0)
    if deferrable and (best == NO_CLUSTER or scores[n] > masked[best]):
        return DEFER
    return best


def with_defer(cluster_scores: np.ndarray, defer_score: float = -np.inf) -> np.ndarray:
    return np.append(cluster_scores.astype(np.float64), defer_score)
