"""Online evaluation on live decisions: a candidate model judged beside the active one, moved through the
registry by the promotion gate and undone by the rollback monitor (docs/model-lifecycle.md, "Online
evaluation"). Tier-agnostic: a tier feeds outcomes; what an outcome is (unschedulable pods, carbon per
replica-hour, SLO-violation minutes) is the gate's metrics (:func:`~.gates.tier_gate`).

* :class:`CanarySplit` — which decisions the candidate serves during canary: a stable hash of the decision's key
  (a pod's uid, a workload's id, a deployment's name) against ``share``. The same key always gets the same arm
  (in every process and after a restart: the hash is BLAKE2b, not Python's per-process ``hash``), so a pod or
  deployment is never flipped between models mid-life, and about ``share`` of keys get the candidate.
* :class:`OnlineEvaluator` — one candidate version's evaluation, by phase (its state in the registry):

  - **shadow**: the candidate decides beside the active model on every decision; the tier feeds both
    models' outcome on the same decision where it can compute the candidate's counterfactually
    (:meth:`OnlineEvaluator.observe`, with ``agreed`` when it knows whether the two decided alike);
  - **canary**: the two arms' outcome streams (:meth:`OnlineEvaluator.observe_arm`), paired in arrival order
    (matched windows: the i-th window of each arm);
  - **active** (after the evaluator activated it, or a version forced active): paired outcomes of the new
    model and the one it replaced, for the :class:`~.gates.RollbackPanel`.

  The gate's PROMOTE moves the candidate shadow → canary, then canary → active (a fresh gate with the same
  metrics and test for each phase: decisions latch); REJECT retires it; after activation the monitor's
  ROLLBACK calls the registry's rollback (checked in the same transaction to still be this version:
  ``expected_active``), and its KEEP ends the watch. Every decision is an audit record with the gate's or the
  monitor's evidence: transitions through :meth:`~.registry.ModelRegistry.promote` / ``rollback``, KEEP
  through :meth:`~.registry.ModelRegistry.attest`. HOLD and WATCH are not decisions and write nothing.

Hazards: an operator who moves the version meanwhile wins (the registry judges each transition on the state
it finds); the evaluator then stops (phase ``done``) and says why. A registry that is unreachable raises
:class:`~.registry.RegistryUnavailableError` to the caller; the gate's decision is latched, so the next
observation tries the transition again.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from meridian.model_registry.gates import (
    GateDecision,
    GateResult,
    PromotionGate,
    RollbackDecision,
    RollbackPanel,
    RollbackResult,
)
from meridian.model_registry.registry import (
    ActiveVersionChangedError,
    ModelRegistry,
    NothingToRollBackError,
    TransitionResult,
)
from meridian.model_registry.versions import ForbiddenTransitionError, ModelState, checked_model, model_of

log = logging.getLogger(__name__)

Outcomes = Mapping[str, Sequence[float] | np.ndarray]


class Arm(StrEnum):
    CANDIDATE = "candidate"
    ACTIVE = "active"


@dataclass(frozen=True)
class CanarySplit:
    """Deterministic per-key assignment of decisions to the candidate (about ``share`` of keys) or the active
    model. ``salt`` (e.g. the candidate's version id) draws a new split per candidate, so one unlucky set of
    deployments is not every canary's."""

    share: float
    salt: str = ""

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"canary share must be within [0, 1], got {self.share}")

    def position(self, key: str) -> float:
        """The key's place in [0, 1): BLAKE2b of salt and key, stable across processes and restarts."""
        digest = hashlib.blake2b(f"{self.salt}\x00{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2.0**64

    def arm(self, key: str) -> Arm:
        return Arm.CANDIDATE if self.position(key) < self.share else Arm.ACTIVE

    def serves_candidate(self, key: str) -> bool:
        return self.arm(key) is Arm.CANDIDATE


class Phase(StrEnum):
    CANDIDATE = "candidate"  # registered, not yet shadowing: enter_shadow() first
    SHADOW = "shadow"
    CANARY = "canary"
    ACTIVE = "active"  # watched by the rollback monitor
    DONE = "done"  # retired, rolled back, kept, or moved by someone else


@dataclass(frozen=True)
class EvaluationStep:
    """What one observation led to: the phase it was judged in, the decision (``hold``/``watch`` when none),
    the registry's transition when one was made, and the evidence written to the audit."""

    phase: Phase
    decision: str
    evidence: dict[str, Any]
    transition: TransitionResult | None = None


@dataclass
class _Agreement:
    decisions: int = 0
    agreed: int = 0

    def add(self, agreed: Sequence[bool]) -> None:
        self.decisions += len(agreed)
        self.agreed += sum(bool(a) for a in agreed)

    @property
    def rate(self) -> float | None:
        return self.agreed / self.decisions if self.decisions else None


@dataclass
class _ArmQueues:
    """Each canary arm's outcomes not yet paired, per metric."""

    candidate: deque[dict[str, float]] = field(default_factory=deque)
    active: deque[dict[str, float]] = field(default_factory=deque)

    def push(self, arm: Arm, outcome: Mapping[str, float]) -> None:
        (self.candidate if arm is Arm.CANDIDATE else self.active).append(dict(outcome))

    def pairs(self) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        """Pop every complete pair, as per-metric lists (empty when one arm has nothing queued)."""
        cand: dict[str, list[float]] = {}
        act: dict[str, list[float]] = {}
        while self.candidate and self.active:
            for target, outcome in ((cand, self.candidate.popleft()), (act, self.active.popleft())):
                for name, value in outcome.items():
                    target.setdefault(name, []).append(float(value))
        return cand, act


class OnlineEvaluator:
    """One candidate version's online evaluation (see the module docstring).

    ``gate`` judges the current phase (shadow or canary); each later phase gets a fresh gate with the same
    metrics and sequential test. ``rollback_monitor`` (fresh: a panel over the tier's metrics,
    :func:`~.gates.tier_rollback`) watches the
    version once active. ``who`` signs every audit record (e.g. ``online-evaluator@regional-eu-1``).
    """

    def __init__(self, registry: ModelRegistry, model: str, candidate_version: str, gate: PromotionGate,
                 rollback_monitor: RollbackPanel, who: str) -> None:
        if model_of(candidate_version) != checked_model(model):
            raise ValueError(f"{candidate_version} is not a version of {model}")
        self.registry = registry
        self.model = model
        self.candidate_version = candidate_version
        self.gate = gate
        self.monitor = rollback_monitor
        self.who = who
        self.replaced: str | None = None  # the version the candidate replaced, once it activated it
        self.agreement = _Agreement()
        self._arms = _ArmQueues()
        state = registry.get(candidate_version).state
        self.phase = {ModelState.CANDIDATE: Phase.CANDIDATE, ModelState.SHADOW: Phase.SHADOW,
                      ModelState.CANARY: Phase.CANARY, ModelState.ACTIVE: Phase.ACTIVE}.get(state, Phase.DONE)
        self.last = EvaluationStep(self.phase, "hold", {})

    # ------------------------------------------------------------------ feeding outcomes
    def enter_shadow(self, why: str = "online evaluation: shadow the active model") -> TransitionResult:
        """Start the evaluation of a registered candidate: candidate → shadow."""
        result = self.registry.promote(self.candidate_version, ModelState.SHADOW, who=self.who, why=why,
                                       evidence={"evaluator": "online", "phase": "candidate"})
        self.phase = Phase.SHADOW
        return result

    def observe(self, candidate: Mapping[str, float], active: Mapping[str, float], *,
                agreed: bool | None = None) -> EvaluationStep:
        """One decision's paired outcome per metric (shadow: both models on the same decision; active: the new
        model and the one it replaced); ``agreed``: whether the two models decided alike."""
        return self.observe_many({k: [v] for k, v in candidate.items()}, {k: [v] for k, v in active.items()},
                                 agreements=() if agreed is None else (agreed,))

    def observe_arm(self, arm: Arm, outcome: Mapping[str, float]) -> EvaluationStep:
        """Canary: one window's outcome of one arm; judged once the other arm has a window to pair it with.
        Windows that arrive after the canary ended (in flight when it was decided) are ignored."""
        if self.phase in (Phase.ACTIVE, Phase.DONE):
            return self.last
        if self.phase is not Phase.CANARY:
            raise RuntimeError(f"{self.candidate_version}: arm outcomes are for the canary phase, not {self.phase}")
        self._arms.push(arm, outcome)
        candidate, active = self._arms.pairs()
        return self.observe_many(candidate, active) if candidate else self.last

    def observe_many(self, candidate: Outcomes, active: Outcomes, *,
                     agreements: Sequence[bool] = ()) -> EvaluationStep:
        """Paired outcomes per metric (equal lengths), judged in order; samples after a decision are dropped
        (the next phase starts from its own evidence)."""
        if self.phase is Phase.CANDIDATE:
            raise RuntimeError(f"{self.candidate_version} is a candidate: enter_shadow() before feeding outcomes")
        if self.phase in (Phase.SHADOW, Phase.CANARY):
            self.agreement.add(agreements)
            result = self.gate.update_many(candidate, active)
            self.last = (self._act_on_gate(result) if result.decision is not GateDecision.HOLD
                         else EvaluationStep(self.phase, "hold", self._gate_evidence(result)))
        elif self.phase is Phase.ACTIVE:
            verdict = self.monitor.update_many(candidate, active)
            self.last = (self._act_on_monitor(verdict) if verdict.decision is not RollbackDecision.WATCH
                         else EvaluationStep(self.phase, "watch", self._monitor_evidence(verdict)))
        return self.last

    # ------------------------------------------------------------------ acting on decisions
    def _gate_evidence(self, result: GateResult) -> dict[str, Any]:
        evidence: dict[str, Any] = {"evaluator": "online", "phase": str(self.phase), "gate": result.as_dict()}
        if self.agreement.rate is not None:
            evidence["agreement"] = {"rate": self.agreement.rate, "decisions": self.agreement.decisions}
        return evidence

    def _monitor_evidence(self, verdict: RollbackResult) -> dict[str, Any]:
        return {"evaluator": "online", "phase": str(self.phase), "replaced": self.replaced,
                "rollback_monitor": verdict.as_dict(), "max_decisions": self.monitor.settings.max_decisions}

    def _act_on_gate(self, result: GateResult) -> EvaluationStep:
        phase, evidence = self.phase, self._gate_evidence(result)
        if result.decision is GateDecision.REJECT:
            target, why = ModelState.RETIRED, f"online gate rejected it in {phase}: {result.reason}"
        else:
            target = ModelState.CANARY if phase is Phase.SHADOW else ModelState.ACTIVE
            why = f"online gate passed in {phase}: {result.reason}"
        try:
            transition = self.registry.promote(self.candidate_version, target, who=self.who, why=why,
                                               evidence=evidence)
        except ForbiddenTransitionError as exc:
            return self._stop(phase, str(result.decision), evidence, exc)
        if target is ModelState.RETIRED:
            self.phase = Phase.DONE
        elif target is ModelState.CANARY:
            self.phase, self.gate = Phase.CANARY, PromotionGate(self.gate.metrics, self.gate.test)
            self.agreement = _Agreement()
        else:
            self.phase = Phase.ACTIVE
            self.replaced = transition.retired.version_id if transition.retired else None
        log.info("online evaluation of %s: %s in %s → %s", self.candidate_version, result.decision, phase, target)
        return EvaluationStep(phase, str(result.decision), evidence, transition)

    def _act_on_monitor(self, verdict: RollbackResult) -> EvaluationStep:
        phase, evidence = self.phase, self._monitor_evidence(verdict)
        self.phase = Phase.DONE
        if verdict.decision is RollbackDecision.KEEP:
            self.registry.attest(self.candidate_version, who=self.who, evidence=evidence,
                                 why=f"online rollback monitor keeps it: {verdict.reason}")
            return EvaluationStep(phase, str(verdict.decision), evidence)
        try:
            transition = self.registry.rollback(self.model, who=self.who, evidence=evidence,
                                                why=f"online rollback monitor: {verdict.reason}",
                                                expected_active=self.candidate_version)
        except (ActiveVersionChangedError, NothingToRollBackError) as exc:
            return self._stop(phase, str(verdict.decision), evidence, exc)
        log.warning("online evaluation of %s: rolled back after %d decisions (%s)", self.candidate_version,
                    verdict.evidence.n, verdict.reason)
        return EvaluationStep(phase, str(verdict.decision), evidence, transition)

    def _stop(self, phase: Phase, decision: str, evidence: dict[str, Any], exc: Exception) -> EvaluationStep:
        """The registry refused the transition (someone moved the version meanwhile): stop evaluating."""
        self.phase = Phase.DONE
        log.warning("online evaluation of %s stopped: %s was decided in %s but the registry refused: %s",
                    self.candidate_version, decision, phase, exc)
        return EvaluationStep(phase, f"{decision} (not applied: {exc})", evidence)
