"""The stream bus: Meridian's message fabric (ARCHITECTURE.md, "The fabric: Redis streams").

``StreamBus`` is the one interface; :class:`RedisStreamBus` is production (consumer groups,
acknowledge after apply, ``XAUTOCLAIM`` of what a dead consumer left pending, dead-letter streams,
approximate ``MAXLEN`` trimming, pipelined batches) and :class:`InProcessStreamBus` is the embedded
default with the same semantics. Stream names come from :mod:`meridian.bus.streams`.
"""

from meridian.bus.base import BusError, BusUnavailableError, StreamBus, StreamEntry
from meridian.bus.memory import InProcessStreamBus
from meridian.bus.redis_bus import RedisStreamBus
from meridian.bus.streams import (
    SUMMARY_STREAM,
    carbon_key,
    dead_letter_stream,
    dispatch_stream,
    events_stream,
    telemetry_stream,
)

__all__ = [
    "SUMMARY_STREAM",
    "BusError",
    "BusUnavailableError",
    "InProcessStreamBus",
    "RedisStreamBus",
    "StreamBus",
    "StreamEntry",
    "carbon_key",
    "dead_letter_stream",
    "dispatch_stream",
    "events_stream",
    "open_bus",
    "telemetry_stream",
]


def open_bus(url: str, *, key_prefix: str = "") -> StreamBus:
    """A bus from a URL: ``redis://…``/``rediss://…``/``unix://…`` or ``memory://`` (in-process)."""
    if url.startswith("memory:"):
        return InProcessStreamBus(key_prefix=key_prefix)
    return RedisStreamBus(url, key_prefix=key_prefix)
