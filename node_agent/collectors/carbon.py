"""Grid carbon intensity for the node's reports, and the feeder that keeps a Redis key current.

Sources, in the order an operator would pick them:

* ``redis``: the key ``meridian:carbon:<zone>`` (gCO2/kWh as text), kept current by one
  :class:`CarbonFeeder` per zone — one reader of the upstream feed instead of one per node;
* ``file``: a carbon series CSV read by the agent itself (:class:`~meridian.carbon_feed.CarbonFeed`,
  Electricity Maps or Let's Wait Awhile layouts), replayed from ``offset_s``;
* ``static``: a configured constant.

With no value at all (no constant configured, nothing read yet) a report says ``CARBON_SOURCE_NONE``:
the global tier shows the cluster's intensity as unknown instead of a 0 g/kWh grid.

A failed read keeps the last good value (intensity moves on the scale of hours) and is counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from meridian.bus import BusError, StreamBus, carbon_key
from meridian.carbon_feed import CarbonFeed
from protos import telemetry_pb2 as pb

log = logging.getLogger(__name__)


@dataclass
class CarbonCollector:
    source: str = "static"  # static | file | redis
    static_g_per_kwh: float | None = None
    feed: CarbonFeed | None = None
    bus: StreamBus | None = None
    zone: str = ""
    last_g_per_kwh: float | None = None
    errors_total: int = field(default=0)

    @classmethod
    def from_file(cls, path: str | Path, *, offset_s: float = 0.0, column: str = "direct") -> CarbonCollector:
        return cls(source="file", feed=CarbonFeed.from_file(path, offset_s=offset_s, column=column))

    def read(self, now_s: float) -> tuple[float, int]:
        """(gCO2/kWh, ``pb.CarbonSource``) now."""
        if self.source == "file" and self.feed is not None:
            return float(self.feed.intensity_at(now_s)), pb.CARBON_SOURCE_FEED_FILE
        if self.source == "redis" and self.bus is not None:
            try:
                raw = self.bus.get_value(carbon_key(self.zone))
                if raw is not None:
                    self.last_g_per_kwh = float(raw)
            except (BusError, ValueError) as exc:
                self.errors_total += 1
                log.debug("carbon key for %s unreadable: %s", self.zone, exc)
            if self.last_g_per_kwh is not None:
                return self.last_g_per_kwh, pb.CARBON_SOURCE_REDIS_KEY
        if self.static_g_per_kwh is None:
            return 0.0, pb.CARBON_SOURCE_NONE
        return self.static_g_per_kwh, pb.CARBON_SOURCE_STATIC


@dataclass
class CarbonFeeder:
    """Writes a feed's current intensity to ``meridian:carbon:<zone>`` every ``interval_s``."""

    bus: StreamBus
    feed: CarbonFeed
    zone: str
    interval_s: float = 60.0

    def publish_once(self, now_s: float) -> float:
        value = float(self.feed.intensity_at(now_s))
        self.bus.set_value(carbon_key(self.zone), repr(value).encode())
        return value

    def run(self, stop: threading.Event, *, clock: Callable[[], float] = time.time) -> None:
        while not stop.is_set():
            try:
                self.publish_once(clock())
            except BusError as exc:
                log.warning("carbon feeder %s: %s", self.zone, exc)
            stop.wait(self.interval_s)
