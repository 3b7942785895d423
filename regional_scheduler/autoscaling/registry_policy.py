"""The autoscaling policy one deployment runs under the model registry, with the candidate judged live.

:func:`policy_from_registry` reads the registry once (the autoscaler rebuilds it when a version moves):

* the **served** policy is the ``learned`` DQN policy on the registry's *active* autoscaling checkpoint, or
  the named fallback policy while the registry has none;
* with a version in **shadow**, a :class:`~.shadow.ShadowRunner` runs it beside the served policy and its
  windows go to the continual learner (:mod:`.shadow_publisher`);
* in **canary**, the split is per deployment (:class:`~meridian.model_registry.evaluation.CanarySplit` salted
  with the version id, keyed by ``namespace/name``): a deployment in the candidate's arm runs the candidate
  live and the served policy in shadow, and its records say so (``candidate_is_live``), so the learner still
  receives candidate-versus-active pairs from both arms.
"""

from __future__ import annotations

from pathlib import Path

from meridian.bus import StreamBus
from meridian.model_registry.evaluation import CanarySplit
from meridian.model_registry.registry import ModelRegistry
from meridian.model_registry.versions import ModelState
from regional_scheduler.autoscaling.dqn.checkpoint import load_checkpoint
from regional_scheduler.autoscaling.policies.base import AutoscalingPolicy
from regional_scheduler.autoscaling.policies.learned_policy import LearnedPolicy
from regional_scheduler.autoscaling.policies.registry import get_policy
from regional_scheduler.autoscaling.shadow import ShadowRunner
from regional_scheduler.autoscaling.shadow_publisher import evaluation_publisher

MODEL = "autoscaling"


def _learned(path: Path) -> LearnedPolicy:
    return LearnedPolicy(load_checkpoint(path)[0])


def policy_from_registry(registry: ModelRegistry, bus: StreamBus, *, deployment: str,
                         fallback: str = "quantile-budget", canary_share: float = 0.1,
                         window_decisions: int = 15) -> AutoscalingPolicy:
    """The policy ``deployment`` (``namespace/name``) runs, in a shadow runner while a candidate is judged."""
    active = registry.active_checkpoint(MODEL)
    served: AutoscalingPolicy = _learned(active[1]) if active else get_policy(fallback)
    candidate_version = registry.judged(MODEL)
    if candidate_version is None:
        return served
    candidate = _learned(registry.artifact_path(candidate_version.version_id))
    live_candidate = (candidate_version.state is ModelState.CANARY
                      and CanarySplit(canary_share, salt=candidate_version.version_id).serves_candidate(deployment))
    sink = evaluation_publisher(bus, candidate=candidate_version.version_id,
                                active=active[0].version_id if active else f"unversioned:{fallback}",
                                window_decisions=window_decisions, candidate_is_live=live_candidate)
    live, shadow = (candidate, served) if live_candidate else (served, candidate)
    return ShadowRunner(live, shadow, sink=sink)
