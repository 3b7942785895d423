"""The placement policy a regional scheduler serves under the model registry, with the candidate judged live.

:func:`policy_from_registry` reads the registry once (a scheduler rebuilds it when the registry's events say a
placement version moved):

* the **served** policy is the ``learned`` policy on the registry's *active* placement checkpoint (its
  artifact, digest-checked by the store), or the named fallback policy while the registry has none;
* when a version is in **shadow** or **canary**, the served policy is wrapped in a
  :class:`~regional_scheduler.policies.learned.ShadowPolicy` with that version's checkpoint as the candidate:
  every decision records both choices and their exact fragmentation increase, windows of them go to the
  continual learner as evaluation records (:mod:`.shadow_publisher`), and in canary a
  :class:`~meridian.model_registry.evaluation.CanarySplit` salted with the version id serves the candidate's
  choice for its share of pods.

A candidate whose checkpoint does not load is not served in any form: the learned policy falls back to FGD
on every decision and counts it (``bad_checkpoint``), which the gate then sees as the candidate's outcome.
"""

from __future__ import annotations

from meridian.bus import StreamBus
from meridian.model_registry.evaluation import CanarySplit
from meridian.model_registry.registry import ModelRegistry
from meridian.model_registry.versions import ModelState
from regional_scheduler.learned.serving import ServingSettings
from regional_scheduler.learned.shadow_publisher import evaluation_publisher
from regional_scheduler.policies.base import ScorePolicy
from regional_scheduler.policies.learned import LearnedPolicy, ShadowPolicy
from regional_scheduler.policies.registry import get_policy

MODEL = "placement"


def policy_from_registry(registry: ModelRegistry, bus: StreamBus, *, fallback: str = "fgd",
                         canary_share: float = 0.1, window_decisions: int = 50,
                         serving: ServingSettings | None = None) -> ScorePolicy:
    """The served placement policy, in a shadow of the registry's candidate when there is one."""
    base = serving or ServingSettings()
    active = registry.active_checkpoint(MODEL)
    served: ScorePolicy = (LearnedPolicy(base.model_copy(update={"checkpoint": active[1]})) if active
                           else get_policy(fallback))
    candidate = registry.judged(MODEL)
    if candidate is None:
        return served
    learned = LearnedPolicy(base.model_copy(update={"checkpoint": registry.artifact_path(candidate.version_id)}))
    canary = (CanarySplit(canary_share, salt=candidate.version_id) if candidate.state is ModelState.CANARY
              else None)
    compared_with = active[0].version_id if active else f"unversioned:{fallback}"
    sink = evaluation_publisher(bus, candidate=candidate.version_id, active=compared_with,
                                window_decisions=window_decisions)
    return ShadowPolicy(served, learned, canary=canary, sink=sink)
