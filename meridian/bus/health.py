"""Consumer-group health as Prometheus gauges: lag (not yet delivered) and pending (not yet acknowledged).

A consumer calls :meth:`GroupGauges.maybe_update` from its loop; the two queries run at most every
``interval_s`` so a busy consumer does not double its round trips. A growing lag means the consumers are
too slow or down; a growing pending count means entries are read and not acknowledged (a stuck apply).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from meridian import observability
from meridian.bus.base import BusError, BusUnavailableError, StreamBus

log = logging.getLogger(__name__)


@dataclass
class GroupGauges:
    bus: StreamBus
    stream: str
    group: str
    interval_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    _next_s: float = field(default=0.0, init=False)

    def update(self) -> tuple[int | None, int]:
        """Query now and set the gauges; returns (lag, pending). Lag None: Redis could not compute it."""
        lag = self.bus.group_lag(self.stream, self.group)
        pending = self.bus.pending(self.stream, self.group)
        if lag is not None:
            observability.STREAM_LAG.labels(stream=self.stream, group=self.group).set(lag)
        observability.STREAM_PENDING.labels(stream=self.stream, group=self.group).set(pending)
        return lag, pending

    def maybe_update(self) -> None:
        now = self.clock()
        if now < self._next_s:
            return
        self._next_s = now + self.interval_s
        try:
            self.update()
        except (BusError, BusUnavailableError) as exc:  # a metric must never stop a consumer
            log.debug("stream gauges for %s/%s not updated: %s", self.stream, self.group, exc)
