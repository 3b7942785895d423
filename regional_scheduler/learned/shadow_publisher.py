"""Evaluation records of a placement candidate running in shadow or canary, for the continual learner.

A :class:`~regional_scheduler.policies.learned.ShadowPolicy` hands every decision's record to the publisher
built here (:class:`~meridian.lifecycle.evaluation_publisher.WindowedEvaluationPublisher`); each window of
``window_decisions`` decisions becomes one evaluation record: per arm, the GPU fragmentation its choices add
(summed over the window), and the share of decisions on which the two models agreed.

Why fragmentation is exact and unschedulable pods are not in it: both models rank the same feasible nodes on
the same cluster snapshot, so each choice's fragmentation increase is measured, not estimated, for the model
that was not served too. Whether a pod is unschedulable is decided by the filter before either model is
asked, so within one decision both arms have the same count (0); a model's effect on later pods' fit
emerges only over a trajectory, which the bench simulates (``meridian bench lifecycle``) and a live shadow
cannot. The window's ``unschedulable_pods`` is therefore reported equal for both arms, which leaves the
live gate's decision to fragmentation.
"""

from __future__ import annotations

from collections.abc import Sequence

from meridian.bus import StreamBus
from meridian.lifecycle.evaluation_publisher import WindowedEvaluationPublisher, WindowSummary
from regional_scheduler.policies.learned import ShadowRecord


def summarise(batch: Sequence[ShadowRecord]) -> WindowSummary:
    return WindowSummary(
        candidate={"unschedulable_pods": 0.0, "gpu_fragmentation": sum(r.learned_fragmentation for r in batch)},
        active={"unschedulable_pods": 0.0, "gpu_fragmentation": sum(r.active_fragmentation for r in batch)},
        agreed=sum(r.agree for r in batch) / len(batch))


def evaluation_publisher(bus: StreamBus, *, candidate: str, active: str,
                         window_decisions: int = 50) -> WindowedEvaluationPublisher[ShadowRecord]:
    """The sink to give ``ShadowPolicy`` while ``candidate`` is judged against ``active``."""
    return WindowedEvaluationPublisher(bus, model="placement", candidate=candidate, active=active,
                                       summarise=summarise, window_decisions=window_decisions)
