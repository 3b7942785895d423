"""Shadow mode: run a candidate policy beside the live one on the same observations and record both.

Only the live decision is actuated. The shadow policy keeps its own guard-rail memory (as if it were
live), so its record shows what it *would* have done, including when its rails would have bound.

Each record also carries both arms' **modelled** outcome of the minute, computed the same way for both so
the pair can be compared (the online evaluation's gate needs paired outcomes, and the shadow arm was never
actuated, so it has no measurement): an arm serves a decision's interval with the replicas it asked for one
pod start-up (``startup_delay_s``) earlier, and the interval violates the SLO when the observed load (in
replicas at 100 %) over those replicas exceeds the highest utilisation whose M/M/c p99 stays within the
SLO (:func:`~.queueing.max_utilisation_within_slo`, the simulator's queueing model). Replica-seconds are
what the arm asked for over the interval since the previous decision. Times come from the observations,
so the same runner serves the simulator's 15-second ticks and the serving loop's minutes. This is the counterfactual "where it can be computed": it shares the simulator's
model of latency, not a measurement of the shadow arm.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from regional_scheduler.autoscaling.policies.base import AutoscalingPolicy, FollowsContext, PolicyContext
from regional_scheduler.autoscaling.queueing import max_utilisation_within_slo
from regional_scheduler.autoscaling.simulator import Observation


@dataclass(frozen=True)
class ShadowRecord:
    time_s: float
    current_replicas: int
    live_replicas: int
    shadow_replicas: int
    live_violation: bool = False  # modelled SLO violation of the interval with the live arm's replicas
    shadow_violation: bool = False  # the same for the shadow arm
    interval_s: float = 0.0  # seconds since the previous decision (0 for the first)


class ShadowRecordSink(Protocol):
    """Receives every shadow record (e.g. the publisher of evaluation records for the continual learner)."""

    def __call__(self, record: ShadowRecord) -> None: ...


@dataclass
class _ArmReplicas:
    """An arm's requested replicas over the last start-up delay: what serves at ``t`` is what it asked for at
    the latest decision no later than ``t - lag_s`` (the current replicas before it has one)."""

    lag_s: float
    asked: deque[tuple[float, int]] = field(default_factory=deque)

    def serving(self, time_s: float, requested: int, current: int) -> int:
        self.asked.append((time_s, requested))
        ready = current
        while self.asked and self.asked[0][0] <= time_s - self.lag_s:
            ready = self.asked[0][1]
            if len(self.asked) > 1 and self.asked[1][0] <= time_s - self.lag_s:
                self.asked.popleft()
            else:
                break
        return ready


@dataclass
class ShadowRunner(FollowsContext):
    """A policy that decides with ``live`` and records ``shadow``'s decision for the same observation."""

    live: AutoscalingPolicy
    shadow: AutoscalingPolicy
    records: list[ShadowRecord] = field(default_factory=list)
    sink: ShadowRecordSink | None = None
    _slo_utilisation: float = field(default=math.inf, init=False)  # no context yet: nothing is judged a violation
    _arms: tuple[_ArmReplicas, _ArmReplicas] = field(default_factory=lambda: (_ArmReplicas(0), _ArmReplicas(0)),
                                                     init=False)

    @property
    def name(self) -> str:
        return f"{self.live.name}+shadow:{self.shadow.name}"

    def _follow(self, context: PolicyContext) -> None:
        svc = context.service
        self._slo_utilisation = max_utilisation_within_slo(workers=svc.workers_per_replica,
                                                           service_time_s=svc.service_time_ms / 1e3,
                                                           slo_s=svc.slo_p99_ms / 1e3)
        if self._arms[0].lag_s != svc.startup_delay_s:
            self._arms = (_ArmReplicas(svc.startup_delay_s), _ArmReplicas(svc.startup_delay_s))

    def reset(self, context: PolicyContext) -> None:
        self.live.reset(context)
        self.shadow.reset(context)
        self.records.clear()
        self._arms = (_ArmReplicas(0), _ArmReplicas(0))
        self._follow(context)

    def update_context(self, context: PolicyContext) -> None:
        """Each policy follows the context in place if it declares :class:`FollowsContext`, else is reset."""
        for policy in (self.live, self.shadow):
            if isinstance(policy, FollowsContext):
                policy.update_context(context)
            else:
                policy.reset(context)
        self._follow(context)

    def _violates(self, load_replicas: float, replicas: int) -> bool:
        if load_replicas <= 0:
            return False
        return replicas <= 0 or load_replicas / replicas > self._slo_utilisation

    def decide(self, observation: Observation) -> int:
        live = self.live.decide(observation)
        shadow = self.shadow.decide(observation)
        current, now = observation.current_replicas, observation.time_s
        serving = [arm.serving(now, asked, current) for arm, asked in zip(self._arms, (live, shadow), strict=True)]
        load = observation.load_replicas if math.isfinite(observation.load_replicas) else 0.0
        interval = now - self.records[-1].time_s if self.records else 0.0
        record = ShadowRecord(now, current, live, shadow, self._violates(load, serving[0]),
                              self._violates(load, serving[1]), interval)
        self.records.append(record)
        if self.sink is not None:
            self.sink(record)
        return live

    def disagreement_fraction(self) -> float:
        if not self.records:
            return 0.0
        return sum(r.live_replicas != r.shadow_replicas for r in self.records) / len(self.records)
