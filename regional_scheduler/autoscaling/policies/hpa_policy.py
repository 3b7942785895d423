"""The Kubernetes HPA as a policy (CPU utilisation target, default ``behavior``); not guard-railed."""

from __future__ import annotations

from regional_scheduler.autoscaling.hpa import HpaBehavior, HpaController, HpaSpec
from regional_scheduler.autoscaling.policies.base import FollowsContext, PolicyContext, ScalesOnUtilisation
from regional_scheduler.autoscaling.simulator import Observation

NAME = "hpa"


class HpaPolicy(FollowsContext, ScalesOnUtilisation):
    name = NAME

    def __init__(self, behavior: HpaBehavior | None = None) -> None:
        self.behavior = behavior or HpaBehavior()
        self.controller: HpaController | None = None

    def reset(self, context: PolicyContext) -> None:
        sizing = context.sizing
        self.controller = HpaController(HpaSpec(
            min_replicas=sizing.min_replicas, max_replicas=sizing.max_replicas,
            target_utilisation=sizing.target_utilisation, behavior=self.behavior))

    def update_context(self, context: PolicyContext) -> None:
        """Serving: the HPA keeps its recommendations and scale events; only its bounds follow sizing."""
        if self.controller is not None:
            self.controller.spec = self.controller.spec.model_copy(update={
                "min_replicas": context.sizing.min_replicas, "max_replicas": context.sizing.max_replicas})

    def utilisation_metric(self) -> str:
        return "CPU utilisation (usage / request over the target's ready pods)"

    def decide(self, observation: Observation) -> int:
        assert self.controller is not None, "reset() first"
        return self.controller.desired_replicas(
            now_s=observation.time_s, current_replicas=observation.current_replicas,
            ready_pods=observation.ready_replicas, unready_pods=observation.pending_replicas,
            utilisation=observation.utilisation)


def build() -> HpaPolicy:
    return HpaPolicy()
