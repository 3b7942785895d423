"""Shadow mode: run a candidate policy beside the live one on the same observations and record both.

Only the live decision is actuated. The shadow policy keeps its own guard-rail memory (as if it were
live), so its record shows what it *would* have done, including when its rails would have bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from regional_scheduler.autoscaling.policies.base import AutoscalingPolicy, FollowsContext, PolicyContext
from regional_scheduler.autoscaling.simulator import Observation


@dataclass(frozen=True)
class ShadowRecord:
    time_s: float
    current_replicas: int
    live_replicas: int
    shadow_replicas: int


@dataclass
class ShadowRunner(FollowsContext):
    """A policy that decides with ``live`` and records ``shadow``'s decision for the same observation."""

    live: AutoscalingPolicy
    shadow: AutoscalingPolicy
    records: list[ShadowRecord] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.live.name}+shadow:{self.shadow.name}"

    def reset(self, context: PolicyContext) -> None:
        self.live.reset(context)
        self.shadow.reset(context)
        self.records.clear()

    def update_context(self, context: PolicyContext) -> None:
        """Each policy follows the context in place if it declares :class:`FollowsContext`, else is reset."""
        for policy in (self.live, self.shadow):
            if isinstance(policy, FollowsContext):
                policy.update_context(context)
            else:
                policy.reset(context)

    def decide(self, observation: Observation) -> int:
        live = self.live.decide(observation)
        shadow = self.shadow.decide(observation)
        self.records.append(ShadowRecord(observation.time_s, observation.current_replicas, live, shadow))
        return live

    def disagreement_fraction(self) -> float:
        if not self.records:
            return 0.0
        return sum(r.live_replicas != r.shadow_replicas for r in self.records) / len(self.records)
