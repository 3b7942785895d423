"""The ``learned`` placement policy: the learned model inside a time budget, FGD when it cannot answer.

A plugin like every other policy of this package: the registry names it, and the model it serves
(checkpoint, features, network) lives in :mod:`regional_scheduler.learned`. The scheduler's filter runs
before any policy sees a node (:class:`~regional_scheduler.framework.Scheduler`), so the model only ranks
feasible nodes and can never break a hard constraint. Around the model:

- **Fallback.** A missing (``missing_checkpoint``) or refused (``bad_checkpoint``) checkpoint, a model
  error (an exception, or a non-finite score) or a decision slower than the budget (default 5 ms, wall
  clock) makes the decision FGD's, the best heuristic on the openb benchmark. Each such decision
  increments ``meridian_placement_fallbacks_total{reason}`` and is logged (the first time per reason at
  WARNING, then at DEBUG so a broken model does not flood the log).
- **Budget: enforced or counted.** Serving enforces the budget (``enforce_budget``, default on). A
  wall-clock rule makes results depend on machine load, so ``meridian bench placement`` turns it off:
  the model then decides every time and a slow decision is only *counted* (``over_budget``,
  ``meridian_placement_over_budget_total``), which keeps benchmark results reproducible and still shows
  how often serving would have fallen back.
- **Shadow mode.** :class:`ShadowPolicy` lets the active policy decide and runs the learned one beside
  it, recording both choices and whether they agree (``meridian_placement_shadow_decisions_total``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from prometheus_client import Counter

from meridian.cluster_state import ClusterState
from meridian.model import Pod
from meridian.model_registry.evaluation import CanarySplit
from regional_scheduler.framework import select_best
from regional_scheduler.learned.checkpoint import CheckpointError, load_checkpoint
from regional_scheduler.learned.serving import LearnedScorer, ServingSettings
from regional_scheduler.policies.base import (
    ObservesUnschedulable,
    ReportsRunCounts,
    ScorePolicy,
    Scores,
    ScoresWithFragmentation,
    WorkloadAware,
)
from regional_scheduler.policies.fgd import FgdPolicy

NAME = "learned"

log = logging.getLogger(__name__)

FALLBACKS = Counter("meridian_placement_fallbacks_total",
                    "Placement decisions the learned policy handed to the fallback heuristic, by reason",
                    ["reason"])
OVER_BUDGET = Counter("meridian_placement_over_budget_total",
                      "Learned placement decisions slower than the budget (fallen back when the budget is enforced)")
SHADOW_DECISIONS = Counter("meridian_placement_shadow_decisions_total",
                           "Decisions scored in shadow mode, by whether the learned choice agreed with the active one",
                           ["agreement"])


class LearnedPolicy(WorkloadAware, ObservesUnschedulable, ReportsRunCounts):
    """The ``learned`` ScorePolicy: the model inside a time budget, FGD when the model cannot answer."""

    name = NAME

    def __init__(self, settings: ServingSettings | None = None, *, scorer: LearnedScorer | None = None) -> None:
        self.settings = settings or ServingSettings()
        self.scorer = scorer
        self.load_error: str | None = None
        self.load_error_reason = "missing_checkpoint"
        if scorer is None:
            try:
                nets, _ = load_checkpoint(self.settings.checkpoint)
                self.scorer = LearnedScorer(nets)
            except CheckpointError as exc:
                self.load_error = str(exc)
                if self.settings.checkpoint.is_file():
                    self.load_error_reason = "bad_checkpoint"
                log.warning("learned placement policy unavailable, every decision falls back to fgd: %s", exc)
        # The fallback is the scorer's own FGD, prepared or not: a live scheduler's fallback then
        # reads the same online window and caches as the features, not a cold FGD of its own.
        self._fallback = self.scorer.features.fgd if self.scorer is not None else FgdPolicy()
        self._logged: set[str] = set()
        self.fallback_count: dict[str, int] = {}
        self.over_budget = 0  # decisions slower than the budget (fallen back or not)

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None:
        if self.scorer is not None:
            self.scorer.prepare(state, workload)
        else:
            self._fallback.prepare(state, workload)

    def observe_unschedulable(self, state: ClusterState, pod: Pod) -> None:
        self._fallback.observe_unschedulable(state, pod)

    def run_counts(self) -> dict[str, float]:
        """What a benchmark reports for this run: decisions over the budget, fallbacks to FGD and, with a
        model, whether the gate (``gate_share``) left the workload to FGD at the run's end."""
        counts = {"over_budget_decisions": float(self.over_budget),
                  "fallback_decisions": float(sum(self.fallback_count.values()))}
        if self.scorer is not None:
            counts["gated_to_fgd"] = float(self.scorer.gated)
        return counts

    def _fall_back(self, reason: str, detail: str, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        FALLBACKS.labels(reason=reason).inc()
        self.fallback_count[reason] = self.fallback_count.get(reason, 0) + 1
        level = logging.DEBUG if reason in self._logged else logging.WARNING
        self._logged.add(reason)
        log.log(level, "placement of pod %s fell back to fgd (%s): %s", pod.name, reason, detail)
        return self._fallback.score(state, pod, nodes)

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        if self.scorer is None:
            return self._fall_back(self.load_error_reason, self.load_error or "no model", state, pod, nodes)
        t0 = time.perf_counter()
        try:
            result = self.scorer.score(state, pod, nodes)
        except Exception as exc:  # any model failure must not stop scheduling
            return self._fall_back("model_error", f"{type(exc).__name__}: {exc}", state, pod, nodes)
        elapsed_ms = (time.perf_counter() - t0) * 1e3
        # One reduction: a sum is finite iff every (bounded, ~0–100) score is.
        if not math.isfinite(float(result.scores.sum())):
            return self._fall_back("model_error", "non-finite score", state, pod, nodes)
        if elapsed_ms > self.settings.budget_ms:
            self.over_budget += 1
            OVER_BUDGET.inc()
            if self.settings.enforce_budget:
                return self._fall_back("timeout", f"{elapsed_ms:.2f} ms > budget {self.settings.budget_ms} ms",
                                       state, pod, nodes)
        return result


@dataclass(frozen=True)
class ShadowRecord:
    """One decision in shadow (or canary) mode: both models' choices, the GPU fragmentation increase each
    choice causes on the same cluster state (the counterfactual of the model that did not serve, exact because
    both are scored on one snapshot), and which model's choice was served."""

    pod: str
    active_node: int
    learned_node: int
    active_fragmentation: float = 0.0
    learned_fragmentation: float = 0.0
    served: str = "active"  # "active" or "candidate" (canary)

    @property
    def agree(self) -> bool:
        return self.active_node == self.learned_node


class ShadowRecordSink(Protocol):
    """Receives every shadow record (e.g. the publisher of evaluation records for the continual learner)."""

    def __call__(self, record: ShadowRecord) -> None: ...


class ShadowPolicy(WorkloadAware, ObservesUnschedulable):
    """Decide with ``active``; score the same candidates with ``learned`` and record both choices.

    The learned policy's errors never affect the active decision (they are counted as fallbacks by
    the learned policy itself). ``records`` keeps the last ``history`` decisions. With ``canary``, the pods
    its split assigns to the candidate (by pod name: a stable hash, so a retried pod keeps its arm) are served
    by the learned choice. Each record carries both choices' fragmentation increase — from the active policy's
    own score when it declares :class:`ScoresWithFragmentation` (FGD), else from an FGD scorer of the shadow's
    own (the same target workload the policies read) — and goes to ``sink``.
    """

    def __init__(self, active: ScorePolicy, learned: LearnedPolicy, *, history: int = 10_000,
                 canary: CanarySplit | None = None, sink: ShadowRecordSink | None = None) -> None:
        self.active = active
        self.learned = learned
        self.name = f"{active.name}+shadow-{learned.name}"
        self.records: deque[ShadowRecord] = deque(maxlen=history)
        self.canary = canary
        self.sink = sink
        self._fragmentation = None if isinstance(active, ScoresWithFragmentation) else FgdPolicy()
        self.n_decisions = 0
        self.n_agree = 0

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None:
        for policy in (self.active, self.learned, self._fragmentation):
            if policy is not None and isinstance(policy, WorkloadAware):
                policy.prepare(state, workload)

    def observe_unschedulable(self, state: ClusterState, pod: Pod) -> None:
        for policy in (self.active, self.learned, self._fragmentation):
            if policy is not None and isinstance(policy, ObservesUnschedulable):
                policy.observe_unschedulable(state, pod)

    def _active_score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> tuple[Scores, np.ndarray]:
        if isinstance(self.active, ScoresWithFragmentation):
            return self.active.score_with_delta(state, pod, nodes)
        assert self._fragmentation is not None
        result = self.active.score(state, pod, nodes)
        return result, self._fragmentation.score_with_delta(state, pod, nodes)[1]

    def score(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> Scores:
        result, delta = self._active_score(state, pod, nodes)
        try:
            shadow = self.learned.score(state, pod, nodes)
            learned_at = select_best(shadow.scores)
        except Exception as exc:  # shadow must never break the live decision
            log.warning("shadow scoring failed for pod %s: %s", pod.name, exc)
            return result
        active_at = select_best(result.scores)
        serve_candidate = self.canary is not None and self.canary.serves_candidate(pod.name)
        record = ShadowRecord(pod.name, int(nodes[active_at]), int(nodes[learned_at]), float(delta[active_at]),
                              float(delta[learned_at]), "candidate" if serve_candidate else "active")
        self.records.append(record)
        self.n_decisions += 1
        self.n_agree += record.agree
        SHADOW_DECISIONS.labels(agreement="agree" if record.agree else "disagree").inc()
        if self.sink is not None:
            self.sink(record)
        return shadow if serve_candidate else result

    @property
    def agreement(self) -> float:
        return self.n_agree / self.n_decisions if self.n_decisions else 1.0


def build(settings: ServingSettings | None = None) -> LearnedPolicy:
    """The registry's constructor: the committed checkpoint unless the environment names another
    (``MERIDIAN_LEARNED_CHECKPOINT``, ``MERIDIAN_LEARNED_BUDGET_MS``, ``MERIDIAN_LEARNED_ENFORCE_BUDGET``)."""
    return LearnedPolicy(settings or ServingSettings.from_env())
