"""Evaluation records of an autoscaling candidate running in shadow, for the continual learner.

A :class:`~regional_scheduler.autoscaling.shadow.ShadowRunner` hands every minute's record here; every
``window_decisions`` decisions this publishes one :class:`~meridian.lifecycle.records.EvaluationRecord` on
the autoscaling model's evaluations stream with, per arm, the window's SLO-violation minutes and replica-hours
as the runner modelled them (both arms by the same queueing model: see :mod:`.shadow`) and the share of
decisions on which the two asked for the same replicas. Canary for autoscaling is per deployment
(:class:`~meridian.model_registry.evaluation.CanarySplit` on the deployment's name): a deployment in the
candidate's arm runs the candidate live and the active model in shadow, with the arms swapped in its records.
"""

from __future__ import annotations

import logging
import threading

from meridian.bus import BusError, StreamBus
from meridian.lifecycle.records import EvaluationRecord, evaluations_stream
from regional_scheduler.autoscaling.shadow import ShadowRecord

log = logging.getLogger(__name__)


class ShadowEvaluationPublisher:
    """Windows of shadow minutes → evaluation records on the bus. ``candidate_is_live``: a canary deployment,
    where the live arm is the candidate."""

    def __init__(self, bus: StreamBus, *, candidate: str, active: str, window_decisions: int = 15,
                 first_window: int = 0, candidate_is_live: bool = False) -> None:
        if window_decisions < 1:
            raise ValueError("window_decisions must be ≥ 1")
        self.bus, self.candidate, self.active = bus, candidate, active
        self.window_decisions, self.window = window_decisions, first_window
        self.candidate_is_live = candidate_is_live
        self.published = 0
        self.lost = 0
        self._pending: list[ShadowRecord] = []
        self._lock = threading.Lock()

    def __call__(self, record: ShadowRecord) -> None:
        with self._lock:
            self._pending.append(record)
            if len(self._pending) < self.window_decisions:
                return
            batch, self._pending = self._pending, []
            window, self.window = self.window, self.window + 1
        self._publish(window, batch)

    def _publish(self, window: int, batch: list[ShadowRecord]) -> None:
        live = {"slo_violation_minutes": sum(r.interval_s for r in batch if r.live_violation) / 60.0,
                "replica_hours": sum(r.live_replicas * r.interval_s for r in batch) / 3600.0}
        shadow = {"slo_violation_minutes": sum(r.interval_s for r in batch if r.shadow_violation) / 60.0,
                  "replica_hours": sum(r.shadow_replicas * r.interval_s for r in batch) / 3600.0}
        candidate, active = (live, shadow) if self.candidate_is_live else (shadow, live)
        evaluation = EvaluationRecord(model="autoscaling", window=window, candidate=self.candidate,
                                      active=self.active, decisions=len(batch), candidate_outcomes=candidate,
                                      active_outcomes=active,
                                      agreed=sum(r.live_replicas == r.shadow_replicas for r in batch) / len(batch))
        try:
            self.bus.publish(evaluations_stream("autoscaling"), evaluation.model_dump_json().encode())
            self.published += 1
        except BusError as exc:
            self.lost += 1
            log.warning("autoscaling shadow window %d not published (the gate waits for the next): %s", window, exc)
