"""The agent's publish side: a bounded buffer in front of the bus.

Design
------
Reports are serialised as soon as they are made and appended to a buffer; ``flush`` sends the whole
buffer as one pipelined batch. While the bus is unreachable the buffer keeps the newest
``buffer_max`` reports and drops the oldest beyond that, counting them (``dropped_total``): fresh
telemetry is worth more than old, and an agent must never grow without bound during a long outage.
Retries follow a back-off sequence (kopf-style ``backoff_s``; the last delay repeats) so a fleet of
agents does not hammer a recovering Redis in lock-step. An outage is said twice, never more: one line when
publishing starts failing (why, and what is buffered against which cap) and one when it works again (how
long it lasted, what was sent and dropped); ``notify`` receives them (``meridian agent`` prints them),
else they are logged.

Hazards
-------
* A batch that failed half-way may be sent again in full: the consumer's sequence check makes the
  duplicates harmless (at-least-once delivery, exactly-once application).
* A buffered report keeps the time it was measured (``observed_unix_ms``); consumers decide
  liveness by arrival, so a burst after an outage marks the node alive, which it is.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

from meridian import observability
from meridian.bus import BusError, BusUnavailableError, StreamBus
from meridian.bus.consumer import backoff_delay

log = logging.getLogger(__name__)
PUBLISHED = observability.counter("meridian_agent_reports_published_total", "Reports the agent handed to the bus.")
DROPPED = observability.counter("meridian_agent_reports_dropped_total", "Reports dropped because the buffer was "
                                "full during a bus outage (oldest first).")
BUFFERED = observability.gauge("meridian_agent_buffered_reports", "Reports waiting in the agent's buffer.")
PUBLISH_FAILURES = observability.counter("meridian_agent_publish_failures_total", "Failed attempts to publish the "
                                         "buffer.")


class ReportPublisher:
    def __init__(self, *, bus: StreamBus, stream: str, buffer_max: int = 10_000, maxlen: int | None = 1_000_000,
                 backoff_s: Sequence[float] = (0.5, 1.0, 2.0, 5.0, 10.0),
                 clock: Callable[[], float] = time.monotonic, notify: Callable[[str], None] | None = None) -> None:
        if buffer_max < 1:
            raise ValueError("buffer_max must be at least 1")
        self.bus, self.stream, self.buffer_max, self.maxlen = bus, stream, buffer_max, maxlen
        self.backoff_s = tuple(backoff_s)
        self.clock = clock
        self.buffer: deque[bytes] = deque()
        self.published_total = 0
        self.dropped_total = 0
        self.failures = 0
        self.last_success_s: float | None = None
        self._retry_at = float("-inf")
        self.notify = notify
        self._outage_since_s: float | None = None
        self._dropped_before_outage = 0

    def submit(self, payloads: Sequence[bytes]) -> None:
        self.buffer.extend(payloads)
        overflow = len(self.buffer) - self.buffer_max
        if overflow > 0:
            for _ in range(overflow):
                self.buffer.popleft()
            self.dropped_total += overflow
            DROPPED.inc(overflow)
        BUFFERED.set(len(self.buffer))

    def flush(self) -> bool:
        """Send everything buffered; False if the bus refused (the buffer is kept for later)."""
        if not self.buffer:
            return True
        now = self.clock()
        if now < self._retry_at:
            return False
        batch = list(self.buffer)
        try:
            self.bus.publish_many(self.stream, batch, maxlen=self.maxlen)
        except (BusUnavailableError, BusError) as exc:
            if not self.failures:  # once per outage: why (down, refused password, an ACL that forbids it)
                self._outage_since_s, self._dropped_before_outage = now, self.dropped_total
                self._say(f"cannot publish to {self.stream}: {exc}; buffering {len(self.buffer)} reports (cap "
                          f"{self.buffer_max}, the oldest dropped beyond it) and retrying", level=logging.WARNING)
            self._retry_at = now + backoff_delay(self.backoff_s, self.failures)
            self.failures += 1
            PUBLISH_FAILURES.inc()
            return False
        for _ in range(len(batch)):
            self.buffer.popleft()
        self.failures = 0
        self._retry_at = float("-inf")
        self.published_total += len(batch)
        self.last_success_s = now
        PUBLISHED.inc(len(batch))
        BUFFERED.set(len(self.buffer))
        if self._outage_since_s is not None:
            self._say(f"publishing to {self.stream} again after {now - self._outage_since_s:.0f} s: sent {len(batch)} "
                      f"buffered reports, dropped {self.dropped_total - self._dropped_before_outage}",
                      level=logging.INFO)
            self._outage_since_s = None
        return True

    def _say(self, message: str, *, level: int) -> None:
        if self.notify is not None:
            self.notify(message)
        else:
            log.log(level, "%s", message)
