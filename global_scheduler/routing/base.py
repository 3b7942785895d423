"""The router's extension point and its staged orchestrator.

A policy implements :class:`RoutingPolicy`: given the clusters, the workload and the feasibility
mask from the filter stage, it returns ``n + 1`` scores, the last one for "defer this workload to a
later hour" (``-inf`` for policies that never defer). The :class:`Router` reads as Karmada's
``Schedule``: snapshot → filter → score → select → assign, each stage timed, and an error in any
stage is raised as :class:`RoutingStageError` naming the stage.

Optional extension points are small protocols a policy *declares* by inheriting them:
:class:`ScoresInBatch`, :class:`RefinesScores` and :class:`CountsFallbacks` (the GNN declares all
three). They are ``runtime_checkable``; the router reads which ones a policy declares once, when it is
given the policy, and the routing pass and the benchmark ask ``isinstance``, never ``getattr``. They are
protocols, not no-op methods on a base class, because :class:`RoutingPolicy` is itself a protocol:
the policies and test doubles are plain classes with no common base a default could live on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from global_scheduler.routing.feasibility import feasible_mask
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures

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


@runtime_checkable
class ScoresInBatch(Protocol):
    """A policy that scores many workloads in one call (the GNN: one batched forward pass).

    Its raw scores go through :meth:`Router.decide_scored`, which filters each workload on the clusters
    as the batch's earlier decisions left them and refines the scores if the policy declares
    :class:`RefinesScores`. Declared, not defaulted: a policy without it is scored one workload at a time
    by :meth:`Router.decide`."""

    def score_batch(self, clusters: ClusterFeatures, workloads: list[WorkloadFeatures]) -> np.ndarray | None:
        """``(B, n + 1)`` raw scores, or None to have this batch decided one workload at a time."""
        ...


@runtime_checkable
class RefinesScores(Protocol):
    """A policy whose batched raw scores are corrected per decision, on the current clusters (the GNN's
    shield and its "defer only when allowed"). Without it the batched scores are selected as they are
    (the identity: what a no-op default would do, but there is no base class to put one on)."""

    def refine(self, clusters: ClusterFeatures, workload: WorkloadFeatures, feasible: np.ndarray,
               scores: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class CountsFallbacks(Protocol):
    """A policy that counts the decisions its model could not take (answered by its fallback heuristic
    instead); the routing pass and the benchmark report the count. Policies without a model have none
    to count and do not declare it (they count as 0)."""

    fallbacks: int


def fallbacks_of(policy: RoutingPolicy) -> int:
    """The policy's fallback count so far; 0 for a policy that does not declare :class:`CountsFallbacks`."""
    return int(policy.fallbacks) if isinstance(policy, CountsFallbacks) else 0


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

    @property
    def policy(self) -> RoutingPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: RoutingPolicy) -> None:
        """Registration: the extension points ``policy`` declares are read here, once."""
        self._policy = policy
        self.batch_scorer: ScoresInBatch | None = policy if isinstance(policy, ScoresInBatch) else None
        self._refiner: RefinesScores | None = policy if isinstance(policy, RefinesScores) else None

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
        refiner = self._refiner
        final = self._stage("score", t, lambda: refiner.refine(clusters, workload, mask, scores) if refiner else scores)
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
