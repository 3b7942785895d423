"""The Horizontal Pod Autoscaler (autoscaling/v2), as kube-controller-manager computes it.

Follows the Kubernetes documentation ("Algorithm details", "Configurable scaling behavior") and the
controller it describes (``pkg/controller/podautoscaler``: ``replica_calculator.go`` and
``horizontal.go``), for one CPU-utilisation Resource metric:

1. **Replica calculation.** ``usageRatio = utilisation / target``. Ready pods carry the metric; pods not
   yet ready are set aside. If no unready pod needs counting (or the ratio is ≤ 1) the result is
   ``currentReplicas`` when ``|1 − usageRatio| ≤ tolerance`` (0.1) else ``ceil(usageRatio × readyPods)``.
   When scaling up with unready pods, those pods are assumed to use 0% and the ratio is recomputed over
   all pods; if the new ratio is within tolerance or reverses the direction, nothing changes, otherwise
   ``ceil(newRatio × allPods)``.
2. **Stabilisation.** Every recommendation is remembered with its time. The scale-down window (300 s by
   default) takes the *highest* recommendation in the window, the scale-up window (0 s) the lowest.
3. **Rate policies.** ``selectPolicy`` (Max by default) over the policies of the direction, each limiting
   the change relative to the replicas at the start of its period, computed from the scale events of
   that period: scale-up default ``max(100% per 15 s, 4 pods per 15 s)``, scale-down ``100% per 15 s``.
4. **Bounds.** min/max replicas.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, Field


class PolicyType(StrEnum):
    PODS = "Pods"
    PERCENT = "Percent"


class SelectPolicy(StrEnum):
    MAX = "Max"
    MIN = "Min"
    DISABLED = "Disabled"


class ScalingPolicy(BaseModel):
    """``HPAScalingPolicy``: a change of ``value`` pods or percent allowed per ``period_seconds``."""

    type: PolicyType
    value: int = Field(gt=0)
    period_seconds: int = Field(gt=0, le=1800)


class ScalingRules(BaseModel):
    """``HPAScalingRules`` for one direction."""

    stabilization_window_seconds: int = Field(0, ge=0, le=3600)
    select_policy: SelectPolicy = SelectPolicy.MAX
    policies: list[ScalingPolicy]


def default_scale_up() -> ScalingRules:
    return ScalingRules(stabilization_window_seconds=0, policies=[
        ScalingPolicy(type=PolicyType.PERCENT, value=100, period_seconds=15),
        ScalingPolicy(type=PolicyType.PODS, value=4, period_seconds=15)])


def default_scale_down() -> ScalingRules:
    return ScalingRules(stabilization_window_seconds=300, policies=[
        ScalingPolicy(type=PolicyType.PERCENT, value=100, period_seconds=15)])


class HpaBehavior(BaseModel):
    """``HorizontalPodAutoscalerBehavior`` with the documented defaults."""

    scale_up: ScalingRules = Field(default_factory=default_scale_up)
    scale_down: ScalingRules = Field(default_factory=default_scale_down)


class HpaSpec(BaseModel):
    """The parts of an HPA spec this controller uses: one CPU utilisation target."""

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(ge=1)
    target_utilisation: float = Field(0.6, gt=0, description="averageUtilization / 100")
    tolerance: float = Field(0.1, ge=0, description="--horizontal-pod-autoscaler-tolerance")
    behavior: HpaBehavior = Field(default_factory=HpaBehavior)


def replicas_from_utilisation(*, current_replicas: int, ready_pods: int, unready_pods: int,
                              utilisation: float, target: float, tolerance: float) -> int:
    """``GetResourceReplicas`` for a metric every ready pod reports (no missing pods).

    ``utilisation`` is the average over ready pods, as a fraction of the CPU request.
    """
    if ready_pods == 0:
        return current_replicas
    usage_ratio = utilisation / target
    scale_up_with_unready = unready_pods > 0 and usage_ratio > 1.0
    if not scale_up_with_unready:
        if abs(1.0 - usage_ratio) <= tolerance:
            return current_replicas
        return math.ceil(usage_ratio * ready_pods)
    # Unready pods count with 0% use: the total use is spread over all pods.
    all_pods = ready_pods + unready_pods
    new_ratio = utilisation * ready_pods / all_pods / target
    if abs(1.0 - new_ratio) <= tolerance or new_ratio < 1.0:
        return current_replicas
    new_replicas = math.ceil(new_ratio * all_pods)
    if new_replicas < current_replicas:
        return current_replicas
    return new_replicas


@dataclass
class _ScaleEvent:
    time_s: float
    change: int


def _change_in_period(events: deque[_ScaleEvent], now_s: float, period_s: int) -> int:
    cutoff = now_s - period_s
    return sum(e.change for e in events if e.time_s > cutoff)


def scale_up_limit(current: int, events: deque[_ScaleEvent], now_s: float, rules: ScalingRules) -> int:
    """``calculateScaleUpLimitWithScalingRules``."""
    if rules.select_policy is SelectPolicy.DISABLED:
        return current
    pick = min if rules.select_policy is SelectPolicy.MIN else max
    result: int | None = None
    for policy in rules.policies:
        period_start = current - _change_in_period(events, now_s, policy.period_seconds)
        if policy.type is PolicyType.PODS:
            proposed = period_start + policy.value
        else:
            proposed = math.ceil(period_start * (1 + policy.value / 100))
        result = proposed if result is None else pick(result, proposed)
    return current if result is None else result


def scale_down_limit(current: int, events: deque[_ScaleEvent], now_s: float, rules: ScalingRules) -> int:
    """``calculateScaleDownLimitWithBehaviors``: Max selects the policy allowing the biggest decrease."""
    if rules.select_policy is SelectPolicy.DISABLED:
        return current
    pick = max if rules.select_policy is SelectPolicy.MIN else min
    result: int | None = None
    for policy in rules.policies:
        period_start = current + _change_in_period(events, now_s, policy.period_seconds)
        if policy.type is PolicyType.PODS:
            proposed = period_start - policy.value
        else:
            proposed = int(period_start * (1 - policy.value / 100))
        result = proposed if result is None else pick(result, proposed)
    return current if result is None else result


@dataclass
class HpaController:
    """One HPA object's controller state: recommendations and scale events over time."""

    spec: HpaSpec
    _recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    _up_events: deque[_ScaleEvent] = field(default_factory=deque)
    _down_events: deque[_ScaleEvent] = field(default_factory=deque)

    def reset(self) -> None:
        self._recommendations.clear()
        self._up_events.clear()
        self._down_events.clear()

    def _stabilise(self, now_s: float, current: int, desired: int) -> int:
        up_window = self.spec.behavior.scale_up.stabilization_window_seconds
        down_window = self.spec.behavior.scale_down.stabilization_window_seconds
        keep = max(up_window, down_window)
        while self._recommendations and self._recommendations[0][0] <= now_s - keep:
            self._recommendations.popleft()
        up_rec = desired
        down_rec = desired
        for when, rec in self._recommendations:
            if when > now_s - up_window:
                up_rec = min(up_rec, rec)
            if when > now_s - down_window:
                down_rec = max(down_rec, rec)
        self._recommendations.append((now_s, desired))
        recommendation = current
        recommendation = max(recommendation, up_rec)
        return min(recommendation, down_rec)

    def _apply_rates(self, now_s: float, current: int, desired: int) -> int:
        spec = self.spec
        if desired > current:
            limit = max(scale_up_limit(current, self._up_events, now_s, spec.behavior.scale_up), current)
            return min(desired, spec.max_replicas, limit)
        if desired < current:
            limit = scale_down_limit(current, self._down_events, now_s, spec.behavior.scale_down)
            return max(desired, spec.min_replicas, limit)
        return desired

    def _record(self, now_s: float, current: int, new: int) -> None:
        longest = max([p.period_seconds for r in (self.spec.behavior.scale_up, self.spec.behavior.scale_down)
                       for p in r.policies] or [0])
        for events in (self._up_events, self._down_events):
            while events and events[0].time_s <= now_s - longest:
                events.popleft()
        if new > current:
            self._up_events.append(_ScaleEvent(now_s, new - current))
        elif new < current:
            self._down_events.append(_ScaleEvent(now_s, current - new))

    def desired_replicas(self, *, now_s: float, current_replicas: int, ready_pods: int, unready_pods: int,
                         utilisation: float | None) -> int:
        """One sync: the replica count the HPA writes to the scale subresource."""
        spec = self.spec
        if current_replicas == 0 and spec.min_replicas > 0:
            return 0  # scaling is disabled for a target scaled to zero by hand
        if current_replicas > spec.max_replicas:
            desired = spec.max_replicas
        elif current_replicas < spec.min_replicas:
            desired = spec.min_replicas
        elif utilisation is None:
            return current_replicas  # no metrics: the controller does nothing
        else:
            proposal = replicas_from_utilisation(
                current_replicas=current_replicas, ready_pods=ready_pods, unready_pods=unready_pods,
                utilisation=utilisation, target=spec.target_utilisation, tolerance=spec.tolerance)
            stabilised = self._stabilise(now_s, current_replicas, proposal)
            desired = self._apply_rates(now_s, current_replicas, stabilised)
        self._record(now_s, current_replicas, desired)
        return desired
