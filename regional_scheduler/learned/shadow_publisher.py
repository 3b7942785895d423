"""Evaluation records of a placement candidate running in shadow or canary, for the continual learner.

A :class:`~regional_scheduler.policies.learned.ShadowPolicy` hands every decision's record here
(:class:`~regional_scheduler.policies.learned.ShadowRecordSink`); every ``window_decisions`` decisions this
publishes one :class:`~meridian.lifecycle.records.EvaluationRecord` on the model's evaluations stream: per
arm, the GPU fragmentation its choices add (summed over the window) and the share of decisions on which the
two models agreed.

Why fragmentation is exact and unschedulable pods are not in it: both models rank the same feasible nodes on
the same cluster snapshot, so each choice's fragmentation increase is measured, not estimated, for the model
that was not served too. Whether a pod is unschedulable is decided by the filter before either model is
asked, so within one decision both arms have the same count (0); a model's effect on later pods' fit
emerges only over a trajectory, which the bench simulates (``meridian bench lifecycle``) and a live shadow
cannot. The window's ``unschedulable_pods`` is therefore reported equal for both arms, which leaves the
live gate's decision to fragmentation.
"""

from __future__ import annotations

import logging
import threading

from meridian.bus import BusError, StreamBus
from meridian.lifecycle.records import EvaluationRecord, evaluations_stream
from regional_scheduler.policies.learned import ShadowRecord

log = logging.getLogger(__name__)


class ShadowEvaluationPublisher:
    """Windows of shadow records → evaluation records on the bus (thread-safe: the dispatch worker's
    threads may decide concurrently)."""

    def __init__(self, bus: StreamBus, *, candidate: str, active: str, window_decisions: int = 50,
                 first_window: int = 0) -> None:
        if window_decisions < 1:
            raise ValueError("window_decisions must be ≥ 1")
        self.bus, self.candidate, self.active = bus, candidate, active
        self.window_decisions = window_decisions
        self.window = first_window
        self.published = 0
        self.lost = 0  # windows the bus refused (logged; the gate simply waits for the next)
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
        evaluation = EvaluationRecord(
            model="placement", window=window, candidate=self.candidate, active=self.active, decisions=len(batch),
            candidate_outcomes={"unschedulable_pods": 0.0,
                                "gpu_fragmentation": sum(r.learned_fragmentation for r in batch)},
            active_outcomes={"unschedulable_pods": 0.0, "gpu_fragmentation": sum(r.active_fragmentation for r in batch)},
            agreed=sum(r.agree for r in batch) / len(batch))
        try:
            self.bus.publish(evaluations_stream("placement"), evaluation.model_dump_json().encode())
            self.published += 1
        except BusError as exc:
            self.lost += 1
            log.warning("placement shadow window %d not published (the gate waits for the next): %s", window, exc)
