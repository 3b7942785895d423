"""The score extension point (kube-scheduler's ``ScorePlugin``), as a small protocol.

A policy scores every feasible node of one pod in a single vectorised pass. Higher is better.
Policies that choose a GPU device for shared-GPU pods return it beside the score (FGD, for
example, picks the device that minimises the fragmentation increase); otherwise the state's
tightest-fit device rule applies. Ties go to the first node in node order (the scheduler's
``select_best``, ``np.argmax``), which the FGD paper's figures need; a policy that declares
:class:`ChoosesTieBreak` with ``tie_break = "random"`` gets a uniform draw among the tied nodes from
the scheduler's seeded generator instead, as kube-scheduler's ``selectHost`` does.

Optional extension points are small protocols a policy *declares* by inheriting them (kube-scheduler's
``PreFilterPlugin``, ``ReservePlugin``, …): :class:`WorkloadAware`, :class:`ObservesUnschedulable`,
:class:`ChoosesTieBreak`, :class:`ReportsRunCounts` and :class:`ScoresWithFragmentation`. They are ``runtime_checkable``, and the scheduler
asks ``isinstance`` once, when it is given the policy, never ``getattr`` per decision. They are
protocols rather than no-op methods on a base class because a score policy is itself a protocol
(:class:`ScorePolicy`): the policies, test doubles and experiments are plain classes with no common
base a default could live on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

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


@runtime_checkable
class WorkloadAware(Protocol):
    """A policy that needs the target workload (e.g. FGD's typical pods) before scheduling.

    Declared, not defaulted: a policy without it has nothing to prepare, and the scheduler skips the
    call (decided once, in ``Scheduler.policy``)."""

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None: ...


@runtime_checkable
class ObservesUnschedulable(Protocol):
    """A policy that learns the workload from the pods it sees (FGD's online target workload) and
    must also count the pods no node can hold: they are never scored, and leaving them out would
    bias the estimate towards the pods that still fit, the more so the fuller the cluster.

    Declared, not defaulted: only policies with an online estimate need it; for the others the
    scheduler's unschedulable path makes no call at all."""

    def observe_unschedulable(self, state: ClusterState, pod: Pod) -> None: ...


TieBreak = Literal["first", "random"]


@runtime_checkable
class ChoosesTieBreak(Protocol):
    """A policy that picks how the scheduler breaks exact score ties: ``"first"`` (node order, every
    policy's default) or ``"random"`` (uniform among the tied nodes, seeded by the scheduler; the
    ``random`` policy, whose scores are all equal). A data member, so the scheduler reads it once
    when given the policy; policies that do not declare this protocol get ``"first"``."""

    tie_break: TieBreak


@runtime_checkable
class ReportsRunCounts(Protocol):
    """A policy with per-run counters a benchmark reports beside the placement metrics (the learned
    policy's decisions over its budget and fallbacks to FGD). Declared, not defaulted: a benchmark
    result carries these keys only for policies that count them (``None`` in its summary otherwise)."""

    def run_counts(self) -> dict[str, float]:
        """Counter name → value, merged into ``RunResult.final``."""
        ...


@runtime_checkable
class ScoresWithFragmentation(Protocol):
    """A policy whose score comes from each node's GPU fragmentation increase (FGD) and can hand it back with
    the score: the shadow mode's counterfactual then costs no second FGD pass. Declared by FGD."""

    def score_with_delta(self, state: ClusterState, pod: Pod, nodes: np.ndarray) -> tuple[Scores, np.ndarray]:
        """:meth:`ScorePolicy.score` and each node's fragmentation increase."""
        ...


# The FGD simulator's normalisation constants (open-gpu-share utils: MaxSpecCpu, MaxSpecGpu).
MAX_SPEC_MILLI_CPU = 128_000
MAX_SPEC_GPU_MILLI = 8_000
MAX_NODE_SCORE = 100
