"""Drift alerts as bus events: a :class:`~meridian.drift.DriftPublisher` that appends each alert to the model's
drift stream, so an operator's dashboard or another learner sees the feature that drifted without scraping
logs. A bus outage loses the event (logged), never the alert's metric or log line, and never stops learning."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from meridian.bus import BusError, StreamBus
from meridian.drift import DriftAlert
from meridian.lifecycle.records import DriftEvent, drift_stream

log = logging.getLogger(__name__)

DRIFT_STREAM_MAXLEN = 10_000


class BusDriftPublisher:
    """Publishes each alert on ``meridian:learn:{<model>}:drift``; ``window`` is the record being observed."""

    def __init__(self, bus: StreamBus, model: str) -> None:
        self.bus, self.model = bus, model
        self.window: int | None = None
        self.lost = 0

    def __call__(self, alert: DriftAlert) -> None:
        event = DriftEvent(model=self.model, feature=alert.feature, detector=str(alert.detector),
                           sample_index=alert.sample_index, window=self.window, value=alert.value,
                           at=datetime.now(UTC))
        try:
            self.bus.publish(drift_stream(self.model), event.model_dump_json().encode(), maxlen=DRIFT_STREAM_MAXLEN)
        except BusError as exc:
            self.lost += 1
            log.warning("drift alert of %s on %s not published on the bus: %s", self.model, alert.feature, exc)
