"""Windows of a tier's shadow records → evaluation records on the bus, for the continual learner.

Every tier's shadow wrapper (placement's ``ShadowPolicy``, the autoscaler's ``ShadowRunner``, the router's
``ShadowRouting``) hands each decision's record to a sink; this one collects ``window_decisions`` of them and
publishes one :class:`~.records.EvaluationRecord` with what the tier's ``summarise`` makes of the window: each
arm's outcome per metric and the share of decisions on which they agreed. What a record holds and how a window
is summarised is the tier's; the windowing, the numbering and the bus are here, once.

Thread-safe (a tier's workers may decide concurrently). A window the bus refuses is counted in ``lost`` and
logged; the gate simply waits for the next one, so a Redis outage delays a promotion and never fakes one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

from meridian.bus import BusError, StreamBus
from meridian.lifecycle.records import EvaluationRecord, evaluations_stream

log = logging.getLogger(__name__)

R = TypeVar("R")


class WindowSummary(NamedTuple):
    candidate: dict[str, float]
    active: dict[str, float]
    agreed: float | None


class WindowedEvaluationPublisher(Generic[R]):
    def __init__(self, bus: StreamBus, *, model: str, candidate: str, active: str,
                 summarise: Callable[[Sequence[R]], WindowSummary], window_decisions: int,
                 first_window: int = 0) -> None:
        if window_decisions < 1:
            raise ValueError("window_decisions must be ≥ 1")
        self.bus, self.model, self.candidate, self.active = bus, model, candidate, active
        self.summarise, self.window_decisions, self.window = summarise, window_decisions, first_window
        self.published = 0
        self.lost = 0
        self._pending: list[R] = []
        self._lock = threading.Lock()

    def __call__(self, record: R) -> None:
        with self._lock:
            self._pending.append(record)
            if len(self._pending) < self.window_decisions:
                return
            batch, self._pending = self._pending, []
            window, self.window = self.window, self.window + 1
        summary = self.summarise(batch)
        evaluation = EvaluationRecord(model=self.model, window=window, candidate=self.candidate, active=self.active,
                                      decisions=len(batch), candidate_outcomes=summary.candidate,
                                      active_outcomes=summary.active, agreed=summary.agreed)
        try:
            self.bus.publish(evaluations_stream(self.model), evaluation.model_dump_json().encode())
            self.published += 1
        except BusError as exc:
            self.lost += 1
            log.warning("%s shadow window %d not published (the gate waits for the next): %s", self.model, window,
                        exc)
