"""Evaluation records of a routing candidate in shadow, for the continual learner: every ``window_decisions``
paired decisions of :class:`~.shadow.ShadowRouting`, per arm the mean carbon per replica-hour of its choices and
its SLO violations (summed), through :class:`~meridian.lifecycle.evaluation_publisher.WindowedEvaluationPublisher`."""

from __future__ import annotations

from collections.abc import Sequence

from global_scheduler.routing.shadow import RoutingShadowRecord
from meridian.bus import StreamBus
from meridian.lifecycle.evaluation_publisher import WindowedEvaluationPublisher, WindowSummary


def summarise(batch: Sequence[RoutingShadowRecord]) -> WindowSummary:
    n = len(batch)
    return WindowSummary(
        candidate={"carbon_per_replica_hour": sum(r.candidate_carbon for r in batch) / n,
                   "slo_violations": float(sum(r.candidate_slo_violation for r in batch))},
        active={"carbon_per_replica_hour": sum(r.active_carbon for r in batch) / n,
                "slo_violations": float(sum(r.active_slo_violation for r in batch))},
        agreed=sum(r.agree for r in batch) / n)


def evaluation_publisher(bus: StreamBus, *, candidate: str, active: str,
                         window_decisions: int = 20) -> WindowedEvaluationPublisher[RoutingShadowRecord]:
    """The sink to give ``ShadowRouting`` while ``candidate`` is judged against ``active``."""
    return WindowedEvaluationPublisher(bus, model="routing", candidate=candidate, active=active,
                                       summarise=summarise, window_decisions=window_decisions)
