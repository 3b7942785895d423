"""Evaluation records of a routing candidate in shadow, for the continual learner: every ``window_decisions``
paired decisions of :class:`~.shadow.ShadowRouting`, per arm the mean carbon per replica-hour of its choices and
its SLO violations (summed), on the routing model's evaluations stream."""

from __future__ import annotations

import logging
import threading

from global_scheduler.routing.shadow import RoutingShadowRecord
from meridian.bus import BusError, StreamBus
from meridian.lifecycle.records import EvaluationRecord, evaluations_stream

log = logging.getLogger(__name__)


class RoutingEvaluationPublisher:
    def __init__(self, bus: StreamBus, *, candidate: str, active: str, window_decisions: int = 20,
                 first_window: int = 0) -> None:
        if window_decisions < 1:
            raise ValueError("window_decisions must be ≥ 1")
        self.bus, self.candidate, self.active = bus, candidate, active
        self.window_decisions, self.window = window_decisions, first_window
        self.published = 0
        self.lost = 0
        self._pending: list[RoutingShadowRecord] = []
        self._lock = threading.Lock()

    def __call__(self, record: RoutingShadowRecord) -> None:
        with self._lock:
            self._pending.append(record)
            if len(self._pending) < self.window_decisions:
                return
            batch, self._pending = self._pending, []
            window, self.window = self.window, self.window + 1
        n = len(batch)
        evaluation = EvaluationRecord(
            model="routing", window=window, candidate=self.candidate, active=self.active, decisions=n,
            candidate_outcomes={"carbon_per_replica_hour": sum(r.candidate_carbon for r in batch) / n,
                                "slo_violations": float(sum(r.candidate_slo_violation for r in batch))},
            active_outcomes={"carbon_per_replica_hour": sum(r.active_carbon for r in batch) / n,
                             "slo_violations": float(sum(r.active_slo_violation for r in batch))},
            agreed=sum(r.agree for r in batch) / n)
        try:
            self.bus.publish(evaluations_stream("routing"), evaluation.model_dump_json().encode())
            self.published += 1
        except BusError as exc:
            self.lost += 1
            log.warning("routing shadow window %d not published (the gate waits for the next): %s", window, exc)
