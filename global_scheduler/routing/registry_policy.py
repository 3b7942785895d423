"""The routing policy the global scheduler serves under the model registry, with the candidate judged live.

:func:`policy_from_registry` reads the registry once: the served policy is the GNN router on the registry's
*active* routing checkpoint, or the named fallback policy while the registry has none; with a version in
shadow or canary, a :class:`~.shadow.ShadowRouting` scores the candidate GNN beside it on every workload and
publishes windows of both arms' outcomes to the continual learner (:mod:`.shadow_publisher`). Routing has no
canary split (a policy sees a workload's features, not its id), so a canary version is judged in shadow too.
The shadow scores one workload at a time: it does not declare the GNN's batch scoring.
"""

from __future__ import annotations

from global_scheduler.routing.base import RoutingPolicy
from global_scheduler.routing.gnn_routing import GnnRouting
from global_scheduler.routing.registry import get_policy
from global_scheduler.routing.shadow import ShadowRouting
from global_scheduler.routing.shadow_publisher import evaluation_publisher
from meridian.bus import StreamBus
from meridian.model_registry.registry import ModelRegistry

MODEL = "routing"


def policy_from_registry(registry: ModelRegistry, bus: StreamBus, *, fallback: str = "least-carbon-slo",
                         window_decisions: int = 20) -> RoutingPolicy:
    """The served routing policy, in a shadow of the registry's candidate when there is one."""
    active = registry.active_checkpoint(MODEL)
    served: RoutingPolicy = GnnRouting(active[1]) if active else get_policy(fallback)
    candidate = registry.judged(MODEL)
    if candidate is None:
        return served
    sink = evaluation_publisher(bus, candidate=candidate.version_id,
                                active=active[0].version_id if active else f"unversioned:{fallback}",
                                window_decisions=window_decisions)
    return ShadowRouting(served, GnnRouting(registry.artifact_path(candidate.version_id)), sink=sink)
