"""Evaluation records of an autoscaling candidate running in shadow, for the continual learner.

A :class:`~regional_scheduler.autoscaling.shadow.ShadowRunner` hands every decision's record to the publisher
built here (:class:`~meridian.lifecycle.evaluation_publisher.WindowedEvaluationPublisher`); each window of
``window_decisions`` decisions becomes one evaluation record with, per arm, the window's SLO-violation minutes
and replica-hours as the runner modelled them (both arms by the same queueing model: see :mod:`.shadow`) and
the share of decisions on which the two asked for the same replicas. Canary for autoscaling is per deployment
(:class:`~meridian.model_registry.evaluation.CanarySplit` on the deployment's name): a deployment in the
candidate's arm runs the candidate live and the active model in shadow (``candidate_is_live``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from meridian.bus import StreamBus
from meridian.lifecycle.evaluation_publisher import WindowedEvaluationPublisher, WindowSummary
from regional_scheduler.autoscaling.shadow import ShadowRecord


def summarise(batch: Sequence[ShadowRecord], *, candidate_is_live: bool = False) -> WindowSummary:
    live = {"slo_violation_minutes": sum(r.interval_s for r in batch if r.live_violation) / 60.0,
            "replica_hours": sum(r.live_replicas * r.interval_s for r in batch) / 3600.0}
    shadow = {"slo_violation_minutes": sum(r.interval_s for r in batch if r.shadow_violation) / 60.0,
              "replica_hours": sum(r.shadow_replicas * r.interval_s for r in batch) / 3600.0}
    candidate, active = (live, shadow) if candidate_is_live else (shadow, live)
    return WindowSummary(candidate, active, sum(r.live_replicas == r.shadow_replicas for r in batch) / len(batch))


def evaluation_publisher(bus: StreamBus, *, candidate: str, active: str, window_decisions: int = 15,
                         candidate_is_live: bool = False) -> WindowedEvaluationPublisher[ShadowRecord]:
    """The sink to give ``ShadowRunner`` while ``candidate`` is judged against ``active``."""
    return WindowedEvaluationPublisher(bus, model="autoscaling", candidate=candidate, active=active,
                                       summarise=partial(summarise, candidate_is_live=candidate_is_live),
                                       window_decisions=window_decisions)
