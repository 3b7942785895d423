"""The regional scheduler's scheduling cycle, read as its stages (Karmada's ``Schedule``):

filter (hard constraints) → score (the policy, on feasible nodes only) → select (highest score)
→ assign (GPU devices).

Ties go to the first node in node order. kube-scheduler's ``selectHost`` samples ties at random,
but the FGD paper's numbers are only reproduced with first-in-order ties (we measured FGD on
``default`` seed 42 at 90.2 % GPU allocation with random ties against the paper's 95.1 %, and
95.3 % with first ties; see ``docs/results-placement.md``). A policy that declares
:class:`~regional_scheduler.policies.base.ChoosesTieBreak` with ``tie_break = "random"`` gets a
uniform draw among the tied nodes from the scheduler's generator (seeded by ``seed``) instead. Each
stage is timed and its errors are wrapped with the stage's name. The policy never sees an infeasible
node, so no policy — learned or not — can break a hard constraint. A pod no node can hold is still
shown to a policy that learns the workload online (``observe_unschedulable``), so that its estimate
is not biased towards the pods that fit.

The policy's optional extension points are declared protocols (``policies/base.py``); which ones it
implements is read once, when the scheduler is given the policy (kube-scheduler builds its list per
extension point at start), not probed per decision.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from meridian.cluster_state import ClusterState, Placement
from meridian.model import Pod
from regional_scheduler.filters import Diagnosis, run_filters
from regional_scheduler.policies.base import (
    ChoosesTieBreak,
    ObservesUnschedulable,
    ScorePolicy,
    WorkloadAware,
)


class StageError(RuntimeError):
    def __init__(self, stage: str, pod: str, cause: BaseException) -> None:
        super().__init__(f"{stage} failed for pod {pod}: {cause}")
        self.stage = stage


@dataclass
class Decision:
    pod: str
    placement: Placement | None
    diagnosis: Diagnosis | None = None
    stage_ms: dict[str, float] = field(default_factory=dict)

    @property
    def node(self) -> int | None:
        return None if self.placement is None else self.placement.node


def select_best(scores: np.ndarray, rng: np.random.Generator | None = None) -> int:
    """Index of a highest score: the first one, or uniformly among ties when ``rng`` is given."""
    if rng is None:
        return int(np.argmax(scores))
    best = np.flatnonzero(scores == scores.max())
    return int(best[0]) if best.size == 1 else int(best[rng.integers(best.size)])


class Scheduler:
    def __init__(self, policy: ScorePolicy, *, seed: int = 0) -> None:
        self.policy = policy
        self.rng = np.random.default_rng(seed)

    @property
    def policy(self) -> ScorePolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: ScorePolicy) -> None:
        """Registration: the extension points ``policy`` declares are read here, once."""
        self._policy = policy
        self._workload_aware = policy if isinstance(policy, WorkloadAware) else None
        self._observes_unschedulable = policy if isinstance(policy, ObservesUnschedulable) else None
        self.random_ties = isinstance(policy, ChoosesTieBreak) and policy.tie_break == "random"

    @property
    def name(self) -> str:
        return self.policy.name

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None:
        if self._workload_aware is not None:
            self._workload_aware.prepare(state, workload)

    def schedule(self, state: ClusterState, pod: Pod) -> Decision:
        decision = Decision(pod=pod.name, placement=None)
        t0 = time.perf_counter()
        try:
            mask, diagnosis = run_filters(state, pod)
        except Exception as exc:
            raise StageError("filter", pod.name, exc) from exc
        t1 = time.perf_counter()
        decision.stage_ms["filter"] = (t1 - t0) * 1e3
        nodes = np.flatnonzero(mask)
        if nodes.size == 0:
            decision.diagnosis = diagnosis
            if self._observes_unschedulable is not None:
                try:
                    self._observes_unschedulable.observe_unschedulable(state, pod)
                except Exception as exc:
                    raise StageError("score", pod.name, exc) from exc
            return decision
        try:
            result = self.policy.score(state, pod, nodes)
        except Exception as exc:
            raise StageError("score", pod.name, exc) from exc
        t2 = time.perf_counter()
        decision.stage_ms["score"] = (t2 - t1) * 1e3
        pick = select_best(result.scores, self.rng if self.random_ties else None)
        node = int(nodes[pick])
        t3 = time.perf_counter()
        decision.stage_ms["select"] = (t3 - t2) * 1e3
        try:
            device = None if result.devices is None else int(result.devices[pick])
            if device is not None and device >= 0 and pod.requests.gpu_milli:
                placement = Placement(node, (device,), pod.requests.gpu_milli)
            else:
                placement = state.choose_devices(node, pod)
        except Exception as exc:
            raise StageError("assign", pod.name, exc) from exc
        decision.stage_ms["assign"] = (time.perf_counter() - t3) * 1e3
        decision.placement = placement
        return decision

    def place(self, state: ClusterState, pod: Pod) -> Placement | None:
        """The simulator's hook: decide and return the placement (the simulator allocates)."""
        return self.schedule(state, pod).placement
